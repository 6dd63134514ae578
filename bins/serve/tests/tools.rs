//! Tools and structured outputs on the demo model: a grammar holds every
//! constrained reply to its schema or forced call, malformed output without
//! one is text (never a 5xx), and requests without a grammar get the tokens
//! they get alone, batched with constrained ones or not.

mod common;

use common::{Server, chat_stream_text};
use serde_json::{Value, json};

/// Seeded requests per check (the bar: 50 of 50).
const SEEDED_REQUESTS: u64 = 50;
/// Room for a whole call in the demo's small tokens: the markers, the
/// function's name and bounded arguments.
const CALL_MAX_TOKENS: u64 = 160;
const CITY_MAX_CHARS: usize = 16;

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 12 },
            "age": { "type": "integer", "minimum": 0, "maximum": 120 },
            "member": { "type": "boolean" },
        },
        "required": ["name", "age", "member"],
        "additionalProperties": false,
    })
}

/// Whether `value` is valid under `person_schema`.
fn is_person(value: &Value) -> bool {
    let Some(object) = value.as_object() else { return false };
    object.len() == 3
        && object.get("name").and_then(Value::as_str).is_some_and(|n| n.chars().count() <= 12)
        && object.get("age").and_then(Value::as_u64).is_some_and(|a| a <= 120)
        && object.get("member").is_some_and(Value::is_boolean)
}

fn weather_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string", "maxLength": CITY_MAX_CHARS },
            "unit": { "enum": ["celsius", "fahrenheit"] },
        },
        "required": ["city", "unit"],
        "additionalProperties": false,
    })
}

fn openai_tools() -> Value {
    json!([
        { "type": "function", "function": { "name": "get_weather", "description": "The weather in a city", "parameters": weather_parameters() } },
        { "type": "function", "function": { "name": "get_time", "parameters": { "type": "object", "properties": {}, "additionalProperties": false } } },
    ])
}

/// Whether `arguments` (JSON text) are valid `get_weather` arguments.
fn is_weather_call(arguments: &str) -> bool {
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(arguments) else { return false };
    object.len() == 2
        && object.get("city").and_then(Value::as_str).is_some_and(|c| c.chars().count() <= CITY_MAX_CHARS)
        && object.get("unit").and_then(Value::as_str).is_some_and(|u| u == "celsius" || u == "fahrenheit")
}

fn chat(messages: Value, seed: u64, extra: Value) -> Value {
    let mut body = json!({ "model": "demo", "messages": messages, "max_tokens": CALL_MAX_TOKENS, "seed": seed, "temperature": 1.0 });
    body.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
    body
}

fn ask_weather() -> Value {
    json!([{ "role": "user", "content": "What is the weather in Paris?" }])
}

#[test]
fn schema_constrained_replies_are_valid_json_under_the_schema() {
    let server = Server::start(&[]);
    let format = json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "person", "schema": person_schema() } } });
    let mut valid = 0;
    for seed in 0..SEEDED_REQUESTS {
        let messages = json!([{ "role": "user", "content": "Describe a person." }]);
        let response = server.post("/v1/chat/completions", &chat(messages, seed, format.clone()));
        assert_eq!(response.status, 200, "{}", response.text());
        let reply = response.json();
        let content = reply["choices"][0]["message"]["content"].as_str().expect("content");
        if serde_json::from_str::<Value>(content).is_ok_and(|v| is_person(&v)) {
            valid += 1;
        } else {
            eprintln!("seed {seed}: not a person: {content:?} ({})", reply["choices"][0]["finish_reason"]);
        }
    }
    assert_eq!(valid, SEEDED_REQUESTS, "replies valid under the schema");

    // Any object: its strings are unbounded, so only a reply cut by the
    // length limit may be unfinished.
    let object = server
        .post("/v1/chat/completions", &chat(ask_weather(), 1, json!({ "response_format": { "type": "json_object" } })));
    let choice = &object.json()["choices"][0];
    let content = choice["message"]["content"].as_str().expect("content").to_owned();
    assert!(
        serde_json::from_str::<Value>(&content).is_ok_and(|v| v.is_object())
            || choice["finish_reason"] == "length" && content.starts_with('{'),
        "json_object: {choice}"
    );
}

#[test]
fn forced_tool_calls_parse_with_valid_arguments() {
    let server = Server::start(&[]);
    let forced = json!({ "tools": openai_tools(), "tool_choice": { "type": "function", "function": { "name": "get_weather" } } });
    let mut parsed = 0;
    for seed in 0..SEEDED_REQUESTS {
        let reply = server.post("/v1/chat/completions", &chat(ask_weather(), seed, forced.clone())).json();
        let choice = &reply["choices"][0];
        let call = &choice["message"]["tool_calls"][0];
        if choice["finish_reason"] == "tool_calls"
            && call["function"]["name"] == "get_weather"
            && call["id"].as_str().is_some_and(|id| id.starts_with("call_"))
            && call["function"]["arguments"].as_str().is_some_and(is_weather_call)
        {
            parsed += 1;
        } else {
            eprintln!("seed {seed}: no valid call: {choice}");
        }
    }
    assert_eq!(parsed, SEEDED_REQUESTS, "forced calls that parse");
}

#[test]
fn streamed_tool_calls_arrive_as_deltas_with_the_tool_calls_finish_reason() {
    let server = Server::start(&[]);
    let body = chat(ask_weather(), 7, json!({ "tools": openai_tools(), "tool_choice": "required", "stream": true }));
    let response = server.post("/v1/chat/completions", &body);
    assert_eq!(response.status, 200, "{}", response.text());
    let (_, finish, _) = chat_stream_text(&response);
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let calls: Vec<Value> = response
        .events()
        .iter()
        .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .collect();
    assert_eq!(calls.len(), 1, "one call: {calls:?}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["type"], "function");
    let name = calls[0]["function"]["name"].as_str().expect("name");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().expect("arguments")).expect("JSON");
    assert!(name == "get_weather" && is_weather_call(&arguments.to_string()) || name == "get_time", "{}", calls[0]);
}

#[test]
fn a_conversation_with_calls_and_results_is_templated() {
    let server = Server::start(&[]);
    let messages = json!([
        { "role": "user", "content": "What is the weather in Paris?" },
        { "role": "assistant", "content": null, "tool_calls": [
            { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}" } },
        ] },
        { "role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny" },
    ]);
    let response =
        server.post("/v1/chat/completions", &chat(messages, 1, json!({ "tools": openai_tools(), "max_tokens": 16 })));
    assert_eq!(response.status, 200, "{}", response.text());
}

#[test]
fn unconstrained_tool_requests_give_text_never_a_server_error() {
    let server = Server::start(&[]);
    for seed in 0..8 {
        let response =
            server.post("/v1/chat/completions", &chat(ask_weather(), seed, json!({ "tools": openai_tools() })));
        assert_eq!(response.status, 200, "{}", response.text());
        let choice = &response.json()["choices"][0];
        assert!(choice["message"]["content"].is_string() || choice["finish_reason"] == "tool_calls", "{choice}");
    }
}

/// Bad schemas and tool lists are the request's fault: a 400 naming the
/// field, in one line. A self-referential `$ref` used to fail at the first
/// step in the batcher (a 500 with the parser's state), and 4000 forced
/// tools came back with llguidance's 121-line backtrace.
#[test]
fn bad_schemas_and_unknown_tools_are_400s_naming_the_field() {
    let server = Server::start(&[]);
    let small_tool = |i: usize| {
        json!({ "type": "function", "function": { "name": format!("f{i}"), "parameters": { "type": "object",
            "properties": { "a": { "type": "string", "pattern": "^[a-z]{8}$" } } } } })
    };
    let many_tools: Vec<Value> = (0..4000).map(small_tool).collect();
    let self_reference = json!({ "$defs": { "a": { "$ref": "#/$defs/a" } }, "$ref": "#/$defs/a" });
    let cases = [
        (
            json!({ "response_format": { "type": "json_schema", "json_schema": { "schema": self_reference } } }),
            "response_format",
        ),
        (json!({ "tools": many_tools, "tool_choice": "required" }), "tools"),
        (
            json!({ "response_format": { "type": "json_schema", "json_schema": { "schema": { "type": "no-such-type" } } } }),
            "response_format",
        ),
        (json!({ "response_format": { "type": "yaml" } }), "response_format"),
        (
            json!({ "tools": openai_tools(), "tool_choice": { "type": "function", "function": { "name": "nope" } } }),
            "tool_choice",
        ),
        (json!({ "tool_choice": "required" }), "tool_choice"),
        (json!({ "tools": [{ "type": "function", "function": {} }] }), "tools"),
    ];
    for (extra, param) in cases {
        let response = server.post("/v1/chat/completions", &chat(ask_weather(), 1, extra.clone()));
        assert_eq!(response.status, 400, "{param}: {}", response.text());
        assert_eq!(response.json()["error"]["param"], param, "{param}");
        let message = response.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
        assert!(!message.contains('\n') && message.len() < 300, "{param}: {message}");
    }
    assert!(!server.stderr().contains("error"), "client errors are not the server's: {}", server.stderr());
}

fn anthropic_body(stream: bool) -> Value {
    json!({
        "model": "demo",
        "max_tokens": CALL_MAX_TOKENS,
        "seed": 3,
        "stream": stream,
        "messages": [{ "role": "user", "content": "What is the weather in Paris?" }],
        "tools": [{ "name": "get_weather", "description": "The weather in a city", "input_schema": weather_parameters() }],
        "tool_choice": { "type": "tool", "name": "get_weather" },
    })
}

#[test]
fn anthropic_forced_tool_use_is_a_tool_use_block() {
    let server = Server::start(&[]);
    let reply = server.post("/v1/messages", &anthropic_body(false)).json();
    assert_eq!(reply["stop_reason"], "tool_use", "{reply}");
    let block =
        reply["content"].as_array().expect("content").iter().find(|b| b["type"] == "tool_use").expect("tool_use");
    assert_eq!(block["name"], "get_weather");
    assert!(block["id"].as_str().is_some_and(|id| id.starts_with("toolu_")), "{block}");
    assert!(is_weather_call(&block["input"].to_string()), "{block}");

    let response = server.post("/v1/messages", &anthropic_body(true));
    let events = response.events();
    let data: Vec<Value> = events.iter().map(|(_, d)| serde_json::from_str(d).expect("JSON")).collect();
    let start = data
        .iter()
        .find(|d| d["type"] == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .expect("tool_use start");
    assert_eq!(start["content_block"]["input"], json!({}));
    let index = &start["index"];
    let partial = data
        .iter()
        .find(|d| d["type"] == "content_block_delta" && &d["index"] == index)
        .and_then(|d| d["delta"]["partial_json"].as_str())
        .expect("input_json_delta");
    assert!(is_weather_call(partial), "{partial}");
    assert!(data.iter().any(|d| d["type"] == "content_block_stop" && &d["index"] == index));
    let delta = data.iter().find(|d| d["type"] == "message_delta").expect("message_delta");
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");

    // The call and its result, sent back.
    let mut body = anthropic_body(false);
    body["messages"] = json!([
        { "role": "user", "content": "What is the weather in Paris?" },
        { "role": "assistant", "content": [block.clone()] },
        { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": block["id"], "content": [{ "type": "text", "text": "18 degrees" }] }] },
    ]);
    body["tool_choice"] = json!({ "type": "auto" });
    body["max_tokens"] = json!(16);
    let response = server.post("/v1/messages", &body);
    assert_eq!(response.status, 200, "{}", response.text());
}

fn free_body(i: u64) -> Value {
    let prompt = ["Tell me a story.", "Say something.", "Hello!"][i as usize % 3];
    json!({
        "model": "demo",
        "messages": [{ "role": "user", "content": prompt }],
        "max_tokens": 48,
        "seed": 100 + i,
        "temperature": 0.9,
        "ignore_eos": true,
        "stream": true,
    })
}

#[test]
fn free_requests_batched_with_constrained_ones_get_the_tokens_they_get_alone() {
    let server = Server::start(&["--max-batch", "4"]);
    let alone: Vec<String> =
        (0..2).map(|i| chat_stream_text(&server.post("/v1/chat/completions", &free_body(i))).0).collect();
    let addr = server.addr;
    let send = move |body: Value| {
        std::thread::spawn(move || {
            common::request(
                addr,
                "POST",
                "/v1/chat/completions",
                &[("Content-Type", "application/json")],
                Some(body.to_string().as_bytes()),
            )
        })
    };
    let forced = json!({ "tools": openai_tools(), "tool_choice": { "type": "function", "function": { "name": "get_weather" } } });
    let format = json!({ "response_format": { "type": "json_schema", "json_schema": { "schema": person_schema() } } });
    let constrained = [send(chat(ask_weather(), 5, forced)), send(chat(ask_weather(), 6, format))];
    let free: Vec<_> = (0..2).map(|i| send(free_body(i))).collect();
    let batched: Vec<String> = free.into_iter().map(|t| chat_stream_text(&t.join().expect("request")).0).collect();
    for t in constrained {
        assert_eq!(t.join().expect("request").status, 200);
    }
    assert_eq!(batched, alone, "free requests batched with constrained ones");
}

#[test]
fn a_call_cut_by_the_length_limit_is_text_not_an_error() {
    let server = Server::start(&[]);
    let forced = json!({ "tools": openai_tools(), "tool_choice": "required", "max_tokens": 8 });
    let choice =
        server.post("/v1/chat/completions", &chat(ask_weather(), 1, forced.clone())).json()["choices"][0].clone();
    assert_eq!(choice["finish_reason"], "length", "{choice}");
    assert!(choice["message"]["tool_calls"].is_null(), "{choice}");
    let text = choice["message"]["content"].as_str().expect("content").to_owned();
    assert!(text.starts_with("<tool_call>"), "{text:?}");
    // Too short even for the shortest call: said so beside the text.
    assert!(choice["note"].as_str().is_some_and(|note| note.contains("max_tokens")), "{choice}");
    let mut message = anthropic_body(false);
    message["max_tokens"] = json!(8);
    let message = server.post("/v1/messages", &message).json();
    assert_eq!(message["stop_reason"], "max_tokens", "{message}");
    assert!(message["note"].as_str().is_some_and(|note| note.contains("max_tokens")), "{message}");

    let mut streamed = forced;
    streamed["stream"] = json!(true);
    let response = server.post("/v1/chat/completions", &chat(ask_weather(), 1, streamed));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(chat_stream_text(&response), (text, Some("length".to_owned()), None));
}

/// A tool as published tools write one: a required string without bounds,
/// which the demo writes until the length limit unless the call is closed.
fn city_tools() -> Value {
    json!([{ "type": "function", "function": { "name": "get_weather", "parameters": {
        "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] } } }])
}

/// Room for the demo's shortest forced call (its markers, the name and
/// `{"city": ""}`) and a few tokens of the city.
const TINY_MAX_TOKENS: u64 = 64;

#[test]
fn a_forced_call_with_an_unbounded_string_closes_before_a_tiny_max_tokens() {
    let server = Server::start(&[]);
    let named = json!({ "type": "function", "function": { "name": "get_weather" } });
    for (choice, stream) in [(named.clone(), false), (json!("required"), false), (named, true)] {
        for seed in 0..8 {
            let extra = json!({ "tools": city_tools(), "tool_choice": choice, "max_tokens": TINY_MAX_TOKENS, "stream": stream });
            let response = server.post("/v1/chat/completions", &chat(ask_weather(), seed, extra));
            assert_eq!(response.status, 200, "{}", response.text());
            let (finish, arguments) = if stream {
                let call = response
                    .events()
                    .iter()
                    .filter_map(|(_, data)| serde_json::from_str::<Value>(data).ok())
                    .find_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].get(0).cloned());
                (chat_stream_text(&response).1.unwrap_or_default(), call.map(|c| c["function"]["arguments"].clone()))
            } else {
                let choice = response.json()["choices"][0].clone();
                let finish = choice["finish_reason"].as_str().unwrap_or_default().to_owned();
                (finish, Some(choice["message"]["tool_calls"][0]["function"]["arguments"].clone()))
            };
            assert_eq!(finish, "tool_calls", "{choice} seed {seed}: {}", response.text());
            let arguments: Value = serde_json::from_str(arguments.as_ref().and_then(Value::as_str).expect("arguments"))
                .expect("arguments are JSON");
            let object = arguments.as_object().expect("an object");
            assert!(object.len() == 1 && object["city"].is_string(), "{arguments}");
        }
    }
}

#[test]
fn a_strict_json_reply_with_an_unbounded_string_closes_before_a_tiny_max_tokens() {
    let server = Server::start(&[]);
    let schema = json!({ "type": "object", "properties": { "name": { "type": "string" }, "tags": { "type": "array",
        "items": { "type": "string" } } }, "required": ["name", "tags"] });
    let format = json!({ "response_format": { "type": "json_schema", "json_schema": { "name": "p", "schema": schema, "strict": true } }, "max_tokens": 24 });
    for seed in 0..8 {
        let messages = json!([{ "role": "user", "content": "Describe a person." }]);
        let choice =
            server.post("/v1/chat/completions", &chat(messages, seed, format.clone())).json()["choices"][0].clone();
        assert_eq!(choice["finish_reason"], "stop", "{choice}");
        let content: Value =
            serde_json::from_str(choice["message"]["content"].as_str().expect("content")).expect("JSON");
        assert!(
            content["name"].is_string() && content["tags"].is_array() && content.as_object().unwrap().len() == 2,
            "{content}"
        );
    }
}
