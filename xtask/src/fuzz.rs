//! `cargo xtask fuzz [--seconds N] [--only a,b] [--debug] [--build-only]`: builds the AFL++
//! targets of fuzz/ (cargo-afl, stable toolchain) and runs each for a bounded time on
//! its committed corpus (`--build-only`: builds them and stops, so that CI can build them
//! beside its tests). Fails if any run found a crash or a hang, naming
//! the inputs, which then become regression tests in the crate that owns the
//! parser (fuzz/README.md).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cli::{target_dir, workspace_root};

/// Every target: `fuzz/src/bin/<name>.rs`, seeded from `fuzz/corpus/<name>/`.
const TARGETS: [&str; 14] = [
    "config_json",
    "safetensors_header",
    "manifest",
    "kv_session",
    "usage_json",
    "trace",
    "chat_template",
    "tokenizer_json",
    "npy",
    "http_body",
    "grammar",
    "template_source",
    "tokenize_text",
    "hub_answers",
];
/// What CI gives each target.
const SECONDS_DEFAULT: u64 = 20;
/// An input that takes longer than this is a hang: every parser here answers
/// in microseconds to milliseconds.
const HANG_MS: u64 = 2000;
/// A target above this much address space is stopped (an allocation out of
/// proportion to an input of a few KiB counts as a finding).
const MEMORY_LIMIT_MIB: u64 = 2048;

pub fn run(args: &[String]) -> Result<()> {
    let mut seconds = SECONDS_DEFAULT;
    let mut only: Option<Vec<String>> = None;
    // Release by default (more executions per second); `--debug` builds in
    // a fraction of the time, with overflow checks on, which is what a
    // bounded CI run wants.
    let mut profile = "release";
    let mut build_only = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = args.next().context("--seconds N")?.parse().context("--seconds N")?,
            "--only" => only = Some(args.next().context("--only a,b")?.split(',').map(str::to_owned).collect()),
            "--debug" => profile = "debug",
            "--build-only" => build_only = true,
            other => bail!("unknown argument {other:?} (expected --seconds N, --only a,b, --debug, --build-only)"),
        }
    }
    let targets: Vec<&str> = match &only {
        Some(names) => {
            for name in names {
                if !TARGETS.contains(&name.as_str()) {
                    bail!("unknown fuzz target {name:?} (targets: {})", TARGETS.join(", "));
                }
            }
            TARGETS.into_iter().filter(|t| names.iter().any(|n| n == t)).collect()
        }
        None => TARGETS.to_vec(),
    };
    let fuzz_dir = workspace_root().join("fuzz");
    let target_root = target_dir();
    // Its own target directory: instrumented builds must not replace the
    // workspace's artifacts.
    let build_dir = target_root.join("fuzz");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let afl = Command::new(&cargo).args(["afl", "--version"]).output();
    if !afl.is_ok_and(|o| o.status.success()) {
        bail!("cargo-afl is missing: `cargo install cargo-afl --locked && cargo afl config --build` (fuzz/README.md)");
    }
    let mut build = Command::new(&cargo);
    build.args(["afl", "build"]);
    if profile == "release" {
        build.arg("--release");
    }
    let status = build
        .arg("--manifest-path")
        .arg(fuzz_dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &build_dir)
        .status()
        .context("cargo afl build")?;
    if !status.success() {
        bail!("cargo afl build failed with {status}");
    }
    if build_only {
        return Ok(());
    }
    // One afl-fuzz process per core (each is single-threaded), taking the
    // targets in turn: on CI's two cores the run takes half the time and each
    // target still gets its seconds on a core of its own.
    let lanes = std::thread::available_parallelism().map_or(1, |n| n.get()).min(targets.len()).max(1);
    let next = std::sync::Mutex::new(targets.into_iter());
    let ran: Vec<Result<Vec<String>>> = std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..lanes)
            .map(|_| {
                scope.spawn(|| {
                    let mut findings = Vec::new();
                    loop {
                        let Some(target) = next.lock().expect("no lane panics holding it").next() else {
                            return Ok(findings);
                        };
                        findings.extend(fuzz_one(
                            &cargo,
                            target,
                            seconds,
                            &fuzz_dir,
                            &build_dir.join(profile),
                            &target_root,
                        )?);
                    }
                })
            })
            .collect();
        lanes.into_iter().map(|lane| lane.join().expect("a fuzz lane panicked")).collect()
    });
    let mut findings = Vec::new();
    for lane in ran {
        findings.extend(lane?);
    }
    if !findings.is_empty() {
        bail!("the fuzzer found {} inputs:\n{}", findings.len(), findings.join("\n"));
    }
    Ok(())
}

/// Runs afl-fuzz on one target for `seconds` from its committed corpus, and
/// returns the crashes and hangs it found.
fn fuzz_one(
    cargo: &str,
    target: &str,
    seconds: u64,
    fuzz_dir: &Path,
    bin_dir: &Path,
    target_root: &Path,
) -> Result<Vec<String>> {
    let out = target_root.join("fuzz-out").join(target);
    // A fresh run each time: the committed corpus is the starting point.
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!("fuzz: {target} for {seconds} s");
    let status = Command::new(cargo)
        .args(["afl", "fuzz", "-V", &seconds.to_string(), "-t", &HANG_MS.to_string()])
        .args(["-m", &MEMORY_LIMIT_MIB.to_string(), "-i"])
        .arg(fuzz_dir.join("corpus").join(target))
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(bin_dir.join(target))
        .env("AFL_NO_UI", "1")
        // Shared CI machines: no CPU pinning or frequency scaling checks, and
        // crashes are seen by waiting on the child whatever core_pattern says.
        .env("AFL_NO_AFFINITY", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        .stdout(std::fs::File::create(out.join("afl.log"))?)
        .status()
        .with_context(|| format!("cargo afl fuzz {target}"))?;
    let stats = std::fs::read_to_string(out.join("default/fuzzer_stats")).unwrap_or_default();
    let stat = |key: &str| {
        stats.lines().find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix(':')).unwrap_or("?").trim().to_owned()
    };
    println!(
        "fuzz: {target}: {} execs, {} paths, edges {}",
        stat("execs_done"),
        stat("corpus_count"),
        stat("bitmap_cvg")
    );
    if !status.success() {
        bail!("afl-fuzz {target} failed with {status}; see {}", out.join("afl.log").display());
    }
    let mut findings = Vec::new();
    for kind in ["crashes", "hangs"] {
        let dir = out.join("default").join(kind);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_name() != "README.txt" {
                findings.push(format!("{target} {kind}: {}", entry.path().display()));
            }
        }
    }
    Ok(findings)
}
