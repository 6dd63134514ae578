//! The shipped demo model against transformers: the f32 container's logits
//! on held-out text, the greedy continuation of "Once upon a time", and the
//! tokenizer's ids (reference from `xtask/fixtures/demo_ref.py`); and a
//! long conversation with it fitted to its 256-token context.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use strata_engine::{Engine, EngineOptions, GenerateOptions, SamplingOptions};
use strata_format::{ConvertOptions, QuantPreset, npy};
use strata_text::{Chat, Reply, ReplyOptions, TextModel, Tokenizer};

/// The demo checkpoint in the repository (the binaries carry a copy).
const DEMO_MODEL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo");

fn reference() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/demo/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn container(dir: &tempfile::TempDir) -> PathBuf {
    let out = dir.path().join("demo-f32");
    strata_format::convert(DEMO_MODEL_DIR, &out, &ConvertOptions::new(QuantPreset::F32)).unwrap();
    out
}

#[test]
fn demo_model_logits_and_greedy_text_match_transformers() {
    let r = reference();
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() };
    let engine = Engine::open(&container(&dir), &options).unwrap();
    let (_, want) =
        npy::read_f32(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/demo/logits_f32.npy")).unwrap();
    let got = engine.logits(&ids(&r["tokens"])).unwrap();
    let n = want.len() as f64;
    let mean = want.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let std = (want.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n).sqrt() as f32;
    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(diff <= 1e-3 * std, "max |Δlogit| {diff} > 1e-3 × {std}");

    let greedy = ids(&r["greedy"]);
    let clear = r["greedy_margins"].as_array().unwrap().iter().take_while(|m| m.as_f64().unwrap() > 1e-2).count();
    let options = GenerateOptions { max_new_tokens: greedy.len(), ignore_eos: true, ..GenerateOptions::default() };
    let report = engine.session().generate(&ids(&r["prompt"]), &options, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(report.tokens[..clear], greedy[..clear]);
}

#[test]
fn demo_tokenizer_matches_transformers_ids() {
    let tokenizer = Tokenizer::from_dir(Path::new(DEMO_MODEL_DIR)).unwrap().unwrap();
    assert_eq!(tokenizer.encode("Once upon a time", false).unwrap(), ids(&reference()["prompt"]));
}

fn say(chat: &mut Chat<'_>, text: &str, options: &ReplyOptions) -> strata_text::Result<Reply> {
    chat.say(text, options, |_| ControlFlow::Continue(()))
}

#[test]
fn a_long_chat_drops_its_oldest_turns_keeps_the_system_prompt_and_never_a_failed_turn() {
    let dir = tempfile::tempdir().unwrap();
    let engine_options = EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() };
    let engine = Engine::open(&container(&dir), &engine_options).unwrap();
    let text = TextModel::load(&engine).unwrap();
    let mut chat = Chat::new(&engine, text, Some("You tell fortunes."));
    // As `chat` answers by default: up to 200 tokens of a 256-token context.
    let sampling = SamplingOptions { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 7 };
    let options = ReplyOptions { max_new_tokens: 200, sampling, stop: Vec::new() };
    let say = |chat: &mut Chat<'_>, text: &str| say(chat, text, &options);

    let first = say(&mut chat, "Tell me a fortune.").unwrap();
    let second = say(&mut chat, "Another one, please.").unwrap();
    // Room is kept for a short answer, not for 200 tokens: the first
    // exchange is still there for the second.
    assert_eq!((first.dropped_messages, second.dropped_messages), (0, 0));
    assert_eq!(chat.messages().len(), 5);
    let mut dropped = 0;
    for i in 0..12 {
        let question = format!("What about number {i}?");
        dropped += say(&mut chat, &question).unwrap().dropped_messages;
        let messages = chat.messages();
        assert_eq!(messages[0].content, "You tell fortunes.", "the system prompt stays");
        let roles: Vec<&str> = messages[1..].iter().map(|m| m.role.as_str()).collect();
        assert!(roles.chunks(2).all(|turn| turn == ["user", "assistant"]), "whole turns dropped: {roles:?}");
        assert_eq!(messages[messages.len() - 2].content, question, "the question stays");
    }
    assert!(dropped > 0, "a long conversation outgrows 256 tokens, and the reply says so");

    // A message too long for the context even alone fails and is not kept.
    let before = chat.messages().to_vec();
    assert!(say(&mut chat, &"a fortune ".repeat(300)).is_err());
    assert_eq!(chat.messages(), &before[..], "the conversation is as it was");
    say(&mut chat, "And now?").unwrap();
}
