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
