//! Command-line flags. These names are a contract other checks drive: keep
//! them stable.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use strata_engine::ByteSize;

#[derive(Debug, Parser)]
#[command(name = "strata", version, about = "Run Mixture-of-Experts models larger than RAM")]
pub struct Cli {
    /// Where Hugging Face checkpoints given as models are converted to and
    /// cached (default: ~/.cache/strata/models).
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
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
        /// Columns per scale of q4 tensors.
        #[arg(long, default_value_t = strata_format::Q4_DEFAULT_GROUP)]
        q4_group: usize,
        /// Replace OUT_DIR if it exists.
        #[arg(long)]
        overwrite: bool,
    },
    /// Describe a container: family, shapes, sizes, quantization, hashes.
    Info {
        /// A container or Hugging Face checkpoint (default: the demo model).
        model_dir: Option<PathBuf>,
        /// Also verify every file's SHA-256.
        #[arg(long)]
        verify: bool,
    },
    /// Teacher-forced logits at every position, written as a float32 .npy.
    Logits {
        /// A container or Hugging Face checkpoint (default: the demo model).
        model_dir: Option<PathBuf>,
        #[arg(long, value_parser = parse_tokens)]
        tokens: TokenList,
        #[arg(long)]
        out: PathBuf,
        /// Run the tokens in forward passes of at most this many (default:
        /// the engine's, from the model's shapes). 1 feeds them one at a
        /// time through the decode path, as generation does.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        pass_tokens: Option<u32>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Generate after a prompt: text (`--prompt`, the answer printed as text)
    /// or token ids (`--tokens`).
    Generate {
        /// A container or Hugging Face checkpoint (default: the demo model).
        model_dir: Option<PathBuf>,
        /// The prompt as token ids. Optional when continuing an existing
        /// `--session`, to which the tokens (if given) are appended.
        #[arg(long, value_parser = parse_tokens, conflicts_with = "prompt")]
        tokens: Option<TokenList>,
        /// The prompt as text, tokenized with the model's tokenizer; the
        /// answer is printed as text.
        #[arg(long)]
        prompt: Option<String>,
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
        /// Where named sessions are kept (with `--session`).
        #[arg(long)]
        kv_dir: Option<PathBuf>,
        /// Save the sequence as this session under `--kv-dir`, or continue it
        /// from its end if it exists (letters, digits, '.', '_', '-').
        #[arg(long)]
        session: Option<String>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Perplexity of a text file under the model (teacher-forced, in windows
    /// of the model's context).
    Perplexity {
        /// A container or Hugging Face checkpoint (default: the demo model).
        model_dir: Option<PathBuf>,
        #[arg(long)]
        text: PathBuf,
        /// Print one JSON object as the last line.
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
    /// Print shell completions, e.g. `strata completions bash > ~/.local/share/bash-completion/completions/strata`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// The hit rates LRU, LFRU, pinned, predict and Belady's optimal policy get on a trace.
    Replay {
        file: PathBuf,
        /// The expert cache to simulate.
        #[arg(long)]
        expert_cache: ByteSize,
    },
}

/// Flags shared by every command that runs a model.
pub use strata_engine::args::EngineArgs as RunArgs;

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
