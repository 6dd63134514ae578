//! The `speculation` suite of `cargo xtask bench`: where drafting with a
//! model's own MTP layer pays (issue 34's break-even map,
//! docs/BENCHMARKS.md). Greedy decoding of the trained MTP demo
//! (`target/demo-mtp`, made by `cargo xtask train-demo --mtp`: random
//! weights accept no draft), converted to q8, with `--speculate off`, `on`
//! drafting k = 1, 2 and 3 tokens ahead, and `auto`; resident (every expert
//! read at open) and streamed (`--io direct`) with a quarter and a tenth of
//! its routed experts cached, and a tenth again on a disk held to 50 MB/s
//! ([`ReadThrottle`]: this machine's disk is too fast for the misses of so
//! small a model to outweigh its compute). Each row is a mode's tokens/s against `off`'s
//! at the same cache in the same run, the modes alternated within each
//! repetition, with the acceptance (and each draft position's), the tokens
//! each verify pass gave and the expert cache's hit rate: a verify pass over
//! k + 1 tokens reads the union of their experts, so what drafting saves in
//! passes of the stack it may pay back in reads.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::batching::expert_bytes;
use super::common::{Bins, num, run_json};
use super::options::Options;
use super::report::{Report, Row};
use super::stats::median;
use super::throttle::ReadThrottle;
use crate::cli::workspace_root;

/// The trained pair, as `cargo xtask train-demo --mtp` writes it.
const CHECKPOINT: &str = "target/demo-mtp";
/// What makes [`CHECKPOINT`]: about 20 minutes of one core, so the suite
/// says so rather than spending them (and loading the machine it times).
const TRAIN_COMMAND: &str = "cargo xtask train-demo --mtp";

/// The modes compared at each cache, `off` first (every ratio's bound).
const MODES: [(&str, &[&str]); 5] = [
    ("off", &["--speculate", "off"]),
    ("on, k = 1", &["--speculate", "on", "--draft-tokens", "1"]),
    ("on, k = 2", &["--speculate", "on", "--draft-tokens", "2"]),
    ("on, k = 3", &["--speculate", "on", "--draft-tokens", "3"]),
    ("auto, k = 2", &["--speculate", "auto", "--draft-tokens", "2"]),
];

/// Where the experts come from in a row of the map.
struct Cache {
    name: &'static str,
    /// The share of the routed experts' bytes cached (`None`: the default
    /// budget, which holds them all from the start).
    share: Option<f64>,
    /// The disk held to this many bytes a second ([`ReadThrottle`]): the
    /// disk-bound host where the seed engine found drafting a net loss.
    read_bytes_per_s: Option<u64>,
}

const CACHES: [Cache; 4] = [
    Cache { name: "resident", share: None, read_bytes_per_s: None },
    Cache { name: "a quarter of the experts cached", share: Some(0.25), read_bytes_per_s: None },
    Cache { name: "a tenth of the experts cached", share: Some(0.1), read_bytes_per_s: None },
    Cache {
        name: "a tenth of the experts cached, the disk held to 50 MB/s",
        share: Some(0.1),
        read_bytes_per_s: Some(50_000_000),
    },
];

/// Held-out fortunes whose first words prompt each repetition's runs.
const PROMPTS: usize = 3;

/// `auto`'s bar: never slower than `off` by more than these rows' noise
/// (issue 34).
const AUTO_GOAL: f64 = 0.95;

pub(crate) fn suite_speculation(bins: &Bins, opts: &Options, report: &mut Report) -> Result<()> {
    let checkpoint = workspace_root().join(CHECKPOINT);
    if !checkpoint.join("config.json").exists() {
        eprintln!("speculation: no {CHECKPOINT}, skipped; `{TRAIN_COMMAND}` makes it (about 20 minutes on one core)");
        report.notes.push(format!(
            "speculation: {CHECKPOINT} does not exist here, so the speculation rows were skipped; \
             `{TRAIN_COMMAND}` trains it (about 20 minutes on one core), then rerun on a quiet machine."
        ));
        return Ok(());
    }
    let model = convert(bins, opts, &checkpoint)?;
    let prompts = prompts(&checkpoint.join("heldout.txt"))?;
    let all_experts = expert_bytes(&model)?;
    let usage = opts.out.join("speculation-usage.json");
    // Four times a streaming run's steps: acceptance is a share of drafts,
    // and a run of this model takes well under a second.
    let steps = 4 * opts.tokens;
    let throttles: Vec<Option<ReadThrottle>> = CACHES
        .iter()
        .map(|cache| {
            let rate = cache.read_bytes_per_s?;
            ReadThrottle::new(&model, rate)
                .inspect(|throttle| {
                    report.notes.push(format!(
                        "speculation: in the rows \"{}\", reads from disk {} were held to {} bytes/s by a control group.",
                        cache.name, throttle.disk, throttle.read_bytes_per_s
                    ))
                })
                .map_err(|e| {
                    eprintln!("speculation: {}: skipped: {e:#}", cache.name);
                    report.notes.push(format!("speculation: the rows \"{}\" were skipped: {e:#}.", cache.name));
                })
                .ok()
        })
        .collect();
    let runs = |c: usize| CACHES[c].read_bytes_per_s.is_none() || throttles[c].is_some();
    let mut tallies: Vec<Vec<Tally>> =
        CACHES.iter().map(|_| MODES.iter().map(|_| Tally::default()).collect()).collect();
    let mut raw = Vec::new();
    for rep in 0..opts.reps {
        for (c, cache) in CACHES.iter().enumerate().filter(|&(c, _)| runs(c)) {
            let cache_bytes = cache.share.map(|s| ((all_experts * s) as u64).to_string());
            for (m, (mode, mode_args)) in MODES.iter().enumerate() {
                eprintln!("speculation: {}, {mode}, run {}/{}", cache.name, rep + 1, opts.reps);
                let mut extra: Vec<&str> = mode_args.to_vec();
                match &cache_bytes {
                    Some(bytes) => extra.extend(["--expert-cache", bytes.as_str(), "--io", "direct"]),
                    None => extra.extend(["--io", "pread"]),
                }
                for prompt in &prompts {
                    // Every run learns its usage afresh, so that no mode's hit
                    // rate gains from the runs before it.
                    let _ = std::fs::remove_file(&usage);
                    let stats = generate(bins, &model, prompt, steps, &usage, &extra, throttles[c].as_ref())?;
                    tallies[c][m].add(&stats)?;
                    raw.push(
                        json!({ "cache": cache.name, "mode": mode, "rep": rep, "prompt": prompt, "stats": stats }),
                    );
                }
            }
        }
    }
    let mut map = Vec::new();
    for (c, cache) in CACHES.iter().enumerate().filter(|&(c, _)| runs(c)) {
        let off = &tallies[c][0];
        let mut cells = Vec::new();
        for (m, (mode, _)) in MODES.iter().enumerate() {
            let tally = &tallies[c][m];
            report.push(row(cache, mode, tally, off));
            if m > 0 {
                cells.push(Cell {
                    ratio: tally.rate() / off.rate(),
                    acceptance: tally.acceptance(),
                    hit_rate: tally.hit_rate(),
                });
            }
        }
        map.push((cache.name.to_string(), off.hit_rate(), cells));
    }
    report.notes.push(map_table(&map));
    report.raw.push(json!({ "suite": "speculation", "model": model, "steps": steps, "runs": raw }));
    Ok(())
}

/// The pair converted to q8 (the MTP layer kept at q8) under `OUT/models`,
/// afresh each run (seconds), so that a retrained pair is never timed stale.
fn convert(bins: &Bins, opts: &Options, checkpoint: &Path) -> Result<PathBuf> {
    let model = opts.out.join("models").join("demo-mtp-q8");
    eprintln!("speculation: converting {} to q8 -> {}", checkpoint.display(), model.display());
    let status = Command::new(&bins.strata)
        .arg("convert")
        .arg(checkpoint)
        .arg(&model)
        .args(["--quant", "q8", "--overwrite"])
        .status()
        .context("running strata convert")?;
    if !status.success() {
        bail!("strata convert {} failed with {status}", checkpoint.display());
    }
    Ok(model)
}

/// The first words of [`PROMPTS`] held-out fortunes, spread over the file
/// (fortunes are separated by blank lines).
fn prompts(heldout: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(heldout).with_context(|| format!("reading {}", heldout.display()))?;
    let fortunes: Vec<&str> = text.split("\n\n").filter(|f| f.split_whitespace().count() >= 6).collect();
    if fortunes.len() < PROMPTS {
        bail!("{} holds fewer than {PROMPTS} fortunes", heldout.display());
    }
    let every = fortunes.len() / PROMPTS;
    Ok((0..PROMPTS).map(|i| fortunes[i * every].split_whitespace().take(4).collect::<Vec<_>>().join(" ")).collect())
}

/// One greedy `strata generate --json` run of `steps` tokens (its reads
/// held to `throttle`'s rate, if any): its stats.
fn generate(
    bins: &Bins,
    model: &Path,
    prompt: &str,
    steps: usize,
    usage: &Path,
    extra: &[&str],
    throttle: Option<&ReadThrottle>,
) -> Result<Value> {
    let mut a = vec![
        "generate".to_string(),
        model.display().to_string(),
        "--prompt".into(),
        prompt.into(),
        "--max-new-tokens".into(),
        steps.to_string(),
        "--ignore-eos".into(),
        "--json".into(),
        "--temperature".into(),
        "0".into(),
        "--usage-file".into(),
        usage.display().to_string(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    let (bin, a) = match throttle {
        Some(throttle) => throttle.wrap(&bins.strata, &a),
        None => (bins.strata.clone(), a),
    };
    Ok(run_json(&bin, &a)?["stats"].clone())
}

/// One mode's runs at one cache: each run's rate, and the counts pooled.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Tally {
    /// Each run's decode tokens/s.
    rates: Vec<f64>,
    drafted: f64,
    accepted: f64,
    /// Verify passes whose draft i stood (so did every draft before it).
    accepted_at: Vec<f64>,
    verify_passes: f64,
    /// Tokens the verify passes gave: each pass's own and its accepted drafts.
    verified_tokens: f64,
    expert_hits: f64,
    expert_misses: f64,
}

impl Tally {
    /// Adds one run's `stats` (`generate --json`'s).
    fn add(&mut self, stats: &Value) -> Result<()> {
        self.rates.push(num(stats, "decode_tokens_per_s")?);
        self.expert_hits += num(stats, "expert_hits")?;
        self.expert_misses += num(stats, "expert_misses")?;
        let spec = &stats["speculation"];
        if spec.is_null() {
            return Ok(());
        }
        self.drafted += num(spec, "drafted")?;
        self.accepted += num(spec, "accepted")?;
        self.verify_passes += num(spec, "verify_passes")?;
        self.verified_tokens += num(spec, "verified_tokens")?;
        let at: Vec<f64> = spec["accepted_at"]
            .as_array()
            .context("speculation.accepted_at")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        if self.accepted_at.len() < at.len() {
            self.accepted_at.resize(at.len(), 0.0);
        }
        self.accepted_at.iter_mut().zip(at).for_each(|(total, n)| *total += n);
        Ok(())
    }

    /// The median run's tokens/s.
    fn rate(&self) -> f64 {
        median(&self.rates)
    }

    /// Drafts that stood, of those drafted (`None`: nothing drafted).
    fn acceptance(&self) -> Option<f64> {
        (self.drafted > 0.0).then(|| self.accepted / self.drafted)
    }

    /// Per draft position, the share of verify passes in which that draft
    /// (and every one before it) stood.
    fn acceptance_by_position(&self) -> Vec<f64> {
        self.accepted_at.iter().map(|n| n / self.verify_passes.max(1.0)).collect()
    }

    fn tokens_per_verify_pass(&self) -> Option<f64> {
        (self.verify_passes > 0.0).then(|| self.verified_tokens / self.verify_passes)
    }

    /// Expert lookups the cache held, over the whole runs.
    fn hit_rate(&self) -> Option<f64> {
        let lookups = self.expert_hits + self.expert_misses;
        (lookups > 0.0).then(|| self.expert_hits / lookups)
    }
}

/// One mode's row: its rate against `off`'s at the same cache.
fn row(cache: &Cache, mode: &str, tally: &Tally, off: &Tally) -> Row {
    let (measured, bound) = (tally.rate(), off.rate());
    let drafting = match (tally.acceptance(), tally.tokens_per_verify_pass()) {
        (Some(acceptance), Some(per_pass)) => format!(
            "acceptance {} (passes whose draft 1, 2, ... stood: {}), {per_pass:.2} tokens a verify pass; ",
            percent(Some(acceptance)),
            tally.acceptance_by_position().iter().map(|a| percent(Some(*a))).collect::<Vec<_>>().join(" "),
        ),
        _ => "no drafts; ".into(),
    };
    let io = if cache.share.is_some() { "--io direct" } else { "--io pread" };
    Row {
        suite: "speculation".into(),
        runs: tally.rates.clone(),
        bound_runs: off.rates.clone(),
        load: None,
        name: format!("speculation: demo-mtp q8, {} ({io}), --speculate {mode}", cache.name),
        measured,
        unit: "tok/s".into(),
        limit_name: "--speculate off at the same cache, alternated in the same run".into(),
        limit: bound,
        limit_unit: "tok/s".into(),
        bound,
        ratio: measured / bound,
        goal: mode.starts_with("auto").then_some(AUTO_GOAL),
        note: format!("{drafting}expert hit rate {} (off: {})", percent(tally.hit_rate()), percent(off.hit_rate())),
    }
}

/// One cell of the map: a mode's speed-up over `off` at one cache, with
/// what explains it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cell {
    ratio: f64,
    acceptance: Option<f64>,
    hit_rate: Option<f64>,
}

/// The break-even map as a markdown table: a line per cache (with `off`'s
/// hit rate), a column per mode, each cell the speed-up over `off` and the
/// acceptance and hit rate behind it.
fn map_table(map: &[(String, Option<f64>, Vec<Cell>)]) -> String {
    let modes: Vec<&str> = MODES.iter().skip(1).map(|(m, _)| *m).collect();
    let mut s = format!(
        "Speculation break-even map (tok/s over `--speculate off` at the same cache; acceptance, hit rate):\n\n\
         | cache (hit rate with off) | {} |\n|---|{}\n",
        modes.join(" | "),
        "---|".repeat(modes.len())
    );
    for (cache, off_hits, cells) in map {
        let cells: Vec<String> = cells
            .iter()
            .map(|c| format!("**{:.2}×** ({}, {})", c.ratio, percent(c.acceptance), percent(c.hit_rate)))
            .collect();
        s.push_str(&format!("| {cache} ({}) | {} |\n", percent(*off_hits), cells.join(" | ")));
    }
    s
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".into(), |s| format!("{:.0}%", 100.0 * s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(rate: f64, hits: u64, misses: u64, speculation: Value) -> Value {
        json!({ "decode_tokens_per_s": rate, "expert_hits": hits, "expert_misses": misses, "speculation": speculation })
    }

    /// `generate --json`'s speculation counts.
    fn drafts(drafted: u64, accepted: u64, accepted_at: &[u64], verify_passes: u64, verified_tokens: u64) -> Value {
        json!({ "drafted": drafted, "accepted": accepted, "accepted_at": accepted_at,
                "verify_passes": verify_passes, "verified_tokens": verified_tokens })
    }

    #[test]
    fn runs_pool_their_counts_and_take_the_median_rate() {
        let mut on = Tally::default();
        on.add(&stats(30.0, 90, 10, drafts(20, 12, &[8, 4], 10, 22))).unwrap();
        on.add(&stats(50.0, 60, 40, drafts(10, 3, &[3], 10, 13))).unwrap();
        on.add(&stats(40.0, 50, 50, drafts(10, 5, &[3, 2], 5, 10))).unwrap();
        assert_eq!(on.rate(), 40.0);
        assert_eq!(on.acceptance(), Some(0.5));
        assert_eq!(on.acceptance_by_position(), vec![0.56, 0.24]);
        assert_eq!(on.tokens_per_verify_pass(), Some(1.8));
        assert_eq!(on.hit_rate(), Some(0.6666666666666666));

        let mut off = Tally::default();
        off.add(&stats(20.0, 100, 0, Value::Null)).unwrap();
        off.add(&stats(24.0, 100, 0, Value::Null)).unwrap();
        assert_eq!((off.acceptance(), off.tokens_per_verify_pass()), (None, None));
        let r = row(&CACHES[1], "on, k = 2", &on, &off);
        assert_eq!((r.measured, r.bound, r.ratio, r.goal), (40.0, 22.0, 40.0 / 22.0, None));
        assert!(r.note.contains("acceptance 50% (passes whose draft 1, 2, ... stood: 56% 24%)"), "{}", r.note);
        assert!(
            r.note.contains("1.80 tokens a verify pass") && r.note.contains("hit rate 67% (off: 100%)"),
            "{}",
            r.note
        );
        assert!(r.name.contains("--io direct"), "{}", r.name);
        assert_eq!(row(&CACHES[0], "auto, k = 2", &off, &off).goal, Some(AUTO_GOAL));
    }

    #[test]
    fn the_map_has_a_line_per_cache_and_a_cell_per_drafting_mode() {
        let cell = |ratio, acceptance| Cell { ratio, acceptance, hit_rate: Some(0.5) };
        let cells = vec![cell(1.3, Some(0.6)), cell(1.1, Some(0.5)), cell(0.9, Some(0.4)), cell(1.0, None)];
        let table = map_table(&[("a tenth of the experts cached".into(), Some(0.55), cells)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[2], "| cache (hit rate with off) | on, k = 1 | on, k = 2 | on, k = 3 | auto, k = 2 |");
        assert_eq!(lines[3], "|---|---|---|---|---|");
        assert_eq!(
            lines[4],
            "| a tenth of the experts cached (55%) | **1.30×** (60%, 50%) | **1.10×** (50%, 50%) | \
             **0.90×** (40%, 50%) | **1.00×** (-, 50%) |"
        );
    }
}
