//! `cargo xtask bench --peer llama.cpp`: the same model run by Strata and by
//! llama.cpp, alternately, resident and bigger than RAM under one memory
//! cgroup.
//!
//! Everything it needs is installed under `OUT/peer` (default
//! `target/bench/peer`) on first use and reused: a Python venv with cmake,
//! numpy and pyyaml from PyPI; the llama-cpp-python sdist (which vendors
//! llama.cpp), from which `llama-bench` is built with `-DGGML_NATIVE=ON`
//! less AMX (see `build_llama_cpp`); an OLMoE-1B-7B-shaped synthetic q4
//! container, and its GGUF at the nearest
//! quantization (`xtask/bench/strata_to_gguf.py`: Q4_0 experts, Q8_0 other
//! matrices; the same bytes per weight as Strata's q4 preset).
//!
//! Rows (ratio = Strata ÷ llama.cpp, the peer being the bound here):
//! - resident decode: llama-bench `tg` (model in the page cache, mmap)
//!   against every decode step of `strata generate` (as a user sees it),
//!   against its fully cached steps, and against `--activations q8` (lossy
//!   int8 inputs, as llama.cpp computes), at least five alternations; resident
//!   prefill (64 tokens); both engines again beside a competing process (a
//!   busy loop on one core, a known load: a row with no goal);
//! - bigger than RAM: both under a cgroup v1 memory limit of 40% of the
//!   GGUF file, page caches emptied first: llama-bench `tg` with `--repack 0`
//!   (repacking's anonymous copy is OOM-killed at 40%,
//!   shared/research/peer-llamacpp.md) against Strata with `--io direct` and
//!   `--ram-budget` the limit less its slack.
//!
//! Every run waits for a quiet machine and records what the rest of it did
//! (`bench_quiet`): a row whose runs shared the machine is marked loaded and
//! compared with no goal, since llama.cpp's spinning threads collapse when
//! anything else takes a core.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::options::Options;
use super::report::{Report, Row};
use super::stats::median;
use crate::cli::workspace_root;

const SDIST: &str = "llama_cpp_python-0.3.36";

/// llama.cpp's build directory, named for its flags so that a build made
/// with other flags is not reused.
const BUILD_DIR: &str = "build-noamx";

/// The cgroup (v1 memory controller) both engines run in for the
/// bigger-than-RAM rows.
const CGROUP: &str = "/sys/fs/cgroup/memory/strata-bench-peer";

/// Memory the Strata process may use beyond `--ram-budget`: the engine's
/// `SLACK_BYTES` (binary, stacks, allocator, activations). With `--io
/// direct` expert reads bypass the page cache, and the dense file's pages
/// are inside the budget, so nothing else is charged to the cgroup.
const STRATA_SLACK_BYTES: u64 = 96 << 20;

/// Context for the cgroup runs: the KV arena is reserved for the whole
/// context out of the budget, and 16 decode steps after an 8-token prompt
/// need only this much.
const CGROUP_CONTEXT: &str = "64";

pub(crate) fn run(peer: &str, opts: &Options) -> Result<()> {
    if peer != "llama.cpp" {
        bail!("unknown peer {peer:?} (known: llama.cpp)");
    }
    let started = std::time::Instant::now();
    let dir = opts.out.join("peer");
    std::fs::create_dir_all(&dir)?;
    let bins = super::common::build(opts.bins.as_deref())?;
    let llama_bench = build_llama_cpp(&dir)?;
    let model = super::common::synth(&bins, opts, "olmoe-1b-7b", 4)?;
    let gguf = dir.join("olmoe-1b-7b-l4-q4.gguf");
    if !gguf.exists() {
        eprintln!("peer: converting {} to GGUF (Q4_0 experts, Q8_0 the rest)", model.display());
        let tmp = gguf.with_extension("gguf.tmp");
        let status = Command::new(dir.join("venv/bin/python"))
            .arg(workspace_root().join("xtask/bench/strata_to_gguf.py"))
            .arg(&model)
            .arg(&tmp)
            .env("PYTHONPATH", llama_dir(&dir).join("gguf-py"))
            .status()
            .context("running strata_to_gguf.py")?;
        if !status.success() {
            bail!("strata_to_gguf.py failed with {status}");
        }
        std::fs::rename(&tmp, &gguf)?;
    }
    let mut report = Report::new(super::common::machine_info());
    resident(&bins, &llama_bench, &model, &gguf, opts, &mut report)?;
    bigger_than_ram(&bins, &llama_bench, &model, &gguf, opts, &mut report)?;
    report.notes.push(format!(
        "Peer: llama.cpp from the {SDIST} sdist (vendored llama.cpp), built with -DGGML_NATIVE=ON less AMX; model: \
         OLMoE-1B-7B shapes, 4 layers, random weights; GGUF at the nearest quantization."
    ));
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.write(&dir)?;
    println!("{}", report.table());
    println!("wrote {}", dir.join("report.md").display());
    Ok(())
}

fn llama_dir(dir: &Path) -> PathBuf {
    dir.join(SDIST).join("vendor").join("llama.cpp")
}

fn check(status: std::io::Result<std::process::ExitStatus>, what: &str) -> Result<()> {
    let status = status.with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed with {status}");
    }
    Ok(())
}

/// The venv, the sdist and `llama-bench`, each made once.
fn build_llama_cpp(dir: &Path) -> Result<PathBuf> {
    let venv = dir.join("venv");
    if !venv.join("bin/cmake").exists() {
        eprintln!("peer: creating a venv with cmake, numpy, pyyaml");
        check(Command::new("python3").args(["-m", "venv"]).arg(&venv).status(), "python3 -m venv")?;
        check(
            Command::new(venv.join("bin/pip")).args(["install", "-q", "cmake", "numpy", "pyyaml"]).status(),
            "pip install",
        )?;
    }
    let tarball = dir.join("sdist").join(format!("{SDIST}.tar.gz"));
    if !tarball.exists() {
        eprintln!("peer: downloading the llama-cpp-python sdist (it vendors llama.cpp)");
        check(
            Command::new(venv.join("bin/pip"))
                .args(["download", "-q", "--no-deps", "--no-binary", "llama-cpp-python", "llama-cpp-python==0.3.36"])
                .arg("-d")
                .arg(dir.join("sdist"))
                .status(),
            "pip download",
        )?;
    }
    let llama = llama_dir(dir);
    if !llama.join("CMakeLists.txt").exists() {
        check(Command::new("tar").arg("xzf").arg(&tarball).arg("-C").arg(dir).status(), "tar")?;
    }
    let bench = llama.join(BUILD_DIR).join("bin/llama-bench");
    if !bench.exists() {
        eprintln!("peer: building llama-bench (several minutes on 2 cores)");
        let cmake = venv.join("bin/cmake");
        // Without AMX: on a CPU with AMX, llama-bench built with it died
        // of SIGSEGV at its first `ldtilecfg` whenever this program started
        // it (never from a shell; 2026-12-02), and the two builds ran at the
        // same speed from a shell there (tg32 41.1 / 40.8 tok/s, pp64 285 /
        // 287): AMX serves batched products only.
        let no_amx = if cfg!(target_arch = "x86_64") { "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" } else { "" };
        check(
            Command::new(&cmake)
                .current_dir(&llama)
                .args(["-S", ".", "-B", BUILD_DIR, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON"])
                .arg(format!("-DCMAKE_C_FLAGS={no_amx}"))
                .arg(format!("-DCMAKE_CXX_FLAGS={no_amx}"))
                .args([
                    "-DLLAMA_CURL=OFF",
                    "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF",
                ])
                .args(["-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"])
                .arg("-DBUILD_SHARED_LIBS=OFF")
                .status(),
            "cmake configure",
        )?;
        check(
            Command::new(&cmake)
                .current_dir(&llama)
                .args(["--build", BUILD_DIR, "-j2", "--target", "llama-bench"])
                .status(),
            "cmake --build",
        )?;
    }
    Ok(bench)
}

/// Runs `bin args`, inside the peer cgroup when `cgroup`, once the machine
/// is quiet (its load recorded for the next row); returns stdout.
fn output(bin: &Path, args: &[String], cgroup: bool) -> Result<String> {
    let mut cmd = if cgroup {
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("echo $$ > {CGROUP}/cgroup.procs && exec \"$@\"")).arg("sh").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args);
    let out = super::quiet::measured(|| cmd.output().with_context(|| format!("running {}", bin.display())))?;
    if !out.status.success() {
        bail!(
            "{} failed with {} (an OOM kill shows as signal 9): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// tokens/s of llama-bench's single test (`-p P -n N`, one repetition).
fn llama_bench_ts(
    bench: &Path,
    gguf: &Path,
    prompt: usize,
    gen_tokens: usize,
    extra: &[&str],
    cgroup: bool,
) -> Result<f64> {
    let mut args = vec![
        "-m".to_string(),
        gguf.display().to_string(),
        "-t".into(),
        "2".into(),
        "-p".into(),
        prompt.to_string(),
        "-n".into(),
        gen_tokens.to_string(),
        "-r".into(),
        "1".into(),
        "-o".into(),
        "json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let text = output(bench, &args, cgroup)?;
    let start = text.find('[').context("llama-bench printed no JSON")?;
    let v: Value = serde_json::from_str(&text[start..]).context("parsing llama-bench JSON")?;
    v[0]["avg_ts"].as_f64().context("llama-bench avg_ts")
}

/// Strata's `generate --json` stats.
fn strata(
    bins_strata: &Path,
    model: &Path,
    prompt: &str,
    max_new: usize,
    extra: &[&str],
    cgroup: bool,
) -> Result<Value> {
    let mut args = vec![
        "generate".to_string(),
        model.display().to_string(),
        "--tokens".into(),
        prompt.into(),
        "--max-new-tokens".into(),
        max_new.to_string(),
        "--ignore-eos".into(),
        "--json".into(),
        // Sampled from a fixed seed: greedy decoding of random weights
        // loops over a few tokens (2 to 9 here) whose experts a cache then
        // keeps, where llama-bench's `tg` feeds a random token each step.
        "--temperature".into(),
        "1".into(),
        "--seed".into(),
        "1".into(),
        "--threads".into(),
        "2".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let text = output(bins_strata, &args, cgroup)?;
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).context("strata printed nothing")?;
    Ok(serde_json::from_str::<Value>(last)?["stats"].clone())
}

/// A row of Strata's runs against the peer's, alternated run by run.
fn row(name: &str, strata: &[f64], peer: &[f64], goal: Option<f64>, note: &str) -> Row {
    let (measured, bound) = (median(strata), median(peer));
    Row {
        suite: "peer".into(),
        runs: strata.to_vec(),
        bound_runs: peer.to_vec(),
        load: None,
        name: name.into(),
        measured,
        unit: "tok/s".into(),
        limit_name: "llama.cpp on the same model, same run".into(),
        limit: bound,
        limit_unit: "tok/s".into(),
        bound,
        ratio: measured / bound,
        goal,
        note: note.into(),
    }
}

/// Resident decode runs of `strata generate` and llama-bench `tg32`,
/// alternated: Strata's rate over every decode step, over its fully cached
/// steps, with `--activations q8` (int8 inputs, lossy) where asked for, and
/// llama.cpp's.
#[derive(Default)]
struct DecodeRuns {
    ours_all: Vec<f64>,
    ours_cached: Vec<f64>,
    ours_lossy: Vec<f64>,
    theirs: Vec<f64>,
}

/// Strata's flags for the resident decode runs.
const RESIDENT_FLAGS: [&str; 2] = ["--ram-budget", "16GiB"];

impl DecodeRuns {
    fn run(&mut self, bins: &super::common::Bins, bench: &Path, model: &Path, gguf: &Path, lossy: bool) -> Result<()> {
        self.theirs.push(llama_bench_ts(bench, gguf, 0, 32, &[], false)?);
        if lossy {
            let flags = [RESIDENT_FLAGS.as_slice(), &["--activations", "q8"]].concat();
            let stats = strata(&bins.strata, model, "1,2,3,4,5,6,7,8", 48, &flags, false)?;
            self.ours_lossy.push(stats["decode_tokens_per_s"].as_f64().context("decode_tokens_per_s")?);
        }
        let stats = strata(&bins.strata, model, "1,2,3,4,5,6,7,8", 48, &RESIDENT_FLAGS, false)?;
        let steps: Vec<f64> = stats["per_token"]
            .as_array()
            .into_iter()
            .flatten()
            .skip(1)
            .filter(|s| s["expert_misses"].as_u64() == Some(0))
            .filter_map(|s| s["ms"].as_f64())
            .collect();
        self.ours_cached.push(1000.0 / median(&steps));
        self.ours_all.push(stats["decode_tokens_per_s"].as_f64().context("decode_tokens_per_s")?);
        Ok(())
    }
}

/// Alternations of the resident rows: a quiet machine varies by a tenth from
/// run to run (2026-12-02: llama.cpp 87.9–100.8 tok/s), so a median needs
/// more than three.
const RESIDENT_RUNS_MIN: usize = 5;

/// Alternations of the rows beside a competing process.
const COMPETING_RUNS: usize = 3;

fn resident(
    bins: &super::common::Bins,
    bench: &Path,
    model: &Path,
    gguf: &Path,
    opts: &Options,
    report: &mut Report,
) -> Result<()> {
    let (mut decode, mut ours_pp, mut theirs_pp) = (DecodeRuns::default(), Vec::new(), Vec::new());
    // Warm both models into the page cache, as a model run before is: the
    // bigger-than-RAM runs of an earlier bench leave them evicted. (Only the
    // GGUF was read until 2026-12-02, so Strata's first run read its
    // container from disk.)
    for file in std::iter::once(gguf.to_path_buf()).chain(super::common::model_files(model)?) {
        std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    }
    let reps = opts.reps.max(RESIDENT_RUNS_MIN);
    for rep in 0..reps {
        eprintln!("peer: resident, run {}/{reps}", rep + 1);
        decode.run(bins, bench, model, gguf, true)?;
    }
    report.push(row(
        "resident decode as a user runs it, Strata q4 vs llama.cpp Q4_0 (2 threads)",
        &decode.ours_all,
        &decode.theirs,
        Some(1.0),
        "Strata: every decode step of `strata generate` (48 tokens, the expert cache filling from the page cache); llama.cpp: llama-bench tg32 (mmap, repack on)",
    ));
    report.push(row(
        "resident decode with --activations q8 (int8 inputs: lossy), as a user runs it",
        &decode.ours_lossy,
        &decode.theirs,
        Some(1.2),
        "Strata: as the row above with `--activations q8` (llama.cpp's int8 arithmetic; logit costs in docs/BENCHMARKS.md, \
         \"int8 activations\"), alternated with it; llama.cpp: the same llama-bench tg32 runs",
    ));
    report.push(row(
        "resident decode, warm steps, Strata q4 vs llama.cpp Q4_0 (2 threads)",
        &decode.ours_cached,
        &decode.theirs,
        Some(1.3),
        "Strata: fully cached decode steps of the same runs; llama.cpp: llama-bench tg32 (mmap, repack on)",
    ));
    for rep in 0..opts.reps {
        eprintln!("peer: resident prefill, run {}/{}", rep + 1, opts.reps);
        theirs_pp.push(llama_bench_ts(bench, gguf, 64, 0, &[], false)?);
        // A warm prefill, as llama-bench's (it runs a warm-up first): the
        // experts the prompt routes to are already in the expert cache.
        let a: Vec<String> = ["batch", "--model", &model.display().to_string(), "--prompt-tokens", "64"]
            .into_iter()
            .chain(["--steps", "1", "--warm", "1"])
            .map(String::from)
            .collect();
        let v = super::common::run_json(bins.probe(), &a)?;
        ours_pp.push(v["prefill_tokens_per_s"].as_f64().context("prefill_tokens_per_s")?);
    }
    report.push(row(
        "resident prefill, 64 tokens",
        &ours_pp,
        &theirs_pp,
        Some(1.0),
        "Strata: a 64-token prompt after a warm-up prefill (strata-probe batch --warm 1); llama-bench pp64",
    ));
    // Both engines beside a known load: one core of the two kept busy by a
    // shell loop. Not the resident speed (no goal), but what a user sees when
    // a browser or a build shares the machine: spinning threads wait for the
    // core they lost.
    let mut competing = DecodeRuns::default();
    {
        let _busy = super::quiet::BusyCore::start(1)?;
        for rep in 0..COMPETING_RUNS {
            eprintln!("peer: resident beside a busy core, run {}/{COMPETING_RUNS}", rep + 1);
            competing.run(bins, bench, model, gguf, false)?;
        }
    }
    report.push(row(
        "resident decode beside a competing process (one core busy), as a user runs it",
        &competing.ours_all,
        &competing.theirs,
        None,
        "a shell loop pinned to core 1 (taskset) for the whole run, both engines at 2 threads; a known load, so the \
         runs count as quiet when nothing else ran",
    ));
    report.raw.push(json!({
        "peer": "resident", "strata_tg": decode.ours_cached, "strata_tg_all_steps": decode.ours_all,
        "strata_tg_all_steps_activations_q8": decode.ours_lossy,
        "llama_tg": decode.theirs, "strata_pp": ours_pp, "llama_pp": theirs_pp,
        "competing": { "strata_tg_all_steps": competing.ours_all, "llama_tg": competing.theirs },
    }));
    Ok(())
}

fn bigger_than_ram(
    bins: &super::common::Bins,
    bench: &Path,
    model: &Path,
    gguf: &Path,
    opts: &Options,
    report: &mut Report,
) -> Result<()> {
    let limit = (std::fs::metadata(gguf)?.len() as f64 * 0.4) as u64;
    std::fs::create_dir_all(CGROUP)
        .with_context(|| format!("creating {CGROUP} (cgroup v1 memory controller, root)"))?;
    std::fs::write(format!("{CGROUP}/memory.limit_in_bytes"), limit.to_string()).context("setting the memory limit")?;
    let budget = format!("{}MiB", (limit - STRATA_SLACK_BYTES) >> 20);
    let mut files = vec![gguf.to_path_buf()];
    files.extend(super::common::model_files(model)?);
    let (mut ours, mut theirs, mut notes) = (Vec::new(), Vec::new(), Vec::new());
    let result = (|| -> Result<()> {
        for rep in 0..opts.reps {
            eprintln!("peer: 40% of the model in a cgroup ({} MiB), run {}/{}", limit >> 20, rep + 1, opts.reps);
            super::common::evict(bins, &files)?;
            match llama_bench_ts(bench, gguf, 0, 16, &["--repack", "0"], true) {
                Ok(ts) => theirs.push(ts),
                Err(e) => notes.push(format!("llama.cpp run {rep}: {e}")),
            }
            super::common::evict(bins, &files)?;
            let extra = ["--ram-budget", budget.as_str(), "--io", "direct", "--context", CGROUP_CONTEXT];
            let stats = strata(&bins.strata, model, "1,2,3,4,5,6,7,8", 16, &extra, true)?;
            ours.push(stats["decode_tokens_per_s"].as_f64().context("decode_tokens_per_s")?);
        }
        Ok(())
    })();
    // Leave no cgroup behind (its processes have all exited by now).
    let _ = std::fs::remove_dir(CGROUP);
    result?;
    report.push(row(
        &format!("bigger than RAM: decode in a cgroup of 40% of the model ({} MiB)", limit >> 20),
        &ours,
        &theirs,
        Some(15.0),
        &format!(
            "page caches emptied; Strata --io direct --ram-budget {budget} --context {CGROUP_CONTEXT}; \
             llama-bench tg16 --repack 0 (mmap)"
        ),
    ));
    report.notes.extend(notes);
    report.raw.push(json!({ "peer": "bigger_than_ram", "limit_bytes": limit, "strata_tg": ours, "llama_tg": theirs }));
    Ok(())
}
