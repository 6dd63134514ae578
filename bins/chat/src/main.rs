//! `chat`: talk to a model in the terminal.
//!
//! With no arguments it chats with the demo model built into the binary.
//! `--model DIR` takes a Strata container or a Hugging Face checkpoint
//! (converted once into a cache), `--model ORG/NAME` a model pulled with
//! `strata pull`. Piped input (`echo question | chat`) prints one answer and
//! exits. A thin binary: flags, the line editor and printing are here; the
//! conversation itself is `strata_text::Chat`.

mod repl;

use std::io::{IsTerminal, Read, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use strata_dist::args::WorkersArgs;
use strata_engine::SamplingDefaults;
use strata_engine::args::{EngineArgs, SamplingArgs};
use strata_hub::{default_cache_dir, resolve_model};
use strata_text::{Chat, ReplyOptions, TextModel};

#[derive(Debug, Parser)]
#[command(
    name = "chat",
    version,
    about = "Chat with a Mixture-of-Experts model",
    after_help = "Examples:
  chat                                                    the demo model built in
  strata pull allenai/OLMoE-1B-7B-0125-Instruct && chat --model allenai/OLMoE-1B-7B-0125-Instruct
  echo \"Tell me a fortune.\" | chat                        one answer, then exit"
)]
pub struct Cli {
    /// A Strata container, a Hugging Face checkpoint directory, or ORG/NAME
    /// pulled with `strata pull` (default: the demo model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where pulled models and converted checkpoints are cached (default: ~/.cache/strata/models).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// A config.json key to accept although the model's family does not
    /// know it, when a Hugging Face checkpoint is converted (repeatable;
    /// dotted for nested keys, e.g. `text_config.moe_latent_dim`).
    #[arg(long, value_name = "KEY")]
    allow_unknown_config: Vec<String>,
    /// Take tokenizer.json and the chat template from this directory instead
    /// of the model's (e.g. for a `strata synth` container, which has none).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// A system message opening the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(long, visible_alias = "max-tokens", default_value_t = 200)]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Where `/save` and `/load` keep conversations (default: a `sessions` folder next to the cache).
    #[arg(long)]
    kv_dir: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    workers: WorkersArgs,
}

fn main() -> ExitCode {
    restore_sigpipe();
    // The engine's news (a usage file ignored, a mirror falling back) as
    // `chat: warning: ...` lines; `RUST_LOG` for more.
    strata_engine::logging::init("chat", strata_engine::logging::LogFormat::Text, "warn");
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("chat: error: {}", strata_engine::args::error_line(&*err));
            ExitCode::from(1)
        }
    }
}

/// A closed pipe (`echo question | chat | head -c1`) ends the program
/// quietly, as it ends `cat`: Rust starts programs with SIGPIPE ignored,
/// which turns the next print into a panic.
fn restore_sigpipe() {
    // SAFETY: called first thing in `main`, before any thread exists; it
    // only sets the signal's disposition back to the system default.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> Result<()> {
    let cache_dir = cli.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let interactive = std::io::stdin().is_terminal();
    let resolved = resolve_model(cli.model.as_deref(), &cache_dir, interactive, &cli.allow_unknown_config)?;
    let engine = cli
        .workers
        .open(&resolved.container_dir, cli.engine.options())
        .with_context(|| format!("opening {}", resolved.container_dir.display()))?;
    let text_dir = cli.tokenizer.clone().unwrap_or_else(|| engine.container().dir().to_path_buf());
    let text = TextModel::from_dir(&engine, &text_dir)?;
    let sampling = cli.sampling.resolve(&SamplingDefaults::from_dir(&text_dir))?.options;
    let options = ReplyOptions { max_new_tokens: cli.max_new_tokens, sampling, stop: Vec::new() };
    let mut chat = Chat::new(&engine, text, cli.system.as_deref());
    if !interactive {
        return answer_piped(&mut chat, &options);
    }
    let kv_dir = cli.kv_dir.clone().unwrap_or_else(|| cache_dir.join("..").join("sessions"));
    repl::run(&engine, &mut chat, &options, &kv_dir, cli.model.is_none())
}

/// `echo question | chat`: one answer, streamed to stdout, then exit.
fn answer_piped(chat: &mut Chat<'_>, options: &ReplyOptions) -> Result<()> {
    let mut question = String::new();
    std::io::stdin().read_to_string(&mut question).context("reading standard input")?;
    let question = question.trim();
    if question.is_empty() {
        anyhow::bail!("no question on standard input");
    }
    let mut stdout = std::io::stdout();
    // The answer only: a script reading it wants no thinking.
    chat.say(question, options, |split| {
        if let strata_text::Split::Answer(text) = split {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
        ControlFlow::Continue(())
    })?;
    println!();
    for warning in chat.take_warnings() {
        eprintln!("chat: warning: {warning}");
    }
    Ok(())
}
