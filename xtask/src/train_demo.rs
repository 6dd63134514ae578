//! `cargo xtask train-demo`: train the embedded demo model (`models/demo/`) from scratch on the CPU.
//!
//! The Python side is `xtask/train_demo/train.py`: a byte-level BPE tokenizer (Hugging Face tokenizers) and
//! a small OLMoE (transformers) trained on the English fortune files of Debian's `fortunes` package (BSD
//! licence), written as a standard Hugging Face checkpoint. It runs in the same pinned venv as
//! `cargo xtask fixtures` (`target/fixtures-venv`, from `xtask/fixtures/requirements.txt`) unless
//! `--python PATH` names an interpreter. The text comes from `/usr/share/games/fortunes`; when it is
//! missing on Debian, `apt-get install fortunes` installs it, elsewhere the task stops and says so.
//!
//! The run is deterministic for a given seed and thread count, checkpoints to `target/train-demo/` every
//! 100 steps and resumes from there when rerun; `--fresh` starts over.
//!
//! `--mtp` trains the second demo instead: a small DeepSeek-V3 (MLA, 64 routed experts a MoE layer) with its
//! multi-token-prediction layer, trained jointly on the same text with the demo's tokenizer, written to
//! `target/demo-mtp/` (never committed; work in `target/train-demo-mtp/`). It is the pair speculative decoding
//! drafts with for real, which `cargo xtask bench --only speculation` times.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{ArgAction, Parser};

use crate::cli::{parse_cli, workspace_root};
use crate::fixtures::ensure_venv;

/// Where Debian's `fortunes` and `fortunes-min` packages put the fortune files.
const FORTUNES_DIR: &str = "/usr/share/games/fortunes";
/// Files that only the full `fortunes` package ships (`fortunes-min` has just `fortunes`).
const FORTUNES_PROBES: &[&str] = &["fortunes", "computers", "people", "wisdom"];

/// The options of `cargo xtask train-demo`.
#[derive(Debug, Parser)]
#[command(
    name = "train-demo",
    bin_name = "cargo xtask train-demo",
    about = "Train the demo MoE (tokenizer + OLMoE) from scratch and write models/demo/; with --mtp, the MTP \
             demo (DeepSeek-V3 and its MTP layer) into target/demo-mtp/.",
    long_about = None,
    args_override_self = true,
    disable_help_flag = true
)]
struct Cli {
    /// use this Python (e.g. an existing venv's bin/python) instead of creating target/fixtures-venv and
    /// pip-installing xtask/fixtures/requirements.txt
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// interpreter used to create target/fixtures-venv (default: python3)
    #[arg(long, value_name = "PATH", default_value = "python3", hide_default_value = true)]
    base_python: PathBuf,
    /// train the MTP demo: a DeepSeek-V3 and its multi-token-prediction layer, the demo's tokenizer
    #[arg(long)]
    mtp: bool,
    /// checkpoint directory (default: models/demo; with --mtp, target/demo-mtp)
    #[arg(long, value_name = "DIR")]
    out: Option<String>,
    /// checkpoints, tokenizer and log while training (default: target/train-demo; with --mtp,
    /// target/train-demo-mtp)
    #[arg(long, value_name = "DIR")]
    work: Option<String>,
    /// torch threads (default: 1; the result depends on it)
    #[arg(long, value_name = "N", value_parser = positive)]
    threads: Option<String>,
    /// seed of the split, the chat mix, the initialisation and the batches (default: 1234)
    #[arg(long, value_name = "N")]
    seed: Option<String>,
    /// optimizer steps (default: 1800, about 50 minutes on one core; with --mtp, 500, about 20 minutes)
    #[arg(long, value_name = "N")]
    steps: Option<String>,
    /// ignore an interrupted run in --work and start over
    #[arg(long)]
    fresh: bool,
    /// rewrite --out from the best checkpoint in --work
    #[arg(long)]
    export_only: bool,
    /// let train.py run with unpinned torch/transformers/tokenizers
    #[arg(long)]
    allow_other_versions: bool,
    /// this text
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
    /// Arguments after `--` go to xtask/train_demo/train.py unchanged (see its --help)
    #[arg(last = true, value_name = "TRAIN_PY_ARGS")]
    train_py_args: Vec<String>,
}

/// A thread count: a positive integer, kept as written for train.py.
fn positive(v: &str) -> Result<String, String> {
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(v.to_string()),
        _ => Err("needs a positive integer".to_string()),
    }
}

#[derive(Debug, PartialEq)]
struct Opts {
    python: Option<PathBuf>,
    base_python: PathBuf,
    threads: u32,
    /// Arguments handed to train.py.
    forward: Vec<String>,
}

fn parse_args(args: &[String]) -> Result<Option<Opts>> {
    let Some(cli) = parse_cli::<Cli>("train-demo", args)? else {
        return Ok(None);
    };
    let mut forward = Vec::new();
    if cli.mtp {
        forward.extend(["--arch".to_string(), "deepseek_v3".to_string()]);
    }
    for (flag, value) in [
        ("--out", cli.out),
        ("--work", cli.work),
        ("--threads", cli.threads.clone()),
        ("--seed", cli.seed),
        ("--steps", cli.steps),
    ] {
        if let Some(v) = value {
            forward.extend([flag.to_string(), v]);
        }
    }
    for (flag, set) in [
        ("--fresh", cli.fresh),
        ("--export-only", cli.export_only),
        ("--allow-other-versions", cli.allow_other_versions),
    ] {
        if set {
            forward.push(flag.to_string());
        }
    }
    forward.extend(cli.train_py_args);
    let threads = match &cli.threads {
        Some(v) => v.parse().with_context(|| format!("--threads {v:?}"))?,
        None => 1,
    };
    Ok(Some(Opts { python: cli.python, base_python: cli.base_python, threads, forward }))
}

/// Entry point of `cargo xtask train-demo`. `args` are the arguments after `train-demo`.
pub fn run(args: &[String]) -> Result<()> {
    let Some(opts) = parse_args(args)? else {
        return Ok(());
    };
    let root = workspace_root();
    let script = root.join("xtask").join("train_demo").join("train.py");
    if !script.is_file() {
        bail!("missing {}", script.display());
    }
    ensure_fortunes(Path::new(FORTUNES_DIR))?;
    let python = match &opts.python {
        Some(p) if p.is_absolute() || p.components().count() == 1 => p.clone(),
        Some(p) => std::env::current_dir()?.join(p),
        None => ensure_venv(&root, &root.join("xtask").join("fixtures").join("requirements.txt"), &opts.base_python)?,
    };
    println!("train-demo: using Python {}", python.display());
    let threads = opts.threads.to_string();
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--fortunes")
        .arg(FORTUNES_DIR)
        .args(&opts.forward)
        .current_dir(&root)
        // CPU only and offline; the thread count is part of what makes the run reproducible.
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("OMP_NUM_THREADS", &threads)
        .env("MKL_NUM_THREADS", &threads)
        .env("PYTHONHASHSEED", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1");
    println!("+ {} {}", python.display(), shown_args(&cmd));
    let status = cmd.status().with_context(|| format!("failed to start {}", python.display()))?;
    if !status.success() {
        bail!("train.py failed ({status}); rerun the same command to resume from the last checkpoint");
    }
    Ok(())
}

fn shown_args(cmd: &Command) -> String {
    cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}

fn have_fortunes(dir: &Path) -> bool {
    FORTUNES_PROBES.iter().all(|f| dir.join(f).is_file())
}

/// Make sure Debian's `fortunes` package is installed; install it with apt-get on Debian.
fn ensure_fortunes(dir: &Path) -> Result<()> {
    if have_fortunes(dir) {
        return Ok(());
    }
    let hint = "the demo model is trained on the English fortune files of Debian's `fortunes` package \
                (BSD licence), expected in /usr/share/games/fortunes";
    if !Path::new("/etc/debian_version").exists() {
        bail!("{hint}; this is not Debian: install that package's files there by hand");
    }
    println!("train-demo: installing Debian's `fortunes` package");
    let apt = |args: &[&str]| -> Result<bool> {
        println!("+ apt-get {}", args.join(" "));
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .with_context(|| format!("{hint}; could not run apt-get"))?;
        Ok(status.success())
    };
    if !apt(&["install", "-y", "--no-install-recommends", "fortunes"])? {
        // A fresh machine may have no package lists yet.
        if !(apt(&["update"])? && apt(&["install", "-y", "--no-install-recommends", "fortunes"])?) {
            bail!("{hint}; `apt-get install fortunes` failed (run it as root)");
        }
    }
    if !have_fortunes(dir) {
        bail!("{hint}; `apt-get install fortunes` succeeded but the files are not there");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_forward_nothing() {
        let o = parse_args(&[]).unwrap().unwrap();
        assert_eq!(o, Opts { python: None, base_python: "python3".into(), threads: 1, forward: vec![] });
    }

    #[test]
    fn options_are_forwarded_to_train_py() {
        let args = strings(&[
            "train-demo",
            "--python=/v/bin/python",
            "--threads",
            "2",
            "--steps=10",
            "--fresh",
            "--",
            "--lr",
            "1e-3",
        ]);
        let o = parse_args(&args).unwrap().unwrap();
        assert_eq!(o.python, Some(PathBuf::from("/v/bin/python")));
        assert_eq!(o.threads, 2);
        assert_eq!(o.forward, strings(&["--threads", "2", "--steps", "10", "--fresh", "--lr", "1e-3"]));
    }

    #[test]
    fn mtp_trains_the_deepseek_v3_pair() {
        let o = parse_args(&strings(&["--mtp", "--steps", "5"])).unwrap().unwrap();
        assert_eq!(o.forward, strings(&["--arch", "deepseek_v3", "--steps", "5"]));
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse_args(&strings(&["--threads", "0"])).is_err());
        assert!(parse_args(&strings(&["--steps"])).is_err());
        assert!(parse_args(&strings(&["--bogus"])).is_err());
        assert!(parse_args(&strings(&["--help"])).unwrap().is_none());
    }
}
