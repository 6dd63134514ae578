//! The HTTP APIs as a client sees them: OpenAI chat and text completions
//! (streamed and not), models, Anthropic Messages, health, metrics, and
//! what every malformed request gets back.

mod common;

use common::{Server, chat_stream_text, request};
use serde_json::{Value, json};

fn chat(content: &str) -> Value {
    json!({ "model": "demo", "messages": [{ "role": "user", "content": content }] })
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        base[k] = v.clone();
    }
    base
}

#[test]
fn chat_completions_streamed_or_not_give_the_same_seeded_text() {
    let server = Server::start(&[]);
    let body = with(chat("Give me a quote by Mark Twain."), json!({ "seed": 7, "temperature": 0.9, "max_tokens": 40 }));
    let first = server.post("/v1/chat/completions", &body);
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], "demo");
    let text = first["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    assert!(!text.is_empty());
    let usage = &first["usage"];
    let completion_tokens = usage["completion_tokens"].as_u64().unwrap();
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5);
    assert!((1..=40).contains(&completion_tokens));
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().unwrap() + completion_tokens));
    let finish = first["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || (finish == "length" && completion_tokens == 40), "{first}");

    // The same seed gives the same text, streamed or not.
    let again = server.post("/v1/chat/completions", &body).json();
    assert_eq!(again["choices"][0]["message"]["content"], text.as_str());
    let streamed = server.post(
        "/v1/chat/completions",
        &with(body.clone(), json!({ "stream": true, "stream_options": { "include_usage": true } })),
    );
    assert_eq!(streamed.status, 200);
    assert!(streamed.header("content-type").unwrap().starts_with("text/event-stream"));
    let (streamed_text, streamed_finish, streamed_usage) = chat_stream_text(&streamed);
    assert_eq!(streamed_text, text);
    assert_eq!(streamed_finish.as_deref(), Some(finish));
    assert_eq!(streamed_usage.as_ref(), Some(usage));
    let first_chunk: Value = serde_json::from_str(&streamed.events()[0].1).unwrap();
    assert_eq!(first_chunk["object"], "chat.completion.chunk");
    assert_eq!(first_chunk["choices"][0]["delta"]["role"], "assistant");

    // Another seed, most likely another text; greedy is the same every time.
    let greedy = with(chat("Give me a quote by Mark Twain."), json!({ "temperature": 0, "max_tokens": 30 }));
    let a = server.post("/v1/chat/completions", &greedy).json();
    let b = server.post("/v1/chat/completions", &with(greedy, json!({ "seed": 12345 }))).json();
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
}

#[test]
fn completions_honour_max_tokens_and_stop_strings() {
    let server = Server::start(&[]);
    let base =
        json!({ "model": "demo", "prompt": "The only thing", "temperature": 0, "max_tokens": 24, "ignore_eos": true });
    let full = server.post("/v1/completions", &base);
    assert_eq!(full.status, 200, "{}", full.text());
    let full = full.json();
    assert_eq!(full["object"], "text_completion");
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(full["usage"]["completion_tokens"], 24);
    let text = full["choices"][0]["text"].as_str().unwrap().to_owned();

    // A stop string from the middle of that text ends the reply before it.
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 3, "{text:?}");
    let stop = format!(" {}", words[2]);
    let cut = text.find(&stop).expect("stop string in the text");
    let stopped = server.post("/v1/completions", &with(base.clone(), json!({ "stop": [stop, "never-there"] }))).json();
    assert_eq!(stopped["choices"][0]["text"].as_str().unwrap(), &text[..cut], "{stopped}");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert!(stopped["usage"]["completion_tokens"].as_u64().unwrap() < 24);

    // Streamed, in pieces that add up to the same text; a string `stop` too.
    let streamed = server.post("/v1/completions", &with(base.clone(), json!({ "stream": true })));
    let (streamed_text, finish, usage) = chat_stream_text(&streamed);
    assert_eq!(streamed_text, text);
    assert_eq!(finish.as_deref(), Some("length"));
    assert!(usage.is_none(), "usage only when asked for");
    let streamed =
        server.post("/v1/completions", &with(base.clone(), json!({ "stream": true, "stop": stop_of(&text) })));
    let (streamed_text, finish, _) = chat_stream_text(&streamed);
    assert_eq!(finish.as_deref(), Some("stop"));
    assert!(text.starts_with(&streamed_text) && streamed_text.len() < text.len());

    // Token ids as the prompt.
    let ids = server.post("/v1/completions", &with(base, json!({ "prompt": [1, 2, 3], "max_tokens": 3 }))).json();
    assert_eq!(ids["usage"]["prompt_tokens"], 3);
    assert_eq!(ids["usage"]["completion_tokens"], 3);
}

fn stop_of(text: &str) -> String {
    text.split_whitespace().nth(1).expect("two words").to_owned()
}

#[test]
fn models_health_metrics_and_info() {
    let server = Server::start(&["--model-name", "tiny-moe"]);
    let models = server.get("/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny-moe");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(server.get("/v1/models/tiny-moe").json()["id"], "tiny-moe");
    let missing = server.get("/v1/models/gpt-4");
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "model_not_found");
    let wrong = server.post("/v1/chat/completions", &chat("hi"));
    assert_eq!(wrong.status, 404, "the model is called tiny-moe here");

    let health = server.get("/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");

    let ok = server.post(
        "/v1/chat/completions",
        &json!({ "model": "tiny-moe", "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 8, "seed": 1 }),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let generated = ok.json()["usage"]["completion_tokens"].as_f64().unwrap();
    let metrics = server.get("/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics.header("content-type").unwrap().starts_with("text/plain; version=0.0.4"));
    let text = metrics.text();
    for name in [
        "strata_tokens_per_second",
        "strata_queue_depth",
        "strata_expert_hits_total",
        "strata_expert_misses_total",
        "strata_expert_bytes_read_total",
        "strata_generated_tokens_total",
        "strata_active_sequences",
        "strata_vram_bytes_uploaded_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} in\n{text}");
    }
    assert_eq!(server.metric("strata_generated_tokens_total"), generated);
    assert!(server.metric("strata_expert_hits_total") + server.metric("strata_expert_misses_total") > 0.0);
    assert!(server.metric("strata_expert_bytes_read_total") > 0.0, "the first tokens read experts from disk");
    assert_eq!(server.metric("strata_requests_total{endpoint=\"chat_completions\"}"), 1.0);

    let info = server.get("/info").json();
    assert_eq!(info["model"], "tiny-moe");
    assert_eq!(info["info"]["family"], "olmoe");
    assert!(info["info"]["experts"].as_u64().unwrap() > 1);
    assert!(info["live"]["expert_hit_rate"].as_f64().is_some());
}

#[test]
fn anthropic_messages_streamed_and_not() {
    let server = Server::start(&[]);
    let body = json!({
        "model": "demo",
        "max_tokens": 20,
        "system": "You are terse.",
        "messages": [{ "role": "user", "content": [{ "type": "text", "text": "Give me a quote by Mark Twain." }] }],
        "temperature": 0,
    });
    let reply = server.post("/v1/messages", &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = reply.json();
    assert_eq!(reply["type"], "message");
    assert_eq!(reply["role"], "assistant");
    assert!(reply["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(reply["content"][0]["type"], "text");
    let text = reply["content"][0]["text"].as_str().unwrap().to_owned();
    let stop_reason = reply["stop_reason"].as_str().unwrap();
    assert!(["end_turn", "max_tokens"].contains(&stop_reason), "{reply}");
    assert!(reply["usage"]["input_tokens"].as_u64().unwrap() > 0);

    let streamed = server.post("/v1/messages", &with(body.clone(), json!({ "stream": true })));
    assert_eq!(streamed.status, 200);
    let events = streamed.events();
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_deref().unwrap_or("")).collect();
    assert_eq!(&names[..3], ["message_start", "content_block_start", "ping"]);
    assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert!(names[3..names.len() - 3].iter().all(|n| *n == "content_block_delta"), "{names:?}");
    let mut streamed_text = String::new();
    for (name, data) in &events {
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["type"].as_str(), name.as_deref(), "each event's data names its type");
        if data["type"] == "content_block_delta" {
            assert_eq!(data["delta"]["type"], "text_delta");
            streamed_text.push_str(data["delta"]["text"].as_str().unwrap());
        }
        if data["type"] == "message_delta" {
            assert_eq!(data["delta"]["stop_reason"], stop_reason);
            assert_eq!(data["usage"]["output_tokens"], reply["usage"]["output_tokens"]);
        }
    }
    assert_eq!(streamed_text, text);

    // Stop sequences are reported as such.
    let word = text.split_whitespace().nth(1).expect("two words").to_owned();
    let stopped = server.post("/v1/messages", &with(body.clone(), json!({ "stop_sequences": [word.clone()] }))).json();
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], word.as_str());

    // `max_tokens` is a cap here (clients send 4096 whatever the model's context).
    let capped = server.post("/v1/messages", &with(body.clone(), json!({ "max_tokens": 4096 })));
    assert_eq!(capped.status, 200, "{}", capped.text());
    let capped_text = capped.json()["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(capped_text.starts_with(&text), "greedy: the reply with 20 tokens, continued");

    // Errors in Anthropic's shape.
    let missing = server.post("/v1/messages", &json!({ "model": "demo", "messages": [] }));
    assert_eq!(missing.status, 400);
    let missing = missing.json();
    assert_eq!(missing["type"], "error");
    assert_eq!(missing["error"]["type"], "invalid_request_error");
    let unknown = server.post("/v1/messages", &with(body, json!({ "model": "claude-x" })));
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["type"], "not_found_error");
}

#[test]
fn malformed_requests_get_4xx_with_error_bodies_never_5xx() {
    let server = Server::start(&["--max-tokens", "64"]);
    let long_prompt = "hello ".repeat(400);
    let cases: Vec<(&str, String, u16)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400),
        ("/v1/chat/completions", "".into(), 400),
        ("/v1/chat/completions", "[1, 2]".into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo"}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": "hi"}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": []}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": 5, "messages": [{"role": "user", "content": "hi"}]}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": 7}]}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "top_p": -1}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 65}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "seed": "x"}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stop": 3}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "n": 3}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "demo", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#.into(), 400),
        ("/v1/chat/completions", r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}"#.into(), 404),
        ("/v1/chat/completions", format!(r#"{{"model": "demo", "messages": [{{"role": "user", "content": "{long_prompt}"}}]}}"#), 400),
        ("/v1/completions", r#"{"model": "demo", "prompt": ""}"#.into(), 400),
        ("/v1/completions", r#"{"model": "demo", "prompt": [4096]}"#.into(), 400),
        ("/v1/completions", r#"{"model": "demo", "prompt": ["a", "b"]}"#.into(), 400),
        ("/v1/completions", r#"{"model": "demo", "prompt": {"x": 1}}"#.into(), 400),
        ("/v1/completions", r#"{"model": "demo", "prompt": "hi", "echo": true}"#.into(), 400),
        ("/v1/completions", format!(r#"{{"model": "demo", "prompt": "{long_prompt}"}}"#), 400),
        ("/v1/completions", r#"{"model": "demo", "prompt": "hi", "max_tokens": 250}"#.into(), 400),
        ("/v1/messages", r#"{"model": "demo", "max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}"#.into(), 400),
        ("/v1/messages", r#"{"model": "demo", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.5}"#.into(), 400),
        ("/v1/messages", "\u{0}\u{1}".into(), 400),
    ];
    for (path, body, status) in &cases {
        let response =
            request(server.addr, "POST", path, &[("Content-Type", "application/json")], Some(body.as_bytes()));
        assert_eq!(response.status, *status, "{path} {body:.80}: {}", response.text());
        let error = response.json();
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{path} {body:.80}: an error body with a message: {error}");
        assert!(error["error"]["type"].is_string(), "{error}");
    }
    let context = request(
        server.addr,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        Some(format!(r#"{{"model": "demo", "prompt": "{long_prompt}"}}"#).as_bytes()),
    );
    assert_eq!(context.json()["error"]["code"], "context_length_exceeded");

    for (method, path, status) in
        [("GET", "/nowhere", 404), ("DELETE", "/v1/models", 405), ("GET", "/v1/chat/completions", 405)]
    {
        let response = request(server.addr, method, path, &[], None);
        assert_eq!(response.status, status, "{method} {path}");
        assert!(response.json()["error"]["message"].is_string());
    }
    // Still serving.
    assert_eq!(server.get("/health").status, 200);
    let ok = server.post("/v1/completions", &json!({ "model": "demo", "prompt": "hi", "max_tokens": 2 }));
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
}

#[test]
fn memory_in_use_is_shown_in_metrics_and_info() {
    let server = Server::start(&[]);
    let body = json!({ "model": "demo", "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 8 });
    let ok = server.post("/v1/chat/completions", &body);
    assert_eq!(ok.status, 200, "{}", ok.text());
    // Resident memory under its standard name, and the caches' use beside
    // their capacity.
    let resident = server.metric("process_resident_memory_bytes");
    assert!(resident > 1e6, "resident memory {resident}");
    let used = server.metric("strata_expert_cache_used_bytes");
    let capacity = server.metric("strata_expert_cache_capacity_bytes");
    assert!(used > 0.0 && used <= capacity, "expert cache {used} of {capacity}");
    // The finished request's session waits in the idle pool with its KV.
    assert!(server.metric("strata_kv_bytes") > 0.0);
    let live = &server.get("/info").json()["live"];
    assert!(live["resident_bytes"].as_f64().unwrap() > 1e6, "{live}");
    assert!(live["expert_cache_used_bytes"].as_f64().unwrap() > 0.0, "{live}");
    assert!(live["kv_bytes"].as_f64().unwrap() > 0.0, "{live}");
}

#[test]
fn the_token_limit_flag_has_the_name_chat_and_strata_use_too() {
    let server = Server::start(&["--max-new-tokens", "7"]);
    assert_eq!(server.get("/info").json()["limits"]["max_tokens"], 7);
}

/// `--log-format json`: every line a request logs carries its id, the id
/// the response's `X-Request-Id` names (the client's own when it sends one),
/// and its last line says how it ended and how long it took.
#[test]
fn a_requests_id_is_on_each_of_its_json_log_lines() {
    let server = Server::start(&["--log-format", "json"]);
    let body = json!({ "model": "demo", "prompt": "Once upon a time", "max_tokens": 4 });
    let response = server.post("/v1/completions", &body);
    assert_eq!(response.status, 200, "{}", response.text());
    let id = response.header("x-request-id").expect("an X-Request-Id").to_owned();
    assert!(id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    let lines_of = |id: &str| -> Vec<Value> {
        let stderr = server.stderr();
        let lines = stderr.lines().map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")));
        lines.filter(|l| l["spans"].as_array().is_some_and(|s| s.iter().any(|s| s["id"] == id))).collect()
    };
    let done = |lines: &[Value]| lines.iter().any(|l| l["fields"]["message"] == "done");
    assert!(server.wait_for(std::time::Duration::from_secs(10), |_| done(&lines_of(&id))), "{}", server.stderr());
    let lines = lines_of(&id);
    assert!(lines.len() >= 2, "a line for the generation and one for the end: {lines:?}");
    let end = lines.iter().find(|l| l["fields"]["message"] == "done").expect("the end");
    assert_eq!(end["fields"]["status"], 200, "{end}");
    assert!(end["fields"]["duration_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{end}");
    assert!(end["timestamp"].is_string() && end["level"] == "INFO", "{end}");

    let headers = [("Content-Type", "application/json"), ("X-Request-Id", "client-7.a_b")];
    let response = request(server.addr, "POST", "/v1/completions", &headers, Some(body.to_string().as_bytes()));
    assert_eq!(response.header("x-request-id"), Some("client-7.a_b"));
    assert!(server.wait_for(std::time::Duration::from_secs(10), |_| done(&lines_of("client-7.a_b"))));
}

/// `RUST_LOG=strata=debug`: each batch step's span names the requests it
/// carries, so its end (tokens, milliseconds) and each MoE layer's expert
/// loads (layer, experts, bytes, stall) join a request's lines by its id.
#[test]
fn batch_steps_and_expert_loads_carry_the_request_ids_of_their_batch() {
    // A cache smaller than the demo's experts: they are streamed, not all
    // read at open.
    let args = ["--log-format", "json", "--expert-cache", "1MiB"];
    let server = Server::start_with_env(&[("RUST_LOG", "strata=debug")], &args);
    let body = json!({ "model": "demo", "prompt": "Once upon a time", "max_tokens": 3 }).to_string();
    let headers = [("Content-Type", "application/json"), ("X-Request-Id", "joined-by-id")];
    let response = request(server.addr, "POST", "/v1/completions", &headers, Some(body.as_bytes()));
    assert_eq!(response.status, 200, "{}", response.text());
    let in_its_steps = |message: &str| -> Vec<Value> {
        let stderr = server.stderr();
        let lines = stderr.lines().map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")));
        let carries = |span: &Value| {
            span["name"] == "step"
                && span["requests"].as_str().is_some_and(|ids| ids.split(',').any(|id| id == "joined-by-id"))
        };
        lines
            .filter(|l| l["fields"]["message"] == message)
            .filter(|l| l["spans"].as_array().is_some_and(|spans| spans.iter().any(carries)))
            .collect()
    };
    let steps_logged = |_: &Server| in_its_steps("stepped").len() >= 3;
    assert!(server.wait_for(std::time::Duration::from_secs(10), steps_logged), "{}", server.stderr());
    let steps = in_its_steps("stepped");
    let prompt_tokens: u64 = steps.iter().map(|l| l["fields"]["prompt_tokens"].as_u64().expect("prompt tokens")).sum();
    assert!(prompt_tokens > 0, "the prompt is fed in the request's steps: {steps:?}");
    assert!(steps.iter().all(|l| l["fields"]["elapsed_ms"].as_f64().is_some_and(|ms| ms > 0.0)), "{steps:?}");
    let loads = in_its_steps("experts loaded");
    let first = loads.first().unwrap_or_else(|| panic!("no expert loads in the request's steps:\n{}", server.stderr()));
    let layer = first["spans"].as_array().and_then(|spans| spans.iter().find(|s| s["name"] == "moe_layer"));
    assert!(layer.is_some_and(|span| span["layer"].is_u64()), "{first}");
    for field in ["resident_experts", "loaded_experts", "bytes_loaded"] {
        assert!(first["fields"][field].is_u64(), "{field}: {first}");
    }
    assert!(first["fields"]["stall_ms"].is_f64(), "{first}");
    // A fresh server's small cache is cold: its first request reads experts.
    let bytes_loaded: u64 = loads.iter().filter_map(|l| l["fields"]["bytes_loaded"].as_u64()).sum();
    assert!(bytes_loaded > 0, "{loads:?}");
}

/// `RUST_LOG` chooses the lines: at `warn` a request writes none, at
/// `debug` even the health checks that `info` leaves out are logged.
#[test]
fn rust_log_filters_the_log() {
    let body = json!({ "model": "demo", "prompt": "Once upon a time", "max_tokens": 4 });
    let quiet = Server::start_with_env(&[("RUST_LOG", "warn")], &[]);
    let id = quiet.post("/v1/completions", &body).header("x-request-id").expect("an id").to_owned();
    let health_id = quiet.get("/health").header("x-request-id").expect("an id").to_owned();
    let verbose = Server::start_with_env(&[("RUST_LOG", "debug")], &[]);
    let verbose_id = verbose.get("/health").header("x-request-id").expect("an id").to_owned();
    assert!(
        verbose.wait_for(std::time::Duration::from_secs(10), |s| s.stderr().contains(&verbose_id)),
        "{}",
        verbose.stderr()
    );
    // The verbose server has logged its health check; the quiet one had as
    // long for its requests.
    let stderr = quiet.stderr();
    assert!(!stderr.contains(&id) && !stderr.contains(&health_id), "{stderr}");
}
