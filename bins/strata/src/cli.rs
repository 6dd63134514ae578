//! Command-line flags. These names are a contract other checks drive: keep
//! them stable.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use strata_dist::Shard;
pub use strata_dist::args::WorkersArgs;
use strata_engine::ByteSize;
use strata_engine::args::SamplingArgs;
use strata_hub::{AUTO_CONVERT_PRESET, ModelName};

#[derive(Debug, Parser)]
#[command(
    name = "strata",
    version,
    about = "Run Mixture-of-Experts models larger than RAM",
    after_help = "Examples:
  strata generate --prompt \"Once upon a time\"              the demo model built in
  strata pull allenai/OLMoE-1B-7B-0125-Instruct            fetch a model by name
  strata generate --model allenai/OLMoE-1B-7B-0125-Instruct --prompt \"Hello\"
  strata models                                            what is pulled"
)]
pub struct Cli {
    /// Where models are cached: pulled ones, and Hugging Face checkpoints
    /// given as models, converted (default: ~/.cache/strata/models).
    #[arg(long, global = true)]
    pub cache_dir: Option<PathBuf>,
    /// A config.json key to accept although the model's family does not
    /// know it, when a Hugging Face checkpoint is converted (repeatable;
    /// dotted for nested keys, e.g. `text_config.moe_latent_dim`).
    #[arg(long, global = true, value_name = "KEY")]
    pub allow_unknown_config: Vec<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Convert a Hugging Face checkpoint into a Strata container.
    #[command(after_help = "Example:\n  strata convert path/to/hf-checkpoint my-model --quant q4")]
    Convert {
        hf_dir: PathBuf,
        out_dir: PathBuf,
        /// Weight format: f32, bf16, q8 or q4 (routed experts q4, dense q8).
        #[arg(long, default_value = AUTO_CONVERT_PRESET.name())]
        quant: String,
        /// Columns per scale of q4 tensors.
        #[arg(long, default_value_t = strata_format::Q4_DEFAULT_GROUP)]
        q4_group: usize,
        /// Replace OUT_DIR if it exists.
        #[arg(long)]
        overwrite: bool,
        /// Leave out the multi-token-prediction layers (kept, never below
        /// q8, where the checkpoint has them: the draft heads of
        /// speculative decoding).
        #[arg(long)]
        no_mtp: bool,
        /// Dequantize routed experts stored MXFP4 (Kimi K3's and gpt-oss's
        /// hub checkpoints) to --quant's expert format, instead of keeping
        /// their codes and scales as they are.
        #[arg(long)]
        dequantize_mxfp4: bool,
    },
    /// Describe a container: family, shapes, sizes, quantization, hashes.
    #[command(after_help = "Example:\n  strata info --model allenai/OLMoE-1B-7B-0125-Instruct --verify")]
    Info {
        #[command(flatten)]
        model_dir: ModelArg,
        /// Also verify every file's SHA-256.
        #[arg(long)]
        verify: bool,
    },
    /// Teacher-forced logits at every position, written as a float32 .npy.
    #[command(after_help = "Example:\n  strata logits my-model --tokens 1,2,3 --out logits.npy")]
    Logits {
        #[command(flatten)]
        model_dir: ModelArg,
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
        #[command(flatten)]
        workers: WorkersArgs,
    },
    /// Generate after a prompt: text (`--prompt`, the answer printed as text)
    /// or token ids (`--tokens`).
    #[command(
        after_help = "Example:\n  strata generate --model allenai/OLMoE-1B-7B-0125-Instruct --prompt \"Hello\" --max-new-tokens 64"
    )]
    Generate {
        #[command(flatten)]
        model_dir: ModelArg,
        /// The prompt as token ids. Optional when continuing an existing
        /// `--session`, to which the tokens (if given) are appended.
        #[arg(long, value_parser = parse_tokens, conflicts_with = "prompt")]
        tokens: Option<TokenList>,
        /// The prompt as text, tokenized with the model's tokenizer; the
        /// answer is printed as text.
        #[arg(long)]
        prompt: Option<String>,
        /// Most tokens to generate.
        #[arg(long, visible_alias = "max-tokens", default_value_t = 32)]
        max_new_tokens: usize,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Keep generating past end-of-sequence tokens.
        #[arg(long)]
        ignore_eos: bool,
        /// Print one JSON object `{"tokens": [...], "sampling": {...}, "seed": N, "stats": {...}}`
        /// as the last line.
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
        #[command(flatten)]
        workers: WorkersArgs,
    },
    /// Serve a model's routed experts (all, or shard I of N) to coordinators:
    /// `generate`, `logits`, `chat` and `serve` with `--workers`. Every peer must
    /// present the key (`--key-file`, or STRATA_WORKER_KEY) before anything is computed.
    #[command(
        after_help = "Example:\n  STRATA_WORKER_KEY=$(cat key) strata worker my-model --listen 10.0.0.2:7447 --shard 0/2"
    )]
    Worker {
        #[command(flatten)]
        model_dir: ModelArg,
        /// Where to listen, HOST:PORT: this machine only unless told otherwise.
        #[arg(long, default_value = "127.0.0.1:7447")]
        listen: String,
        /// Which experts: shard I of N holds expert e of every layer when e mod N = I.
        #[arg(long, default_value = "0/1")]
        shard: Shard,
        /// The file holding the key coordinators must present (default: the
        /// STRATA_WORKER_KEY environment variable).
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Perplexity of a text file under the model (teacher-forced, in windows
    /// of the model's context).
    #[command(after_help = "Example:\n  strata perplexity --text models/demo/heldout.txt")]
    Perplexity {
        #[command(flatten)]
        model_dir: ModelArg,
        #[arg(long)]
        text: PathBuf,
        /// Print one JSON object as the last line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Write the container's weights, dequantized, as a Hugging Face checkpoint.
    #[command(after_help = "Example:\n  strata export my-model back-to-hf")]
    Export {
        /// A container, a Hugging Face checkpoint, ORG/NAME pulled with
        /// `strata pull`, or `demo` (the demo model built in).
        #[arg(value_name = "MODEL")]
        model_dir: PathBuf,
        out_hf_dir: PathBuf,
        /// Replace OUT_HF_DIR if it exists.
        #[arg(long)]
        overwrite: bool,
    },
    /// Write a container with random weights in a real model's shapes.
    #[command(after_help = "Example:\n  strata synth --like olmoe-1b-7b --layers 4 olmoe4")]
    Synth {
        /// The model whose shapes to copy.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(strata_format::LIKE.map(|(name, _)| name)))]
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
        /// The hashed n-gram table's base size instead of the model's (qwen3.8-flash-next: its 20000000 makes a
        /// 51 B-parameter table), so that it fits a disk; the shapes of everything else are kept.
        #[arg(long, value_name = "N")]
        ngram_vocab_size_base: Option<u64>,
        out_dir: PathBuf,
    },
    /// Routing traces recorded with `--trace`.
    #[command(after_help = "Example:\n  strata trace replay run.trace --expert-cache 4MiB")]
    Trace {
        #[command(subcommand)]
        command: TraceCommand,
    },
    /// Print shell completions, e.g. `strata completions bash > ~/.local/share/bash-completion/completions/strata`.
    #[command(after_help = "Example:\n  strata completions bash > ~/.local/share/bash-completion/completions/strata")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Fetch a model from the Hugging Face hub by name (config, tokenizer,
    /// safetensors; each file checked against the hub's SHA-256) and convert
    /// it into the cache; then `--model ORG/NAME` runs it in every command,
    /// `chat` and `serve`. An interrupted pull resumes where it stopped.
    #[command(after_help = "Examples:
  strata pull allenai/OLMoE-1B-7B-0125-Instruct
  strata pull Qwen/Qwen3-30B-A3B@main --quant q4
  HF_ENDPOINT=https://hf-mirror.example strata pull org/name

HF_TOKEN, when set, is sent to the hub (gated and private repositories).")]
    Pull {
        /// ORG/NAME, or ORG/NAME@REVISION for a branch, tag or commit.
        #[arg(value_name = "ORG/NAME[@REVISION]", value_parser = parse_model_name)]
        name: ModelName,
        /// The hub's address (default: $HF_ENDPOINT, else https://huggingface.co).
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// Weight format: f32, bf16, q8 or q4 (routed experts q4, dense q8).
        #[arg(long, default_value = AUTO_CONVERT_PRESET.name())]
        quant: String,
    },
    /// List the pulled models: name, revision, family, weight format, size
    /// on disk, last use (and, on stderr, partial downloads).
    #[command(after_help = "Example:\n  strata models")]
    Models,
    /// Remove a pulled model, or a partial download of one, from the cache.
    #[command(after_help = "Example:\n  strata rm allenai/OLMoE-1B-7B-0125-Instruct")]
    Rm {
        /// ORG/NAME of a pulled (or partly downloaded) model.
        #[arg(value_name = "ORG/NAME", value_parser = parse_model_name)]
        name: ModelName,
    },
    /// Copies of expert files on other drives, read beside the container
    /// with `--mirror DIR`.
    #[command(after_help = "Example:\n  strata mirror stage /mnt/fast --model my-model --budget 8GiB")]
    Mirror {
        #[command(subcommand)]
        command: MirrorCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum MirrorCommand {
    /// Which layer files a mirror of `--budget` would hold: the layers whose
    /// experts the usage file ranks hottest.
    #[command(after_help = "Example:\n  strata mirror plan /mnt/fast --model my-model --budget 8GiB")]
    Plan {
        #[command(flatten)]
        args: MirrorArgs,
    },
    /// Copy the planned files into DIR (verified, through temporary files,
    /// keeping `--reserve` free) and publish its receipt.
    #[command(after_help = "Example:\n  strata mirror stage /mnt/fast --model my-model --budget 8GiB")]
    Stage {
        #[command(flatten)]
        args: MirrorArgs,
    },
    /// Hash every expert file in DIR against the container and publish a
    /// receipt of them (for copies made by hand, or to recheck).
    #[command(after_help = "Example:\n  strata mirror verify /mnt/fast --model my-model")]
    Verify {
        #[command(flatten)]
        args: MirrorArgs,
    },
}

impl MirrorCommand {
    pub fn args(&self) -> &MirrorArgs {
        match self {
            MirrorCommand::Plan { args } | MirrorCommand::Stage { args } | MirrorCommand::Verify { args } => args,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct MirrorArgs {
    /// The mirror directory.
    pub dir: PathBuf,
    /// The container mirrored (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The most bytes of expert files the mirror may hold (default: all).
    #[arg(long)]
    pub budget: Option<ByteSize>,
    /// Free space to leave on the mirror's filesystem.
    #[arg(long, default_value = "1GiB")]
    pub reserve: ByteSize,
    /// Learned usage that ranks the layers (default: usage.json in the model directory).
    #[arg(long)]
    pub usage_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// The hit rates LRU, LFRU, pinned, predict and Belady's optimal policy get on a trace.
    #[command(
        after_help = "Example:\n  strata generate --prompt \"Hello\" --trace run.trace && strata trace replay run.trace --expert-cache 4MiB"
    )]
    Replay {
        file: PathBuf,
        /// The expert cache to simulate.
        #[arg(long)]
        expert_cache: ByteSize,
        /// A trace of the same model on other text, whose routing `predict`
        /// learns before the replay (as a run that had learned it would).
        #[arg(long, value_name = "TRACE")]
        learn: Option<PathBuf>,
    },
}

/// The model a command runs: positional, or `--model` as `chat` and `serve`
/// take it.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArg {
    /// A container, a Hugging Face checkpoint, or ORG/NAME pulled with
    /// `strata pull` (default: the demo model built in).
    #[arg(value_name = "MODEL")]
    model_dir: Option<PathBuf>,
    /// The same as MODEL, spelled as in `chat` and `serve`.
    #[arg(long, value_name = "MODEL", conflicts_with = "model_dir")]
    model: Option<PathBuf>,
}

impl ModelArg {
    /// The model given either way (`None`: the demo model).
    pub fn dir(self) -> Option<PathBuf> {
        self.model_dir.or(self.model)
    }
}

/// Flags shared by every command that runs a model.
pub use strata_engine::args::EngineArgs as RunArgs;

fn parse_model_name(text: &str) -> Result<ModelName, String> {
    ModelName::parse(text)
        .ok_or_else(|| format!("{text:?} is not a model name (expected ORG/NAME or ORG/NAME@REVISION)"))
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
