//! Real clients against `serve`: the official `openai` and `anthropic`
//! Python packages (tools and structured outputs too), and the chat page in
//! headless Chromium driven by playwright-core.
//!
//! `.ci/run` installs what they need (Debian's chromium, a venv with the
//! pinned Python clients, playwright-core from npm) and sets
//! `STRATA_SERVE_E2E=require`, so there a missing tool fails the test. On a
//! machine without them the tests install the Python and npm parts into
//! target/ themselves, and skip, saying why, only if that is impossible.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Server, repo_root};

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target/tmp has a parent").to_path_buf()
}

/// Fails (CI) or skips (elsewhere) a test whose tools cannot be had.
fn unavailable(test: &str, why: &str) {
    if std::env::var("STRATA_SERVE_E2E").as_deref() == Ok("require") {
        panic!("{test}: {why} (STRATA_SERVE_E2E=require: .ci/run should have installed it)");
    }
    eprintln!("SKIPPED {test}: {why}; run .ci/run (or install it) to run this test");
}

fn run(command: &mut Command) -> Result<String, String> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|e| format!("{shown}: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if output.status.success() { Ok(text) } else { Err(format!("{shown} failed ({}):\n{text}", output.status)) }
}

/// A Python with every package requirements.txt pins (the official
/// `openai` and `anthropic` clients, jsonschema): target/serve-py, made if
/// missing.
fn python_with_clients() -> Result<PathBuf, String> {
    let requirements = repo_root().join("bins/serve/tests/py/requirements.txt");
    let venv = target_dir().join("serve-py");
    let python = venv.join("bin/python");
    let text = std::fs::read_to_string(&requirements).map_err(|e| format!("{}: {e}", requirements.display()))?;
    let pinned: Vec<&str> = text.lines().filter(|l| l.contains("==")).collect();
    let has_them = |python: &Path| {
        run(Command::new(python).args(["-m", "pip", "freeze", "--disable-pip-version-check"]))
            .is_ok_and(|frozen| pinned.iter().all(|pin| frozen.lines().any(|l| l == *pin)))
    };
    if python.exists() && has_them(&python) {
        return Ok(python);
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "-r"]).arg(&requirements))?;
    if has_them(&python) {
        Ok(python)
    } else {
        Err(format!("{} did not install into {}", requirements.display(), venv.display()))
    }
}

/// Runs `script` (in tests/py) with the pinned clients against a fresh
/// server started with `args`, at `base` (`/v1` for OpenAI's client, the
/// root for Anthropic's).
fn client_script_passes(test: &str, script: &str, base: &str, args: &[&str]) {
    let python = match python_with_clients() {
        Ok(python) => python,
        Err(why) => return unavailable(test, &why),
    };
    let server = Server::start(&[&["--api-key", "test-key"], args].concat());
    let script = repo_root().join("bins/serve/tests/py").join(script);
    let base = format!("http://{}{base}", server.addr);
    let output = Command::new(python).arg(&script).args([base.as_str(), "demo", "test-key"]).output().expect("python");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{text}");
    assert!(output.status.success(), "{test}: client checks failed:\n{text}\nserver:\n{}", server.stderr());
}

#[test]
fn the_official_openai_python_client_works() {
    client_script_passes("the_official_openai_python_client_works", "openai_client.py", "/v1", &[]);
}

#[test]
fn the_official_anthropic_python_clients_tool_use_works() {
    client_script_passes("the_official_anthropic_python_clients_tool_use_works", "anthropic_client.py", "", &[]);
}

/// The demo's tokenizer with a template that thinks (tests/py/thinking_template.jinja).
#[test]
fn the_official_clients_read_reasoning_apart_from_the_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(common::demo_model().join("tokenizer.json"), dir.path().join("tokenizer.json")).expect("copy");
    let template = repo_root().join("bins/serve/tests/py/thinking_template.jinja");
    std::fs::copy(template, dir.path().join("chat_template.jinja")).expect("copy");
    let tokenizer = dir.path().to_str().expect("a UTF-8 path");
    client_script_passes(
        "the_official_clients_read_reasoning_apart_from_the_answer",
        "thinking_client.py",
        "",
        &["--tokenizer", tokenizer],
    );
}

/// playwright-core from npm in target/serve-node, at the version
/// tests/browser/package.json pins, installed if missing.
fn playwright_core() -> Result<PathBuf, String> {
    let manifest = repo_root().join("bins/serve/tests/browser/package.json");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    let version = manifest["dependencies"]["playwright-core"].as_str().ok_or("no playwright-core in package.json")?;
    let prefix = target_dir().join("serve-node");
    let module = prefix.join("node_modules/playwright-core");
    let installed = |module: &Path| {
        std::fs::read_to_string(module.join("package.json"))
            .is_ok_and(|p| p.contains(&format!("\"version\": \"{version}\"")))
    };
    if installed(&module) {
        return Ok(module);
    }
    std::fs::create_dir_all(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
    run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(&prefix)
        .arg(format!("playwright-core@{version}")))?;
    if installed(&module) { Ok(module) } else { Err(format!("playwright-core@{version} did not install")) }
}

#[test]
fn the_chat_page_streams_a_reply_in_headless_chromium() {
    let chromium = std::env::var_os("CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    if !chromium.exists() {
        return unavailable(
            "the_chat_page_streams_a_reply_in_headless_chromium",
            &format!("no Chromium at {} (apt-get install chromium)", chromium.display()),
        );
    }
    let module = match playwright_core() {
        Ok(module) => module,
        Err(why) => return unavailable("the_chat_page_streams_a_reply_in_headless_chromium", &why),
    };
    let server = Server::start(&[]);
    let script = repo_root().join("bins/serve/tests/browser/chat_page.cjs");
    let screenshot = target_dir().join("serve-chat-page.png");
    let _ = std::fs::remove_file(&screenshot);
    let output = Command::new("node")
        .arg(&script)
        .arg(format!("http://{}/", server.addr))
        .arg(&screenshot)
        .env("PLAYWRIGHT_CORE", &module)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{text}");
    assert!(output.status.success(), "the chat page checks failed:\n{text}\nserver:\n{}", server.stderr());
    let png = std::fs::read(&screenshot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real screenshot at {}", screenshot.display());
    println!("screenshot: {}", screenshot.display());
    // Whether the stop also cancelled work on the server depends on whether
    // the server had finished the reply before the click (it generates
    // faster than a browser reads); tests/limits.rs checks that a closed
    // connection cancels. Here: the server is idle again.
    assert!(server.wait_for(std::time::Duration::from_secs(10), |s| s.metric("strata_active_sequences") == 0.0));
    println!("cancelled on the server: {}", server.metric("strata_requests_cancelled_total"));
}

/// The `curl` example of `serve --help`, as a user pastes it: its lines
/// from `curl` on, with their `\` continuations.
fn help_curl_example() -> String {
    let help = run(Command::new(env!("CARGO_BIN_EXE_serve")).arg("--help")).expect("serve --help");
    let mut lines = help.lines().skip_while(|line| !line.trim_start().starts_with("curl "));
    let mut example = String::new();
    for line in lines.by_ref() {
        example.push_str(line.trim());
        if !example.ends_with('\\') {
            return example;
        }
        example.push('\n');
    }
    panic!("no complete curl example in serve --help:\n{help}");
}

#[test]
fn the_curl_example_of_serve_help_works_as_pasted() {
    let test = "the_curl_example_of_serve_help_works_as_pasted";
    if run(Command::new("curl").arg("--version")).is_err() {
        return unavailable(test, "no curl on PATH");
    }
    let example = help_curl_example();
    const HELP_ADDRESS: &str = "http://127.0.0.1:8080";
    assert!(example.contains(HELP_ADDRESS), "{example}");
    // serve --help's own example, at the test server's port; curl adds the
    // status code on a last line of its own.
    let server = Server::start(&[]);
    let command = example.replace(HELP_ADDRESS, &format!("http://{}", server.addr))
        + " --silent --show-error --write-out '\\n%{http_code}'";
    let output = run(Command::new("sh").arg("-c").arg(&command)).unwrap_or_else(|e| panic!("{e}"));
    let (body, status) = output.trim_end().rsplit_once('\n').unwrap_or_else(|| panic!("{output}"));
    assert_eq!(status, "200", "{example}\n{body}");
    let reply: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(!content.trim().is_empty(), "a completion: {reply}");
}
