//! Qwen3.8-Flash-Next's n-gram PLE tables stay on disk: a model whose
//! tables are ten times its memory budget opens inside the budget (the
//! tables are not counted as resident, only a CRC32C per row is) and runs
//! a prompt and decode steps with resident memory inside the budget and its
//! slack. Alone in its own test binary so no other test allocates
//! concurrently.

use std::path::Path;

use strata_engine::{Engine, EngineOptions, GenerateOptions, RamBudget};
use strata_format::{QuantPreset, SynthOptions, names, synth_config};

const BUDGET_BYTES: u64 = 16 << 20;

/// The committed fixture's text config with tables of about
/// `10 · BUDGET_BYTES` at f32: two PLE layers, 4 heads of 128 each, the
/// heads' primes from `ngram_vocab_size_base`.
fn config_with_tables_ten_times_the_budget() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/qwen4_exp/hf_bf16/config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (heads, head_dim, layers) = (4u64, 128u64, 2u64);
    let base = 10 * BUDGET_BYTES / (layers * heads * head_dim * 4);
    config["ple_embed_dim"] = (heads * head_dim).into();
    config["ngram_vocab_size_base"] = base.into();
    config.to_string()
}

#[test]
fn ple_tables_ten_times_the_budget_stay_on_disk_and_memory_stays_inside_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let options = SynthOptions { seed: 7, ..SynthOptions::new("", QuantPreset::F32) };
    synth_config(&model, config_with_tables_ten_times_the_budget(), &options).unwrap();
    let container = strata_format::Container::open_with(&model, strata_format::Embedding::ReadByRow).unwrap();
    let table_bytes: u64 = container
        .manifest()
        .tensors
        .iter()
        .filter(|t| names::is_ple_table(&t.name))
        .map(|t| t.length_bytes + t.scale_length_bytes)
        .sum();
    assert!(table_bytes >= 10 * BUDGET_BYTES, "tables of {table_bytes} bytes");
    drop(container);

    // Reset the high-water mark to the current RSS (Linux >= 4.0).
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let rss_before = strata_tier::resident_bytes();
    let opts = EngineOptions {
        ram_budget: RamBudget::Bytes(BUDGET_BYTES),
        usage_file: Some(dir.path().join("usage.json")),
        preload_experts: false,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&model, &opts).unwrap();
    assert!(engine.budget().dense_bytes < BUDGET_BYTES / 2, "{:?}", engine.budget());
    let mut session = engine.session();
    let options = GenerateOptions { max_new_tokens: 4, ignore_eos: true, ..GenerateOptions::default() };
    let report =
        session.generate(&[5, 9, 14, 2, 77, 31, 8], &options, |_| std::ops::ControlFlow::Continue(())).unwrap();
    // Every token of the prompt and of the steps that ran reads a row per
    // head of each of the two PLE layers.
    let tokens = report.stats.prompt_tokens + report.stats.generated_tokens - 1;
    assert_eq!(report.stats.ple_rows_read, (tokens * 2 * 4) as u64, "{:?}", report.stats);
    assert_eq!(report.stats.ple_bytes_read, report.stats.ple_rows_read * 128 * 4);
    let (Some(peak), Some(before), true) = (strata_tier::peak_rss_bytes(), rss_before, reset) else {
        eprintln!("no /proc/self/status or clear_refs here; skipping the RSS assertion");
        return;
    };
    eprintln!(
        "RSS {:.1} MiB before open, peak {:.1} MiB, budget {:.1} MiB, tables {:.1} MiB",
        before as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        BUDGET_BYTES as f64 / 1048576.0,
        table_bytes as f64 / 1048576.0
    );
    assert!(peak < BUDGET_BYTES + strata_tier::SLACK_BYTES, "peak RSS {peak} bytes");
    assert!(peak < table_bytes, "the tables were never resident: peak RSS {peak} bytes");
}
