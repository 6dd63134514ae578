//! Limits and safety: API key, Host allowlist, CORS, body size, the bounded
//! queue (429), and a client that disconnects cancelling its generation.

mod common;

use std::io::Read;
use std::time::Duration;

use common::{Server, request, send};
use serde_json::json;

fn body(max_tokens: u64) -> String {
    json!({
        "model": "demo",
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0,
    })
    .to_string()
}

#[test]
fn api_key_host_allowlist_cors_and_body_limit() {
    let server = Server::start(&["--api-key", "s3cret", "--max-body", "2KiB", "--allowed-host", "my.box"]);
    let chat =
        json!({ "model": "demo", "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 2 }).to_string();
    let post = |headers: &[(&str, &str)], body: &str| {
        let mut all = vec![("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        request(server.addr, "POST", "/v1/chat/completions", &all, Some(body.as_bytes()))
    };

    let none = post(&[], &chat);
    assert_eq!(none.status, 401);
    assert_eq!(none.json()["error"]["code"], "invalid_api_key");
    assert_eq!(post(&[("Authorization", "Bearer wrong")], &chat).status, 401);
    assert_eq!(post(&[("Authorization", "Bearer s3cret")], &chat).status, 200);
    assert_eq!(post(&[("x-api-key", "s3cret")], &chat).status, 200, "Anthropic's header too");
    assert_eq!(request(server.addr, "GET", "/v1/models", &[], None).status, 401);
    assert_eq!(request(server.addr, "GET", "/metrics", &[], None).status, 401);
    assert_eq!(request(server.addr, "GET", "/v1/models", &[("Authorization", "Bearer s3cret")], None).status, 200);
    let messages = request(server.addr, "POST", "/v1/messages", &[], Some(b"{}"));
    assert_eq!(messages.status, 401);
    assert_eq!(messages.json()["error"]["type"], "authentication_error", "Anthropic's error shape");
    // The page and the health check stay open (the page asks for the key).
    assert_eq!(request(server.addr, "GET", "/", &[], None).status, 200);
    assert_eq!(request(server.addr, "GET", "/health", &[], None).status, 200);

    // DNS rebinding: a name we were not told about is refused, before auth.
    let key = ("Authorization", "Bearer s3cret");
    for host in ["evil.example", "evil.example:8080", "127.0.0.1.nip.io"] {
        let response = request(server.addr, "GET", "/v1/models", &[("Host", host), key], None);
        assert_eq!(response.status, 403, "{host}");
        assert_eq!(response.json()["error"]["code"], "host_not_allowed");
        assert_eq!(request(server.addr, "GET", "/", &[("Host", host)], None).status, 403, "{host}");
    }
    for host in ["localhost:8080", "127.0.0.1", "[::1]:8080", "my.box", "MY.BOX:80"] {
        assert_eq!(request(server.addr, "GET", "/v1/models", &[("Host", host), key], None).status, 200, "{host}");
    }

    // CORS is off: no Access-Control headers, and a preflight is not approved.
    let origin = ("Origin", "http://page.example");
    let plain = request(server.addr, "GET", "/v1/models", &[origin, key], None);
    assert!(plain.header("access-control-allow-origin").is_none());
    let preflight = request(
        server.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[origin, ("Access-Control-Request-Method", "POST")],
        None,
    );
    assert!(preflight.header("access-control-allow-origin").is_none());

    // Bodies over --max-body: 413 with an error body.
    let big = json!({ "model": "demo", "prompt": "x".repeat(4096) }).to_string();
    let json = ("Content-Type", "application/json");
    let too_big = request(server.addr, "POST", "/v1/completions", &[key, json], Some(big.as_bytes()));
    assert_eq!(too_big.status, 413);
    assert!(too_big.json()["error"]["message"].is_string());
}

#[test]
fn cors_is_allowed_for_the_origins_given() {
    let server = Server::start(&["--cors-origin", "http://page.example"]);
    let preflight = request(
        server.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "http://page.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization,content-type"),
        ],
        None,
    );
    assert!(preflight.status < 300, "{}", preflight.status);
    assert_eq!(preflight.header("access-control-allow-origin"), Some("http://page.example"));
    let other = request(server.addr, "GET", "/v1/models", &[("Origin", "http://other.example")], None);
    assert!(other.header("access-control-allow-origin").is_none());
    let allowed = request(server.addr, "GET", "/v1/models", &[("Origin", "http://page.example")], None);
    assert_eq!(allowed.header("access-control-allow-origin"), Some("http://page.example"));
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    // One sequence at a time and one waiting: of six long requests sent at
    // once, at most two are taken.
    let server = Server::start(&["--max-batch", "1", "--queue", "1"]);
    let addr = server.addr;
    let requests: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                let b = body(200);
                request(addr, "POST", "/v1/completions", &[("Content-Type", "application/json")], Some(b.as_bytes()))
            })
        })
        .collect();
    let responses: Vec<_> = requests.into_iter().map(|t| t.join().expect("request thread")).collect();
    let rejected: Vec<_> = responses.iter().filter(|r| r.status == 429).collect();
    assert!(!rejected.is_empty(), "statuses: {:?}", responses.iter().map(|r| r.status).collect::<Vec<_>>());
    for r in &rejected {
        assert_eq!(r.header("retry-after"), Some("1"));
        let error = r.json();
        assert_eq!(error["error"]["type"], "rate_limit_error");
        assert_eq!(error["error"]["code"], "queue_full");
    }
    assert!(responses.iter().all(|r| r.status == 200 || r.status == 429));
    assert_eq!(server.metric("strata_requests_rejected_total"), rejected.len() as f64);
}

#[test]
fn a_client_that_disconnects_cancels_its_generation() {
    let server = Server::start(&["--max-batch", "2"]);
    let stream_body = json!({
        "model": "demo",
        "prompt": "Once upon a time",
        "max_tokens": 240,
        "ignore_eos": true,
        "stream": true,
    })
    .to_string();
    let mut connection = send(
        server.addr,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        Some(stream_body.as_bytes()),
    );
    // Read until the first token arrives, then hang up.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = connection.read(&mut buf).expect("read");
        assert!(n > 0, "stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    drop(connection);
    assert!(
        server.wait_for(Duration::from_secs(20), |s| s.metric("strata_requests_cancelled_total") >= 1.0
            && s.metric("strata_active_sequences") == 0.0),
        "{}",
        server.get("/metrics").text()
    );
    let generated = server.metric("strata_generated_tokens_total");
    assert!(generated < 240.0, "generation stopped early, after {generated} tokens");

    // A non-streamed request whose client goes away is cancelled as well.
    let plain = body(240);
    let connection =
        send(server.addr, "POST", "/v1/completions", &[("Content-Type", "application/json")], Some(plain.as_bytes()));
    assert!(server.wait_for(Duration::from_secs(20), |s| s.metric("strata_active_sequences") == 1.0));
    drop(connection);
    assert!(
        server.wait_for(Duration::from_secs(20), |s| s.metric("strata_requests_cancelled_total") >= 2.0
            && s.metric("strata_active_sequences") == 0.0),
        "{}",
        server.get("/metrics").text()
    );
    assert!(server.metric("strata_generated_tokens_total") < generated + 240.0);
    // And the server carries on.
    let ok = server.post("/v1/completions", &json!({ "model": "demo", "prompt": "hi", "max_tokens": 3 }));
    assert_eq!(ok.status, 200);
}

/// `--api-key` puts the key in `ps` for every user of the machine:
/// `STRATA_API_KEY` and `--api-key-file` keep it out of the command line.
#[test]
fn api_key_from_the_environment_or_a_file_stays_out_of_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "fi1e-key\n").unwrap();
    let key_file = key_file.to_str().unwrap();
    let chat =
        json!({ "model": "demo", "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 1 }).to_string();
    for (server, key) in [
        (Server::start_with_env(&[("STRATA_API_KEY", "env-key")], &[]), "env-key"),
        (Server::start(&["--api-key-file", key_file]), "fi1e-key"),
    ] {
        let post = |headers: &[(&str, &str)]| {
            let mut all = vec![("Content-Type", "application/json")];
            all.extend_from_slice(headers);
            request(server.addr, "POST", "/v1/chat/completions", &all, Some(chat.as_bytes())).status
        };
        assert_eq!(post(&[]), 401, "{key}");
        assert_eq!(post(&[("Authorization", &format!("Bearer {key}"))]), 200, "{key}");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.pid())).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(key), "{key} is not on the command line");
    }
}
