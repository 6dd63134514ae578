//! `echo question | chat` prints one answer from the demo model and exits.

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn piped_question_gets_one_english_answer() {
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_chat"))
        .args(["--cache-dir", cache.path().to_str().unwrap(), "--temperature", "0", "--max-new-tokens", "40"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Tell me a fortune.\n").unwrap();
    let out = child.wait_with_output().unwrap();
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_chat"))
        .args(["--cache-dir", cache.path().to_str().unwrap(), "--temperature", "0", "--max-new-tokens", "20"])
        .args(["--usage-file", usage.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Tell me a fortune.\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.split_whitespace().count() >= 3, "the answer is printed: {stdout:?}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("usage")).collect();
    assert_eq!(warnings.len(), 1, "one warning naming the usage file: {stderr}");
    assert!(warnings[0].contains("warning") && warnings[0].contains("usage.json"), "{stderr}");
}
