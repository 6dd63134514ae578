//! The `batching` suite of `cargo xtask bench`: what continuous batching
//! buys. The engine decodes 4 sequences per forward pass (`Session::
//! feed_batch`, what `serve` runs each step) against 1, on the demo model
//! (resident, compute-bound) and on the streaming model (experts from disk
//! through a small cache), with the bytes of experts read per token.
//!
//! The bound of a 4-stream rate is 4 × the 1-stream rate: a step over 4
//! sequences costing no more than a step over 1.
//!
//! A cache sized for the batch: on the demo with a quarter of its experts
//! cached, the expert bytes read per token by 4 streams decoded together
//! against one stream's at the same cache; the bound is one stream's bytes
//! (a least quantity: ratio = bound ÷ measured).

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::common::{Bins, demo_container, evict, model_files, run_json, synth};
use super::options::Options;
use super::report::{Report, Row};
use super::stats::median;

/// The bar: 4 streams reach 2.5 × the tokens/s of one.
const GOAL_SPEEDUP: f64 = 2.5;

/// Decode steps per demo run: long enough for a stable median.
const DEMO_STEPS: usize = 192;

pub(crate) fn suite_batching(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    if let Some(demo) = demo_container(bins, opts, report)? {
        let runs = compare(bins, opts, "demo", &demo, &[], DEMO_STEPS, None)?;
        push_rows(report, "demo q8", &runs, false);
        report.raw.push(runs.raw);
        cache_for_the_batch(bins, opts, &demo, report)?;
    }
    let model = synth(bins, opts, "qwen3-30b-a3b", opts.stream_layers)?;
    let files = model_files(&model)?;
    // A cache of a quarter of the experts, so both runs stream from disk.
    let quarter = format!("{}MiB", (expert_bytes(&model)? / 4.0 / (1u64 << 20) as f64).round());
    // No cache: every step reads its union from disk, so the rows show
    // what batching saves in reads. A quarter cache: what batching costs
    // when 4 streams' experts no longer fit where one stream's did.
    for cache in ["0", quarter.as_str()] {
        let extra = ["--io", "direct", "--expert-cache", cache];
        let runs = compare(bins, opts, "streaming", &model, &extra, opts.tokens, Some(&files))?;
        let what = if cache == "0" { "no expert cache".to_string() } else { format!("{cache} expert cache") };
        push_rows(report, &format!("streaming (--io direct, {what})"), &runs, true);
        report.raw.push(runs.raw);
    }
    Ok(())
}

/// Bytes of all of `model`'s expert records.
pub(crate) fn expert_bytes(model: &Path) -> Result<f64> {
    let m: Value = serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json"))?)?;
    Ok(m["expert_layers"]
        .as_array()
        .context("expert_layers")?
        .iter()
        .filter_map(|l| Some(l["record_bytes"].as_f64()? * l["num_experts"].as_f64()?))
        .sum())
}

/// Expert bytes read per token by 1 stream and by 4 decoded together, with
/// a quarter of the demo's experts cached under the default policy.
fn cache_for_the_batch(bins: &Bins, opts: &Options, demo: &Path, report: &mut Report) -> Result<()> {
    let quarter_bytes = ((expert_bytes(demo)? / 4.0) as u64).to_string();
    let extra = ["--expert-cache", quarter_bytes.as_str(), "--cache-policy", "predict"];
    let runs = compare(bins, opts, "demo, quarter cache", demo, &extra, DEMO_STEPS, None)?;
    report.push(Row {
        suite: "batching".into(),
        runs: Vec::new(),
        bound_runs: Vec::new(),
        load: None,
        name: "demo q8, quarter expert cache: expert bytes per token, 4 streams decoded together".into(),
        measured: runs.four_bytes_per_token / 1e3,
        unit: "kB/token".into(),
        limit_name: "1 stream's bytes per token at the same cache".into(),
        limit: runs.one_bytes_per_token / 1e3,
        limit_unit: "kB/token (1 stream)".into(),
        bound: runs.one_bytes_per_token / 1e3,
        ratio: runs.one_bytes_per_token / runs.four_bytes_per_token,
        goal: Some(1.0),
        note: format!("4 streams = {:.2}x one stream's tok/s", runs.four_tps / runs.one_tps),
    });
    report.raw.push(runs.raw);
    Ok(())
}

/// Medians of the 1- and 4-stream runs.
struct Runs {
    one_tps: f64,
    four_tps: f64,
    one_bytes_per_token: f64,
    four_bytes_per_token: f64,
    raw: Value,
}

/// Alternates 1- and 4-stream runs (so both see the same machine load),
/// `opts.reps` of each; `evict_first` empties the page cache before each.
fn compare(
    bins: &Bins,
    opts: &Options,
    what: &str,
    model: &Path,
    extra: &[&str],
    steps: usize,
    evict_first: Option<&[std::path::PathBuf]>,
) -> Result<Runs> {
    let (mut tps, mut bytes) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut raw = Vec::new();
    for rep in 0..opts.reps {
        for (k, streams) in [1usize, 4].into_iter().enumerate() {
            eprintln!("batching: {what}, {streams} stream(s), run {}/{}", rep + 1, opts.reps);
            if let Some(files) = evict_first {
                evict(bins, files)?;
            }
            let mut a: Vec<String> = ["batch", "--model", &model.display().to_string()].map(String::from).to_vec();
            a.extend(["--streams".into(), streams.to_string(), "--steps".into(), steps.to_string()]);
            a.extend(extra.iter().map(|s| s.to_string()));
            let mut v = run_json(bins.probe(), &a)?;
            tps[k].push(v["tokens_per_s_overall"].as_f64().context("tokens_per_s_overall")?);
            bytes[k].push(v["expert_bytes_per_token"].as_f64().context("expert_bytes_per_token")?);
            v["step_s"].take();
            raw.push(json!({ "suite": "batching", "model": what, "rep": rep, "result": v }));
        }
    }
    Ok(Runs {
        one_tps: median(&tps[0]),
        four_tps: median(&tps[1]),
        one_bytes_per_token: median(&bytes[0]),
        four_bytes_per_token: median(&bytes[1]),
        raw: Value::Array(raw),
    })
}

fn push_rows(report: &mut Report, what: &str, runs: &Runs, bytes_matter: bool) {
    let speedup = runs.four_tps / runs.one_tps;
    let mut note = format!("4 streams = {speedup:.2}x one stream's tok/s");
    if bytes_matter {
        note += &format!(
            "; expert bytes read per token {:.1} MB with 1 stream, {:.1} MB with 4",
            runs.one_bytes_per_token / 1e6,
            runs.four_bytes_per_token / 1e6
        );
    }
    report.push(Row {
        suite: "batching".into(),
        runs: Vec::new(),
        bound_runs: Vec::new(),
        load: None,
        name: format!("{what}: 4 streams decoded together"),
        measured: runs.four_tps,
        unit: "tok/s".into(),
        limit_name: "4 x the 1-stream rate (a step of 4 costing a step of 1)".into(),
        limit: runs.one_tps,
        limit_unit: "tok/s (1 stream)".into(),
        bound: 4.0 * runs.one_tps,
        ratio: runs.four_tps / (4.0 * runs.one_tps),
        goal: Some(GOAL_SPEEDUP / 4.0),
        note,
    });
}
