//! `cargo xtask sweep`: convert random transformers checkpoints at shapes and configs other than the fixtures'
//! and check that Strata's logits match transformers'.
//!
//! 1. `xtask/fixtures/sweep.py gen` writes, under `target/sweep-tmp/<case>/`, a random checkpoint saved by
//!    transformers (`hf/`: odd head_dim, GQA ratios 1/2/4/8, dense first layers, tied embeddings, biases, sliding
//!    windows, linear RoPE scaling, sharded, f32/bf16, 5.x or 4.x config spelling) and its float32 teacher-forced
//!    logits (`reference.npy`), plus `cases.json`.
//! 2. For every case: `strata convert hf <case>/strata --quant <f32|bf16>` and `strata logits` → `strata.npy`;
//!    for the export cases also `--quant q4` → `q4.npy` and `strata export` → `q4_hf/`. A failing command's
//!    stderr goes to `<case>/<step>.err` and the sweep goes on.
//! 3. `sweep.py check` compares (1e-3·std for f32, 2e-3·std for bf16; q4: transformers on the export against
//!    Strata's q4 logits at 1e-3·std), prints the table and fails if any check does.
//!
//! The Python interpreter is chosen as for `cargo xtask fixtures` (`--python PATH`, or the pinned venv).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::fixtures::{build_strata, path_str, python_cmd, resolve_python, run_cmd, workspace_root};

const USAGE: &str = "\
cargo xtask sweep [OPTIONS]

Convert random transformers checkpoints (all three families, odd shapes, both config spellings, f32 and bf16)
with strata and compare the logits with transformers'. Work directory: target/sweep-tmp/.

Options:
  --python PATH           use this Python instead of the pinned target/fixtures-venv (see `cargo xtask fixtures`)
  --base-python PATH      interpreter used to create target/fixtures-venv (default: python3)
  --strata PATH           use this strata binary instead of `cargo build --release -p strata`
  --case NAME[,NAME]      only these cases (repeatable; `sweep.py cases` lists them)
  --random N              this many randomly drawn cases on top of the curated ones (default: 12)
  --seed S                seed of the random cases, weights and prompts (default: 0)
  --reuse                 skip generation and reuse target/sweep-tmp's checkpoints (after a previous run)
  --keep-tmp              keep target/sweep-tmp/ even when every check passes
  --allow-other-versions  let the Python script run with unpinned torch/transformers versions
  -h, --help              this text
";

#[derive(Debug)]
struct Opts {
    python: Option<PathBuf>,
    base_python: PathBuf,
    strata: Option<PathBuf>,
    cases: Vec<String>,
    random: Option<String>,
    seed: Option<String>,
    reuse: bool,
    keep_tmp: bool,
    allow_other_versions: bool,
}

fn parse_args(args: &[String]) -> Result<Option<Opts>> {
    let mut o = Opts {
        python: None,
        base_python: PathBuf::from("python3"),
        strata: None,
        cases: Vec::new(),
        random: None,
        seed: None,
        reuse: false,
        keep_tmp: false,
        allow_other_versions: false,
    };
    let args = match args.first().map(String::as_str) {
        Some("sweep") => &args[1..],
        _ => args,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().with_context(|| format!("{name} needs a value")),
            }
        };
        match flag {
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(None);
            }
            "--python" => o.python = Some(PathBuf::from(value(flag)?)),
            "--base-python" => o.base_python = PathBuf::from(value(flag)?),
            "--strata" => o.strata = Some(PathBuf::from(value(flag)?)),
            "--case" | "--cases" => {
                o.cases.extend(value(flag)?.split(',').filter(|s| !s.is_empty()).map(str::to_string))
            }
            "--random" => o.random = Some(number(flag, value(flag)?)?),
            "--seed" => o.seed = Some(number(flag, value(flag)?)?),
            "--reuse" => o.reuse = true,
            "--keep-tmp" => o.keep_tmp = true,
            "--allow-other-versions" => o.allow_other_versions = true,
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(Some(o))
}

fn number(flag: &str, v: String) -> Result<String> {
    v.parse::<u64>().with_context(|| format!("{flag} needs a non-negative integer, got {v:?}"))?;
    Ok(v)
}

/// One entry of `cases.json` as far as the strata side needs it.
struct Case {
    name: String,
    quant: String,
    prompt: String,
    export: bool,
}

fn read_cases(path: &Path) -> Result<Vec<Case>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let items = json.as_array().with_context(|| format!("{} is not a list", path.display()))?;
    items
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().map(str::to_string).with_context(|| format!("case without {k}: {c}"));
            let prompt = c["prompt"].as_array().with_context(|| format!("case without prompt: {c}"))?;
            let prompt = prompt
                .iter()
                .map(|t| t.as_u64().map(|t| t.to_string()).context("non-integer token"))
                .collect::<Result<Vec<_>>>()?
                .join(",");
            Ok(Case { name: s("name")?, quant: s("quant")?, prompt, export: c["export"].as_bool().unwrap_or(false) })
        })
        .collect()
}

/// Runs one strata step; on failure its stderr goes to `<dir>/<step>.err` and `false` is returned.
fn strata_step(strata: &Path, dir: &Path, step: &str, args: &[&str], root: &Path) -> Result<bool> {
    let err_file = dir.join(format!("{step}.err"));
    if err_file.exists() {
        fs::remove_file(&err_file)?;
    }
    let out = Command::new(strata)
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("failed to start {}", strata.display()))?;
    if out.status.success() {
        return Ok(true);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("sweep: {}: strata {step} failed ({}): {}", dir_name(dir), out.status, stderr.trim());
    fs::write(&err_file, format!("strata {}\n{}\n{stderr}", args.join(" "), out.status))?;
    Ok(false)
}

fn dir_name(dir: &Path) -> String {
    dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn run_strata_case(strata: &Path, tmp: &Path, case: &Case, root: &Path) -> Result<()> {
    let dir = tmp.join(&case.name);
    let hf = path_str(&dir.join("hf"))?;
    let s = |p: &str| path_str(&dir.join(p));
    let (converted, logits) = (s("strata")?, s("strata.npy")?);
    for f in ["strata.npy", "q4.npy"] {
        let _ = fs::remove_file(dir.join(f));
    }
    if strata_step(strata, &dir, "convert", &["convert", &hf, &converted, "--quant", &case.quant, "--overwrite"], root)?
    {
        strata_step(strata, &dir, "logits", &["logits", &converted, "--tokens", &case.prompt, "--out", &logits], root)?;
    }
    if case.export {
        let (q4, q4_logits, q4_hf) = (s("q4")?, s("q4.npy")?, s("q4_hf")?);
        if dir.join("q4_hf").exists() {
            fs::remove_dir_all(dir.join("q4_hf"))?;
        }
        if strata_step(strata, &dir, "convert_q4", &["convert", &hf, &q4, "--quant", "q4", "--overwrite"], root)? {
            strata_step(
                strata,
                &dir,
                "logits_q4",
                &["logits", &q4, "--tokens", &case.prompt, "--out", &q4_logits],
                root,
            )?;
            strata_step(strata, &dir, "export_q4", &["export", &q4, &q4_hf], root)?;
        }
    }
    Ok(())
}

/// Entry point of `cargo xtask sweep`. `args` are the arguments after `sweep` (a leading `"sweep"` is tolerated).
pub fn run(args: &[String]) -> Result<()> {
    let Some(opts) = parse_args(args)? else {
        return Ok(());
    };
    let root = workspace_root()?;
    let script = root.join("xtask").join("fixtures").join("sweep.py");
    if !script.is_file() {
        bail!("missing {}", script.display());
    }
    let tmp = root.join("target").join("sweep-tmp");
    let python = resolve_python(&root, opts.python.as_deref(), &opts.base_python)?;
    let strata = match &opts.strata {
        Some(p) => p.clone(),
        None => build_strata(&root)?,
    };
    let mut common: Vec<String> = vec!["--dir".into(), path_str(&tmp)?];
    if opts.allow_other_versions {
        common.push("--allow-other-versions".into());
    }

    if opts.reuse {
        if !tmp.join("cases.json").is_file() {
            bail!("--reuse: {} has no cases.json; run without --reuse first", tmp.display());
        }
    } else {
        if tmp.exists() {
            fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
        }
        println!("sweep: generating checkpoints and transformers references in {}", tmp.display());
        let mut cmd = python_cmd(&python, &script);
        cmd.arg("gen").args(&common);
        for c in &opts.cases {
            cmd.args(["--case", c]);
        }
        if let Some(n) = &opts.random {
            cmd.args(["--random", n]);
        }
        if let Some(s) = &opts.seed {
            cmd.args(["--seed", s]);
        }
        run_cmd(&mut cmd, &root)?;
    }

    let cases = read_cases(&tmp.join("cases.json"))?;
    println!("sweep: strata convert/logits/export with {} ({} cases)", strata.display(), cases.len());
    for case in &cases {
        run_strata_case(&strata, &tmp, case, &root)?;
    }

    let mut cmd = python_cmd(&python, &script);
    cmd.arg("check").args(&common);
    let checked = run_cmd(&mut cmd, &root);
    match checked {
        Ok(()) if !opts.keep_tmp => {
            fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
            Ok(())
        }
        Ok(()) => Ok(()),
        Err(e) => {
            println!("sweep: kept {} for inspection (rerun the comparison with --reuse)", tmp.display());
            Err(e.context("some sweep checks failed (table above)"))
        }
    }
}
