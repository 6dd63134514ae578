//! The streaming suite: decode bigger than its expert cache, per I/O
//! backend, prefetch on and off, record checks on and off.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::common::*;
use super::options::Options;
use super::report::{Report, Row};
use super::stats::{median, percentile};

/// I/O backends compared on the streaming model.
pub(super) const STREAM_IO: [&str; 3] = ["pread", "direct", "uring"];

/// Look-ahead prefetch against none on the streaming model (`--io direct`,
/// page cache emptied before each run, `off` and `on` alternated): whether
/// `--prefetch` pays here, with how its guesses fared. It is on by default
/// only where it measures faster (issue 15).
pub(super) fn prefetch_ab(
    bins: &Bins,
    opts: &Options,
    model: &Path,
    files: &[PathBuf],
    [budget, expert_cache]: [&str; 2],
    report: &mut Report,
) -> Result<()> {
    let (mut rates, mut used, mut read, mut wasted, mut steps) = ([vec![], vec![]], 0.0, 0.0, 0.0, 0.0);
    let mut recall = Vec::new();
    for rep in 0..opts.reps {
        for (k, prefetch) in ["off", "on"].into_iter().enumerate() {
            eprintln!("streaming: --prefetch {prefetch}, run {}/{}", rep + 1, opts.reps);
            evict(bins, files)?;
            let extra =
                ["--ram-budget", budget, "--expert-cache", expert_cache, "--io", "direct", "--prefetch", prefetch];
            let (stats, _, _) = generate(bins, model, &extra, opts.tokens)?;
            rates[k].push(num(&stats, "decode_tokens_per_s")?);
            if k == 1 {
                used += num(&stats, "prefetch_used")?;
                read += num(&stats, "prefetch_issued")?;
                wasted += num(&stats, "prefetch_wasted_bytes")?;
                steps += decode_steps(&stats).len() as f64;
                recall = stats["layer_prefetch_recall"].as_array().cloned().unwrap_or_default();
            }
        }
    }
    let recall: Vec<String> =
        recall.iter().map(|r| r.as_f64().map_or("-".into(), |r| format!("{:.0}%", 100.0 * r))).collect();
    let (on, off) = (median(&rates[1]), median(&rates[0]));
    report.push(Row {
        suite: "streaming".into(),
        runs: Vec::new(),
        bound_runs: Vec::new(),
        load: None,
        name: "streaming decode --io direct, look-ahead prefetch on ÷ off".into(),
        measured: on,
        unit: "tok/s".into(),
        limit_name: "the same runs without prefetch, alternated".into(),
        limit: off,
        limit_unit: "tok/s".into(),
        bound: off,
        ratio: on / off,
        goal: None,
        note: format!(
            "guesses used {:.0}% of those read, {:.0} MB wasted a step; recall by layer {}",
            100.0 * used / read.max(1.0),
            wasted / steps.max(1.0) / 1e6,
            recall.join(" ")
        ),
    });
    Ok(())
}

pub(super) fn suite_streaming(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    let model = synth(bins, opts, &opts.stream_like, opts.stream_layers)?;
    let fp = footprint(&model)?;
    let files = model_files(&model)?;
    // The budget: a quarter of the model, but at least what the engine needs
    // (dense part + KV + I/O buffers + one layer's routed experts).
    let budget_bytes = (fp.total_bytes / 4.0).max(1.2 * (1u64 << 30) as f64);
    let budget = format!("{}MiB", (budget_bytes / (1u64 << 20) as f64).round());
    let expert_cache = streaming_expert_cache(&fp);
    eprintln!("streaming: O_DIRECT bandwidth of the expert files");
    let mut disk = vec![direct_read_gbs(bins, &model)?];

    #[derive(Default)]
    struct PerIo {
        rates: Vec<f64>,
        /// Expert bytes the engine read per decode step (cache misses).
        logical_per_token: Vec<f64>,
        /// Bytes the device delivered per decode step.
        device_per_token: Vec<f64>,
        ttft_cold_ms: Vec<f64>,
        ttft_cold_device: Vec<f64>,
        ttft_warm_ms: Vec<f64>,
        ttft_warm_device: Vec<f64>,
        step_ms: Vec<f64>,
        /// Share of the decode steps' time spent waiting on expert reads.
        stall_share: Vec<f64>,
        /// Bytes of n-gram table rows (PLE) a decode step read.
        ple_per_token: Vec<f64>,
        curve: Vec<f64>,
    }
    let mut per_io: Vec<PerIo> = STREAM_IO.iter().map(|_| PerIo::default()).collect();
    let mut raw = Vec::new();
    for rep in 0..opts.reps {
        for (k, io) in STREAM_IO.iter().enumerate() {
            eprintln!("streaming: --io {io}, run {}/{}", rep + 1, opts.reps);
            let extra = ["--ram-budget", budget.as_str(), "--expert-cache", expert_cache.as_str(), "--io", io];
            // Cold first token: what loading and the prompt cost from an empty page cache.
            evict(bins, &files)?;
            let (first, _, first_device) = generate(bins, &model, &extra, 1)?;
            // Warm first token: a new process right after.
            let (warm, _, warm_device) = generate(bins, &model, &extra, 1)?;
            // Cold decode: the same prompt, so the device bytes beyond the
            // cold first token's are the decode steps'.
            evict(bins, &files)?;
            let (stats, wall_s, device) = generate(bins, &model, &extra, opts.tokens)?;
            let steps = decode_steps(&stats);
            let n_steps = steps.len().max(1) as f64;
            let logical: f64 = steps.iter().filter_map(|s| s["bytes_read"].as_f64()).sum();
            let ms: Vec<f64> = steps.iter().filter_map(|s| s["ms"].as_f64()).collect();
            let stall_ms: f64 = steps.iter().filter_map(|s| s["stall_ms"].as_f64()).sum();
            let p = &mut per_io[k];
            p.stall_share.push(stall_ms / ms.iter().sum::<f64>().max(1e-9));
            p.rates.push(num(&stats, "decode_tokens_per_s")?);
            p.logical_per_token.push(logical / n_steps);
            // The whole run's rows less the first token's (the prompt's).
            let ple_bytes = num(&stats, "ple_bytes_read")? - num(&first, "ple_bytes_read")?;
            p.ple_per_token.push(ple_bytes.max(0.0) / n_steps);
            p.device_per_token.push(((device - first_device) / n_steps).max(0.0));
            p.ttft_cold_ms.push(num(&first, "prefill_ms")?);
            p.ttft_cold_device.push(first_device);
            p.ttft_warm_ms.push(num(&warm, "prefill_ms")?);
            p.ttft_warm_device.push(warm_device);
            p.step_ms.extend(&ms);
            if rep == 0 {
                p.curve = ms.clone();
            }
            raw.push(json!({
                "io": io, "rep": rep, "wall_s": wall_s, "device_read_bytes": device,
                "first_token_device_read_bytes": first_device, "warm_device_read_bytes": warm_device,
                "stats": stats, "first_token_stats": first, "warm_stats": warm,
            }));
        }
    }
    eprintln!("streaming: O_DIRECT bandwidth again");
    disk.push(direct_read_gbs(bins, &model)?);
    let disk_gbs = disk.iter().copied().fold(0.0, f64::max);
    let per_second = |bytes: f64| bytes / (disk_gbs * 1e9);
    for (k, io) in STREAM_IO.iter().enumerate() {
        let p = &per_io[k];
        let device = median(&p.device_per_token);
        let logical = median(&p.logical_per_token);
        let measured = median(&p.rates);
        let bound = 1.0 / per_second(device);
        report.push(Row {
            suite: "streaming".into(),
            runs: Vec::new(),
            bound_runs: Vec::new(),
            load: None,
            name: format!(
                "streaming decode --io {io}, {} shapes, {} layers, budget {budget}",
                opts.stream_like, opts.stream_layers
            ),
            measured,
            unit: "tok/s".into(),
            limit_name: format!(
                "O_DIRECT read of the expert files / {:.0} MB read from the device per token ({:.0} MB of records)",
                device / 1e6,
                logical / 1e6
            ),
            limit: disk_gbs,
            limit_unit: "GB/s".into(),
            bound,
            ratio: measured / bound,
            goal: Some(0.9),
            note: format!(
                "model {:.1} GB, {:.1}x the budget; stall {:.0}% of decode time{}",
                fp.total_bytes / 1e9,
                fp.total_bytes / budget_bytes,
                100.0 * median(&p.stall_share),
                match median(&p.ple_per_token) {
                    ple if ple > 0.0 => format!(
                        "; n-gram table rows {:.0} KB a step, {:.1}% of the bytes read",
                        ple / 1e3,
                        100.0 * ple / (ple + logical)
                    ),
                    _ => String::new(),
                }
            ),
        });
        // Time rows: the bound is a least time, so ratio = bound / measured.
        let step_bound_ms = per_second(device) * 1e3;
        for (what, ms, bound_ms, note) in [
            (
                "time to first token, cold",
                median(&p.ttft_cold_ms),
                per_second(median(&p.ttft_cold_device)) * 1e3,
                "page cache emptied; 8-token prompt; bound: that run's device bytes",
            ),
            (
                "time to first token, warm",
                median(&p.ttft_warm_ms),
                per_second(median(&p.ttft_warm_device)) * 1e3,
                "new process right after; bound: that run's device bytes (0 when the page cache served all)",
            ),
            ("decode latency p50", percentile(&p.step_ms, 50.0), step_bound_ms, ""),
            ("decode latency p95", percentile(&p.step_ms, 95.0), step_bound_ms, ""),
            ("decode latency p99", percentile(&p.step_ms, 99.0), step_bound_ms, ""),
        ] {
            report.push(Row {
                suite: "latency".into(),
                runs: Vec::new(),
                bound_runs: Vec::new(),
                load: None,
                name: format!("{what}, --io {io}"),
                measured: ms,
                unit: "ms".into(),
                limit_name: "device bytes / O_DIRECT bandwidth".into(),
                limit: disk_gbs,
                limit_unit: "GB/s".into(),
                bound: bound_ms,
                ratio: bound_ms / ms,
                goal: None,
                note: note.into(),
            });
        }
        report.curves.push((format!("--io {io}"), p.curve.clone()));
    }
    prefetch_ab(bins, opts, &model, &files, [&budget, &expert_cache], report)?;
    // The integrity check every record read from disk passes (CRC32C and the
    // finite-float scan), as time per decode step: its rate over records in
    // memory times the record bytes a step reads, against 3% of the step (the
    // most it may cost). An upper bound: each record is checked while the
    // other reads of the layer are still in flight.
    eprintln!("streaming: record check rate");
    let check = run_json(bins.probe(), &args(&["check", "--model", &model.to_string_lossy(), "--reps", "5"]))?;
    let check_gbs = num(&check, "check_gbs_median")?;
    let direct = STREAM_IO.iter().position(|io| *io == "direct").context("direct backend")?;
    let check_ms = median(&per_io[direct].logical_per_token) / (check_gbs * 1e9) * 1e3;
    let step_ms = percentile(&per_io[direct].step_ms, 50.0);
    report.push(Row {
        suite: "streaming".into(),
        runs: Vec::new(),
        bound_runs: Vec::new(),
        load: None,
        name: "record check (CRC32C + finite scan) per decode step, --io direct".into(),
        measured: check_ms,
        unit: "ms".into(),
        limit_name: format!("3% of the median step ({step_ms:.1} ms); check rate {check_gbs:.1} GB/s"),
        limit: 0.03,
        limit_unit: "of a step".into(),
        bound: 0.03 * step_ms,
        ratio: 0.03 * step_ms / check_ms,
        // An upper bound, not the bar: the A/B below measures what the
        // check costs the step once it overlaps the reads.
        goal: None,
        note: format!("{:.2}% of the step if not overlapped at all", 100.0 * check_ms / step_ms),
    });
    // The same check as an A/B inside each decode run: odd steps checked,
    // even ones not. Each checked step's milliseconds per byte read is set
    // against its two unchecked neighbours' (mean of logs), which cancels
    // the shared disk's drift: whole runs alternated in pairs scattered ±10%
    // with it, more than the effect. On the bare disk (the bar), and, where
    // the blkio cgroup allows, once more on the disk capped at a fixed rate
    // (shown beside the bar).
    let mut ab_raw = Vec::new();
    for capped in [false, true] {
        let Some((ab, ab_throttle)) = record_check_ab(bins, opts, &model, [&budget, &expert_cache], &disk, capped)?
        else {
            continue;
        };
        let ratio = (-ab.cost.mean).exp();
        report.push(Row {
            suite: "streaming".into(),
            runs: Vec::new(),
            bound_runs: Vec::new(),
            load: None,
            name: match ab_throttle {
                None => "streaming decode step with the record check ÷ without, --io direct".into(),
                Some(rate) => format!("the same on the disk capped at {:.2} GB/s (a drive of fixed speed)", rate / 1e9),
            },
            measured: ab.unchecked_ms / ratio,
            unit: "ms".into(),
            limit_name: format!(
                "the same step without the check: {} checked steps against their neighbours, in {} runs",
                ab.cost.steps, ab.cost.runs
            ),
            limit: 1.0,
            limit_unit: "x".into(),
            bound: ab.unchecked_ms,
            ratio,
            goal: ab_throttle.is_none().then_some(0.97),
            note: format!(
                "the check adds {:.2}% ± {:.2}% (1 s.e., from the runs' means: {}) to a step; \
                 every decode step counted but each run's first pair",
                100.0 * ab.cost.mean,
                100.0 * ab.cost.se,
                ab.cost.run_means.iter().map(|m| format!("{:.2}%", 100.0 * m)).collect::<Vec<_>>().join(" "),
            ),
        });
        ab_raw.push(json!({ "throttle_bytes_per_s": ab_throttle, "runs": ab.raw }));
    }
    report.raw.push(json!({
        "suite": "streaming", "model": model, "budget": budget, "direct_gbs": disk, "runs": raw, "check": check,
        "check_ab": ab_raw,
    }));
    Ok(())
}

/// The record check's A/B over steps alternated within runs.
pub(super) struct CheckAb {
    cost: CheckCost,
    /// Median unchecked step.
    unchecked_ms: f64,
    raw: Vec<Value>,
}

/// What the check adds to a step, as the log of a ratio (0.02: 2%).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CheckCost {
    pub(crate) mean: f64,
    /// Standard error, from the spread of the runs' means (steps of one run
    /// share its disk and are not independent).
    pub(crate) se: f64,
    pub(crate) run_means: Vec<f64>,
    pub(crate) steps: usize,
    pub(crate) runs: usize,
}

impl CheckCost {
    /// From each run's steps `(seconds, bytes read, checked)`: every checked
    /// step whose neighbours are both unchecked gives `ln(its ms per byte)`
    /// minus the mean of theirs. Steps that read nothing carry no rate and
    /// are left out. `None` with fewer than two runs of such steps.
    pub(crate) fn of_runs(runs: &[Vec<(f64, u64, bool)>]) -> Option<CheckCost> {
        let per_run: Vec<Vec<f64>> = runs
            .iter()
            .map(|steps| {
                let log_rate = |(s, bytes, _): (f64, u64, bool)| (bytes > 0).then(|| (s / bytes as f64).ln());
                steps
                    .windows(3)
                    .filter(|w| w[1].2 && !w[0].2 && !w[2].2)
                    .filter_map(|w| Some(log_rate(w[1])? - (log_rate(w[0])? + log_rate(w[2])?) / 2.0))
                    .collect()
            })
            .filter(|d: &Vec<f64>| !d.is_empty())
            .collect();
        if per_run.len() < 2 {
            return None;
        }
        let mean_of = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let all: Vec<f64> = per_run.iter().flatten().copied().collect();
        let run_means: Vec<f64> = per_run.iter().map(|d| mean_of(d)).collect();
        let runs = run_means.len();
        // The standard error of a mean of `runs` means: their sample
        // variance over `runs`.
        let grand_mean = mean_of(&run_means);
        let variance = run_means.iter().map(|m| (m - grand_mean).powi(2)).sum::<f64>() / (runs - 1) as f64;
        Some(CheckCost { mean: mean_of(&all), se: (variance / runs as f64).sqrt(), run_means, steps: all.len(), runs })
    }
}

/// The record check's A/B (decode runs whose odd steps are checked), and
/// the rate the disk was capped at for them (`None`: the bare disk); `None`
/// when `capped` and no cap can be set.
pub(super) fn record_check_ab(
    bins: &Bins,
    opts: &Options,
    model: &Path,
    [budget, expert_cache]: [&str; 2],
    disk_gbs: &[f64],
    capped: bool,
) -> Result<Option<(CheckAb, Option<f64>)>> {
    // 90% of the worst O_DIRECT rate the suite measured: steps about as
    // long as the bare disk's (a slower cap would hide more of the check
    // behind longer reads), with some room for the disk's dips under it.
    let worst_gbs = disk_gbs.iter().copied().fold(f64::INFINITY, f64::min);
    let throttle = match (capped, super::drives::cannot_throttle()) {
        (false, _) => None,
        (true, Some(reason)) => {
            eprintln!("streaming: no record check A/B on a capped disk ({reason})");
            return Ok(None);
        }
        (true, None) => {
            let throttle = super::drives::Throttle::new("strata-bench-check")?;
            let rate = (0.9 * worst_gbs * 1e9) as u64;
            throttle.cap(&super::drives::disk_of(model)?, rate)?;
            Some((throttle, rate as f64))
        }
    };
    let runs = (2 * opts.reps).max(4);
    let steps = 4 * opts.tokens;
    let mut steps_of_runs = Vec::with_capacity(runs);
    let mut unchecked_s = Vec::new();
    let mut raw = Vec::with_capacity(runs);
    for run_index in 0..runs {
        eprintln!(
            "streaming: record check A/B{}, run {}/{runs} ({steps} steps, odd ones checked)",
            if capped { " (capped disk)" } else { "" },
            run_index + 1
        );
        let a = args(&[
            "batch",
            "--model",
            &model.to_string_lossy(),
            "--streams",
            "1",
            "--prompt-tokens",
            "8",
            "--steps",
            &steps.to_string(),
            "--io",
            "direct",
            "--ram-budget",
            budget,
            "--expert-cache",
            expert_cache,
            "--evict",
            "1",
            "--threads",
            "0",
            "--context",
            "4096",
            "--cache-policy",
            "predict",
            "--check-records",
            "alternate",
        ]);
        let run = match &throttle {
            Some((throttle, _)) => throttle.run_json(bins.probe(), &a)?,
            None => run_json(bins.probe(), &a)?,
        };
        let column = |key: &str| -> Result<Vec<Value>> {
            run.get(key).and_then(Value::as_array).cloned().with_context(|| format!("missing {key:?} in {run}"))
        };
        let (step_s, bytes, checked) = (column("step_s")?, column("step_expert_bytes")?, column("step_checked")?);
        // The first pair of steps follows the prompt's prefill: not a
        // steady decode step.
        let mut run_steps = Vec::with_capacity(steps);
        for ((s, b), c) in step_s.iter().zip(&bytes).zip(&checked).skip(2) {
            let (Some(s), Some(b), Some(c)) = (s.as_f64(), b.as_u64(), c.as_bool()) else {
                bail!("a step of {run} is not a number")
            };
            if !c {
                unchecked_s.push(s);
            }
            run_steps.push((s, b, c));
        }
        steps_of_runs.push(run_steps);
        raw.push(run);
    }
    let cost = CheckCost::of_runs(&steps_of_runs).context("too few checked steps between unchecked ones")?;
    let ab = CheckAb { cost, unchecked_ms: 1e3 * median(&unchecked_s), raw };
    Ok(Some((ab, throttle.map(|(_, rate)| rate))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_cost_is_found_under_a_drifting_disk() {
        // The disk slows 40% over each run and wobbles step to step; the
        // check costs 3% of a step; bytes read vary, and one step read
        // nothing.
        let runs: Vec<Vec<(f64, u64, bool)>> = (0..4)
            .map(|run| {
                (0..96u64)
                    .map(|i| {
                        let bytes = if i == 40 { 0 } else { 150_000_000 + 3_000_000 * ((i * 7 + run) % 11) };
                        let checked = i % 2 == 1;
                        let drift = 1.0 + 0.4 * i as f64 / 96.0 + 0.002 * ((i * 5 + run) % 3) as f64;
                        let s = bytes as f64 / 1e9 * drift * if checked { 1.03 } else { 1.0 };
                        (s, bytes, checked)
                    })
                    .collect()
            })
            .collect();
        let cost = CheckCost::of_runs(&runs).unwrap();
        assert!((cost.mean - 1.03f64.ln()).abs() < 0.002, "{cost:?}");
        assert!(cost.se < 0.002 && cost.runs == 4, "{cost:?}");
        // Every step checked: nothing to compare.
        let all: Vec<Vec<_>> = runs.iter().map(|r| r.iter().map(|&(s, b, _)| (s, b, true)).collect()).collect();
        assert_eq!(CheckCost::of_runs(&all), None);
    }
}
