//! The interactive loop: a line editor with history, streamed answers,
//! slash commands, and Ctrl-C that stops the answer rather than the program.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use strata_engine::{ByteSize, Engine, RunStats};
use strata_text::{Chat, Reply, ReplyOptions, SaveCounts, Split};

const HELP: &str = "\
/help          this text
/reset         forget the conversation (also /clear)
/save NAME     keep the conversation (messages and KV cache) as NAME;
               later turns are not in it until you /save again
/load NAME     continue a saved conversation, its KV cache read back, not recomputed
/stats         speed, expert-cache and memory figures of the last answer
/think on|off  let a reasoning model think before it answers, or not (its thinking shows dimmed)
Ctrl-C         stop the current answer;  Ctrl-D or /bye  quit";

/// What the banner says of the built-in demo model, so that its fortune-cookie
/// answers are not taken for a broken engine.
const DEMO_NOTE: &str = "the built-in demo model: 14.7 M parameters trained on fortune cookies; it writes \
                         fortune-like English and does not follow instructions (for a real one: `strata pull ORG/NAME`, then \
                         `chat --model ORG/NAME`)";

/// `demo`: the model is the built-in demo (no `--model`).
pub fn run<'e>(
    engine: &'e Engine,
    chat: &mut Chat<'e>,
    options: &ReplyOptions,
    kv_dir: &Path,
    demo: bool,
) -> Result<()> {
    let mut editor = DefaultEditor::new().context("starting the line editor")?;
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    // The editor reads keys in raw mode, where Ctrl-C is a key, not SIGINT;
    // SIGINT comes only while an answer streams, and stops it. The editor
    // took SIGINT for itself when it was made, so this handler must come
    // after it to be the one that runs. (rustyline's `signal-hook` feature
    // would leave SIGINT alone, but then a line that arrives in one read
    // stalls after its first character: rustyline issue #690.)
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    let arch = engine.arch();
    let model = if demo { DEMO_NOTE.to_owned() } else { engine.container().dir().display().to_string() };
    println!("strata chat: {model}.");
    println!(
        "{} layers, {} experts (top-{}), context {} tokens; temperature {}, top-k {}, top-p {}, seed {}.",
        arch.layers.len(),
        arch.num_experts(),
        arch.experts_per_token(),
        chat.session().context_tokens(),
        options.sampling.temperature,
        options.sampling.top_k,
        options.sampling.top_p,
        options.sampling.seed
    );
    println!("/help for commands, Ctrl-D to quit.");
    let mut last: Option<RunStats> = None;
    loop {
        let line = match editor.readline("> ") {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => return Ok(()),
            Err(err) => return Err(err).context("reading a line"),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(line);
        if let Some(command) = line.strip_prefix('/') {
            if command_line(command, engine, chat, kv_dir, last.as_ref(), options).is_break() {
                return Ok(());
            }
            continue;
        }
        interrupted.store(false, Ordering::SeqCst);
        match answer(chat, line, options, &interrupted) {
            Ok(reply) => last = Some(reply.stats),
            Err(err) => eprintln!("error: {err:#}"),
        }
    }
}

/// Dim text, and back to normal (SGR 2 and 0): each piece of thinking is
/// wrapped whole, so that a stop in the middle leaves the terminal as it was.
const DIM: &str = "\x1b[2m";
const NORMAL: &str = "\x1b[0m";

fn answer(chat: &mut Chat<'_>, line: &str, options: &ReplyOptions, interrupted: &AtomicBool) -> Result<Reply> {
    let mut stdout = std::io::stdout();
    let mut after_thinking = false;
    let reply = chat.say(line, options, |split| {
        let _ = match split {
            Split::Reasoning(text) => {
                after_thinking = true;
                write!(stdout, "{DIM}{text}{NORMAL}")
            }
            // The answer on a line of its own below the thinking.
            Split::Answer(text) if std::mem::take(&mut after_thinking) => write!(stdout, "\n\n{text}"),
            Split::Answer(text) => write!(stdout, "{text}"),
        };
        let _ = stdout.flush();
        if interrupted.load(Ordering::SeqCst) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    })?;
    println!();
    for warning in chat.take_warnings() {
        eprintln!("warning: {warning}");
    }
    if reply.dropped_messages > 0 {
        let messages = if reply.dropped_messages == 1 { "message was" } else { "messages were" };
        println!(
            "(the oldest {} {messages} dropped to fit the {}-token context)",
            reply.dropped_messages,
            chat.session().context_tokens()
        );
    }
    if reply.finish == strata_engine::Finish::Cancelled {
        println!("(stopped)");
    }
    Ok(reply)
}

fn command_line<'e>(
    command: &str,
    engine: &'e Engine,
    chat: &mut Chat<'e>,
    kv_dir: &Path,
    last: Option<&RunStats>,
    options: &ReplyOptions,
) -> ControlFlow<()> {
    let mut words = command.split_whitespace();
    match (words.next(), words.next()) {
        (Some("help"), _) => println!("{HELP}"),
        // Ollama's words for quitting and forgetting, which people try.
        (Some("quit" | "exit" | "bye"), _) => return ControlFlow::Break(()),
        (Some("reset" | "clear"), _) => {
            chat.reset();
            println!("(conversation forgotten)");
        }
        (Some("stats"), _) => {
            match last {
                Some(stats) => print_stats(stats),
                None => println!("(no answer yet)"),
            }
            let memory = engine.memory_use();
            let session = chat.session();
            println!(
                "memory: {} resident; expert cache {} used of {}; KV cache {} ({} of {} tokens)",
                memory.resident_bytes.map_or_else(|| "unknown".to_owned(), |b| ByteSize(b).to_string()),
                ByteSize(memory.expert_cache_used_bytes),
                ByteSize(memory.expert_cache_capacity_bytes),
                ByteSize(session.kv_bytes()),
                session.tokens().len(),
                session.context_tokens()
            );
            println!("seed {} (--seed to repeat a conversation)", options.sampling.seed);
        }
        (Some("save"), Some(name)) => match chat.save(kv_dir, name) {
            Ok(saved) => println!("(saved {name}: {})", counts(saved)),
            Err(err) => eprintln!("error: {err:#}"),
        },
        (Some("load"), Some(name)) => match chat.load(engine, kv_dir, name) {
            Ok(loaded) => println!("(loaded {name}: {}, KV cache read back)", counts(loaded)),
            Err(err) => eprintln!("error: {err:#}"),
        },
        (Some(verb @ ("save" | "load")), None) => println!("usage: /{verb} NAME"),
        (Some("think"), switch @ Some("on" | "off")) if chat.thinks() => {
            chat.set_thinking(Some(switch == Some("on")));
            println!("(thinking {})", switch.unwrap_or_default());
        }
        (Some("think"), Some("on" | "off")) => println!("(this model's template does not mark thinking)"),
        (Some("think"), _) => println!("usage: /think on|off"),
        _ => println!("unknown command /{command}\n{HELP}"),
    }
    ControlFlow::Continue(())
}

fn counts(saved: SaveCounts) -> String {
    format!("{} messages, {} tokens", saved.messages, saved.tokens)
}

fn print_stats(s: &RunStats) {
    println!(
        "prefill {} tokens in {:.0} ms ({:.1} tok/s); decode {} tokens at {:.1} tok/s",
        s.prompt_tokens, s.prefill_ms, s.prefill_tokens_per_s, s.generated_tokens, s.decode_tokens_per_s
    );
    println!(
        "experts: {} hits, {} misses (hit rate {:.1}%), {:.1} MiB read, {:.0} ms stalled on I/O",
        s.expert_hits,
        s.expert_misses,
        s.expert_hit_rate * 100.0,
        s.bytes_read as f64 / (1 << 20) as f64,
        s.stall_ms
    );
    if let Some(spec) = &s.speculation {
        println!(
            "speculation: {} drafted, {} accepted ({:.0}%; by position {:?}), {:.2} tokens a verify pass, {:.2} ms a \
             token drafting vs {:.2} ms plain",
            spec.drafted,
            spec.accepted,
            spec.acceptance() * 100.0,
            spec.accepted_at,
            spec.tokens_per_verify_pass(),
            spec.ms_per_speculative_token(),
            spec.ms_per_plain_token()
        );
    }
    if s.vram_expert_hits + s.vram_expert_misses > 0 {
        println!(
            "experts in VRAM: {} hits, {} misses, {:.1} MiB uploaded in {:.0} ms",
            s.vram_expert_hits,
            s.vram_expert_misses,
            s.vram_bytes_uploaded as f64 / (1 << 20) as f64,
            s.vram_upload_stall_ms
        );
    }
}
