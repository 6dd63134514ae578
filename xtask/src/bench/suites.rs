//! The suites measured on one model each: the limits, the kernels,
//! prefill, resident decode and the demo.

use anyhow::{Result, bail};
use serde_json::json;

use super::common::*;
use super::options::Options;
use super::report::{Report, Row};
use super::stats::median;

pub(super) fn suite_limits(bins: &Bins, opts: &Options, report: &mut Report) -> Result<Limits> {
    let mut limits = Limits::default();
    for threads in [1usize, 2] {
        eprintln!("limits: DRAM read and FMA peak, {threads} thread(s)");
        // Best of at least 5 reads: see `read_bandwidth_gbs`.
        let reps = opts.reps.max(5).to_string();
        let t = threads.to_string();
        let v = run_json(bins.probe(), &args(&["limits", "--threads", &t, "--reps", &reps, "--fma-seconds", "0.5"]))?;
        limits.dram_gbs[threads - 1] = num(&v, "read_gbs")?;
        limits.fma_gflops[threads - 1] = num(&v, "fma_gflops")?;
        report.limits.push(json!({ "what": format!("DRAM read, {threads} thread(s), 1 GiB"), "value": limits.dram_gbs[threads - 1], "unit": "GB/s" }));
        report.limits.push(json!({ "what": format!("f32 FMA peak, {threads} thread(s)"), "value": limits.fma_gflops[threads - 1], "unit": "GFLOP/s" }));
    }
    Ok(limits)
}

pub(super) fn suite_kernels(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    for format in ["q4", "q8"] {
        for threads in [1usize, 2] {
            eprintln!("kernels: {format} matvec over 1 GiB, {threads} thread(s)");
            let (t, reps) = (threads.to_string(), opts.reps.to_string());
            let v = run_json(
                bins.probe(),
                &args(&["matvec", "--format", format, "--threads", &t, "--reps", &reps, "--bytes", "1073741824"]),
            )?;
            let measured = num(&v, "matvec_gbs_median")?;
            let limit = num(&v, "read_gbs_median")?;
            report.push(Row {
                suite: "kernels".into(),
                runs: Vec::new(),
                bound_runs: Vec::new(),
                load: None,
                name: format!("{format} matvec, 1 GiB, {threads} thread(s)"),
                measured,
                unit: "GB/s".into(),
                limit_name: format!("plain read of the same bytes, {threads} thread(s)"),
                limit,
                limit_unit: "GB/s".into(),
                bound: limit,
                ratio: measured / limit,
                goal: Some(0.8),
                note: format!("int path: {}", v["int_path"]),
            });
            report.raw.push(json!({ "suite": "kernels", "probe": v }));
        }
    }
    Ok(())
}

pub(super) fn suite_prefill(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    for format in ["q8", "q4"] {
        for threads in [1usize, 2] {
            eprintln!("prefill: {format} matmul [4096 x 2048] x 64 tokens, {threads} thread(s)");
            let (t, reps) = (threads.to_string(), opts.reps.to_string());
            let v = run_json(
                bins.probe(),
                &args(&["prefill", "--format", format, "--threads", &t, "--reps", &reps, "--tokens", "64"]),
            )?;
            let measured = num(&v, "gflops_median")?;
            let limit = num(&v, "fma_peak_gflops_median")?;
            report.push(Row {
                suite: "prefill".into(),
                runs: Vec::new(),
                bound_runs: Vec::new(),
                load: None,
                name: format!("{format} matmul 4096x2048 x 64 tokens, {threads} thread(s)"),
                measured,
                unit: "GFLOP/s".into(),
                limit_name: format!("f32 FMA peak, {threads} thread(s)"),
                limit,
                limit_unit: "GFLOP/s".into(),
                bound: limit,
                ratio: measured / limit,
                goal: Some(0.5),
                note: "2 flops per multiply-add".into(),
            });
            report.raw.push(json!({ "suite": "prefill", "probe": v }));
        }
    }
    Ok(())
}

pub(super) fn suite_resident(bins: &Bins, opts: &Options, limits: &Limits, report: &mut Report) -> Result<()> {
    let model = synth(bins, opts, "olmoe-1b-7b", opts.resident_layers)?;
    let fp = footprint(&model)?;
    let mut rates = Vec::new();
    let mut raw = Vec::new();
    for rep in 0..opts.reps {
        eprintln!("resident: decode {} tokens, run {}/{}", opts.tokens * 2, rep + 1, opts.reps);
        // A budget far above the model: after the first tokens every expert
        // is cached. Only decode steps that missed nothing count.
        let (stats, _, _) = generate(bins, &model, &["--ram-budget", "16GiB", "--io", "pread"], opts.tokens * 2)?;
        let ms: Vec<f64> = decode_steps(&stats)
            .into_iter()
            .filter(|s| s["expert_misses"].as_u64() == Some(0))
            .filter_map(|s| s["ms"].as_f64())
            .collect();
        if !ms.is_empty() {
            rates.push(1000.0 / median(&ms));
        }
        raw.push(json!({ "resident_steps": ms.len(), "stats": stats }));
    }
    if rates.is_empty() {
        bail!("resident: no decode step ran with every expert cached; raise --tokens");
    }
    let measured = median(&rates);
    let dram = limits.dram_gbs[1];
    let bound = dram * 1e9 / fp.bytes_per_token;
    report.push(Row {
        suite: "resident".into(),
        runs: Vec::new(),
        bound_runs: Vec::new(),
        load: None,
        name: format!("resident decode, olmoe-1b-7b shapes, {} layers, q4", opts.resident_layers),
        measured,
        unit: "tok/s".into(),
        limit_name: format!("DRAM read 2 threads / {:.1} MB touched per token", fp.bytes_per_token / 1e6),
        limit: dram,
        limit_unit: "GB/s".into(),
        bound,
        ratio: measured / bound,
        goal: Some(0.7),
        note: "median of fully cached decode steps".into(),
    });
    report.raw.push(json!({ "suite": "resident", "model": model, "bytes_per_token": fp.bytes_per_token, "runs": raw }));
    Ok(())
}

pub(super) fn suite_demo(bins: &Bins, opts: &Options, limits: &Limits, report: &mut Report) -> Result<()> {
    let Some(model) = demo_container(bins, opts, report)? else { return Ok(()) };
    let fp = footprint(&model)?;
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    // A longer prompt, so that prefill is a batched product.
    let prompt: Vec<String> = (1..=64).map(|i| i.to_string()).collect();
    let prompt = prompt.join(",");
    for rep in 0..opts.reps {
        eprintln!("demo: run {}/{}", rep + 1, opts.reps);
        let a = args(&[
            "generate",
            &model.display().to_string(),
            "--tokens",
            &prompt,
            "--max-new-tokens",
            &opts.tokens.to_string(),
            "--ignore-eos",
            "--json",
            "--temperature",
            "0",
        ]);
        let v = run_json(&bins.strata, &a)?;
        prefill.push(num(&v["stats"], "prefill_tokens_per_s")?);
        decode.push(num(&v["stats"], "decode_tokens_per_s")?);
    }
    let prefill_bound = limits.fma_gflops[1] * 1e9 / (2.0 * fp.macs_per_token);
    let decode_bound = limits.dram_gbs[1] * 1e9 / fp.bytes_per_token;
    for (name, measured, limit_name, limit, unit, bound) in [
        (
            "demo q8 prefill (64-token prompt)",
            median(&prefill),
            "f32 FMA peak 2 threads / 2 x active params",
            limits.fma_gflops[1],
            "GFLOP/s",
            prefill_bound,
        ),
        (
            "demo q8 decode",
            median(&decode),
            "DRAM read 2 threads / bytes touched per token",
            limits.dram_gbs[1],
            "GB/s",
            decode_bound,
        ),
    ] {
        report.push(Row {
            suite: "demo".into(),
            runs: Vec::new(),
            bound_runs: Vec::new(),
            load: None,
            name: name.into(),
            measured,
            unit: "tok/s".into(),
            limit_name: limit_name.into(),
            limit,
            limit_unit: unit.into(),
            bound,
            ratio: measured / bound,
            goal: None,
            note: format!(
                "{:.0} MB of weights: fits in the last-level cache, so DRAM is not its real limit",
                fp.total_bytes / 1e6
            ),
        });
    }
    Ok(())
}
