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
use strata_engine::{Chat, Engine, Reply, ReplyOptions, RunStats};

const HELP: &str = "\
/help          this text
/reset         forget the conversation
/save NAME     keep the conversation (its KV cache) under NAME
/load NAME     continue a saved conversation, without re-reading it
/stats         speed and expert-cache figures of the last answer
Ctrl-C         stop the current answer;  Ctrl-D  quit";

pub fn run<'e>(engine: &'e Engine, chat: &mut Chat<'e>, options: &ReplyOptions, kv_dir: &Path) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    let mut editor = DefaultEditor::new().context("starting the line editor")?;
    let spec = engine.spec();
    println!(
        "strata chat: {} ({} layers, {} experts, top-{}). /help for commands, Ctrl-D to quit.",
        engine.container().dir().display(),
        spec.num_layers,
        spec.moe.num_experts,
        spec.moe.top_k
    );
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
            command_line(command, engine, chat, kv_dir, last.as_ref());
            continue;
        }
        interrupted.store(false, Ordering::SeqCst);
        match answer(chat, line, options, &interrupted) {
            Ok(reply) => last = Some(reply.stats),
            Err(err) => eprintln!("error: {err:#}"),
        }
    }
}

fn answer(chat: &mut Chat<'_>, line: &str, options: &ReplyOptions, interrupted: &AtomicBool) -> Result<Reply> {
    let mut stdout = std::io::stdout();
    let reply = chat.say(line, options, |text| {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
        if interrupted.load(Ordering::SeqCst) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    })?;
    println!();
    for warning in chat.take_warnings() {
        eprintln!("warning: {warning}");
    }
    if reply.finish == strata_engine::FinishReason::Cancelled {
        println!("(stopped)");
    }
    Ok(reply)
}

fn command_line<'e>(command: &str, engine: &'e Engine, chat: &mut Chat<'e>, kv_dir: &Path, last: Option<&RunStats>) {
    let mut words = command.split_whitespace();
    match (words.next(), words.next()) {
        (Some("help"), _) => println!("{HELP}"),
        (Some("reset"), _) => {
            chat.reset();
            println!("(conversation forgotten)");
        }
        (Some("stats"), _) => match last {
            Some(stats) => print_stats(stats),
            None => println!("(no answer yet)"),
        },
        (Some("save"), Some(name)) => match chat.save(kv_dir, name) {
            Ok(tokens) => println!("(saved {tokens} tokens as {name})"),
            Err(err) => eprintln!("error: {err:#}"),
        },
        (Some("load"), Some(name)) => match chat.load(engine, kv_dir, name) {
            Ok(tokens) => println!("(loaded {name}: {tokens} tokens, no re-prefill)"),
            Err(err) => eprintln!("error: {err:#}"),
        },
        _ => println!("unknown command /{command}\n{HELP}"),
    }
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
}
