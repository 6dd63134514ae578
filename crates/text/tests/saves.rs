//! Saved conversations (`/save`, `/load` of `strata chat`) on the demo
//! model: a save replaces only its own earlier KV file, leaves nothing
//! behind when it fails, and a load never changes the files it reads.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use strata_engine::{Engine, EngineOptions, SamplingOptions};
use strata_format::{ConvertOptions, QuantPreset};
use strata_text::{Chat, ReplyOptions, TextModel};

/// The demo checkpoint in the repository.
const DEMO_MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo");

fn engine(dir: &Path) -> Engine {
    let model = dir.join("demo-q8");
    strata_format::convert(DEMO_MODEL_DIR, &model, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    let options = EngineOptions { threads: 1, usage_file: Some(dir.join("usage.json")), ..EngineOptions::default() };
    Engine::open(&model, &options).unwrap()
}

/// A conversation of one short exchange.
fn chat<'e>(engine: &'e Engine, question: &str) -> Chat<'e> {
    let mut chat = Chat::new(engine, TextModel::load(engine).unwrap(), None);
    let sampling = SamplingOptions { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 1 };
    let options = ReplyOptions { max_new_tokens: 6, sampling, stop: Vec::new() };
    chat.say(question, &options, |_| ControlFlow::Continue(())).unwrap();
    chat
}

/// File names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// The KV files of conversation `name` in `dir`.
fn kv_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    names(dir)
        .into_iter()
        .filter(|f| f.starts_with(&format!("{name}.")) && f.ends_with(".kvs"))
        .map(|f| dir.join(f))
        .collect()
}

fn record(dir: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.chat.json"))).unwrap()).unwrap()
}

#[test]
fn a_save_leaves_the_kv_file_of_a_concurrent_save_of_the_same_name_alone() {
    let dir = tempfile::tempdir().unwrap();
    let kv = dir.path().join("kv");
    let engine = engine(dir.path());
    // Save B has written its KV file and is about to write its record
    // when save A of the same name runs from start to end.
    let b = chat(&engine, "Tell me a fortune.");
    b.save(&kv, "x").unwrap();
    let b_record = record(&kv, "x");
    let b_kv_file = kv.join(b_record["kv_file"].as_str().unwrap());
    std::fs::remove_file(kv.join("x.chat.json")).unwrap();
    let a = chat(&engine, "Another one.");
    a.save(&kv, "x").unwrap();
    assert!(b_kv_file.is_file(), "save A deleted the KV file save B is committing");
    std::fs::write(kv.join("x.chat.json"), serde_json::to_vec(&b_record).unwrap()).unwrap();
    let mut loaded = Chat::new(&engine, TextModel::load(&engine).unwrap(), None);
    loaded.load(&engine, &kv, "x").unwrap();
    assert_eq!(loaded.messages(), b.messages(), "the later commit, B, is the save");

    // Saves racing for real: whichever commits last is what loads.
    std::thread::scope(|scope| {
        for question in ["Tell me a fortune.", "Another one."] {
            let (engine, kv) = (&engine, &kv);
            scope.spawn(move || {
                let chat = chat(engine, question);
                for _ in 0..4 {
                    chat.save(kv, "y").unwrap();
                }
            });
        }
    });
    Chat::new(&engine, TextModel::load(&engine).unwrap(), None).load(&engine, &kv, "y").unwrap();
    assert_eq!(kv_files(&kv, "y").len(), 1, "every KV file but the one named is gone");
}

#[test]
fn saving_x_keeps_a_generate_session_named_x_and_32_hex_digits() {
    let dir = tempfile::tempdir().unwrap();
    let kv = dir.path().join("kv");
    let engine = engine(dir.path());
    let session_name = "x.0123456789abcdef0123456789abcdef";
    let (mut session, _) = engine.open_session(&kv, session_name).unwrap();
    let options = strata_engine::GenerateOptions { max_new_tokens: 3, ..Default::default() };
    let tokens = session.generate(&[1, 2, 3], &options, |_| ControlFlow::Continue(())).unwrap().tokens;
    drop(session);
    let session_bytes = std::fs::read(kv.join(format!("{session_name}.kvs"))).unwrap();
    let chat = chat(&engine, "Tell me a fortune.");
    chat.save(&kv, "x").unwrap();
    chat.save(&kv, "x").unwrap();
    assert_eq!(std::fs::read(kv.join(format!("{session_name}.kvs"))).unwrap(), session_bytes);
    let (session, _) = engine.open_session(&kv, session_name).unwrap();
    assert_eq!(session.tokens()[3..], tokens);
    assert_eq!(kv_files(&kv, "x").len(), 2, "the session and the one KV file the record names");
}

#[test]
fn a_failed_save_leaves_no_file_behind_and_the_previous_save_loadable() {
    let dir = tempfile::tempdir().unwrap();
    let kv = dir.path().join("kv");
    let engine = engine(dir.path());
    let chat = chat(&engine, "Tell me a fortune.");
    chat.save(&kv, "kept").unwrap();
    let before = names(&kv);
    // A record that cannot be replaced: the save fails at its commit.
    std::fs::create_dir_all(kv.join("x.chat.json").join("in-the-way")).unwrap();
    assert!(chat.save(&kv, "x").is_err());
    let mut expected = before;
    expected.push("x.chat.json".to_owned());
    expected.sort();
    assert_eq!(names(&kv), expected, "no KV file or temporary file of the failed save is left");
    Chat::new(&engine, TextModel::load(&engine).unwrap(), None).load(&engine, &kv, "kept").unwrap();
}

#[test]
fn loading_a_damaged_save_refuses_it_and_leaves_its_files_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let kv = dir.path().join("kv");
    let engine = engine(dir.path());
    chat(&engine, "Tell me a fortune.").save(&kv, "x").unwrap();
    let [kv_file] = kv_files(&kv, "x").try_into().unwrap();
    let mut bytes = std::fs::read(&kv_file).unwrap();
    // One bit of the last record, well past the header.
    let last = bytes.len() - 8;
    bytes[last] ^= 0x10;
    std::fs::write(&kv_file, &bytes).unwrap();
    let before = names(&kv);
    let mut loaded = Chat::new(&engine, TextModel::load(&engine).unwrap(), None);
    let err = loaded.load(&engine, &kv, "x").unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
    assert!(loaded.messages().is_empty(), "nothing was loaded");
    assert_eq!(std::fs::read(&kv_file).unwrap(), bytes, "the KV file is not cut");
    assert_eq!(names(&kv), before, "no tail is set aside");
}
