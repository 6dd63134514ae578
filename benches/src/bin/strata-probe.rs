//! `strata-probe`: the measurements of `cargo xtask bench` that need
//! optimized code, one JSON object per run on stdout.
//!
//! ```text
//! strata-probe limits  --threads N --bytes B --reps R --fma-seconds S
//! strata-probe matvec  --format q4|q8 --bytes B --cols C --threads N --reps R
//! strata-probe prefill --format q4|q8 --rows R --cols C --tokens T --threads N --reps R
//! strata-probe disk    --file PATH:RECORD_BYTES:NUM_EXPERTS ... --readers N --max-bytes B
//! strata-probe evict   --file PATH ...
//! strata-probe check   --model DIR --max-bytes B --reps R
//! strata-probe batch   [--model DIR] --streams N --prompt-tokens P --steps S --threads T
//!                      [--io BACKEND] [--expert-cache BYTES] [--evict 1] [--warm 1]
//!                      [--prefill-chunk TOKENS] [--context TOKENS] [--ram-budget SIZE]
//!                      [--check-records 0|1|alternate]
//! ```

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use serde_json::json;
use strata_benches::{
    RandomMatrix, RecordSource, direct_read_gbs, evict_page_cache, fill_random, fma_peak_gflops, matmul_gflops,
    matvec_vs_read, median, read_bandwidth_gbs, uses_int_path,
};
use strata_kernels::QuantFormat;

struct Args {
    values: HashMap<String, Vec<String>>,
}

impl Args {
    fn parse(rest: &[String]) -> Result<Self> {
        let mut values: HashMap<String, Vec<String>> = HashMap::new();
        let mut it = rest.iter();
        while let Some(flag) = it.next() {
            let key = flag.strip_prefix("--").with_context(|| format!("expected a --flag, got {flag:?}"))?;
            let value = it.next().with_context(|| format!("--{key} needs a value"))?;
            values.entry(key.to_owned()).or_default().push(value.clone());
        }
        Ok(Args { values })
    }

    fn get<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T> {
        match self.values.get(key).and_then(|v| v.last()) {
            None => Ok(default),
            Some(text) => text.parse().map_err(|_| anyhow::anyhow!("--{key}: cannot parse {text:?}")),
        }
    }

    fn format(&self) -> Result<QuantFormat> {
        let text: String = self.get("format", "q4".to_owned())?;
        text.parse().map_err(|e| anyhow::anyhow!("--format: {e}"))
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((what, rest)) = args.split_first() else {
        bail!("usage: strata-probe <limits|matvec|prefill|disk|evict|batch|check> [--flag value ...]");
    };
    let a = Args::parse(rest)?;
    let out = match what.as_str() {
        "limits" => {
            let threads = a.get("threads", 1usize)?;
            let bytes = a.get("bytes", 1usize << 30)?;
            let mut buf = vec![0u8; bytes];
            fill_random(&mut buf, 7);
            let read = read_bandwidth_gbs(&buf, threads, a.get("reps", 3usize)?);
            let fma = fma_peak_gflops(threads, a.get("fma-seconds", 0.5f64)?);
            json!({ "threads": threads, "bytes": bytes, "read_gbs": read, "fma_gflops": fma })
        }
        "matvec" => {
            let format = a.format()?;
            let threads = a.get("threads", 1usize)?;
            let m = RandomMatrix::of_size(format, a.get("bytes", 1usize << 30)?, a.get("cols", 4096usize)?, 11);
            let run = matvec_vs_read(&m, threads, a.get("reps", 3usize)?)?;
            json!({
                "format": format.name(), "threads": threads, "rows": m.rows, "cols": m.cols,
                "bytes": m.bytes().len(), "int_path": uses_int_path(&m),
                "matvec_gbs": run.matvec_gbs, "read_gbs": run.read_gbs,
                "matvec_gbs_median": median(&run.matvec_gbs), "read_gbs_median": median(&run.read_gbs),
            })
        }
        "prefill" => {
            let format = a.format()?;
            let threads = a.get("threads", 1usize)?;
            let m = RandomMatrix::new(format, a.get("rows", 4096usize)?, a.get("cols", 2048usize)?, 13);
            let tokens = a.get("tokens", 64usize)?;
            let reps = a.get("reps", 3usize)?;
            // Peak and product alternate, so both see the same machine load.
            let (mut gflops, mut peaks) = (Vec::new(), Vec::new());
            for _ in 0..reps.max(1) {
                gflops.extend(matmul_gflops(&m, tokens, threads, 1)?);
                peaks.push(fma_peak_gflops(threads, a.get("fma-seconds", 0.3f64)?));
            }
            json!({
                "format": format.name(), "threads": threads, "rows": m.rows, "cols": m.cols, "tokens": tokens,
                "int_path": uses_int_path(&m), "gflops": gflops, "fma_peak_gflops": peaks,
                "gflops_median": median(&gflops), "fma_peak_gflops_median": median(&peaks),
            })
        }
        "disk" => {
            let files = a
                .values
                .get("file")
                .context("disk needs --file PATH:RECORD_BYTES:NUM_EXPERTS")?
                .iter()
                .map(|spec| {
                    let mut parts = spec.rsplitn(3, ':');
                    let num_experts = parts.next().and_then(|p| p.parse().ok());
                    let record_bytes = parts.next().and_then(|p| p.parse().ok());
                    match (parts.next(), record_bytes, num_experts) {
                        (Some(path), Some(record_bytes), Some(num_experts)) => {
                            Ok(RecordSource { path: path.into(), record_bytes, num_experts })
                        }
                        _ => bail!("--file {spec:?}: expected PATH:RECORD_BYTES:NUM_EXPERTS"),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let readers = a.get("readers", 1usize)?;
            let gbs = direct_read_gbs(&files, readers, a.get("max-bytes", 2u64 << 30)?)?;
            json!({ "readers": readers, "direct_gbs": gbs })
        }
        "evict" => {
            let files = a.values.get("file").context("evict needs --file PATH")?;
            for file in files {
                evict_page_cache(std::path::Path::new(file))?;
            }
            json!({ "evicted": files.len() })
        }
        "batch" => batch_decode(&a)?,
        "check" => record_check(&a)?,
        other => bail!("unknown probe {other:?} (limits, matvec, prefill, disk, evict, batch, check)"),
    };
    println!("{out}");
    Ok(())
}

/// The rate of the check every expert record read from disk passes (its
/// CRC32C and the finite-float scan, `ExpertLayout::check_record`), over
/// records already in memory: what the check adds to a read, were it not
/// overlapped with anything.
fn record_check(a: &Args) -> Result<serde_json::Value> {
    let model: String = a.get("model", String::new())?;
    let container = strata_format::Container::open(&model)?;
    let max_bytes = a.get("max-bytes", 1u64 << 30)?;
    let mut records: Vec<(&strata_format::ExpertLayout, Vec<Vec<u8>>)> = Vec::new();
    let mut bytes_loaded = 0u64;
    for layer in 0..container.arch().layers.len() {
        let Ok(layout) = container.expert_layout(layer) else { continue };
        if bytes_loaded >= max_bytes {
            break;
        }
        let file = std::fs::read(&layout.path).with_context(|| format!("reading {}", layout.path.display()))?;
        let record_bytes = usize::try_from(layout.record_bytes)?;
        let held: Vec<Vec<u8>> = file.chunks_exact(record_bytes).map(<[u8]>::to_vec).collect();
        bytes_loaded += (held.len() * record_bytes) as u64;
        records.push((layout, held));
    }
    anyhow::ensure!(bytes_loaded > 0, "{model}: no expert records");
    let mut gbs = Vec::new();
    for _ in 0..a.get("reps", 3usize)?.max(1) {
        let started = std::time::Instant::now();
        for (layout, held) in &records {
            for (expert, record) in held.iter().enumerate() {
                layout.check_record(expert, record)?;
            }
        }
        gbs.push(bytes_loaded as f64 / started.elapsed().as_secs_f64() / 1e9);
    }
    Ok(json!({ "bytes": bytes_loaded, "check_gbs": gbs, "check_gbs_median": median(&gbs) }))
}

/// Decode steps of `--streams` sequences fed together (one forward pass per
/// step, as `serve` does), after a prompt each: the seconds per step and the
/// tokens per second of all streams together.
fn batch_decode(a: &Args) -> Result<serde_json::Value> {
    let model: String = a.get("model", String::new())?;
    let dir = if model.is_empty() { None } else { Some(std::path::PathBuf::from(&model)) };
    let resolved = strata_engine::resolve_model(dir.as_deref(), &strata_engine::default_cache_dir(), false, &[])?;
    let streams = a.get("streams", 1usize)?;
    let mut options = strata_engine::EngineOptions {
        threads: a.get("threads", 0usize)?,
        sessions: streams,
        // 1024 by default, which the demo (256 positions) would refuse: it
        // runs at its own context.
        context_tokens: match a.get("context", if model.is_empty() { 0 } else { 1024usize })? {
            0 => None,
            n => Some(n),
        },
        io: a.get("io", strata_engine::IoBackend::default())?,
        prefill_chunk_tokens: match a.get("prefill-chunk", 0usize)? {
            0 => None,
            n => Some(n),
        },
        cache_policy: a.get("cache-policy", strata_engine::PolicyKind::Lru)?,
        ram_budget: a.get("ram-budget", strata_engine::RamBudget::Auto)?,
        io_workers: a.get("io-workers", strata_engine::EngineOptions::default().io_workers)?,
        ..Default::default()
    };
    let cache: String = a.get("expert-cache", String::new())?;
    if !cache.is_empty() {
        let bytes: strata_engine::ByteSize = cache.parse()?;
        options.expert_cache_bytes = Some(bytes.0);
    }
    let engine = strata_engine::Engine::open(&resolved.container_dir, &options)?;
    // Off or alternating only to measure what the check on every read
    // costs: `alternate` checks the odd decode steps, so that checked and
    // unchecked steps meet the same disk, seconds apart at most.
    let check: String = a.get("check-records", "1".to_owned())?;
    let step_checked = |step: usize| match check.as_str() {
        "1" => Ok(true),
        "0" => Ok(false),
        "alternate" => Ok(step % 2 == 1),
        other => Err(anyhow::anyhow!("--check-records: {other:?} is not 0, 1 or alternate")),
    };
    step_checked(0)?;
    if a.get("evict", 0u8)? == 1 {
        engine.evict_page_cache()?;
    }
    let prompt_tokens = a.get("prompt-tokens", 16usize)?;
    let steps = a.get("steps", 64usize)?;
    let vocab = u32::try_from(engine.core().vocab_size)?;
    let mut sessions: Vec<strata_engine::Session<'_>> = (0..streams).map(|_| engine.session()).collect();
    let prompt =
        |i: usize| -> Vec<u32> { (0..prompt_tokens as u32).map(|t| (7 + 31 * t + 101 * i as u32) % vocab).collect() };
    if a.get("warm", 0u8)? == 1 {
        // One prefill of every prompt in a throwaway session first, so the
        // timed prefills find their experts resident (as a warm server does).
        for i in 0..streams {
            engine.session().feed(&prompt(i))?;
        }
    }
    let mut next: Vec<u32> = Vec::with_capacity(streams);
    let prefill_started = std::time::Instant::now();
    for (i, s) in sessions.iter_mut().enumerate() {
        let logits = s.feed(&prompt(i))?;
        next.push(argmax(&logits));
    }
    let prefill_s = prefill_started.elapsed().as_secs_f64();
    let before = engine.store_stats();
    let mut step_s = Vec::with_capacity(steps);
    let mut step_bytes = Vec::with_capacity(steps);
    let decode_started = std::time::Instant::now();
    for step in 0..steps {
        engine.set_record_check(step_checked(step)?);
        let bytes_before = engine.store_stats().bytes_read;
        let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let token_refs: Vec<&[u32]> = tokens.iter().map(|t| &t[..]).collect();
        let mut refs: Vec<&mut strata_engine::Session<'_>> = sessions.iter_mut().collect();
        let started = std::time::Instant::now();
        let logits = strata_engine::Session::feed_batch(&mut refs, &token_refs)?;
        step_s.push(started.elapsed().as_secs_f64());
        step_bytes.push(engine.store_stats().bytes_read - bytes_before);
        next = logits.iter().map(|l| argmax(l)).collect();
    }
    let decode_s = decode_started.elapsed().as_secs_f64();
    let after = engine.store_stats();
    let tokens = (streams * steps) as f64;
    let step_median = median(&step_s);
    Ok(json!({
        "streams": streams, "batch_capacity": engine.batch_capacity(), "steps": steps, "step_s": step_s, "step_s_median": step_median,
        "step_expert_bytes": step_bytes, "step_checked": (0..steps).map(step_checked).collect::<Result<Vec<_>>>()?,
        "prefill_tokens_per_s": (streams * prompt_tokens) as f64 / prefill_s,
        "tokens_per_s": streams as f64 / step_median, "tokens_per_s_overall": tokens / decode_s,
        "expert_bytes_read": after.bytes_read - before.bytes_read,
        "expert_bytes_per_token": (after.bytes_read - before.bytes_read) as f64 / tokens,
        "expert_misses": after.misses - before.misses, "expert_hits": after.hits - before.hits,
    }))
}

fn argmax(logits: &[f32]) -> u32 {
    let best = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
    u32::try_from(best.0).expect("vocabulary fits u32")
}
