//! Continuous batching: concurrent requests are decoded together, and each
//! gets exactly the tokens it gets alone. What batching gains in tokens/s
//! and bytes read is measured by `cargo xtask bench --only batching`
//! (docs/BENCHMARKS.md), not here: a timing assertion on a shared 2-core
//! machine would fail by chance.

mod common;

use std::time::{Duration, Instant};

use common::{Server, chat_stream_text};
use serde_json::{Value, json};

const PROMPTS: [&str; 4] = ["Once upon a time", "The best thing about", "A quote by Mark Twain:", "Computers are"];

fn stream_body(i: usize, max_tokens: u64) -> Value {
    json!({
        "model": "demo",
        "prompt": PROMPTS[i % PROMPTS.len()],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": 1000 + i,
        "ignore_eos": true,
        "stream": true,
        "stream_options": { "include_usage": true },
    })
}

/// Runs `bodies` at once, each on its own connection; returns each text and
/// the completion tokens of all, and the wall time.
fn concurrently(server: &Server, bodies: Vec<Value>) -> (Vec<String>, u64, Duration) {
    let addr = server.addr;
    let started = Instant::now();
    let threads: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            std::thread::spawn(move || {
                let response = common::request(
                    addr,
                    "POST",
                    "/v1/completions",
                    &[("Content-Type", "application/json")],
                    Some(body.to_string().as_bytes()),
                );
                assert_eq!(response.status, 200, "{}", response.text());
                let (text, _, usage) = chat_stream_text(&response);
                (text, usage.expect("usage")["completion_tokens"].as_u64().expect("tokens"))
            })
        })
        .collect();
    let results: Vec<(String, u64)> = threads.into_iter().map(|t| t.join().expect("request thread")).collect();
    let elapsed = started.elapsed();
    let tokens = results.iter().map(|r| r.1).sum();
    (results.into_iter().map(|r| r.0).collect(), tokens, elapsed)
}

#[test]
fn each_stream_gets_the_tokens_it_gets_alone() {
    let server = Server::start(&["--max-batch", "4"]);
    let alone: Vec<String> = (0..4).map(|i| concurrently(&server, vec![stream_body(i, 48)]).0.remove(0)).collect();
    assert!(alone.iter().all(|t| !t.is_empty()));
    let steps = server.metric("strata_steps_total");
    let sequences = server.metric("strata_step_sequences_total");
    let (together, tokens, _) = concurrently(&server, (0..4).map(|i| stream_body(i, 48)).collect());
    assert_eq!(tokens, 4 * 48);
    for i in 0..4 {
        assert_eq!(together[i], alone[i], "stream {i} batched vs alone");
    }
    // They really were decoded together: fewer steps than tokens.
    let batched_steps = server.metric("strata_steps_total") - steps;
    let batched_sequences = server.metric("strata_step_sequences_total") - sequences;
    let mean_batch = batched_sequences / batched_steps;
    assert!(mean_batch > 1.5, "mean batch {mean_batch} over {batched_steps} steps");
}

/// A prompt longer than `--prefill-chunk` is fed over several steps (so
/// the streams already decoding are not stalled behind it) and gives the
/// very text it gives fed at once.
#[test]
fn a_long_prompt_prefilled_in_chunks_gives_the_same_text() {
    let prompt: Vec<u32> = (0..120).map(|t| 40 + (t * 37) % 3000).collect();
    let body = json!({
        "model": "demo",
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0.8,
        "seed": 5,
        "ignore_eos": true,
    });
    let text = |server: &Server| {
        let response = server.post("/v1/completions", &body);
        assert_eq!(response.status, 200, "{}", response.text());
        let v: Value = serde_json::from_str(&response.text()).expect("json");
        v["choices"][0]["text"].as_str().expect("text").to_owned()
    };
    let whole = text(&Server::start(&[]));
    let chunked_server = Server::start(&["--prefill-chunk", "16"]);
    let steps_before = chunked_server.metric("strata_steps_total");
    assert_eq!(text(&chunked_server), whole);
    // 120 prompt tokens 16 at a time: 8 steps, the last of which also
    // gives the first token; then 7 more tokens.
    assert_eq!(chunked_server.metric("strata_steps_total") - steps_before, 8.0 + 7.0);
}

/// A prompt that extends an earlier request's (the next turn of a chat) is
/// prefilled only from where they differ, on the KV the earlier request
/// left, and gives the very text a fresh server gives it.
#[test]
fn a_prompt_sharing_a_prefix_reuses_the_kv_and_gives_the_same_text() {
    let first: Vec<u32> = (0..30).map(|t| 40 + (t * 53) % 3000).collect();
    let second: Vec<u32> = first.iter().copied().chain([7, 8, 9, 10]).collect();
    let body = |prompt: &[u32]| json!({ "model": "demo", "prompt": prompt, "max_tokens": 6, "temperature": 0.8, "seed": 3, "ignore_eos": true });
    let text = |server: &Server, prompt: &[u32]| {
        let response = server.post("/v1/completions", &body(prompt));
        assert_eq!(response.status, 200, "{}", response.text());
        let v: Value = serde_json::from_str(&response.text()).expect("json");
        v["choices"][0]["text"].as_str().expect("text").to_owned()
    };
    let fresh = text(&Server::start(&[]), &second);
    let server = Server::start(&["--max-batch", "2"]);
    text(&server, &first);
    assert_eq!(server.metric("strata_prompt_tokens_reused_total"), 0.0);
    assert_eq!(text(&server, &second), fresh);
    assert_eq!(server.metric("strata_prompt_tokens_reused_total"), first.len() as f64);
    // The same prompt again: all but its last token are reused.
    assert_eq!(text(&server, &second), fresh);
    assert_eq!(server.metric("strata_prompt_tokens_reused_total"), (first.len() + second.len() - 1) as f64);
}
