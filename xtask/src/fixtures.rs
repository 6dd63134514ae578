//! `cargo xtask fixtures`: regenerate the Hugging Face reference fixtures under `testdata/<family>/`.
//!
//! Stage 1 (Python only): for each family, a tiny random checkpoint of the real architecture written by
//! transformers' `save_pretrained` (`hf/`), the same weights in bf16 with a 4.x-style config (`hf_bf16/`),
//! teacher-forced logits (`logits_f32.npy`, `logits_bf16.npy`) and `reference.json` (prompt, greedy
//! continuation, margins, routing, versions); for gpt_oss also `hf_mxfp4/`, the same model with its experts
//! packed as the hub's MXFP4 `*_blocks`/`*_scales`.
//!
//! Stage 2 (needs the `strata` CLI): for each quant, `strata convert testdata/<f>/hf <tmp>/<q> --quant <q>`,
//! `strata export <tmp>/<q> <tmp>/<q>_hf`, then transformers float32 logits of the exported checkpoint on the
//! stage-1 prompt -> `logits_<q>.npy` and `reference_<q>.json`.
//!
//! DeepSeek-V3, Qwen3-Next, Qwen3.5, Inkling, GLM-5 and Kimi K2.5 also get `testdata/<family>_mtp/`: the
//! checkpoint with a seeded multi-token-prediction module and, but for GLM-5's (transformers does not run its
//! MTP layer), its draft logits, f32 in stage 1 and on each quant's export in stage 2
//! (`mtp_ref.py`).
//!
//! The Python side lives in `xtask/fixtures/` (`gen_fixtures.py`, `numpy_ref.py`, pinned `requirements.txt`).
//! By default a venv is created in `target/fixtures-venv` with `python3 -m venv` and the pinned requirements
//! are pip-installed from PyPI (reused while `requirements.txt` is unchanged); `--python PATH` uses an
//! existing interpreter instead.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{ArgAction, Parser};

use crate::cli::{non_empty, parse_cli, workspace_root};

/// Families with fixtures, in generation order.
pub const FAMILIES: &[&str] = &[
    "olmoe",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "glm_moe_dsa",
    "kimi_k25",
    "qwen3_next",
    "qwen3_5_moe",
    "gpt_oss",
    "kimi_linear",
    "qwen4_exp",
    "deepseek_v4",
    "inkling",
    "glm5_next",
    "kimi_k3",
];
/// Families whose reference is a script of their own rather than transformers through
/// gen_fixtures.py (transformers has no Kimi K3): stage 1 runs `SCRIPT OUT/FAMILY` (block fixtures) and
/// `SCRIPT --model OUT/FAMILY`, stage 2 `SCRIPT --quantized QUANT CKPT OUT/FAMILY`.
const OWN_REFERENCES: [(&str, &str); 1] = [("kimi_k3", "kimi_k3_ref.py")];

fn own_reference(family: &str) -> Option<&'static str> {
    OWN_REFERENCES.iter().find(|(f, _)| *f == family).map(|(_, script)| *script)
}
/// Families whose fixture has a multi-token-prediction twin, `OUT/FAMILY_mtp` (the fixture's checkpoint
/// plus a seeded MTP module), made by [`MTP_SCRIPT`], and whether the twin has draft logits (GLM-5's has
/// none: transformers does not run its MTP layer): stage 1 runs `SCRIPT FAMILY OUT`
/// after the family's own fixture; for a twin with draft logits, stage 2 converts and exports
/// `FAMILY_mtp/hf` and runs `SCRIPT --dequantized CKPT QUANT FAMILY OUT`.
const MTP_FAMILIES: [(&str, bool); 6] = [
    ("deepseek_v3", true),
    ("qwen3_next", true),
    ("qwen3_5_moe", true),
    ("inkling", true),
    ("glm_moe_dsa", false),
    ("kimi_k25", true),
];
const MTP_SCRIPT: &str = "mtp_ref.py";

fn has_mtp_twin(family: &str) -> bool {
    MTP_FAMILIES.iter().any(|(f, _)| *f == family)
}

fn has_mtp_draft_logits(family: &str) -> bool {
    MTP_FAMILIES.iter().any(|(f, logits)| *f == family && *logits)
}
/// Reference scripts run with the full set in stage 1: the demo model's
/// logits (testdata/demo) and transformers' tokenizer and chat-template
/// renderings (testdata/templates, testdata/tokenizer).
const EXTRA_SCRIPTS: [&str; 2] = ["demo_ref.py", "templates.py"];
/// Quantisations exercised by stage 2.
pub const QUANTS: &[&str] = &["q8", "q4"];
/// Soft budget for the committed fixtures of [`FAMILIES`].
const SIZE_BUDGET_BYTES: u64 = 10 * 1024 * 1024;

/// The options of `cargo xtask fixtures`.
#[derive(Debug, Parser)]
#[command(
    name = "fixtures",
    bin_name = "cargo xtask fixtures",
    about = "Regenerate the transformers reference fixtures in testdata/<family>/.",
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
    /// only the HF checkpoints + reference logits (no strata needed)
    #[arg(long = "stage1-only", conflicts_with = "stage2_only")]
    stage1_only: bool,
    /// only the strata convert/export round trip (needs stage-1 fixtures)
    #[arg(long = "stage2-only")]
    stage2_only: bool,
    /// restrict to these families (repeatable; default: all six families)
    #[arg(long = "family", alias = "families", value_name = "NAME[,NAME]", value_delimiter = ',')]
    families: Vec<String>,
    /// stage 2 quantisations (repeatable; default: q8,q4)
    #[arg(long = "quant", alias = "quants", value_name = "Q[,Q]", value_delimiter = ',')]
    quants: Vec<String>,
    /// use this strata binary instead of `cargo build --release -p strata`
    #[arg(long, value_name = "PATH")]
    strata: Option<PathBuf>,
    /// fixture root (default: testdata), e.g. to diff a regeneration
    #[arg(long, value_name = "DIR", default_value = "testdata", hide_default_value = true)]
    out: PathBuf,
    /// keep target/fixtures-tmp/ (stage-2 converted/exported checkpoints)
    #[arg(long)]
    keep_tmp: bool,
    /// let the Python script run with unpinned torch/transformers versions
    #[arg(long)]
    allow_other_versions: bool,
    /// this text
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
}

#[derive(Debug)]
struct Opts {
    python: Option<PathBuf>,
    base_python: PathBuf,
    stage1: bool,
    stage2: bool,
    families: Vec<String>,
    quants: Vec<String>,
    strata: Option<PathBuf>,
    out: PathBuf,
    keep_tmp: bool,
    allow_other_versions: bool,
}

fn parse_args(args: &[String]) -> Result<Option<Opts>> {
    let Some(cli) = parse_cli::<Cli>("fixtures", args)? else {
        return Ok(None);
    };
    let mut families = non_empty(cli.families);
    if families.is_empty() {
        families = FAMILIES.iter().map(|s| s.to_string()).collect();
    }
    for f in &families {
        if !FAMILIES.contains(&f.as_str()) {
            bail!("unknown family {f:?}; known: {}", FAMILIES.join(", "));
        }
    }
    let mut quants = non_empty(cli.quants);
    if quants.is_empty() {
        quants = QUANTS.iter().map(|s| s.to_string()).collect();
    }
    Ok(Some(Opts {
        python: cli.python,
        base_python: cli.base_python,
        stage1: !cli.stage2_only,
        stage2: !cli.stage1_only,
        families,
        quants,
        strata: cli.strata,
        out: cli.out,
        keep_tmp: cli.keep_tmp,
        allow_other_versions: cli.allow_other_versions,
    }))
}

/// Entry point of `cargo xtask fixtures`. `args` are the arguments after `fixtures` (a leading
/// `"fixtures"` is tolerated).
pub fn run(args: &[String]) -> Result<()> {
    let Some(opts) = parse_args(args)? else {
        return Ok(());
    };
    let root = workspace_root();
    let script_dir = root.join("xtask").join("fixtures");
    let script = script_dir.join("gen_fixtures.py");
    if !script.is_file() {
        bail!("missing {}", script.display());
    }
    let out = if opts.out.is_absolute() { opts.out.clone() } else { root.join(&opts.out) };

    let python = resolve_python(&root, opts.python.as_deref(), &opts.base_python)?;

    let mut py_common: Vec<String> = vec!["--out".into(), path_str(&out)?];
    if opts.allow_other_versions {
        py_common.push("--allow-other-versions".into());
    }

    if opts.stage1 {
        println!("fixtures: stage 1 ({})", opts.families.join(", "));
        let (own, transformers): (Vec<&String>, Vec<&String>) =
            opts.families.iter().partition(|f| own_reference(f).is_some());
        if !transformers.is_empty() {
            let mut cmd = python_cmd(&python, &script);
            cmd.arg("stage1").args(&py_common);
            for f in transformers {
                cmd.args(["--family", f]);
            }
            run_cmd(&mut cmd, &root)?;
        }
        for f in own {
            let own_script = script_dir.join(own_reference(f).context("partitioned by own_reference")?);
            run_cmd(python_cmd(&python, &own_script).arg(out.join(f)), &root)?;
            run_cmd(python_cmd(&python, &own_script).arg("--model").arg(out.join(f)), &root)?;
        }
        for f in opts.families.iter().filter(|f| has_mtp_twin(f)) {
            run_cmd(python_cmd(&python, &script_dir.join(MTP_SCRIPT)).arg(f).arg(&out), &root)?;
        }
        // The demo model's references and the tokenizer/chat-template
        // fixtures belong to no family: regenerated with the full set.
        if opts.families.len() == FAMILIES.len() {
            for extra in EXTRA_SCRIPTS {
                run_cmd(&mut python_cmd(&python, &root.join("xtask/fixtures").join(extra)), &root)?;
            }
        }
    }

    if opts.stage2 {
        for f in &opts.families {
            let reference = out.join(f).join("reference.json");
            if !reference.is_file() {
                bail!("{} is missing: run stage 1 first (`cargo xtask fixtures --stage1-only`)", reference.display());
            }
        }
        let strata = match &opts.strata {
            Some(p) => p.clone(),
            None => build_strata(&root)?,
        };
        println!("fixtures: stage 2 with {} ({})", strata.display(), opts.quants.join(", "));
        let tmp_root = root.join("target").join("fixtures-tmp");
        for f in &opts.families {
            let tmp = tmp_root.join(f);
            if tmp.exists() {
                fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
            }
            fs::create_dir_all(&tmp)?;
            let hf = out.join(f).join("hf");
            for q in &opts.quants {
                let converted = tmp.join(q);
                let exported = tmp.join(format!("{q}_hf"));
                run_cmd(Command::new(&strata).arg("convert").arg(&hf).arg(&converted).args(["--quant", q]), &root)?;
                run_cmd(Command::new(&strata).arg("export").arg(&converted).arg(&exported), &root)?;
                let mut cmd = match own_reference(f) {
                    Some(own_script) => {
                        let mut cmd = python_cmd(&python, &script_dir.join(own_script));
                        cmd.args(["--quantized", q]).arg(&exported).arg(out.join(f));
                        cmd
                    }
                    None => {
                        let mut cmd = python_cmd(&python, &script);
                        cmd.arg("stage2").args(&py_common).args(["--family", f, "--quant", q]);
                        cmd.arg("--ckpt").arg(&exported);
                        cmd
                    }
                };
                run_cmd(&mut cmd, &root)?;
                if has_mtp_draft_logits(f) {
                    let hf = out.join(format!("{f}_mtp")).join("hf");
                    let converted = tmp.join(format!("{q}_mtp"));
                    let exported = tmp.join(format!("{q}_mtp_hf"));
                    run_cmd(Command::new(&strata).arg("convert").arg(&hf).arg(&converted).args(["--quant", q]), &root)?;
                    run_cmd(Command::new(&strata).arg("export").arg(&converted).arg(&exported), &root)?;
                    let mut cmd = python_cmd(&python, &script_dir.join(MTP_SCRIPT));
                    cmd.arg("--dequantized").arg(&exported).args([q, f]).arg(&out);
                    run_cmd(&mut cmd, &root)?;
                }
            }
        }
        if !opts.keep_tmp && tmp_root.exists() {
            fs::remove_dir_all(&tmp_root).with_context(|| format!("removing {}", tmp_root.display()))?;
        }
    }

    summarize(&out, &opts)
}

/// The interpreter for the scripts in `xtask/fixtures/`: `explicit` (`--python`; a relative path is taken
/// from the current directory) or else the pinned venv of [`ensure_venv`], created with `base_python`.
pub(crate) fn resolve_python(root: &Path, explicit: Option<&Path>, base_python: &Path) -> Result<PathBuf> {
    match explicit {
        Some(p) => {
            let p = if p.is_absolute() || p.components().count() == 1 {
                p.to_path_buf()
            } else {
                std::env::current_dir()?.join(p)
            };
            println!("fixtures: using Python {}", p.display());
            Ok(p)
        }
        None => ensure_venv(root, &root.join("xtask").join("fixtures").join("requirements.txt"), base_python),
    }
}

pub(crate) fn path_str(p: &Path) -> Result<String> {
    p.to_str().map(str::to_string).with_context(|| format!("non-UTF-8 path {}", p.display()))
}

fn venv_python(venv: &Path) -> PathBuf {
    if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") }
}

/// Create (or reuse) `target/fixtures-venv` with exactly the pinned requirements.
pub(crate) fn ensure_venv(root: &Path, requirements: &Path, base_python: &Path) -> Result<PathBuf> {
    let venv = root.join("target").join("fixtures-venv");
    let python = venv_python(&venv);
    let stamp = venv.join(".strata-requirements");
    let wanted = fs::read_to_string(requirements).with_context(|| format!("reading {}", requirements.display()))?;
    if python.is_file() && fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        println!("fixtures: reusing {}", venv.display());
        return Ok(python);
    }
    if venv.exists() {
        println!("fixtures: {} is stale, recreating it", venv.display());
        fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    println!("fixtures: creating {} (pip-installs torch; takes a few minutes)", venv.display());
    run_cmd(Command::new(base_python).args(["-m", "venv"]).arg(&venv), root)
        .context("creating the fixtures venv (is python3 with the venv module installed?)")?;
    run_cmd(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-r"])
            .arg(requirements),
        root,
    )?;
    fs::write(&stamp, wanted)?;
    Ok(python)
}

pub(crate) fn python_cmd(python: &Path, script: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(script)
        // CPU only, single-threaded, offline: the references must not depend on the machine.
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("OMP_NUM_THREADS", "1")
        .env("MKL_NUM_THREADS", "1")
        .env("PYTHONHASHSEED", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("TOKENIZERS_PARALLELISM", "false")
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1");
    cmd
}

pub(crate) fn build_strata(root: &Path) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run_cmd(Command::new(cargo).args(["build", "--release", "-p", "strata"]), root)?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() { target } else { root.join(target) };
    let bin = target.join("release").join(if cfg!(windows) { "strata.exe" } else { "strata" });
    if !bin.is_file() {
        bail!("built strata but {} does not exist", bin.display());
    }
    Ok(bin)
}

pub(crate) fn run_cmd(cmd: &mut Command, cwd: &Path) -> Result<()> {
    cmd.current_dir(cwd);
    let shown = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| {
            let s = s.to_string_lossy();
            let cwd = cwd.to_string_lossy();
            s.strip_prefix(&format!("{cwd}/")).map(str::to_string).unwrap_or_else(|| s.to_string())
        })
        .collect::<Vec<_>>()
        .join(" ");
    println!("+ {shown}");
    let status = cmd.status().with_context(|| format!("failed to start {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("command failed ({status}): {shown}");
    }
    Ok(())
}

fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

fn summarize(out: &Path, opts: &Opts) -> Result<()> {
    let mut total = 0;
    let twins: Vec<String> = MTP_FAMILIES.iter().map(|(f, _)| format!("{f}_mtp")).collect();
    for f in FAMILIES.iter().copied().chain(twins.iter().map(String::as_str)) {
        let dir = out.join(f);
        if !dir.is_dir() {
            continue;
        }
        let size = dir_size(&dir);
        total += size;
        let mut line = format!("fixtures: {f:<10} {:>7.2} MB", size as f64 / 1e6);
        if let Ok(text) = fs::read_to_string(dir.join("reference.json")) {
            let r: serde_json::Value = serde_json::from_str(&text).context("parsing reference.json")?;
            let min = |k: &str| {
                r[k].as_array()
                    .map(|a| a.iter().filter_map(serde_json::Value::as_f64).fold(f64::INFINITY, f64::min))
                    .unwrap_or(f64::NAN)
            };
            line += &format!(
                "  logits_std {:.3}  min greedy margin {:.3}  min top-1 margin {:.3}",
                r["logits_std"].as_f64().unwrap_or(f64::NAN),
                min("greedy_margins"),
                min("top1_margins_f32"),
            );
        }
        for q in &opts.quants {
            if let Ok(text) = fs::read_to_string(dir.join(format!("reference_{q}.json"))) {
                let r: serde_json::Value = serde_json::from_str(&text)?;
                line += &format!(
                    "  {q}: top-1 {}/{}",
                    r["top1_agrees_with_f32"].as_u64().unwrap_or(0),
                    r["prompt"].as_array().map_or(0, Vec::len)
                );
            }
        }
        println!("{line}");
    }
    println!("fixtures: total {:.2} MB in {}", total as f64 / 1e6, out.display());
    if total > SIZE_BUDGET_BYTES {
        eprintln!(
            "warning: fixtures exceed the {} MiB budget; shrink vocab/hidden sizes in gen_fixtures.py",
            SIZE_BUDGET_BYTES / (1024 * 1024)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Option<Opts>> {
        parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults() {
        let o = parse(&["fixtures"]).unwrap().unwrap();
        assert_eq!(o.python, None);
        assert_eq!(o.base_python, PathBuf::from("python3"));
        assert!(o.stage1 && o.stage2 && !o.keep_tmp && !o.allow_other_versions);
        assert_eq!(o.families, FAMILIES);
        assert_eq!(o.quants, QUANTS);
        assert_eq!(o.out, PathBuf::from("testdata"));
        assert_eq!(o.strata, None);
    }

    #[test]
    fn lists_values_and_flags() {
        let o = parse(&[
            "--family",
            "olmoe,mixtral",
            "--families=kimi_k25",
            "--quant=q4,",
            "--python",
            "py",
            "--out=/tmp/x",
            "--out",
            "/tmp/y",
            "--stage2-only",
            "--keep-tmp",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(o.families, ["olmoe", "mixtral", "kimi_k25"]);
        assert_eq!(o.quants, ["q4"]);
        assert_eq!(o.python, Some(PathBuf::from("py")));
        assert_eq!(o.out, PathBuf::from("/tmp/y"));
        assert!(!o.stage1 && o.stage2 && o.keep_tmp);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&["--stage1-only", "--stage2-only"]).is_err());
        assert!(parse(&["--family", "llama"]).is_err());
        assert!(parse(&["--out"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["stray"]).is_err());
        assert!(parse(&["-h"]).unwrap().is_none());
    }
}
