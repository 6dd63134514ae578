//! `cargo xtask sweep`: convert random transformers checkpoints at shapes and configs other than the fixtures'
//! and check that Strata's logits and tokens match transformers'.
//!
//! 1. `xtask/fixtures/sweep.py gen` writes, under `target/sweep-tmp/<case>/`, a random checkpoint saved by
//!    transformers (`hf/`) for each of the eleven checked families (GQA: odd head_dim, GQA ratios 1/2/4/8, dense layers, tied
//!    embeddings, biases, sliding windows, linear RoPE scaling; MLA: q LoRA or not, every head dim, YaRN, groups,
//!    shared experts, DSA heads/dims/top-k/shared indexer layers; hybrid (Qwen3-Next, Qwen3.5-MoE): layer_types
//!    patterns or full_attention_interval, partial rotary factors, Gated DeltaNet heads/dims/conv kernel, shared
//!    experts, dense layers, the hub's multimodal layout or the flat text save; Kimi Linear: layer patterns in
//!    each spelling, KDA heads/dims/conv kernel, q LoRA or not, groups, shared experts, dense layers; sharded,
//!    f32/bf16, 5.x or 4.x config spelling), its float32 teacher-forced logits (`reference.npy`), its logits fed
//!    one token at a time through transformers' cache (`decode_reference.npy`) and its 12-token greedy
//!    continuation, plus `cases.json`
//!    (`--family` keeps some families' cases only).
//! 2. For every case: `strata convert hf <case>/strata --quant <f32|bf16>`; `strata logits` → `strata.npy`;
//!    `strata logits --pass-tokens 1` on prompt + continuation → `decode.npy`; where `cases.json` gives a
//!    `split_pass_tokens`, `strata logits --pass-tokens N` on the prompt → `split.npy`; `strata generate --json` →
//!    `greedy.json`; for the export cases also `--quant q8|q4` → `q8.npy`/`q4.npy` and `strata export` →
//!    `q8_hf/`/`q4_hf/`. A failing command's stderr goes to `<case>/<step>.err` and the sweep goes on.
//! 3. `sweep.py check` compares (1e-3·std for f32, 2e-3·std for bf16; greedy tokens exactly; q8/q4: transformers
//!    on the export against Strata's q8/q4 logits at 1e-3·std, 3e-3·std for the recurrent hybrids as in the oracle
//!    test), prints the table and the worst errors per family, and fails if any check does (naming, per family,
//!    the axes every failing case shares).
//!
//! The Python interpreter is chosen as for `cargo xtask fixtures` (`--python PATH`, or the pinned venv).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{ArgAction, Parser};

use crate::cli::{non_empty, parse_cli, workspace_root};
use crate::fixtures::{build_strata, path_str, python_cmd, resolve_python, run_cmd};

/// The options of `cargo xtask sweep`.
#[derive(Debug, Parser)]
#[command(
    name = "sweep",
    bin_name = "cargo xtask sweep",
    about = "Convert random transformers checkpoints (all eleven checked families, random shapes over every config axis, both \
             config spellings, f32 and bf16) with strata and compare teacher-forced logits, decode-path logits and \
             greedy tokens with transformers'. Work directory: target/sweep-tmp/.",
    long_about = None,
    args_override_self = true,
    disable_help_flag = true
)]
struct Opts {
    /// use this Python instead of the pinned target/fixtures-venv (see `cargo xtask fixtures`)
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// interpreter used to create target/fixtures-venv (default: python3)
    #[arg(long, value_name = "PATH", default_value = "python3", hide_default_value = true)]
    base_python: PathBuf,
    /// use this strata binary instead of `cargo build --release -p strata`
    #[arg(long, value_name = "PATH")]
    strata: Option<PathBuf>,
    /// only these cases (repeatable; `sweep.py cases` lists them)
    #[arg(long = "case", alias = "cases", value_name = "NAME[,NAME]", value_delimiter = ',')]
    cases: Vec<String>,
    /// only these families' cases (repeatable; e.g. qwen3_next,qwen3_5_moe)
    #[arg(long = "family", alias = "families", value_name = "NAME[,NAME]", value_delimiter = ',')]
    families: Vec<String>,
    /// this many randomly drawn cases per family on top of the curated ones (default: 20)
    #[arg(long, value_name = "N", value_parser = number)]
    random: Option<String>,
    /// seed of the random cases, weights and prompts (default: 0)
    #[arg(long, value_name = "S", value_parser = number)]
    seed: Option<String>,
    /// skip generation and reuse target/sweep-tmp's checkpoints (after a previous run)
    #[arg(long)]
    reuse: bool,
    /// keep target/sweep-tmp/ even when every check passes
    #[arg(long)]
    keep_tmp: bool,
    /// only create (or check) the pinned target/fixtures-venv and stop: CI installs it while it builds
    #[arg(long)]
    venv_only: bool,
    /// let the Python script run with unpinned torch/transformers versions
    #[arg(long)]
    allow_other_versions: bool,
    /// this text
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
}

fn parse_args(args: &[String]) -> Result<Option<Opts>> {
    let Some(mut o) = parse_cli::<Opts>("sweep", args)? else {
        return Ok(None);
    };
    o.cases = non_empty(o.cases);
    o.families = non_empty(o.families);
    Ok(Some(o))
}

/// A non-negative integer, kept as written: sweep.py gets it unchanged.
fn number(v: &str) -> Result<String, String> {
    match v.parse::<u64>() {
        Ok(_) => Ok(v.to_string()),
        Err(_) => Err("needs a non-negative integer".to_string()),
    }
}

/// One entry of `cases.json` as far as the strata side needs it.
struct Case {
    name: String,
    quant: String,
    prompt: String,
    /// The prompt and the greedy continuation but its last token, for the decode-path logits.
    decode_tokens: String,
    greedy_tokens: usize,
    export: bool,
    /// Tokens per pass of the split-prompt run, for the cases that check one.
    split_pass_tokens: Option<u64>,
}

/// A JSON list of token ids as `strata --tokens` takes it.
fn token_list(c: &serde_json::Value, key: &str) -> Result<String> {
    let list = c[key].as_array().with_context(|| format!("case without {key}: {c}"))?;
    Ok(list
        .iter()
        .map(|t| t.as_u64().map(|t| t.to_string()).context("non-integer token"))
        .collect::<Result<Vec<_>>>()?
        .join(","))
}

fn read_cases(path: &Path) -> Result<Vec<Case>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let items = json.as_array().with_context(|| format!("{} is not a list", path.display()))?;
    items
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().map(str::to_string).with_context(|| format!("case without {k}: {c}"));
            let greedy_tokens = c["greedy"].as_array().with_context(|| format!("case without greedy: {c}"))?.len();
            Ok(Case {
                name: s("name")?,
                quant: s("quant")?,
                prompt: token_list(c, "prompt")?,
                decode_tokens: token_list(c, "decode_tokens")?,
                greedy_tokens,
                export: c["export"].as_bool().unwrap_or(false),
                split_pass_tokens: c["split_pass_tokens"].as_u64(),
            })
        })
        .collect()
}

/// Runs one strata step; on failure its stderr goes to `<dir>/<step>.err` and `false` is returned.
fn strata_step(strata: &Path, dir: &Path, step: &str, args: &[&str], root: &Path) -> Result<bool> {
    strata_step_to(strata, dir, step, args, root, None)
}

/// [`strata_step`], keeping its standard output in `stdout_file` when given.
fn strata_step_to(
    strata: &Path,
    dir: &Path,
    step: &str,
    args: &[&str],
    root: &Path,
    stdout_file: Option<&Path>,
) -> Result<bool> {
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
        if let Some(file) = stdout_file {
            fs::write(file, &out.stdout).with_context(|| format!("writing {}", file.display()))?;
        }
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

/// The quantized containers an export case converts, runs and exports.
const EXPORT_QUANTS: [&str; 2] = ["q8", "q4"];

fn run_strata_case(strata: &Path, tmp: &Path, case: &Case, root: &Path) -> Result<()> {
    let dir = tmp.join(&case.name);
    let hf = path_str(&dir.join("hf"))?;
    let s = |p: &str| path_str(&dir.join(p));
    let (converted, logits) = (s("strata")?, s("strata.npy")?);
    let decode = s("decode.npy")?;
    for f in ["strata.npy", "decode.npy", "split.npy", "greedy.json", "q8.npy", "q4.npy"] {
        let _ = fs::remove_file(dir.join(f));
    }
    if strata_step(strata, &dir, "convert", &["convert", &hf, &converted, "--quant", &case.quant, "--overwrite"], root)?
    {
        strata_step(strata, &dir, "logits", &["logits", &converted, "--tokens", &case.prompt, "--out", &logits], root)?;
        let decode_args =
            ["logits", &converted, "--tokens", &case.decode_tokens, "--pass-tokens", "1", "--out", &decode];
        strata_step(strata, &dir, "decode", &decode_args, root)?;
        if let Some(pass_tokens) = case.split_pass_tokens {
            let (pass_tokens, split) = (pass_tokens.to_string(), s("split.npy")?);
            let split_args =
                ["logits", &converted, "--tokens", &case.prompt, "--pass-tokens", &pass_tokens, "--out", &split];
            strata_step(strata, &dir, "split", &split_args, root)?;
        }
        let new_tokens = case.greedy_tokens.to_string();
        let generate_args = [
            "generate",
            &converted,
            "--tokens",
            &case.prompt,
            "--max-new-tokens",
            &new_tokens,
            "--ignore-eos",
            "--json",
            "--temperature",
            "0",
        ];
        strata_step_to(strata, &dir, "generate", &generate_args, root, Some(&dir.join("greedy.json")))?;
    }
    if case.export {
        for quant in EXPORT_QUANTS {
            let (q, q_logits, q_hf) = (s(quant)?, s(&format!("{quant}.npy"))?, s(&format!("{quant}_hf"))?);
            if dir.join(format!("{quant}_hf")).exists() {
                fs::remove_dir_all(dir.join(format!("{quant}_hf")))?;
            }
            let convert_args = ["convert", &hf, &q, "--quant", quant, "--overwrite"];
            if strata_step(strata, &dir, &format!("convert_{quant}"), &convert_args, root)? {
                let logits_args = ["logits", &q, "--tokens", &case.prompt, "--out", &q_logits];
                strata_step(strata, &dir, &format!("logits_{quant}"), &logits_args, root)?;
                strata_step(strata, &dir, &format!("export_{quant}"), &["export", &q, &q_hf], root)?;
            }
        }
    }
    Ok(())
}

/// Entry point of `cargo xtask sweep`. `args` are the arguments after `sweep` (a leading `"sweep"` is tolerated).
pub fn run(args: &[String]) -> Result<()> {
    let Some(opts) = parse_args(args)? else {
        return Ok(());
    };
    let root = workspace_root();
    let script = root.join("xtask").join("fixtures").join("sweep.py");
    if !script.is_file() {
        bail!("missing {}", script.display());
    }
    let tmp = root.join("target").join("sweep-tmp");
    let python = resolve_python(&root, opts.python.as_deref(), &opts.base_python)?;
    if opts.venv_only {
        return Ok(());
    }
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
        for f in &opts.families {
            cmd.args(["--family", f]);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Option<Opts>> {
        parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap().unwrap();
        assert_eq!((o.python, o.strata, o.random, o.seed), (None, None, None, None));
        assert_eq!(o.base_python, PathBuf::from("python3"));
        assert!(o.cases.is_empty() && o.families.is_empty() && !o.reuse && !o.keep_tmp && !o.allow_other_versions);
    }

    #[test]
    fn lists_values_and_flags() {
        let o = parse(&[
            "sweep",
            "--case",
            "a,b",
            "--cases=c",
            "--family",
            "qwen3_next,qwen3_5_moe",
            "--families=olmoe",
            "--random=3",
            "--seed",
            "007",
            "--reuse",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(o.cases, ["a", "b", "c"]);
        assert_eq!(o.families, ["qwen3_next", "qwen3_5_moe", "olmoe"]);
        assert_eq!(o.random.as_deref(), Some("3"));
        assert_eq!(o.seed.as_deref(), Some("007"));
        assert!(o.reuse && !o.keep_tmp);
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&["--random", "-1"]).is_err());
        assert!(parse(&["--seed=x"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--help"]).unwrap().is_none());
    }
}
