//! `cargo xtask bench`: every speed next to the physical limit that bounds
//! it, both measured in the same run on this machine (docs/BENCHMARKS.md).
//!
//! ```text
//! cargo xtask bench [--only SUITES] [--skip SUITES] [--reps N] [--tokens N]
//!                   [--stream-layers N] [--resident-layers N] [--out DIR]
//!                   [--peer llama.cpp]
//! ```
//!
//! Suites, in order: `limits`, `kernels`, `prefill`, `resident`,
//! `streaming`, `demo`, `batching` (bench_batching.rs), `agent` (bench_agent.rs). Measurements that need
//! optimized code run in the
//! release-built `strata-probe` (package `strata-benches`) and `strata`
//! binaries; this file only orchestrates them, since xtask itself is built
//! without optimization. Results go to `OUT/report.json`, `OUT/report.md`
//! and `OUT/*.svg` (default `OUT` = `target/bench`), and the table is printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{ArgAction, Parser};
use serde_json::{Value, json};

use crate::bench_report::{Report, Row};
use crate::fixtures::{non_empty, parse_cli};

/// Every suite, in the order they run.
const SUITES: [&str; 9] =
    ["limits", "kernels", "prefill", "resident", "streaming", "demo", "batching", "agent", "drives"];

/// Suites run only when `--only` names them: the agent suite's cold
/// 8,192-token prefill of the streaming model takes about ten minutes a
/// repetition, twenty times the rest of the default suite together.
const OPT_IN_SUITES: [&str; 1] = ["agent"];

/// I/O backends compared on the streaming model.
const STREAM_IO: [&str; 3] = ["pread", "direct", "uring"];

/// A prompt of token ids valid in every synthetic vocabulary.
pub(crate) const PROMPT: &str = "1,2,3,4,5,6,7,8";

/// The options of `cargo xtask bench`.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    bin_name = "cargo xtask bench",
    about = "Measure Strata's speed next to the physical limit that bounds each figure (DRAM read, FMA peak, \
             O_DIRECT disk read), all in the same run; write target/bench/report.{json,md} and SVG plots \
             (docs/BENCHMARKS.md).",
    long_about = None,
    args_override_self = true,
    disable_help_flag = true
)]
struct Cli {
    /// run only these suites: limits, kernels, prefill, resident, streaming, demo, batching, agent (only when
    /// named here), drives
    #[arg(long, value_name = "SUITE[,SUITE]", value_delimiter = ',')]
    only: Vec<String>,
    /// skip these suites
    #[arg(long, value_name = "SUITE[,SUITE]", value_delimiter = ',')]
    skip: Vec<String>,
    /// repetitions of every measurement; figures are medians
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// decode steps per streaming run (resident runs twice as many)
    #[arg(long, value_name = "N", default_value_t = 24, value_parser = clap::value_parser!(u64).range(2..))]
    tokens: u64,
    /// decoder layers of the streaming model
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub(crate) stream_layers: usize,
    /// whose shapes the streaming model copies (a `strata synth --like` name, e.g. qwen3.6-35b-a3b)
    #[arg(long, value_name = "NAME", default_value = "qwen3-30b-a3b")]
    stream_like: String,
    /// decoder layers of the OLMoE-1B-7B-shaped resident model
    #[arg(long, value_name = "N", default_value_t = 4)]
    resident_layers: usize,
    /// where reports, plots and synthetic models go (default: target/bench)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// instead of the suites, compare with this engine (llama.cpp)
    #[arg(long, value_name = "ENGINE")]
    peer: Option<String>,
    /// this text
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    suites: Vec<String>,
    pub(crate) reps: usize,
    pub(crate) tokens: usize,
    pub(crate) stream_layers: usize,
    pub(crate) stream_like: String,
    resident_layers: usize,
    pub(crate) out: PathBuf,
    peer: Option<String>,
}

impl Options {
    fn parse(rest: &[String]) -> Result<Option<Self>> {
        let Some(cli) = parse_cli::<Cli>("bench", rest)? else {
            return Ok(None);
        };
        let (only, skip) = (non_empty(cli.only), non_empty(cli.skip));
        for name in only.iter().chain(&skip) {
            if !SUITES.contains(&name.as_str()) {
                bail!("unknown suite {name:?} (known: {})", SUITES.join(", "));
            }
        }
        let mut suites: Vec<String> = if only.is_empty() {
            SUITES.iter().filter(|s| !OPT_IN_SUITES.contains(s)).map(|s| s.to_string()).collect()
        } else {
            only
        };
        suites.retain(|s| !skip.contains(s));
        if suites.is_empty() && cli.peer.is_none() {
            bail!("--only and --skip leave no suite to run");
        }
        Ok(Some(Options {
            suites,
            reps: cli.reps as usize,
            tokens: cli.tokens as usize,
            stream_layers: cli.stream_layers,
            stream_like: cli.stream_like,
            resident_layers: cli.resident_layers,
            out: cli.out.unwrap_or_else(|| workspace_root().join("target").join("bench")),
            peer: cli.peer,
        }))
    }

    fn wants(&self, suite: &str) -> bool {
        self.suites.iter().any(|s| s == suite)
    }
}

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// The release binaries the benchmarks run.
pub(crate) struct Bins {
    pub(crate) strata: PathBuf,
    probe: PathBuf,
}

impl Bins {
    pub(crate) fn probe(&self) -> &Path {
        &self.probe
    }
}

pub(crate) fn build() -> Result<Bins> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("building strata and strata-probe (release)...");
    let status = Command::new(&cargo)
        .args(["build", "--release", "--quiet", "-p", "strata", "-p", "strata-benches", "--bins"])
        .current_dir(workspace_root())
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release failed with {status}");
    }
    let release = target_dir().join("release");
    Ok(Bins { strata: release.join("strata"), probe: release.join("strata-probe") })
}

/// Runs `bin args` and parses the last line of its stdout as JSON.
/// The run waits for a quiet machine and its load is recorded for the next
/// row (`bench_quiet`).
pub(crate) fn run_json(bin: &Path, args: &[String]) -> Result<Value> {
    let output = crate::bench_quiet::measured(|| {
        Command::new(bin).args(args).output().with_context(|| format!("running {}", bin.display()))
    })?;
    if !output.status.success() {
        bail!(
            "{} {} failed with {}: {}",
            bin.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).context("no output")?;
    serde_json::from_str(last).with_context(|| format!("parsing the output of {}: {last}", bin.display()))
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn num(v: &Value, key: &str) -> Result<f64> {
    v.get(key).and_then(Value::as_f64).with_context(|| format!("missing number {key:?} in {v}"))
}

/// The median of the finite `values`: for an even count the mean of the two
/// middle ones (the upper one alone favoured every even-count ratio).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() % 2 {
        1 => sorted[middle],
        _ => (sorted[middle - 1] + sorted[middle]) / 2.0,
    }
}

/// The `p`-th percentile (nearest rank) of `values`.
pub(crate) fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted: Vec<f64> = values.to_vec();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The limits every other row is read against.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) dram_gbs: [f64; 2],
    pub(crate) fma_gflops: [f64; 2],
}

pub fn run(rest: &[String]) -> Result<()> {
    let Some(opts) = Options::parse(rest)? else {
        return Ok(());
    };
    if let Some(peer) = &opts.peer {
        return crate::bench_peer::run(peer, &opts);
    }
    let started = Instant::now();
    let bins = build()?;
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let mut report = Report::new(machine_info());
    let mut limits = Limits::default();
    let need_limits = opts.suites.iter().any(|s| !matches!(s.as_str(), "prefill" | "kernels" | "batching" | "drives"));
    if opts.wants("limits") || need_limits {
        limits = suite_limits(&bins, &opts, &mut report)?;
    }
    if opts.wants("kernels") {
        suite_kernels(&bins, &opts, &mut report)?;
    }
    if opts.wants("prefill") {
        suite_prefill(&bins, &opts, &mut report)?;
    }
    if opts.wants("resident") {
        suite_resident(&bins, &opts, &limits, &mut report)?;
    }
    if opts.wants("streaming") {
        suite_streaming(&bins, &opts, &mut report)?;
    }
    if opts.wants("demo") {
        suite_demo(&bins, &opts, &limits, &mut report)?;
    }
    if opts.wants("batching") {
        crate::bench_batching::suite_batching(&bins, &opts, &mut report)?;
    }
    if opts.wants("agent") {
        crate::bench_agent::suite_agent(&bins, &opts, &limits, &mut report)?;
    }
    if opts.wants("drives") {
        crate::bench_drives::suite_drives(&bins, &opts, &mut report)?;
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.write(&opts.out)?;
    println!("{}", report.table());
    println!("wrote {}", opts.out.join("report.md").display());
    Ok(())
}

/// CPU, cores, memory and load, recorded with every report: the machine is
/// shared, and a busy one explains low ratios.
pub(crate) fn machine_info() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_owned()));
    let date = Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    json!({
        "date": date,
        "cpu": cpu.unwrap_or("unknown"),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "mem_total": mem_total,
        "loadavg_at_start": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

fn suite_limits(bins: &Bins, opts: &Options, report: &mut Report) -> Result<Limits> {
    let mut limits = Limits::default();
    for threads in [1usize, 2] {
        eprintln!("limits: DRAM read and FMA peak, {threads} thread(s)");
        // Best of at least 5 reads: see `read_bandwidth_gbs`.
        let reps = opts.reps.max(5).to_string();
        let t = threads.to_string();
        let v = run_json(&bins.probe, &args(&["limits", "--threads", &t, "--reps", &reps, "--fma-seconds", "0.5"]))?;
        limits.dram_gbs[threads - 1] = num(&v, "read_gbs")?;
        limits.fma_gflops[threads - 1] = num(&v, "fma_gflops")?;
        report.limits.push(json!({ "what": format!("DRAM read, {threads} thread(s), 1 GiB"), "value": limits.dram_gbs[threads - 1], "unit": "GB/s" }));
        report.limits.push(json!({ "what": format!("f32 FMA peak, {threads} thread(s)"), "value": limits.fma_gflops[threads - 1], "unit": "GFLOP/s" }));
    }
    Ok(limits)
}

fn suite_kernels(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    for format in ["q4", "q8"] {
        for threads in [1usize, 2] {
            eprintln!("kernels: {format} matvec over 1 GiB, {threads} thread(s)");
            let (t, reps) = (threads.to_string(), opts.reps.to_string());
            let v = run_json(
                &bins.probe,
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

fn suite_prefill(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    for format in ["q8", "q4"] {
        for threads in [1usize, 2] {
            eprintln!("prefill: {format} matmul [4096 x 2048] x 64 tokens, {threads} thread(s)");
            let (t, reps) = (threads.to_string(), opts.reps.to_string());
            let v = run_json(
                &bins.probe,
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

/// A synthetic container under `OUT/models`, made once and reused.
pub(crate) fn synth(bins: &Bins, opts: &Options, like: &str, layers: usize) -> Result<PathBuf> {
    let dir = opts.out.join("models").join(format!("{like}-l{layers}-q4"));
    if dir.join("manifest.json").exists() {
        return Ok(dir);
    }
    eprintln!("synth: {like}, {layers} layers, q4 -> {} (once; reused by later runs)", dir.display());
    let layers = layers.to_string();
    let status = Command::new(&bins.strata)
        .args(["synth", "--like", like, "--layers", &layers, "--quant", "q4", "--overwrite"])
        .arg(&dir)
        .status()
        .context("running strata synth")?;
    if !status.success() {
        bail!("strata synth failed with {status}");
    }
    Ok(dir)
}

/// What one token touches and computes, from a container's manifest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Footprint {
    /// Bytes of weights (and scales) a decoded token reads when everything
    /// is resident: every dense tensor but the embedding table (one row of
    /// it), and `top_k` expert records' matrices per MoE layer; plus the
    /// recurrent layers' state, read and written back once per step.
    pub(crate) bytes_per_token: f64,
    /// Multiply-adds per token in the weight matrices (active parameters).
    pub(crate) macs_per_token: f64,
    /// Bytes of all files of the model.
    pub(crate) total_bytes: f64,
    /// Bytes of every routed expert's record.
    pub(crate) expert_bytes: f64,
}

pub(crate) fn footprint(model: &Path) -> Result<Footprint> {
    let text = std::fs::read_to_string(model.join("manifest.json")).context("reading manifest.json")?;
    let m: Value = serde_json::from_str(&text).context("parsing manifest.json")?;
    let top_k = m["spec"]["moe"]["top_k"].as_f64().context("spec.moe.top_k")?;
    let tied = m["spec"]["tie_word_embeddings"].as_bool().unwrap_or(false);
    let (mut bytes, mut macs) = (0.0, 0.0);
    for t in m["tensors"].as_array().context("tensors")? {
        let len = t["length_bytes"].as_f64().unwrap_or(0.0) + t["scale_length_bytes"].as_f64().unwrap_or(0.0);
        let shape: Vec<f64> = t["shape"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
        let elems: f64 = shape.iter().product();
        if t["kind"] == "embedding" {
            let rows = shape.first().copied().unwrap_or(1.0).max(1.0);
            if tied {
                // The tied table is also the lm_head: read whole.
                bytes += len;
                macs += elems;
            } else {
                bytes += len / rows;
            }
        } else {
            bytes += len;
            if shape.len() == 2 && shape[0] > 1.0 {
                macs += elems;
            }
        }
    }
    let mut expert_bytes = 0.0;
    for layer in m["expert_layers"].as_array().context("expert_layers")? {
        expert_bytes += layer["record_bytes"].as_f64().unwrap_or(0.0) * layer["num_experts"].as_f64().unwrap_or(0.0);
        for c in layer["components"].as_array().context("components")? {
            let len = c["length_bytes"].as_f64().unwrap_or(0.0) + c["scale_length_bytes"].as_f64().unwrap_or(0.0);
            let elems: f64 = c["shape"].as_array().into_iter().flatten().filter_map(Value::as_f64).product();
            bytes += top_k * len;
            macs += top_k * elems;
        }
    }
    bytes += 2.0 * recurrent_state_bytes(&m["spec"]);
    let total_bytes = m["files"].as_array().into_iter().flatten().filter_map(|f| f["size_bytes"].as_f64()).sum();
    Ok(Footprint { bytes_per_token: bytes, macs_per_token: macs, total_bytes, expert_bytes })
}

/// Bytes of one sequence's Gated DeltaNet state (f32 `d_k × d_v` per value
/// head and `kernel − 1` conv inputs per channel, on every `linear` layer) as
/// the manifest's spec gives them (docs/FORMAT.md); 0 for other models.
fn recurrent_state_bytes(spec: &Value) -> f64 {
    let d = &spec["linear_attention"];
    let n = |key: &str| d[key].as_f64().unwrap_or(0.0);
    let linear_layers = spec["mixers"].as_array().into_iter().flatten().filter(|m| *m == "linear").count() as f64;
    let conv_dim = 2.0 * n("num_k_heads") * n("head_k_dim") + n("num_v_heads") * n("head_v_dim");
    let floats = n("num_v_heads") * n("head_k_dim") * n("head_v_dim") + conv_dim * (n("conv_kernel") - 1.0).max(0.0);
    linear_layers * floats * 4.0
}

/// The O_DIRECT read bandwidth of `model`'s expert files, GB/s: the best
/// that 1, 2 or 4 readers of whole records got (a limit is what the device
/// can do at best).
pub(crate) fn direct_read_gbs(bins: &Bins, model: &Path) -> Result<f64> {
    let m: Value = serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json"))?)?;
    let mut disk_args = vec!["disk".to_string(), "--max-bytes".into(), (2u64 << 30).to_string()];
    for layer in m["expert_layers"].as_array().context("expert_layers")? {
        disk_args.push("--file".into());
        disk_args.push(format!(
            "{}:{}:{}",
            model.join(layer["file"].as_str().context("file")?).display(),
            layer["record_bytes"],
            layer["num_experts"]
        ));
    }
    let mut best_gbs: f64 = 0.0;
    for readers in ["1", "2", "4"] {
        let mut a = disk_args.clone();
        a.extend(["--readers".to_string(), readers.to_string()]);
        best_gbs = best_gbs.max(num(&run_json(&bins.probe, &a)?, "direct_gbs")?);
    }
    Ok(best_gbs)
}

/// Every data file of a container (for page-cache eviction).
pub(crate) fn model_files(model: &Path) -> Result<Vec<PathBuf>> {
    let m: Value = serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json"))?)?;
    Ok(m["files"].as_array().into_iter().flatten().filter_map(|f| f["path"].as_str()).map(|p| model.join(p)).collect())
}

pub(crate) fn evict(bins: &Bins, files: &[PathBuf]) -> Result<()> {
    let mut a = vec!["evict".to_string()];
    for f in files {
        a.push("--file".into());
        a.push(f.display().to_string());
    }
    run_json(&bins.probe, &a).map(|_| ())
}

/// Bytes all waited-for children have read from block devices so far
/// (`ru_inblock` counts 512-byte units): reads the page cache served are not
/// in it, O_DIRECT reads and page-cache misses are.
fn children_device_read_bytes() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass; no other effect.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    usage.ru_inblock as f64 * 512.0
}

/// The expert cache of the streaming rows: 1/32 of the experts (122 MiB on
/// the default model), near the 109 MiB its 1,229 MiB budget left before the
/// embedding table left the budget. The synthetic routers come back to a
/// small set of experts, so the 424 MiB that budget leaves now hits 85% of
/// the time and a step reads 13 MB: the rows would time the compute, not the
/// streaming they are for.
pub(crate) fn streaming_expert_cache(fp: &Footprint) -> String {
    format!("{}KiB", (fp.expert_bytes / 32.0 / 1024.0).round())
}

/// One `strata generate --json` run: its stats, wall time and the bytes it
/// read from the device.
fn generate(bins: &Bins, model: &Path, extra: &[&str], max_new: usize) -> Result<(Value, f64, f64)> {
    let mut a = vec![
        "generate".to_string(),
        model.display().to_string(),
        "--tokens".into(),
        PROMPT.into(),
        "--max-new-tokens".into(),
        max_new.to_string(),
        "--ignore-eos".into(),
        "--json".into(),
        "--temperature".into(),
        "0".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    let (started, device_before) = (Instant::now(), children_device_read_bytes());
    let v = run_json(&bins.strata, &a)?;
    let device_bytes = children_device_read_bytes() - device_before;
    Ok((v["stats"].clone(), started.elapsed().as_secs_f64(), device_bytes))
}

/// Look-ahead prefetch against none on the streaming model (`--io direct`,
/// page cache emptied before each run, `off` and `on` alternated): whether
/// `--prefetch` pays here, with how its guesses fared. It is on by default
/// only where it measures faster (issue 15).
fn prefetch_ab(
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

/// Per-token entries of the decode steps (the first entry is the prefill).
fn decode_steps(stats: &Value) -> Vec<&Value> {
    stats["per_token"].as_array().map(|a| a.iter().skip(1).collect()).unwrap_or_default()
}

fn suite_resident(bins: &Bins, opts: &Options, limits: &Limits, report: &mut Report) -> Result<()> {
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

fn suite_streaming(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
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
                "model {:.1} GB, {:.1}x the budget; stall {:.0}% of decode time",
                fp.total_bytes / 1e9,
                fp.total_bytes / budget_bytes,
                100.0 * median(&p.stall_share)
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
    let check = run_json(&bins.probe, &args(&["check", "--model", &model.to_string_lossy(), "--reps", "5"]))?;
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
struct CheckAb {
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
fn record_check_ab(
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
    let throttle = match (capped, crate::bench_drives::cannot_throttle()) {
        (false, _) => None,
        (true, Some(reason)) => {
            eprintln!("streaming: no record check A/B on a capped disk ({reason})");
            return Ok(None);
        }
        (true, None) => {
            let throttle = crate::bench_drives::Throttle::new("strata-bench-check")?;
            let rate = (0.9 * worst_gbs * 1e9) as u64;
            throttle.cap(&crate::bench_drives::disk_of(model)?, rate)?;
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
            Some((throttle, _)) => throttle.run_json(&bins.probe, &a)?,
            None => run_json(&bins.probe, &a)?,
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

/// The demo checkpoint converted to q8 (the preset a checkpoint is
/// converted with when run directly) under `OUT/models`, once; `None` (and a
/// note) where models/demo is absent.
pub(crate) fn demo_container(bins: &Bins, opts: &Options, report: &mut Report) -> Result<Option<PathBuf>> {
    let checkpoint = workspace_root().join("models").join("demo");
    if !checkpoint.join("config.json").exists() {
        eprintln!("demo: no models/demo, skipped");
        report.notes.push("demo: models/demo does not exist here; the demo rows were skipped.".into());
        return Ok(None);
    }
    let model = opts.out.join("models").join("demo-q8");
    if !model.join("manifest.json").exists() {
        eprintln!("demo: converting models/demo to q8 -> {} (once)", model.display());
        let status = Command::new(&bins.strata)
            .arg("convert")
            .arg(&checkpoint)
            .arg(&model)
            .args(["--quant", "q8", "--overwrite"])
            .status()
            .context("running strata convert")?;
        if !status.success() {
            bail!("strata convert models/demo failed with {status}");
        }
    }
    Ok(Some(model))
}

fn suite_demo(bins: &Bins, opts: &Options, limits: &Limits, report: &mut Report) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[3.0, f64::NAN, 1.0, 2.0]), 2.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn the_default_suite_leaves_out_the_hour_long_agent_suite_until_named() {
        let suites = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            Options::parse(&args).unwrap().unwrap().suites
        };
        let default = suites(&[]);
        assert!(!default.iter().any(|s| s == "agent") && default.iter().any(|s| s == "streaming"), "{default:?}");
        assert_eq!(suites(&["--only", "agent"]), ["agent"]);
        assert!(!suites(&["--skip", "drives"]).iter().any(|s| s == "agent" || s == "drives"));
    }

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
