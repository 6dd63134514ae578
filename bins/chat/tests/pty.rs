//! `chat` in a real pseudo-terminal, as a person at a terminal meets it: the
//! line editor in raw mode, Ctrl-C as the terminal delivers it, and the
//! files `/save` leaves behind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rexpect::session::{PtySession, spawn_command};

/// Every wait in these tests; a debug build on a loaded machine is slow.
const TIMEOUT_MS: u64 = 120_000;

fn chat(cache: &Path, kv: &Path, extra: &[&str]) -> PtySession {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chat"));
    command
        .args(["--cache-dir", cache.to_str().unwrap(), "--kv-dir", kv.to_str().unwrap()])
        .args(extra)
        // A terminal rustyline supports, so it runs in raw mode as it would
        // for a user (with TERM unset or dumb it reads plain lines).
        .env("TERM", "xterm");
    let mut p = spawn_command(command, Some(TIMEOUT_MS)).expect("chat in a pty");
    p.exp_string("Ctrl-D to quit").expect("the banner");
    p.exp_string(PROMPT).expect("the first prompt");
    p
}

/// How rustyline draws the prompt `> ` (after clearing the line): never in
/// an answer's text.
const PROMPT: &str = "\x1b[K> ";
/// What rustyline writes when Enter ends a line (bracketed paste off).
const LINE_ENTERED: &str = "\x1b[?2004l";

/// Types `line` key by key, as a person does, then Enter.
fn type_line(p: &mut PtySession, line: &str) {
    for c in line.chars() {
        p.send(&c.to_string()).unwrap();
        p.flush().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    p.send("\r").unwrap();
    p.flush().unwrap();
    p.exp_string(LINE_ENTERED).unwrap_or_else(|e| panic!("{line:?} entered: {e}"));
}

/// Enters `line` and returns what chat printed until the next prompt,
/// without the editor's escape codes.
fn enter(p: &mut PtySession, line: &str) -> String {
    type_line(p, line);
    let printed = p.exp_string(PROMPT).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    strip_escapes(&printed).trim().to_owned()
}

fn strip_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() || c == '~' {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// The number after `label` in `text` (e.g. "prefill 12 tokens").
fn number_after(text: &str, label: &str) -> usize {
    let rest = &text[text.rfind(label).unwrap_or_else(|| panic!("{label:?} in {text:?}")) + label.len()..];
    rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// The files of saved conversation `name`: its record and the KV file
/// the record names, with their bytes.
fn saved_files(kv: &Path, name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let record = kv.join(format!("{name}.chat.json"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    let kv_file = kv.join(json["kv_file"].as_str().unwrap());
    [record, kv_file].into_iter().map(|path| (path.clone(), std::fs::read(&path).unwrap())).collect()
}

#[test]
fn a_saved_conversation_is_a_copy_that_later_turns_reset_and_other_conversations_never_change() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, kv) = (dir.path().join("cache"), dir.path().join("kv"));
    let mut p = chat(&cache, &kv, &["--temperature", "0", "--max-new-tokens", "24"]);

    enter(&mut p, "Tell me a fortune.");
    let saved = enter(&mut p, "/save a");
    assert!(saved.starts_with("(saved a: 2 messages, "), "{saved}");
    let saved_tokens = number_after(&saved, "messages,");
    let files = saved_files(&kv, "a");
    let record: serde_json::Value = serde_json::from_slice(&files[0].1).unwrap();
    assert_eq!(record["tokens"], saved_tokens, "the record counts the saved tokens");
    assert_eq!(record["messages"][0]["content"], "Tell me a fortune.");

    // More turns, a reset, another conversation and another save.
    let follow_up = "What did Mark Twain say about money?";
    let first_answer = enter(&mut p, follow_up);
    assert!(!first_answer.is_empty(), "an answer to {follow_up:?}");
    assert_eq!(enter(&mut p, "/reset"), "(conversation forgotten)");
    enter(&mut p, "Tell me about computers.");
    assert!(enter(&mut p, "/save b").starts_with("(saved b: 2 messages"));
    for (path, bytes) in &files {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{} is unchanged", path.display());
    }

    // Loading restores exactly the saved copy: the same answer to the same
    // follow-up (greedy), with only the new turn run through the model.
    let loaded = enter(&mut p, "/load a");
    assert_eq!(loaded, format!("(loaded a: 2 messages, {saved_tokens} tokens, KV cache read back)"));
    assert_eq!(enter(&mut p, follow_up), first_answer, "the conversation continued as saved");
    let prefill = number_after(&enter(&mut p, "/stats"), "prefill");
    assert!(prefill < saved_tokens, "only the new turn is prefilled ({prefill} of {saved_tokens} saved)");
    for (path, bytes) in &files {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{} is unchanged after loading", path.display());
    }

    // A name never saved, or none, is one clear line; /bye quits.
    let missing = enter(&mut p, "/load nope");
    assert!(missing.starts_with("error: no conversation saved as nope"), "{missing}");
    assert_eq!(enter(&mut p, "/save"), "usage: /save NAME");
    type_line(&mut p, "/bye");
    p.exp_eof().unwrap();
}

#[test]
fn ctrl_c_stops_a_streaming_answer_and_the_next_prompt_works() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, kv) = (dir.path().join("cache"), dir.path().join("kv"));
    // Greedy on this question the demo model loops until the context is
    // full; uncached direct reads of every expert make each token slow
    // enough that the answer is surely still streaming at the Ctrl-C.
    let slow = ["--temperature", "0", "--threads", "1", "--io", "direct", "--expert-cache", "16KiB"];
    let mut p = chat(&cache, &kv, &slow);
    type_line(&mut p, "Give me a quote by Mark Twain.");
    // The first words of the answer, then Ctrl-C as a terminal sends it.
    let mut shown = String::new();
    while strip_escapes(&shown).chars().filter(char::is_ascii_alphabetic).count() < 3 {
        match p.try_read() {
            Some(c) => shown.push(c),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    p.send_control('c').unwrap();
    let rest = p.exp_string(PROMPT).expect("the next prompt");
    assert!(rest.contains("(stopped)"), "Ctrl-C stopped the answer: {shown}{rest}");
    let generated = number_after(&enter(&mut p, "/stats"), "decode");
    assert!(generated < 200, "stopped early: {generated} tokens generated");
    // The next prompt works: a question gets an answer.
    let answer = enter(&mut p, "Tell me a fortune.");
    assert!(answer.chars().filter(char::is_ascii_alphabetic).count() > 3, "{answer:?}");
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}

/// The repository's checkout, for its fixtures.
fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

#[test]
fn a_strict_alternation_template_keeps_answering_after_the_context_fills() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, kv) = (dir.path().join("cache"), dir.path().join("kv"));
    // The demo's tokenizer with Mixtral's template, which raises an error
    // unless the messages after the system one alternate user/assistant.
    let text = dir.path().join("text");
    std::fs::create_dir(&text).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(repo_file("models/demo").join(file), text.join(file)).unwrap();
    }
    std::fs::copy(repo_file("testdata/templates/mixtral-instruct.jinja"), text.join("chat_template.jinja")).unwrap();
    let tokenizer = ["--tokenizer", text.to_str().unwrap(), "--system", "Be brief."];
    let mut p = chat(&cache, &kv, &[&tokenizer[..], &["--temperature", "0", "--max-new-tokens", "24"]].concat());
    // Greedy, the demo sometimes ends an answer at once, so that an empty
    // answer is still one; an error is not.
    let (mut drops, mut answered_after_a_drop) = (0, 0);
    for turn in 0..14 {
        let printed = enter(&mut p, &format!("Tell me fortune number {turn}."));
        assert!(!printed.contains("error"), "turn {turn}: {printed}");
        if drops > 0 && printed.chars().any(|c| c.is_ascii_alphabetic()) {
            answered_after_a_drop += 1;
        }
        drops += usize::from(printed.contains("dropped to fit"));
    }
    assert!(drops > 0, "14 turns outgrow the demo's 256-token context");
    assert!(answered_after_a_drop > 0, "the model still answers once older turns are dropped");
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn a_line_written_in_one_write_is_answered_with_no_further_key() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, kv) = (dir.path().join("cache"), dir.path().join("kv"));
    let mut p = chat(&cache, &kv, &["--temperature", "0", "--max-new-tokens", "24"]);
    // As a paste without paste brackets, an `expect` script or a fast ssh
    // link delivers it: the whole line in one read. (The session's writer
    // is line-buffered: a string ending in a newline goes out in one write.)
    p.send("Tell me a fortune.\n").unwrap();
    p.flush().unwrap();
    p.exp_string(LINE_ENTERED).expect("the line entered");
    let printed = strip_escapes(&p.exp_string(PROMPT).expect("the answer, then the next prompt"));
    assert!(printed.chars().filter(char::is_ascii_alphabetic).count() > 3, "{printed:?}");
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
}
