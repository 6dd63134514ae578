//! Command-line flags. These names are a contract other checks drive: keep
//! them stable.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use strata_engine::{ByteSize, IoBackend, PolicyKind, RamBudget};

#[derive(Debug, Parser)]
#[command(name = "strata", version, about = "Run Mixture-of-Experts models larger than RAM")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Convert a Hugging Face checkpoint into a Strata container.
    Convert {
        hf_dir: PathBuf,
        out_dir: PathBuf,
        /// Weight format: f32, bf16, q8 or q4 (routed experts q4, dense q8).
        #[arg(long, default_value = "q4")]
        quant: String,
        /// Replace OUT_DIR if it exists.
        #[arg(long)]
        overwrite: bool,
    },
    /// Describe a container: family, shapes, sizes, quantization, hashes.
    Info {
        model_dir: PathBuf,
        /// Also verify every file's SHA-256.
        #[arg(long)]
        verify: bool,
    },
    /// Teacher-forced logits at every position, written as a float32 .npy.
    Logits {
        model_dir: PathBuf,
        #[arg(long, value_parser = parse_tokens)]
        tokens: TokenList,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Generate tokens after a prompt of token ids.
    Generate {
        model_dir: PathBuf,
        #[arg(long, value_parser = parse_tokens)]
        tokens: TokenList,
        #[arg(long, default_value_t = 32)]
        max_new_tokens: usize,
        /// 0 means greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// 0 means no limit.
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Keep generating past end-of-sequence tokens.
        #[arg(long)]
        ignore_eos: bool,
        /// Print one JSON object `{"tokens": [...], "stats": {...}}` as the last line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Write the container's weights, dequantized, as a Hugging Face checkpoint.
    Export { model_dir: PathBuf, out_hf_dir: PathBuf },
    /// Write a container with random weights in a real model's shapes.
    Synth {
        /// The model whose shapes to copy (see `strata synth --help` for the list).
        #[arg(long)]
        like: String,
        /// Keep only this many decoder layers.
        #[arg(long)]
        layers: Option<usize>,
        #[arg(long, default_value = "q4")]
        quant: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replace OUT_DIR if it exists.
        #[arg(long)]
        overwrite: bool,
        out_dir: PathBuf,
    },
    /// Routing traces recorded with `--trace`.
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// The hit rates LRU, LFRU, pinned and Belady's optimal policy get on a trace.
    Replay {
        file: PathBuf,
        /// The expert cache to simulate.
        #[arg(long)]
        expert_cache: ByteSize,
    },
}

/// Flags shared by every command that runs a model.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The one memory budget for dense weights, expert cache, KV and I/O
    /// buffers: a size (e.g. 6GiB) or `auto` (75% of MemAvailable).
    #[arg(long, default_value = "auto")]
    pub ram_budget: RamBudget,
    /// A further cap on the RAM holding routed experts, e.g. 16KiB, 512MiB.
    #[arg(long)]
    pub expert_cache: Option<ByteSize>,
    /// Expert cache replacement policy: lru, lfru or pinned.
    #[arg(long, default_value = "lru")]
    pub cache_policy: PolicyKind,
    /// How experts are read: pread, direct (O_DIRECT), uring (io_uring) or mmap.
    #[arg(long, default_value = "pread")]
    pub io: IoBackend,
    /// Kernel worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// The most tokens a session may hold; its KV arena comes out of the
    /// budget (default: the model's context, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    /// Record every routing decision (layer, token, experts) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Where learned expert usage is kept (default: usage.json in the model directory).
    #[arg(long)]
    pub usage_file: Option<PathBuf>,
}

/// Token ids given as `1,2,3`.
#[derive(Debug, Clone)]
pub struct TokenList(pub Vec<u32>);

fn parse_tokens(text: &str) -> Result<TokenList, String> {
    let ids = text
        .split(',')
        .map(|part| {
            let part = part.trim();
            part.parse::<u32>().map_err(|_| format!("{part:?} is not a token id (expected e.g. 1,2,3)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TokenList(ids))
}
