//! `echo question | chat` prints one answer from the demo model and exits.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `chat` with "Tell me a fortune." piped in, capturing its output.
fn ask(command: &mut Command) -> Output {
    let mut child =
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("chat starts");
    child.stdin.take().unwrap().write_all(b"Tell me a fortune.\n").unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn piped_question_gets_one_english_answer() {
    let cache = tempfile::tempdir().unwrap();
    let out = ask(Command::new(env!("CARGO_BIN_EXE_chat")).args([
        "--cache-dir",
        cache.path().to_str().unwrap(),
        "--temperature",
        "0",
        "--max-new-tokens",
        "40",
    ]));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let words = stdout.split_whitespace().filter(|w| w.chars().all(|c| c.is_ascii_alphabetic())).count();
    assert!(words >= 3, "an answer in words: {stdout:?}");
    assert!(!stdout.contains("<|"), "no special tokens in the text: {stdout:?}");
}

#[test]
fn empty_input_is_one_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chat"))
        .args(["--cache-dir", cache.path().to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no question") && !stderr.contains("panicked"), "{stderr}");
}

/// Learning is an optimisation: a usage file that cannot be written (here
/// its directory is gone, a real ENOENT from the OS) costs one warning,
/// never the answer or the exit status.
#[test]
fn an_unwritable_usage_file_costs_no_answer() {
    let cache = tempfile::tempdir().unwrap();
    let usage = cache.path().join("gone").join("usage.json");
    let out = ask(Command::new(env!("CARGO_BIN_EXE_chat"))
        .args(["--cache-dir", cache.path().to_str().unwrap(), "--temperature", "0", "--max-new-tokens", "20"])
        .args(["--usage-file", usage.to_str().unwrap()]));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.split_whitespace().count() >= 3, "the answer is printed: {stdout:?}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("usage")).collect();
    assert_eq!(warnings.len(), 1, "one warning naming the usage file: {stderr}");
    assert!(warnings[0].contains("warning") && warnings[0].contains("usage.json"), "{stderr}");
}

#[test]
fn the_tokenizer_can_come_from_another_directory() {
    let cache = tempfile::tempdir().unwrap();
    // Only tokenizer.json there: no chat template, so turns are joined plainly.
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    std::fs::copy(demo.join("tokenizer.json"), cache.path().join("tokenizer.json")).unwrap();
    let out = ask(Command::new(env!("CARGO_BIN_EXE_chat"))
        .args(["--cache-dir", cache.path().to_str().unwrap(), "--tokenizer", cache.path().to_str().unwrap()])
        .args(["--temperature", "0", "--max-tokens", "20"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
}
