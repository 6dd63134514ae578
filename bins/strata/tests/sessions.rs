//! Named KV sessions through the command line: a generation stopped and
//! continued in a new process yields exactly the tokens of one that never
//! stopped (GQA and MLA families, greedy and sampled); a process killed
//! while appending reopens at its last complete token; a session of another
//! model is refused with one clear line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("strata runs")
}

/// Runs a command that must succeed and print JSON last; returns that JSON.
fn strata_json(args: &[&str]) -> Value {
    let out = strata(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "strata {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or("null")).unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn convert(family: &str, out: &Path) {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family).join("hf");
    let done = strata(&["convert", path(&hf), path(out), "--quant", "q8"]);
    assert!(done.status.success(), "{family}: {}", String::from_utf8_lossy(&done.stderr));
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect()
}

fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
}

const PROMPT: &str = "5,17,42";
const PROMPT_TOKENS: usize = 3;
/// Greedy, so that runs in different processes compare token for token.
const GREEDY: [&str; 2] = ["--temperature", "0"];

/// olmoe (GQA: keys and values), deepseek_v3 (MLA: one latent stream) and
/// glm_moe_dsa (MLA with the DSA indexer-key stream).
#[test]
fn eight_then_eight_in_a_new_process_equals_sixteen_in_one_go() {
    let dir = tempfile::tempdir().unwrap();
    for family in ["olmoe", "deepseek_v3", "glm_moe_dsa"] {
        let model = dir.path().join(family);
        convert(family, &model);
        let kv = dir.path().join(format!("kv-{family}"));
        let sampled = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "7"];
        for (label, sampling) in [("greedy", &GREEDY[..]), ("sampled", &sampled[..])] {
            let run = |n: &str, extra: &[&str]| {
                let mut args = vec!["generate", path(&model), "--max-new-tokens", n, "--ignore-eos", "--json"];
                args.extend_from_slice(sampling);
                args.extend_from_slice(extra);
                strata_json(&args)
            };
            let whole = tokens(&run("16", &["--tokens", PROMPT]));
            assert_eq!(whole.len(), 16);

            let session = ["--kv-dir", path(&kv), "--session", label];
            let first = run("8", &[&["--tokens", PROMPT][..], &session].concat());
            assert_eq!(first["stats"]["session_reopened_tokens"], 0, "{family} {label}: a new session");
            let second = run("8", &session);
            let stats = &second["stats"];
            assert_eq!(stats["session_reopened_tokens"], PROMPT_TOKENS + 8, "{family} {label}: {stats}");
            assert_eq!(stats["session_cut_bytes"], 0);
            assert_eq!(stats["session_tokens"], PROMPT_TOKENS + 16);
            assert_eq!(stats["prompt_tokens"], 0, "zero re-prefill");
            assert_eq!(stats["session_saved"], true);
            let resumed: Vec<u64> = tokens(&first).into_iter().chain(tokens(&second)).collect();
            assert_eq!(resumed, whole, "{family} {label}: 8 + 8 after a restart must equal 16 in one go");
        }
    }
}

/// `strata info`'s KV bytes per token and its layers' state parts give the
/// header's size and a record's: 16 bytes of prefix, the rows, an 8-byte
/// checksum (docs/FORMAT.md). Every layer of the families tested here keeps
/// the same rows.
fn layout(model: &Path) -> (u64, u64) {
    let out = strata(&["info", path(model)]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = text.lines().find(|l| l.starts_with("kv bytes/token")).expect("kv line");
    let kv_bytes: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    let kinds: Vec<&str> = text.lines().filter(|l| l.starts_with("state parts")).collect();
    assert_eq!(kinds.len(), 1, "every layer keeps the same parts: {text}");
    // `state parts   N x rows D, rows D (f32)`
    let (layers, parts) = kinds[0].trim_start_matches("state parts").trim().split_once(" x ").unwrap();
    let layers: u64 = layers.parse().unwrap();
    let parts = parts.split(", ").count() as u64;
    // Version 3: each layer's part count, then kind and two sizes per part.
    let header_bytes = 128 + layers * (4 + 12 * parts);
    (header_bytes, 24 + kv_bytes)
}

/// Reopens `name` to generate one token, checking the reopened length
/// against the file's size, and that the token is the uninterrupted run's.
fn reopen_and_check(model: &Path, kv: &Path, name: &str, layout: (u64, u64), reference: &[u64]) -> u64 {
    let (header_bytes, record_bytes) = layout;
    let file_bytes = std::fs::metadata(kv.join(format!("{name}.kvs"))).unwrap().len();
    let records = (file_bytes - header_bytes) / record_bytes;
    let torn_bytes = (file_bytes - header_bytes) % record_bytes;
    let args = ["generate", path(model), "--kv-dir", path(kv), "--session", name, "--max-new-tokens", "1"];
    let out = strata(&[&args[..], &["--ignore-eos", "--json"], &GREEDY].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let stats = &v["stats"];
    // Every record of a run killed while decoding is a token with its rows.
    assert_eq!(stats["session_reopened_tokens"], records, "{name}: {stats}");
    assert_eq!(stats["session_cut_bytes"], torn_bytes, "{name}: {stats}");
    assert_eq!(stderr.contains("torn tail"), torn_bytes > 0, "the cut is reported: {stderr}");
    assert_eq!(stats["session_tokens"], records + 1);
    let generated_before = records as usize - PROMPT_TOKENS;
    assert_eq!(tokens(&v), [reference[generated_before]], "{name}: continues where the killed run was");
    records
}

#[test]
fn a_process_killed_while_appending_reopens_at_its_last_complete_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("olmoe");
    convert("olmoe", &model);
    let kv = dir.path().join("kv");
    let layout = layout(&model);
    let session_file = kv.join("s.kvs");

    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["generate", path(&model), "--tokens", PROMPT, "--kv-dir", path(&kv), "--session", "s"])
        .args(["--max-new-tokens", "4000", "--ignore-eos", "--json"])
        .args(GREEDY)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it (SIGKILL) once the prompt and some decoded tokens are on disk.
    let enough_bytes = layout.0 + (PROMPT_TOKENS as u64 + 20) * layout.1;
    let started = Instant::now();
    while std::fs::metadata(&session_file).map_or(0, |m| m.len()) < enough_bytes {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed");
        assert!(started.elapsed() < Duration::from_secs(120), "the session file does not grow");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // A second copy with a torn last record, whatever the kill left.
    let bytes = std::fs::read(&session_file).unwrap();
    std::fs::write(kv.join("torn.kvs"), &bytes[..bytes.len() - 7]).unwrap();

    let most = (bytes.len() as u64 - layout.0) / layout.1 - PROMPT_TOKENS as u64 + 2;
    let reference = tokens(&strata_json(&[
        "generate",
        path(&model),
        "--tokens",
        PROMPT,
        "--max-new-tokens",
        &most.to_string(),
        "--ignore-eos",
        "--json",
        "--temperature",
        "0",
    ]));
    let killed = reopen_and_check(&model, &kv, "s", layout, &reference);
    assert!(killed >= PROMPT_TOKENS as u64 + 20);
    let torn = reopen_and_check(&model, &kv, "torn", layout, &reference);
    assert!(torn == killed || torn + 1 == killed, "killed {killed}, torn {torn}");
    // The cut file is whole again (now ending in the one generated token,
    // not yet run): reopening finds nothing to cut and goes on.
    let args = ["generate", path(&model), "--kv-dir", path(&kv), "--session", "torn", "--max-new-tokens", "1"];
    let v = strata_json(&[&args[..], &["--ignore-eos", "--json"], &GREEDY].concat());
    assert_eq!(
        (&v["stats"]["session_reopened_tokens"], &v["stats"]["session_cut_bytes"]),
        (&(torn + 1).into(), &0.into())
    );
    assert_eq!(tokens(&v), [reference[torn as usize + 1 - PROMPT_TOKENS]]);
}

#[test]
fn a_session_of_another_model_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (olmoe, qwen) = (dir.path().join("olmoe"), dir.path().join("qwen3_moe"));
    convert("olmoe", &olmoe);
    convert("qwen3_moe", &qwen);
    let kv = dir.path().join("kv");
    let session = ["--kv-dir", path(&kv), "--session", "s", "--max-new-tokens", "2"];
    let first = strata(&[&["generate", path(&olmoe), "--tokens", PROMPT][..], &session].concat());
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let before = std::fs::read(kv.join("s.kvs")).unwrap();

    let out = strata(&[&["generate", path(&qwen)][..], &session].concat());
    assert_clean_failure(
        &out,
        &["s.kvs", "written for another model", "content hash", "in the file", "for this model"],
    );
    assert_eq!(std::fs::read(kv.join("s.kvs")).unwrap(), before, "the refused file is untouched");
}

#[test]
fn session_flags_are_checked_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let kv: PathBuf = dir.path().join("kv");
    let model = path(dir.path()); // never opened: every check below comes first
    let out = strata(&["generate", model, "--tokens", "1", "--kv-dir", path(&kv)]);
    assert_clean_failure(&out, &["--kv-dir and --session go together"]);
    let out = strata(&["generate", model, "--session", "s"]);
    assert_clean_failure(&out, &["--kv-dir and --session go together"]);
    let out = strata(&["generate", model]);
    assert_clean_failure(&out, &["no tokens and no session to continue"]);
    let out = strata(&["generate", model, "--kv-dir", path(&kv), "--session", "new"]);
    assert_clean_failure(&out, &["no tokens and no session to continue"]);
    let out = strata(&["generate", model, "--tokens", "1", "--kv-dir", path(&kv), "--session", "../escape"]);
    assert_clean_failure(&out, &["invalid option session", "../escape"]);
    assert!(!kv.exists(), "nothing created");
}
