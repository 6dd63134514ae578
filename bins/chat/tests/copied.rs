//! A `chat` binary copied alone to another place runs the demo model it
//! carries: no repository, no cache, no network.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Whether this machine lets us hide a folder in a private mount namespace
/// (root, as in CI): then the repository's models/demo is out of the
/// binary's sight, as on a machine that never had the repository.
fn can_hide_folders() -> bool {
    Command::new("unshare").args(["--mount", "true"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

#[test]
fn a_binary_copied_alone_runs_the_built_in_demo_offline() {
    let dir = tempfile::tempdir().unwrap();
    let (bin_dir, home, work, empty) =
        (dir.path().join("bin"), dir.path().join("home"), dir.path().join("work"), dir.path().join("empty"));
    for d in [&bin_dir, &home, &work, &empty] {
        std::fs::create_dir(d).unwrap();
    }
    let chat = bin_dir.join("chat");
    std::fs::copy(env!("CARGO_BIN_EXE_chat"), &chat).unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo").canonicalize().unwrap();
    let mut command = if can_hide_folders() {
        let mut c = Command::new("unshare");
        c.args(["--mount", "sh", "-c", r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#, "sh"])
            .args([&empty, &demo, &chat]);
        c
    } else {
        eprintln!("note: cannot hide {} here (not root); the copy runs beside it", demo.display());
        Command::new(&chat)
    };
    let mut child = command
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .current_dir(&work)
        .args(["--temperature", "0", "--max-new-tokens", "30"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Tell me a fortune.\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let words = stdout.split_whitespace().filter(|w| w.chars().all(|c| c.is_ascii_alphabetic())).count();
    assert!(words >= 3, "an answer in words: {stdout:?}");
    // The demo was converted into the home's cache, keyed by its content,
    // and the unpacked checkpoint removed.
    let models = home.join(".cache/strata/models");
    let entries: Vec<String> =
        std::fs::read_dir(&models).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(
        entries.len() == 1
            && entries[0].starts_with("demo-")
            && models.join(&entries[0]).join("manifest.json").is_file(),
        "{entries:?}"
    );
}
