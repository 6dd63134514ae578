//! `cargo xtask bench`'s options: which suites run, how long, where to.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{ArgAction, Parser};

use crate::cli::{non_empty, parse_cli, workspace_root};

/// Every suite, in the order they run.
pub(super) const SUITES: [&str; 10] =
    ["limits", "kernels", "prefill", "resident", "streaming", "demo", "batching", "speculation", "agent", "drives"];

/// Suites run only when `--only` names them: the agent suite's cold
/// 8,192-token prefill of the streaming model takes about ten minutes a
/// repetition, twenty times the rest of the default suite together.
pub(super) const OPT_IN_SUITES: [&str; 1] = ["agent"];

/// The options of `cargo xtask bench`.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    bin_name = "cargo xtask bench",
    about = "Measure Strata's speed next to the physical limit that bounds each figure (DRAM read, FMA peak, \
             O_DIRECT disk read), all in the same run; write target/bench/report.{json,md} and SVG plots \
             (docs/BENCHMARKS.md).",
    long_about = None,
    args_override_self = true,
    disable_help_flag = true
)]
pub(super) struct Cli {
    /// run only these suites: limits, kernels, prefill, resident, streaming, demo, batching, speculation, agent
    /// (only when named here), drives
    #[arg(long, value_name = "SUITE[,SUITE]", value_delimiter = ',')]
    only: Vec<String>,
    /// skip these suites
    #[arg(long, value_name = "SUITE[,SUITE]", value_delimiter = ',')]
    skip: Vec<String>,
    /// repetitions of every measurement; figures are medians
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// decode steps per streaming run (resident runs twice as many)
    #[arg(long, value_name = "N", default_value_t = 24, value_parser = clap::value_parser!(u64).range(2..))]
    tokens: u64,
    /// decoder layers of the streaming model
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub(crate) stream_layers: usize,
    /// whose shapes the streaming model copies (a `strata synth --like` name, e.g. qwen3.6-35b-a3b)
    #[arg(long, value_name = "NAME", default_value = "qwen3-30b-a3b")]
    stream_like: String,
    /// the streaming model's hashed n-gram table base size (`strata synth --ngram-vocab-size-base`: qwen3.8-flash-next's
    /// published 20000000 makes a 51 B-parameter table)
    #[arg(long, value_name = "N")]
    stream_ngram_vocab_size_base: Option<u64>,
    /// seconds each run waits for a quiet machine before it runs anyway, its row marked loaded (default 120)
    #[arg(long, value_name = "S", default_value_t = 120)]
    quiet_wait: u64,
    /// decoder layers of the OLMoE-1B-7B-shaped resident model
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub(super) resident_layers: usize,
    /// where reports, plots and synthetic models go (default: target/bench)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// instead of the suites, compare with this engine (llama.cpp)
    #[arg(long, value_name = "ENGINE")]
    pub(super) peer: Option<String>,
    /// run the strata and strata-probe binaries in DIR instead of building release ones (a shared machine's
    /// target/debug, opt-level 2: figures then a lower bound of release's)
    #[arg(long, value_name = "DIR")]
    bins: Option<PathBuf>,
    /// this text
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
}

#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(super) suites: Vec<String>,
    pub(crate) reps: usize,
    pub(crate) tokens: usize,
    pub(crate) stream_layers: usize,
    pub(crate) stream_like: String,
    pub(crate) stream_ngram_vocab_size_base: Option<u64>,
    pub(super) resident_layers: usize,
    pub(crate) out: PathBuf,
    pub(super) peer: Option<String>,
    /// Prebuilt binaries' directory (`--bins`), else a release build.
    pub(super) bins: Option<PathBuf>,
    /// How long each run waits for a quiet machine (`--quiet-wait`).
    pub(super) quiet_wait: std::time::Duration,
}

impl Options {
    pub(super) fn parse(rest: &[String]) -> Result<Option<Self>> {
        let Some(cli) = parse_cli::<Cli>("bench", rest)? else {
            return Ok(None);
        };
        let (only, skip) = (non_empty(cli.only), non_empty(cli.skip));
        for name in only.iter().chain(&skip) {
            if !SUITES.contains(&name.as_str()) {
                bail!("unknown suite {name:?} (known: {})", SUITES.join(", "));
            }
        }
        let mut suites: Vec<String> = if only.is_empty() {
            SUITES.iter().filter(|s| !OPT_IN_SUITES.contains(s)).map(|s| s.to_string()).collect()
        } else {
            only
        };
        suites.retain(|s| !skip.contains(s));
        if suites.is_empty() && cli.peer.is_none() {
            bail!("--only and --skip leave no suite to run");
        }
        Ok(Some(Options {
            suites,
            reps: cli.reps as usize,
            tokens: cli.tokens as usize,
            stream_layers: cli.stream_layers,
            stream_like: cli.stream_like,
            stream_ngram_vocab_size_base: cli.stream_ngram_vocab_size_base,
            resident_layers: cli.resident_layers,
            out: cli.out.unwrap_or_else(|| workspace_root().join("target").join("bench")),
            peer: cli.peer,
            bins: cli.bins,
            quiet_wait: std::time::Duration::from_secs(cli.quiet_wait),
        }))
    }

    pub(super) fn wants(&self, suite: &str) -> bool {
        self.suites.iter().any(|s| s == suite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_suite_leaves_out_the_hour_long_agent_suite_until_named() {
        let suites = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            Options::parse(&args).unwrap().unwrap().suites
        };
        let default = suites(&[]);
        assert!(!default.iter().any(|s| s == "agent") && default.iter().any(|s| s == "streaming"), "{default:?}");
        assert_eq!(suites(&["--only", "agent"]), ["agent"]);
        assert!(!suites(&["--skip", "drives"]).iter().any(|s| s == "agent" || s == "drives"));
    }
}
