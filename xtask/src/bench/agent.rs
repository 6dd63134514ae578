//! The `agent` suite of `cargo xtask bench`: time to first token for a long
//! agent prompt, cold, and for the next turn, which re-sends that prompt with
//! a little more at its end. A running `serve` finds the prompt's KV in its
//! idle pool; here `strata generate --session` reopens it from the session
//! file (the same KV, no re-prefill), so the warm figure is the new tokens'
//! prefill over the held context.
//!
//! Bounds (least times, so ratio = bound ÷ measured):
//! - cold: the prompt's multiply-adds (active weights per token, plus
//!   attention's `heads × head_dim × n²` over the prompt) at the f32 FMA
//!   peak of 2 threads; for the streaming model, or reading every expert
//!   record once from disk (O_DIRECT), whichever is longer;
//! - warm: the new tokens' multiply-adds (weights, and attention over the
//!   whole held context) at the same peak.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::batching::expert_bytes;
use super::common::{
    Bins, Limits, demo_container, direct_read_gbs, evict, footprint, model_files, num, run_json, synth,
};
use super::options::Options;
use super::report::{Report, Row};
use super::stats::median;

/// An agent's prompt: system text, tool schemas and history.
const PROMPT_TOKENS: usize = 8192;
/// What the next turn adds: a tool result and a question.
const TURN_TOKENS: usize = 64;

pub(crate) fn suite_agent(bins: &Bins, opts: &Options, limits: &Limits, report: &mut Report) -> Result<()> {
    if let Some(demo) = demo_container(bins, opts, report)? {
        ttft(bins, opts, limits, report, "demo q8", &demo, &[], None)?;
    }
    let model = synth(bins, opts, "qwen3-30b-a3b", opts.stream_layers)?;
    let expert_bytes = expert_bytes(&model)?;
    let quarter = format!("{}MiB", (expert_bytes / 4.0 / (1u64 << 20) as f64).round().max(1.0));
    let what = format!("qwen3-30b-a3b shapes, {} layers, --io direct, {quarter} expert cache", opts.stream_layers);
    let extra = ["--io", "direct", "--expert-cache", quarter.as_str()];
    ttft(bins, opts, limits, report, &what, &model, &extra, Some(expert_bytes))?;
    Ok(())
}

/// Cold and warm time to first token on `model`; `expert_bytes` (all its
/// expert records) where they stream from disk, so the cold bound counts
/// reading them.
#[allow(clippy::too_many_arguments)]
fn ttft(
    bins: &Bins,
    opts: &Options,
    limits: &Limits,
    report: &mut Report,
    what: &str,
    model: &Path,
    extra: &[&str],
    expert_bytes: Option<f64>,
) -> Result<()> {
    let m: Value = serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json"))?)?;
    let spec = &m["spec"];
    let vocab = spec["vocab_size"].as_u64().context("spec.vocab_size")?;
    // Token ids valid in any vocabulary, past the first few (specials).
    let ids = |from: usize, n: usize| -> String {
        (from..from + n).map(|i| (3 + (i as u64 * 7919) % (vocab - 3)).to_string()).collect::<Vec<_>>().join(",")
    };
    let context = (PROMPT_TOKENS + TURN_TOKENS + 8).to_string();
    let files = model_files(model)?;
    let (mut cold_ms, mut warm_ms, mut raw) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..opts.reps {
        eprintln!("agent: {what}, run {}/{}", rep + 1, opts.reps);
        // A fresh session directory each run: the cold turn must find nothing.
        let kv_dir = opts.out.join("agent-sessions");
        let _ = std::fs::remove_dir_all(&kv_dir);
        let run = |tokens: &str| -> Result<Value> {
            let mut a: Vec<String> = [
                "generate",
                &model.display().to_string(),
                "--tokens",
                tokens,
                "--max-new-tokens",
                "1",
                "--temperature",
                "0",
                "--ignore-eos",
                "--json",
                "--context",
                &context,
                "--kv-dir",
                &kv_dir.display().to_string(),
                "--session",
                "agent",
            ]
            .map(str::to_owned)
            .to_vec();
            a.extend(extra.iter().map(|s| s.to_string()));
            run_json(&bins.strata, &a)
        };
        evict(bins, &files)?;
        let cold = run(&ids(0, PROMPT_TOKENS))?;
        let warm = run(&ids(PROMPT_TOKENS, TURN_TOKENS))?;
        cold_ms.push(num(&cold["stats"], "prefill_ms")?);
        warm_ms.push(num(&warm["stats"], "prefill_ms")?);
        raw.push(json!({ "cold": cold["stats"], "warm": warm["stats"] }));
    }
    let fp = footprint(model)?;
    let n = |key: &str| spec[key].as_f64().unwrap_or(0.0);
    // Attention's two products per layer: heads × head_dim per held position.
    let attention_macs = |positions: f64| n("num_layers") * n("num_heads") * n("head_dim") * positions;
    let flops_per_s = limits.fma_gflops[1] * 1e9;
    let prompt = PROMPT_TOKENS as f64;
    let cold_compute_ms =
        2.0 * (prompt * fp.macs_per_token + attention_macs(prompt * prompt / 2.0)) / flops_per_s * 1e3;
    let disk_gbs = match expert_bytes {
        Some(_) => Some(direct_read_gbs(bins, model)?),
        None => None,
    };
    let cold_io_ms = match (expert_bytes, disk_gbs) {
        (Some(bytes), Some(gbs)) => bytes / (gbs * 1e9) * 1e3,
        _ => 0.0,
    };
    let turn = TURN_TOKENS as f64;
    let warm_bound_ms =
        2.0 * (turn * fp.macs_per_token + attention_macs(turn * (prompt + turn / 2.0))) / flops_per_s * 1e3;
    let cold_bound_ms = cold_compute_ms.max(cold_io_ms);
    let cold_limit = match disk_gbs {
        Some(gbs) => format!(
            "max(prompt MACs at the FMA peak {:.0} ms, all experts at O_DIRECT {gbs:.2} GB/s {cold_io_ms:.0} ms)",
            cold_compute_ms
        ),
        None => "prompt multiply-adds at the f32 FMA peak, 2 threads".into(),
    };
    for (name, measured, bound, limit_name, note) in [
        (
            format!("time to first token, {PROMPT_TOKENS}-token prompt, cold: {what}"),
            median(&cold_ms),
            cold_bound_ms,
            cold_limit,
            "a fresh session; page cache emptied",
        ),
        (
            format!("time to first token, next turn (+{TURN_TOKENS} tokens), warm: {what}"),
            median(&warm_ms),
            warm_bound_ms,
            "the new tokens' multiply-adds (attention over the held context) at the FMA peak".into(),
            "the prompt's KV reused from the session, not prefilled again",
        ),
    ] {
        report.push(Row {
            suite: "agent".into(),
            runs: Vec::new(),
            bound_runs: Vec::new(),
            load: None,
            name,
            measured,
            unit: "ms".into(),
            limit_name,
            limit: limits.fma_gflops[1],
            limit_unit: "GFLOP/s".into(),
            bound,
            ratio: bound / measured,
            goal: None,
            note: note.into(),
        });
    }
    report.raw.push(json!({ "suite": "agent", "model": model, "what": what, "runs": raw }));
    Ok(())
}
