//! Command-line flags. The names shared with `strata` (`--ram-budget`,
//! `--expert-cache`, `--io`, `--cache-policy`, `--threads`, `--context`) and
//! `--model`, `--host`, `--port`, `--api-key` are a contract: keep them.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use strata_dist::args::WorkersArgs;
use strata_engine::ByteSize;
use strata_engine::args::EngineArgs;
use strata_engine::logging::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "serve",
    version,
    about = "Serve a Mixture-of-Experts model over HTTP: OpenAI and Anthropic APIs, and a chat page",
    after_help = "Examples:
  serve                                                   the demo model on http://127.0.0.1:8080
  strata pull allenai/OLMoE-1B-7B-0125-Instruct && serve --model allenai/OLMoE-1B-7B-0125-Instruct
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'"
)]
pub struct Cli {
    /// A Strata container, a Hugging Face checkpoint (converted once into
    /// the cache), or ORG/NAME pulled with `strata pull`. Default: the demo
    /// model built in.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The name clients use for the model (default: ORG/NAME for a pulled
    /// model, else the model directory's name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Take tokenizer.json and the chat template from this directory instead
    /// of the model's (e.g. for a synthetic container, which has none).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Where pulled models and converted checkpoints are cached (default: ~/.cache/strata/models).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// A config.json key to accept although the model's family does not
    /// know it, when a Hugging Face checkpoint is converted (repeatable;
    /// dotted for nested keys, e.g. `text_config.moe_latent_dim`).
    #[arg(long, value_name = "KEY")]
    pub allow_unknown_config: Vec<String>,

    /// Address to listen on. Loopback by default: the server is for this
    /// machine unless asked otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on the API.
    /// A flag's value is visible to every user in `ps`: prefer the
    /// environment variable or `--api-key-file`.
    #[arg(long, env = "STRATA_API_KEY", hide_env_values = true, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line, surrounding
    /// whitespace removed).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// A further Host header name to accept (repeatable). Requests naming any
    /// other host are refused, against DNS rebinding; `localhost` and IP
    /// addresses are always accepted.
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// Allow browser pages from this origin (repeatable; `*` for any) to call
    /// the API. Off by default.
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,

    /// Sequences decoded together in one forward pass.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_batch: u32,
    /// Prompt tokens prefilled per step, over all new requests: a longer
    /// prompt takes several steps, and the streams already running keep
    /// going meanwhile.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefill_chunk: u32,
    /// Requests waiting for a place in the batch; beyond it, 429 Too Many Requests.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub queue: u32,
    /// The largest request body accepted, e.g. 1MiB.
    #[arg(long, default_value = "1MiB")]
    pub max_body: ByteSize,
    /// The most tokens one request may generate (default: the context).
    #[arg(long, visible_alias = "max-new-tokens")]
    pub max_tokens: Option<usize>,
    /// Seconds a client may take to send a request's head; slower ones are
    /// cut off (against slowloris), as are idle keep-alive connections.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout_secs: u64,
    /// Seconds a client may take to send a request's body (408 after).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout_secs: u64,
    /// Connections open at once; beyond it new ones are closed as they
    /// arrive. Keep it below the file descriptor limit (`ulimit -n`).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Seconds shutdown (Ctrl-C, SIGTERM) waits for open requests before
    /// closing them.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_timeout_secs: u64,

    /// How log lines on stderr are written: `text` for a person, `json` (one
    /// object a line, with the request's id) for a log collector. Which
    /// lines: `RUST_LOG` (default `info`: a line per request; `debug` adds
    /// batch steps and expert loads), e.g. `RUST_LOG=strata_serve=warn`.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,

    /// The engine flags every binary shares (`--ram-budget`, `--expert-cache`,
    /// `--cache-policy`, `--io`, `--threads`, `--context`, `--trace`, `--usage-file`).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Routed experts on other machines (`--workers`, docs/DISTRIBUTED.md).
    #[command(flatten)]
    pub workers: WorkersArgs,
}

/// The longest API key file read: a key is a line, not a document.
const API_KEY_FILE_MAX_BYTES: u64 = 4096;

impl Cli {
    /// The API key: `--api-key` or `STRATA_API_KEY`, else the first line of
    /// `--api-key-file`; none when neither is given. An empty key is refused
    /// (it would look like protection and be none).
    pub fn api_key(&self) -> anyhow::Result<Option<String>> {
        let key = match (&self.api_key, &self.api_key_file) {
            (Some(key), _) => key.trim().to_owned(),
            (None, Some(path)) => {
                use std::io::Read;
                let mut text = String::new();
                std::fs::File::open(path)
                    .and_then(|file| file.take(API_KEY_FILE_MAX_BYTES).read_to_string(&mut text))
                    .with_context(|| format!("--api-key-file {}", path.display()))?;
                text.lines().next().unwrap_or_default().trim().to_owned()
            }
            (None, None) => return Ok(None),
        };
        anyhow::ensure!(!key.is_empty(), "the API key is empty");
        Ok(Some(key))
    }
}
