//! The shipped demo model against transformers: the f32 container's logits
//! on held-out text, the greedy continuation of "Once upon a time", and the
//! tokenizer's ids (reference from `xtask/fixtures/demo_ref.py`).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use strata_engine::text::Tokenizer;
use strata_engine::{Engine, EngineOptions, GenerateOptions};
use strata_format::{ConvertOptions, QuantPreset, npy};

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
