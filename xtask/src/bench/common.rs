//! What the suites share: the release-built binaries, synthetic models and
//! their footprints, page-cache eviction, and one `strata generate` run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::options::Options;
use super::report::Report;
use crate::cli::{target_dir, workspace_root};

/// A prompt of token ids valid in every synthetic vocabulary.
pub(crate) const PROMPT: &str = "1,2,3,4,5,6,7,8";

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

/// The binaries in `prebuilt` (`--bins`), else a fresh release build.
pub(crate) fn build(prebuilt: Option<&Path>) -> Result<Bins> {
    if let Some(dir) = prebuilt {
        let bins = Bins { strata: dir.join("strata"), probe: dir.join("strata-probe") };
        for bin in [&bins.strata, &bins.probe] {
            if !bin.is_file() {
                bail!("--bins: no {}", bin.display());
            }
        }
        return Ok(bins);
    }
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
    let output = super::quiet::measured(|| {
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

pub(super) fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn num(v: &Value, key: &str) -> Result<f64> {
    v.get(key).and_then(Value::as_f64).with_context(|| format!("missing number {key:?} in {v}"))
}

/// The limits every other row is read against.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) dram_gbs: [f64; 2],
    pub(crate) fma_gflops: [f64; 2],
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

/// A synthetic container under `OUT/models`, made once and reused; the
/// streaming model's (`like` the `--stream-like` one) with its n-gram table
/// base if `--stream-ngram-vocab-size-base` gives one.
pub(crate) fn synth(bins: &Bins, opts: &Options, like: &str, layers: usize) -> Result<PathBuf> {
    let ngram_base = opts.stream_ngram_vocab_size_base.filter(|_| like == opts.stream_like);
    let ngram = ngram_base.map(|n| format!("-ngram{n}")).unwrap_or_default();
    let dir = opts.out.join("models").join(format!("{like}-l{layers}{ngram}-q4"));
    if dir.join("manifest.json").exists() {
        return Ok(dir);
    }
    eprintln!("synth: {like}, {layers} layers{ngram}, q4 -> {} (once; reused by later runs)", dir.display());
    let layers = layers.to_string();
    let mut cmd = Command::new(&bins.strata);
    cmd.args(["synth", "--like", like, "--layers", &layers, "--quant", "q4", "--overwrite"]);
    if let Some(n) = ngram_base {
        cmd.args(["--ngram-vocab-size-base", &n.to_string()]);
    }
    let status = cmd.arg(&dir).status().context("running strata synth")?;
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
    // Version 2 manifests (the families with typed layers, DeepSeek V4 among
    // them) carry the checkpoint's config instead of `spec`.
    let hf = m["hf_config"].get("text_config").unwrap_or(&m["hf_config"]);
    let top_k = m["spec"]["moe"]["top_k"]
        .as_f64()
        .or_else(|| hf["num_experts_per_tok"].as_f64())
        .context("spec.moe.top_k or hf_config.num_experts_per_tok")?;
    let tied =
        m["spec"]["tie_word_embeddings"].as_bool().or_else(|| hf["tie_word_embeddings"].as_bool()).unwrap_or(false);
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
pub(super) fn recurrent_state_bytes(spec: &Value) -> f64 {
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
pub(super) fn children_device_read_bytes() -> f64 {
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
pub(super) fn generate(bins: &Bins, model: &Path, extra: &[&str], max_new: usize) -> Result<(Value, f64, f64)> {
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

/// Per-token entries of the decode steps (the first entry is the prefill).
pub(super) fn decode_steps(stats: &Value) -> Vec<&Value> {
    stats["per_token"].as_array().map(|a| a.iter().skip(1).collect()).unwrap_or_default()
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
