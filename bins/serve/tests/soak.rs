//! The soak test: everything the server must survive, at once, for a bounded
//! time. 64 concurrent streams against `--max-batch 4 --queue 8` (429s are
//! retried with backoff, as a client should), while slow clients dribble
//! heads and bodies, oversized bodies arrive and clients drop streams
//! midway, in waves for a bounded time. Throughout, `/health` answers within a second, nothing answers
//! 5xx, resident memory stays within the budget plus a stated slack, and
//! every stream served is the very text it is alone.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Response, Server, Slow, chat_stream_text, parse_response, request, send};
use serde_json::{Value, json};

/// The RAM budget, and the slack allowed above it: strata_tier's own slack
/// (`budget::SLACK_BYTES`, 96 MiB: the binary, thread stacks, activations),
/// plus 32 MiB for what the budget does not plan: the ~100 connections open
/// at once (hyper's read and write buffers, the bodies being read, up to
/// `--max-body` each for the oversized ones before they are refused) and the
/// allocator's free lists after they close.
const BUDGET_MIB: u64 = 64;
const SLACK_MIB: u64 = 96 + 32;
/// Refused before any of it is read: over `--max-body`.
const MAX_BODY: &str = "64KiB";
const OVERSIZED_BYTES: usize = 256 << 10;
const STREAMS: usize = 64;
const TOKENS_PER_STREAM: u64 = 24;
/// Waves of 64 streams start until this much time has passed: long enough
/// for every kind of bad client to come many times, short enough for CI
/// (one wave takes about 5 s in a debug build on 2 shared cores).
const SOAK: Duration = Duration::from_secs(25);
/// A stream still refused after this failed (it starved).
const DEADLINE: Duration = Duration::from_secs(120);

/// The requests streamed: both APIs that stream tokens, a mix of prompts,
/// each with a fixed seed so that its text is fixed.
fn stream_request(i: usize) -> (&'static str, Value) {
    const PROMPTS: [&str; 4] = ["Once upon a time", "The best thing about", "A quote by Mark Twain:", "Computers are"];
    let kind = i % 6;
    let base = json!({
        "model": "demo",
        "max_tokens": TOKENS_PER_STREAM,
        "temperature": 0.8,
        "seed": 7 + kind,
        "ignore_eos": true,
        "stream": true,
    });
    let mut body = base.as_object().expect("object").clone();
    if kind < PROMPTS.len() {
        body.insert("prompt".into(), json!(PROMPTS[kind]));
        ("/v1/completions", Value::Object(body))
    } else {
        body.insert("messages".into(), json!([{ "role": "user", "content": PROMPTS[kind - PROMPTS.len()] }]));
        ("/v1/chat/completions", Value::Object(body))
    }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, &[("Content-Type", "application/json")], Some(body.to_string().as_bytes()))
}

/// Everything the clients saw, shared by their threads.
#[derive(Default)]
struct Seen {
    /// Every status answered, for the no-5xx check.
    statuses: Mutex<Vec<(String, u16)>>,
    refused_429: AtomicUsize,
    health_worst_ms: AtomicUsize,
    health_failures: Mutex<Vec<String>>,
    rss_max_kib: AtomicUsize,
    slow_heads: AtomicUsize,
    slow_bodies: AtomicUsize,
    oversized: AtomicUsize,
    dropped: AtomicUsize,
}

impl Seen {
    fn status(&self, what: &str, status: u16) {
        self.statuses.lock().unwrap().push((what.to_owned(), status));
    }
}

/// One stream, retried while the queue is full (429) with an exponential
/// backoff; its text once served.
fn stream_until_served(addr: SocketAddr, i: usize, seen: &Seen) -> String {
    let (path, body) = stream_request(i);
    let mut backoff = Duration::from_millis(50);
    let started = Instant::now();
    loop {
        let response = post(addr, path, &body);
        seen.status(path, response.status);
        if response.status != 429 {
            assert_eq!(response.status, 200, "stream {i}: {}", response.text());
            return chat_stream_text(&response).0;
        }
        seen.refused_429.fetch_add(1, Ordering::Relaxed);
        assert!(started.elapsed() < DEADLINE, "stream {i} still refused after {DEADLINE:?}");
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// A body that arrives a byte every 300 ms: the server answers 408 once
/// `--body-timeout-secs` pass (or closes the connection), never 5xx.
fn slow_body(addr: SocketAddr, seen: &Seen) {
    let Ok(mut stream) = TcpStream::connect(addr) else { return };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let _ = stream.set_nonblocking(true);
    let mut raw = Vec::new();
    for byte in b"{\"model\": \"demo\", \"prompt\": \"slow\"".iter() {
        if stream.write_all(&[*byte]).is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                break;
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = stream.set_nonblocking(false);
    let _ = stream.read_to_end(&mut raw);
    if raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let status = parse_response(&raw).status;
        seen.status("slow body", status);
        assert_eq!(status, 408, "a body that does not arrive in time");
    }
    seen.slow_bodies.fetch_add(1, Ordering::Relaxed);
}

/// A body declared larger than `--max-body`: 413 before it is read.
fn oversized(addr: SocketAddr, seen: &Seen) {
    let prompt = "x".repeat(OVERSIZED_BYTES);
    let body = json!({ "model": "demo", "prompt": prompt, "max_tokens": 1 }).to_string();
    let mut stream =
        send(addr, "POST", "/v1/completions", &[("Content-Type", "application/json")], Some(body.as_bytes()));
    let mut raw = Vec::new();
    // The server may close (reset) once it has answered, before the rest of
    // the body is read; what arrived before that still says the status.
    let _ = stream.read_to_end(&mut raw);
    if raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let status = parse_response(&raw).status;
        seen.status("oversized", status);
        assert_eq!(status, 413, "a body over --max-body");
    }
    seen.oversized.fetch_add(1, Ordering::Relaxed);
}

/// A stream dropped after its first event: the server cancels it and the
/// batch place is freed for the others.
fn drop_midway(addr: SocketAddr, i: usize, seen: &Seen) {
    let (path, body) = stream_request(i);
    let mut stream =
        send(addr, "POST", path, &[("Content-Type", "application/json")], Some(body.to_string().as_bytes()));
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    while !raw.windows(5).any(|w| w == b"data:") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
        let status = parse_response(&raw[..split + 4]).status;
        seen.status("dropped", status);
        if status == 429 {
            seen.refused_429.fetch_add(1, Ordering::Relaxed);
        }
    }
    seen.dropped.fetch_add(1, Ordering::Relaxed);
}

fn rss_kib(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).unwrap_or(0)
}

#[test]
fn sixty_four_streams_with_slow_oversized_and_dropped_clients_soak_cleanly() {
    let started = Instant::now();
    let budget = format!("{BUDGET_MIB}MiB");
    let server = Server::start(&[
        "--max-batch",
        "4",
        "--queue",
        "8",
        "--ram-budget",
        &budget,
        "--max-body",
        MAX_BODY,
        "--header-timeout-secs",
        "2",
        "--body-timeout-secs",
        "2",
        "--max-connections",
        "256",
    ]);
    let addr = server.addr;
    let pid = server.pid();

    // Each distinct request alone, one after another: the reference texts.
    let alone: Vec<String> = (0..6)
        .map(|kind| {
            let (path, body) = stream_request(kind);
            let response = post(addr, path, &body);
            assert_eq!(response.status, 200, "{}", response.text());
            chat_stream_text(&response).0
        })
        .collect();
    assert!(alone.iter().all(|text| !text.is_empty()), "{alone:?}");

    let seen = Seen::default();
    let done = AtomicBool::new(false);
    let waves: Vec<Vec<String>> = std::thread::scope(|scope| {
        // `/health` every 100 ms on a fresh connection, and RSS with it.
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let response = request(addr, "GET", "/health", &[], None);
                let ms = asked.elapsed().as_millis() as usize;
                seen.health_worst_ms.fetch_max(ms, Ordering::Relaxed);
                if response.status != 200 {
                    seen.health_failures.lock().unwrap().push(format!("{}: {}", response.status, response.text()));
                }
                seen.rss_max_kib.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        // Slow heads: 16 at a time, each cut off by the 2 s head deadline
        // and replaced.
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let mut slow: Vec<Slow> = (0..16).filter_map(|_| Slow::open(addr)).collect();
                let opened = Instant::now();
                while !slow.iter().all(Slow::closed) && opened.elapsed() < Duration::from_secs(10) {
                    slow.iter_mut().for_each(Slow::dribble);
                    std::thread::sleep(Duration::from_millis(200));
                }
                assert!(slow.iter().all(Slow::closed), "slow heads outlived the 2 s deadline by 8 s");
                seen.slow_heads.fetch_add(slow.len(), Ordering::Relaxed);
            }
        });
        // Slow bodies, oversized bodies and dropped streams, in turn.
        for lane in 0..2 {
            let (seen, done) = (&seen, &done);
            scope.spawn(move || {
                let mut round = lane;
                while !done.load(Ordering::Relaxed) {
                    match round % 3 {
                        0 => slow_body(addr, seen),
                        1 => oversized(addr, seen),
                        _ => drop_midway(addr, round, seen),
                    }
                    round += 1;
                }
            });
        }
        let mut waves = Vec::new();
        while waves.is_empty() || started.elapsed() < SOAK {
            let streams: Vec<_> = (0..STREAMS)
                .map(|i| {
                    (
                        i,
                        scope.spawn({
                            let seen = &seen;
                            move || stream_until_served(addr, i, seen)
                        }),
                    )
                })
                .collect();
            let texts: Vec<String> =
                streams.into_iter().map(|(i, s)| s.join().unwrap_or_else(|_| panic!("stream {i}"))).collect();
            waves.push(texts);
        }
        done.store(true, Ordering::Relaxed);
        waves
    });

    for (wave, texts) in waves.iter().enumerate() {
        for (i, text) in texts.iter().enumerate() {
            assert_eq!(text, &alone[i % 6], "wave {wave}, stream {i} (kind {}): together vs alone", i % 6);
        }
    }
    let statuses = seen.statuses.lock().unwrap();
    let errors: Vec<_> = statuses.iter().filter(|(_, s)| *s >= 500).collect();
    assert!(errors.is_empty(), "5xx answers: {errors:?}");
    let failures = seen.health_failures.lock().unwrap();
    assert!(failures.is_empty(), "/health failed: {failures:?}");
    let health_worst_ms = seen.health_worst_ms.load(Ordering::Relaxed);
    let rss_max_mib = seen.rss_max_kib.load(Ordering::Relaxed) >> 10;
    let peak_mib = server.peak_rss_bytes() >> 20;
    eprintln!(
        "soak: {} waves of {STREAMS} streams in {:.1} s; /health worst {health_worst_ms} ms; {} refused with 429; \
         {} slow heads, {} slow bodies, {} oversized, {} dropped; VmRSS max {rss_max_mib} MiB, VmHWM {peak_mib} MiB \
         for a {BUDGET_MIB} MiB budget",
        waves.len(),
        started.elapsed().as_secs_f64(),
        seen.refused_429.load(Ordering::Relaxed),
        seen.slow_heads.load(Ordering::Relaxed),
        seen.slow_bodies.load(Ordering::Relaxed),
        seen.oversized.load(Ordering::Relaxed),
        seen.dropped.load(Ordering::Relaxed),
    );
    assert!(health_worst_ms < 1000, "/health took {health_worst_ms} ms");
    assert!(peak_mib <= BUDGET_MIB + SLACK_MIB, "VmHWM {peak_mib} MiB > {BUDGET_MIB} + {SLACK_MIB} MiB");
    assert!(seen.slow_heads.load(Ordering::Relaxed) > 0 && seen.oversized.load(Ordering::Relaxed) > 0);
    assert!(seen.slow_bodies.load(Ordering::Relaxed) > 0 && seen.dropped.load(Ordering::Relaxed) > 0);
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
}
