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
//! `streaming`, `demo`, `batching`, `speculation`, `agent`, `drives` (a file each here). Measurements that need
//! optimized code run in the
//! release-built `strata-probe` (package `strata-benches`) and `strata`
//! binaries; this file only orchestrates them, since xtask itself is built
//! without optimization. Results go to `OUT/report.json`, `OUT/report.md`
//! and `OUT/*.svg` (default `OUT` = `target/bench`), and the table is printed.
//!
//! Files: `options.rs` (the CLI), `common.rs` (what every suite shares:
//! the binaries, synthetic models, footprints, eviction), `stats.rs`,
//! `quiet.rs` (the machine's load around each run), `report.rs`, and one
//! file a suite or group of suites; `peer.rs` is `--peer`.

mod agent;
mod batching;
mod common;
mod drives;
mod options;
mod peer;
mod quiet;
mod report;
mod speculation;
mod stats;
mod streaming;
mod suites;
mod throttle;

use std::time::Instant;

use anyhow::{Context, Result};

use common::{Limits, build, machine_info};
use options::Options;
use report::Report;
use streaming::suite_streaming;
use suites::{suite_demo, suite_kernels, suite_limits, suite_prefill, suite_resident};

pub fn run(rest: &[String]) -> Result<()> {
    let Some(opts) = Options::parse(rest)? else {
        return Ok(());
    };
    quiet::set_quiet_wait(opts.quiet_wait);
    if let Some(peer) = &opts.peer {
        return peer::run(peer, &opts);
    }
    let started = Instant::now();
    let bins = build(opts.bins.as_deref())?;
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let mut report = Report::new(machine_info());
    let mut limits = Limits::default();
    let need_limits = opts
        .suites
        .iter()
        .any(|s| !matches!(s.as_str(), "prefill" | "kernels" | "batching" | "speculation" | "drives"));
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
        batching::suite_batching(&bins, &opts, &mut report)?;
    }
    if opts.wants("speculation") {
        speculation::suite_speculation(&bins, &opts, &mut report)?;
    }
    if opts.wants("agent") {
        agent::suite_agent(&bins, &opts, &limits, &mut report)?;
    }
    if opts.wants("drives") {
        drives::suite_drives(&bins, &opts, &mut report)?;
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.write(&opts.out)?;
    println!("{}", report.table());
    println!("wrote {}", opts.out.join("report.md").display());
    Ok(())
}
