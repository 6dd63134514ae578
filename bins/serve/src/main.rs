//! `serve`: an HTTP server for one model. OpenAI's chat and text
//! completions, Anthropic's Messages, a chat page, Prometheus metrics, with
//! concurrent requests decoded together by continuous batching.
//!
//! A thin binary: flags in, the engine does the work, errors become HTTP
//! answers. The engine's batcher (`strata_engine::Batcher`) owns every
//! session on its own thread and batches the requests; the async side only
//! parses, tokenizes, queues and streams.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use strata_engine::{BatchLimits, Batcher, EngineOptions, SamplingDefaults, logging};
use strata_hub::{default_cache_dir, resolve_model};
use strata_text::{ChatTemplate, Tokenizer, ToolSyntax, eos_ids_from_dir};
use tokio::sync::Semaphore;

use strata_serve::cli::Cli;
use strata_serve::metrics::Metrics;
use strata_serve::state::{App, ModelInfo};
use strata_serve::{listen, openai, server, state};

/// The least tokenizing budget (see `App::prepare`), so that a small
/// `--max-body` still lets several small requests prepare at once.
const TOKENIZE_BYTES_IN_FLIGHT_MIN: usize = 1 << 20;

/// How long, after the HTTP side stopped, blocking work (a tokenization in
/// progress) may take to end before the process goes on without it.
const RUNTIME_STOP_WAIT: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Requests at info (one line each), the engine's news at warn and up.
    logging::init("serve", cli.log_format, "info");
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{}", strata_engine::args::error_line(&*err));
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Before the model loads: a bad key file fails in a moment, not minutes.
    let api_key = cli.api_key()?;
    let cache_dir = cli.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let resolved = resolve_model(cli.model.as_deref(), &cache_dir, true, &cli.allow_unknown_config)
        .context("finding the model")?;
    if resolved.converted {
        tracing::info!("converted the checkpoint into {}", resolved.container_dir.display());
    }
    let model_name = cli.model_name.clone().unwrap_or_else(|| default_name(cli.model.as_deref()));
    let text_dir = cli.tokenizer.clone().unwrap_or_else(|| resolved.container_dir.clone());
    let tokenizer = Tokenizer::from_dir(&text_dir)?.with_context(|| {
        format!("{} has no tokenizer.json; pass --tokenizer DIR to take one from elsewhere", text_dir.display())
    })?;
    let template = ChatTemplate::from_dir(&text_dir)?;
    if template.is_none() {
        tracing::warn!("{} has no chat template; only /v1/completions will work", text_dir.display());
    }
    let defaults = SamplingDefaults::from_dir(&text_dir);
    let tool_syntax = template
        .as_ref()
        .and_then(|t| ToolSyntax::detect(t.source(), |token| tokenizer.token_to_id(token).is_some()))
        .unwrap_or(ToolSyntax::JsonTags);

    // Every sequence of a full batch holds its own KV arena.
    let options = EngineOptions { sessions: cli.max_batch as usize, ..cli.engine.options() };
    let container_dir = &resolved.container_dir;
    let engine =
        cli.workers.open(container_dir, options).with_context(|| format!("opening {}", container_dir.display()))?;
    let eos_token_ids = eos_ids_from_dir(container_dir, &engine.core().eos_token_ids)?;
    let info = ModelInfo::of(&engine);
    // Past what the cache holds, streams that share few experts evict each
    // other's before their next tokens: more reads.
    if engine.batch_capacity() < cli.max_batch as usize {
        tracing::warn!(
            "the expert cache holds the experts of {} stream(s) per token; batches of up to --max-batch {} may read \
             more per token than one stream (raise --ram-budget or --expert-cache, or lower --max-batch)",
            engine.batch_capacity(),
            cli.max_batch
        );
    }
    let metrics = Arc::new(Metrics::default());
    let limits = BatchLimits {
        max_batch: cli.max_batch as usize,
        prefill_chunk_tokens: cli.prefill_chunk as usize,
        queue_jobs_max: cli.queue as usize,
    };
    let (batcher, batcher_thread) = Batcher::spawn(Arc::new(engine), limits, Arc::clone(&metrics) as _)?;

    let mut allowed_hosts: Vec<String> = cli.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
    // A name given to --host is one the server answers to.
    allowed_hosts.push(cli.host.to_ascii_lowercase());
    let context_tokens = info.context_tokens;
    let max_body = usize::try_from(cli.max_body.bytes()).unwrap_or(usize::MAX);
    // One of the largest bodies at a time (several small ones), counted in
    // u32 permits.
    let tokenize_bytes_in_flight = max_body.clamp(TOKENIZE_BYTES_IN_FLIGHT_MIN, u32::MAX as usize);
    let max_prompt_bytes = state::max_prompt_bytes(&tokenizer, context_tokens);
    let (cut_sender, cut) = tokio::sync::watch::channel(false);
    let app = Arc::new(App {
        model_name: model_name.clone(),
        created: openai::unix_now(),
        tokenizer,
        template,
        tool_syntax,
        grammars: OnceLock::new(),
        defaults,
        vocab_size: info.vocab_size,
        context_tokens,
        max_tokens_limit: cli.max_tokens.unwrap_or(context_tokens).clamp(1, context_tokens),
        max_batch: limits.max_batch,
        info,
        batcher,
        eos_token_ids,
        metrics,
        api_key,
        allowed_hosts,
        body_timeout: Duration::from_secs(cli.body_timeout_secs),
        tokenize_bytes_in_flight,
        tokenizing: Semaphore::new(tokenize_bytes_in_flight),
        max_prompt_bytes,
        cut,
    });
    let router = server::router(Arc::clone(&app), max_body, &cli.cors_origins)?;
    drop(app);

    // The HTTP side only parses, queues and streams; two workers are plenty
    // and leave the cores to the kernels.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((cli.host.as_str(), cli.port))
            .await
            .with_context(|| format!("listening on {}:{}", cli.host, cli.port))?;
        let address = listener.local_addr()?;
        // Tests and scripts read this line for the port. Like the log, a
        // stdout nobody reads any more (`serve | head -1`) stops nothing.
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "serve: listening on http://{address} (model {model_name})");
        if cli.model.is_none() {
            let _ = writeln!(
                stdout,
                "serve: the demo model is 14.7 M parameters trained on fortune cookies: it writes fortune-like \
                 English and does not follow instructions (for a real one: `strata pull ORG/NAME`, then \
                 `serve --model ORG/NAME`)"
            );
        }
        let _ = stdout.flush();
        drop(stdout);
        let limits = listen::ConnLimits {
            header_read_timeout: Duration::from_secs(cli.header_timeout_secs),
            max_connections: connection_cap(cli.max_connections as usize),
            shutdown_deadline: Duration::from_secs(cli.shutdown_timeout_secs),
        };
        listen::serve(listener, router, limits, shutdown_signal(), cut_sender).await;
        anyhow::Ok(())
    })?;
    // Connections the deadline gave up on are dropped with the runtime
    // (cancelling their generations); blocking work gets a moment to end.
    runtime.shutdown_timeout(RUNTIME_STOP_WAIT);
    // The router (and with it every batcher handle) is gone: the batcher
    // finishes what it holds, saves what it learned and returns.
    batcher_thread.join().map_err(|_| anyhow::anyhow!("the batcher thread panicked"))?;
    Ok(())
}

/// `--max-connections`, lowered where needed to leave descriptors for the
/// engine: a connection past the descriptor limit would make `accept` fail
/// (EMFILE) for every client, `/health` included. The soft limit is first
/// raised to the hard one, as the Go runtime does for every server.
fn connection_cap(wanted: usize) -> usize {
    let Some(limit) = raise_fd_limit() else { return wanted };
    // The engine's files are open by now; a usage.json write, an io_uring
    // per I/O thread, the tokenizer and stdio need a few more.
    let in_use = std::fs::read_dir("/proc/self/fd").map_or(0, |fds| fds.count());
    let room = usize::try_from(limit).unwrap_or(usize::MAX).saturating_sub(in_use + FDS_RESERVED).max(1);
    if room < wanted {
        tracing::warn!(
            "--max-connections {wanted} lowered to {room} to stay under the file descriptor limit \
             ({limit}; raise it with `ulimit -n`)"
        );
    }
    wanted.min(room)
}

/// Descriptors kept free for everything but client connections.
const FDS_RESERVED: usize = 32;

/// Raises the soft limit on open files to the hard one; the soft limit
/// after, if the system says.
fn raise_fd_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given, which we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit only reads the struct. It refuses (and changes
        // nothing) above the kernel's nr_open, keeping the old limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    Some(limit.rlim_cur)
}

/// The model's name for clients: ORG/NAME as pulled, else its directory's
/// name.
fn default_name(model: Option<&Path>) -> String {
    let Some(dir) = model else { return strata_hub::DEMO_NAME.to_owned() };
    if let Some(name) = dir.to_str().filter(|_| !dir.exists()).and_then(strata_hub::ModelName::parse) {
        return name.repo;
    }
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    dir.file_name().map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down");
}
