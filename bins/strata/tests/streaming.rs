//! A model several times larger than its memory budget streams its experts
//! from disk: the same tokens as an unbounded run, bytes read accounted by
//! misses, resident memory within budget plus the documented slack.
//! Also: `trace replay` judges every policy against Belady's optimum.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn strata(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("strata runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "strata {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("null")).unwrap_or(Value::Null)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() { dir_bytes(&e.path()) } else { e.metadata().unwrap().len() }
        })
        .sum()
}

#[test]
fn qwen3_30b_shaped_model_streams_under_a_quarter_budget_with_identical_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("qwen3-30b-a3b-12l");
    let model_str = model.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["synth", "--like", "qwen3-30b-a3b", "--layers", "12", "--quant", "q4", model_str])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model_bytes = dir_bytes(&model);
    assert!(model_bytes > 4 << 30, "several GB: {model_bytes}");
    let budget = (model_bytes / 4).to_string();
    let run = |extra: &[&str]| {
        let mut args =
            vec!["generate", model_str, "--tokens", "1,2,3,4,5,6,7,8", "--max-new-tokens", "4", "--ignore-eos"];
        args.extend_from_slice(&["--context", "512", "--json", "--temperature", "0"]);
        args.extend_from_slice(extra);
        strata(&args)
    };
    let unbounded = run(&[]);
    let bounded = run(&["--ram-budget", &budget, "--io", "direct"]);
    assert_eq!(bounded["tokens"], unbounded["tokens"], "limited memory changes speed, never tokens");

    let stats = &bounded["stats"];
    let record_bytes = 2_654_208u64; // 3 × 768 × 2048 q4 + scales, each 64-byte aligned, padded to 4096
    let misses = stats["expert_misses"].as_u64().unwrap();
    let bytes_read = stats["bytes_read"].as_u64().unwrap();
    assert_eq!(bytes_read, misses * record_bytes, "every miss reads one whole record");
    let peak_rss = stats["peak_rss_bytes"].as_u64().unwrap();
    let budget_bytes = stats["ram_budget_bytes"].as_u64().unwrap();
    assert!(
        peak_rss <= budget_bytes + strata_tier::SLACK_BYTES,
        "peak RSS {peak_rss} over budget {budget_bytes} + slack {}",
        strata_tier::SLACK_BYTES
    );
}

#[test]
fn trace_replay_prints_every_policy_and_belady_is_highest() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/olmoe/hf");
    let status = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["convert", fixture.to_str().unwrap(), model.to_str().unwrap(), "--quant", "q8"])
        .output()
        .unwrap();
    assert!(status.status.success());
    let trace = dir.path().join("trace.jsonl");
    let m = model.to_str().unwrap();
    let t = trace.to_str().unwrap();
    let args = ["--max-new-tokens", "48", "--ignore-eos", "--trace", t, "--json", "--temperature", "0"];
    strata(&[&["generate", m, "--tokens", "5,6,7,8"][..], &args].concat());
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["trace", "replay", t, "--expert-cache", "64KiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rate = |policy: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(policy)).unwrap_or_else(|| panic!("{policy} in {text}"));
        line.split_whitespace().nth(1).unwrap().trim_end_matches('%').parse().unwrap()
    };
    let belady = rate("belady");
    for policy in ["lru", "lfru", "pinned", "predict"] {
        assert!(rate(policy) <= belady, "{policy} beats Belady?\n{text}");
    }
    // `--learn` takes a trace of the same container; another container's
    // routing would steer the policy blind, so it is refused.
    let learned = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["trace", "replay", t, "--expert-cache", "64KiB", "--learn", t])
        .output()
        .unwrap();
    assert!(learned.status.success(), "{}", String::from_utf8_lossy(&learned.stderr));
    let other = dir.path().join("other.jsonl");
    std::fs::write(
        &other,
        std::fs::read_to_string(&trace).unwrap().replacen("\"container_hash\":\"", "\"container_hash\":\"0", 1),
    )
    .unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["trace", "replay", t, "--expert-cache", "64KiB", "--learn", other.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("another container"), "{err}");
}
