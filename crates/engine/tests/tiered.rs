//! The tiered store through the engine: limited memory changes speed, never
//! the logits; a batch reads each distinct expert once; learned usage and
//! routing traces are written; disk failures are clear errors.

use std::path::{Path, PathBuf};

use strata_engine::{Engine, EngineOptions, IoBackend, PolicyKind, RamBudget};
use strata_format::{ConvertOptions, QuantPreset};

const FAMILIES: [&str; 3] = ["olmoe", "qwen3_moe", "mixtral"];

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family)
}

fn prompt(family: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(fixture(family).join("reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn convert(family: &str, preset: QuantPreset) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    strata_format::convert(fixture(family).join("hf"), dir.path().join("model"), &ConvertOptions::new(preset)).unwrap();
    dir
}

fn options(dir: &tempfile::TempDir) -> EngineOptions {
    EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() }
}

fn open(dir: &tempfile::TempDir, options: &EngineOptions) -> Engine {
    Engine::open(&dir.path().join("model"), options).unwrap()
}

#[test]
fn logits_are_bit_identical_for_every_cache_policy_io_and_thread_count() {
    for family in FAMILIES {
        let prompt = prompt(family);
        let dir = convert(family, QuantPreset::Q4);
        let reference = open(&dir, &options(&dir)).logits(&prompt).unwrap();
        for policy in [PolicyKind::Lru, PolicyKind::Lfru, PolicyKind::Pinned] {
            for io in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap] {
                for (expert_cache_bytes, threads) in [(None, 2), (Some(16 << 10), 1), (Some(64 << 10), 2)] {
                    let opts = EngineOptions { cache_policy: policy, io, expert_cache_bytes, threads, ..options(&dir) };
                    let engine = open(&dir, &opts);
                    // Twice: the second pass runs on a warm (and, for the
                    // small caches, churned) store.
                    for pass in 0..2 {
                        let got = engine.logits(&prompt).unwrap();
                        let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{family} {policy} {io} {expert_cache_bytes:?} threads {threads} pass {pass}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_prefill_reads_each_distinct_expert_of_each_layer_once() {
    for family in FAMILIES {
        let dir = convert(family, QuantPreset::Q8);
        let trace = dir.path().join("trace.jsonl");
        let opts = EngineOptions { trace_file: Some(trace.clone()), ..options(&dir) };
        let engine = open(&dir, &opts);
        let vocab = engine.spec().vocab_size as u32;
        let tokens: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut session = engine.session();
        session.feed(&tokens).unwrap();
        engine.persist_learning().unwrap();
        let (_, events) = strata_tier::read_trace(&trace).unwrap();
        let stats = engine.store_stats();
        let record_bytes = engine.container().manifest().expert_layers[0].record_bytes;
        let mut distinct_total = 0;
        for (layer, misses) in stats.layer_misses.iter().enumerate() {
            let mut distinct: Vec<usize> =
                events.iter().filter(|e| e.layer == layer).flat_map(|e| e.experts.clone()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(*misses as usize, distinct.len(), "{family} layer {layer}: one read per distinct expert");
            distinct_total += distinct.len();
        }
        assert_eq!(stats.hits, 0, "{family}: a cold store has nothing to hit");
        assert_eq!(stats.bytes_read, distinct_total as u64 * record_bytes, "{family}: misses × record = bytes read");
    }
}

#[test]
fn usage_is_learned_and_bound_to_the_model() {
    let dir = convert("olmoe", QuantPreset::Q8);
    let engine = open(&dir, &options(&dir));
    let mut session = engine.session();
    let generate = strata_engine::GenerateOptions { max_new_tokens: 4, ..Default::default() };
    session.generate(&prompt("olmoe"), &generate, |_| std::ops::ControlFlow::Continue(())).unwrap();
    let text = std::fs::read_to_string(dir.path().join("usage.json")).unwrap();
    assert!(text.contains(engine.container().content_hash()), "usage file names its model");
    // Another model ignores it, with a warning.
    let other = convert("mixtral", QuantPreset::Q8);
    let opts = EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() };
    let engine = Engine::open(&other.path().join("model"), &opts).unwrap();
    assert_eq!(engine.warnings().len(), 1, "{:?}", engine.warnings());
}

#[test]
fn a_budget_too_small_is_refused_with_what_it_needs() {
    let dir = convert("qwen3_moe", QuantPreset::F32);
    let opts = EngineOptions { ram_budget: RamBudget::Bytes(64 << 10), ..options(&dir) };
    let err = Engine::open(&dir.path().join("model"), &opts).err().unwrap().to_string();
    assert!(err.contains("too small") && err.contains("needs at least"), "{err}");
}

#[test]
fn the_budget_reserves_kv_for_every_session_held_at_once() {
    let dir = convert("qwen3_moe", QuantPreset::F32);
    let budget = RamBudget::Bytes(256 << 20);
    let one = open(&dir, &EngineOptions { ram_budget: budget, ..options(&dir) }).budget();
    let four = open(&dir, &EngineOptions { ram_budget: budget, sessions: 4, ..options(&dir) }).budget();
    assert!(one.kv_bytes > 0);
    assert_eq!(four.kv_bytes, 4 * one.kv_bytes);
    // The KV comes out of the same budget: the expert cache shrinks by it.
    assert_eq!(one.expert_cache_bytes - four.expert_cache_bytes, 3 * one.kv_bytes);
}

#[test]
fn an_expert_file_truncated_while_running_is_an_error_not_garbage() {
    let dir = convert("mixtral", QuantPreset::F32);
    let opts = EngineOptions { expert_cache_bytes: Some(0), ..options(&dir) };
    let engine = open(&dir, &opts);
    let experts = dir.path().join("model/experts");
    let file = std::fs::read_dir(&experts).unwrap().next().unwrap().unwrap().path();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(100).unwrap();
    let err = engine.logits(&prompt("mixtral")).unwrap_err().to_string();
    assert!(err.contains(file.file_name().unwrap().to_str().unwrap()), "{err}");
}

#[test]
fn an_expert_file_that_is_missing_or_unreadable_fails_at_open() {
    let dir = convert("olmoe", QuantPreset::F32);
    let experts = dir.path().join("model/experts");
    let file = std::fs::read_dir(&experts).unwrap().next().unwrap().unwrap().path();
    std::fs::remove_file(&file).unwrap();
    let err = Engine::open(&dir.path().join("model"), &options(&dir)).err().unwrap().to_string();
    assert!(err.contains(file.file_name().unwrap().to_str().unwrap()), "{err}");
    // A directory where the file should be cannot be read as one.
    std::fs::create_dir(&file).unwrap();
    let err = Engine::open(&dir.path().join("model"), &options(&dir)).err().unwrap().to_string();
    assert!(err.contains(file.file_name().unwrap().to_str().unwrap()), "{err}");
}
