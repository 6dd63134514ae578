//! OpenAI's API: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`, `GET /v1/models/{id}`. Request fields outside what is
//! honoured are accepted and ignored, as other OpenAI-compatible servers do,
//! except those whose meaning would silently change the answer (`n > 1`,
//! `echo`, `logprobs`), which are refused. Chat honours `tools`,
//! `tool_choice` and `response_format` (see `tools`), and
//! `chat_template_kwargs`; a thinking model's reasoning comes back apart,
//! as `reasoning_content` (see `thinking`).

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use strata_engine::Finish;
use strata_text::{Message, ParsedCall, ToolCall};

use crate::body::JsonBody;
use crate::error::ApiError;
use crate::generate::{GenRequest, Piece, Reply};
use crate::metrics::Endpoint;
use crate::state::{App, SharedApp};
use crate::thinking::template_kwargs;
use crate::tools::{Format, Structure, ToolChoice, called_function, cut_note};

/// A JSON body as `T`, or the 400 saying what is wrong with it.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            ApiError::invalid(format!("the body is not valid JSON: {e}"))
        }
        _ => ApiError::invalid(format!("invalid request: {e}")),
    })
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh id in each API's spelling: `chatcmpl-…`, `cmpl-…`, `call_…`,
/// `msg_…`, `toolu_…`.
pub fn new_id(prefix: &str) -> String {
    use std::hash::BuildHasher;
    let n = std::hash::RandomState::new().hash_one(SystemTime::now());
    let separator = if matches!(prefix, "msg" | "call" | "toolu") { '_' } else { '-' };
    format!("{prefix}{separator}{n:016x}")
}

/// `"stop"` as a string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

fn stops(stop: Option<Stop>) -> Vec<String> {
    match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    }
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Message content: a string, or a list of parts of which only text is understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    /// An assistant turn's calls.
    #[serde(default)]
    tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` turn's call answered.
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    /// An assistant turn's thinking, as the reply gave it (`reasoning`:
    /// vLLM's newer name for it).
    #[serde(default, alias = "reasoning")]
    reasoning_content: Option<String>,
}

/// Fields honoured by both OpenAI endpoints.
#[derive(Debug, Deserialize)]
struct Common {
    model: String,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    /// Not OpenAI's, but vLLM's and llama.cpp's.
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    n: Option<u64>,
    /// vLLM's: generate past end-of-sequence (benchmarks).
    #[serde(default)]
    ignore_eos: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
    /// Variables for the chat template (vLLM's and SGLang's field).
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

/// `prompt`: a string, token ids, or a list of one of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    best_of: Option<u64>,
    #[serde(flatten)]
    common: Common,
}

impl Common {
    fn check(&self, app: &App) -> Result<(), ApiError> {
        app.check_model(&self.model)?;
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid_param("n", "only n = 1 is supported"));
        }
        Ok(())
    }

    fn request(self, prompt: Vec<u32>, max_tokens: Option<u64>) -> GenRequest {
        GenRequest {
            prompt,
            max_tokens: max_tokens.or(self.max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            // OpenAI's seed is any 64-bit integer; its bits are ours.
            seed: self.seed.map(|s| s as u64),
            stop: stops(self.stop),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            // As OpenAI: asking for more than fits is an error.
            cap_max_tokens: false,
            constraint: None,
            calls: None,
            reasoning: None,
        }
    }
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": N}}`.
fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let Some(choice) = choice else { return Ok(ToolChoice::Auto) };
    match (choice.as_str(), choice["function"]["name"].as_str()) {
        (Some("none"), _) => Ok(ToolChoice::None),
        (Some("auto"), _) => Ok(ToolChoice::Auto),
        (Some("required"), _) => Ok(ToolChoice::Required),
        (None, Some(name)) if choice["type"] == "function" => Ok(ToolChoice::Named(name.to_owned())),
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )),
    }
}

/// `response_format`: `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": ...}}`.
fn response_format(format: Option<&Value>) -> Result<Format, ApiError> {
    let Some(format) = format else { return Ok(Format::Text) };
    match format["type"].as_str() {
        Some("text") => Ok(Format::Text),
        Some("json_object") => Ok(Format::JsonObject),
        Some("json_schema") => match &format["json_schema"]["schema"] {
            // OpenAI's default: any JSON object.
            Value::Null => Ok(Format::JsonObject),
            schema => Ok(Format::JsonSchema {
                schema: schema.clone(),
                strict: format["json_schema"]["strict"].as_bool().unwrap_or(false),
            }),
        },
        _ => Err(ApiError::invalid_param(
            "response_format",
            "response_format's type is \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// The reason a reply ended: its calls, if it made any, else how it stopped.
fn finish_reason_of(finish: Finish, called: bool) -> &'static str {
    if called { "tool_calls" } else { finish_reason(finish) }
}

/// A call as `message.tool_calls` and stream deltas carry it.
fn tool_call(call: &ParsedCall) -> Value {
    json!({
        "id": call.id.clone().unwrap_or_else(|| new_id("call")),
        "type": "function",
        "function": { "name": call.name, "arguments": call.arguments },
    })
}

fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "length",
        // A cancelled generation has nobody to tell.
        Finish::Stop | Finish::StopString(_) | Finish::Cancelled => "stop",
    }
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

fn messages(list: Vec<ChatMessage>) -> Result<Vec<Message>, ApiError> {
    if list.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    let mut conversation: Vec<Message> = Vec::with_capacity(list.len());
    for m in list {
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(text)) => text,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                "messages",
                                format!("content parts of type `{kind}` are not supported (text only)"),
                            ));
                        }
                    }
                }
                text
            }
        };
        let message = match m.role.as_str() {
            // OpenAI's newer name for the system role.
            "developer" => Message::system(content),
            "tool" => {
                let Some(id) = m.tool_call_id else {
                    return Err(ApiError::invalid_param("messages", "a `tool` message needs its `tool_call_id`"));
                };
                let name = m.name.unwrap_or_else(|| called_function(&conversation, &id));
                Message::tool_result(id, name, content)
            }
            _ => Message {
                reasoning_content: m.reasoning_content,
                ..match m.tool_calls {
                    Some(calls) if !calls.is_empty() => {
                        Message { role: m.role, ..Message::assistant_calls(content, calls) }
                    }
                    _ => Message::new(m.role, content),
                }
            },
        };
        conversation.push(message);
    }
    Ok(conversation)
}

/// A chat completion body decoded as far as the body alone allows (the
/// model name and the limits are checked against the server after).
pub struct ChatBody {
    common: Common,
    max_completion_tokens: Option<u64>,
    /// The tools, the forced choice and the output format.
    pub structure: Structure,
    pub conversation: Vec<Message>,
    /// `chat_template_kwargs`, checked.
    pub kwargs: serde_json::Map<String, Value>,
}

/// Decodes a chat completion body; every check that needs no server (the
/// fuzz target's entry too).
pub fn parse_chat(body: &[u8]) -> Result<ChatBody, ApiError> {
    let request: ChatRequest = parse(body)?;
    let structure = Structure {
        tools: request.tools.unwrap_or_default(),
        choice: tool_choice(request.tool_choice.as_ref())?,
        format: response_format(request.response_format.as_ref())?,
    };
    structure.check()?;
    let kwargs = template_kwargs(request.chat_template_kwargs)?;
    let conversation = messages(request.messages)?;
    Ok(ChatBody {
        common: request.common,
        max_completion_tokens: request.max_completion_tokens,
        structure,
        conversation,
        kwargs,
    })
}

pub async fn chat_completions(State(app): State<SharedApp>, body: JsonBody) -> Response {
    match chat(app, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn chat(app: SharedApp, body: JsonBody) -> Result<Response, ApiError> {
    let body = body.0?;
    // A queue slot before any work on the body: a full server answers 429
    // without parsing, templating or tokenizing.
    let admission = app.admit()?;
    let ChatBody { common, max_completion_tokens, structure, conversation, kwargs } = parse_chat(&body)?;
    common.check(&app)?;
    let (prompt, structure, constraint, held) = app
        .prepare(body.len(), move |app| {
            let prompt = app.chat_prompt(&conversation, &structure.tools, None, &kwargs)?;
            let grammar = app.constraint(&structure)?;
            let held = grammar.is_some();
            let constraint = app.thinking_constraint(prompt.thinking, None, grammar)?;
            Ok((prompt, structure, constraint, held))
        })
        .await?;
    let stream = common.stream.unwrap_or(false);
    let include_usage = common.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let generation = app.generate(
        admission,
        GenRequest {
            constraint,
            calls: app.call_parser(&structure),
            reasoning: app.reasoning_splitter(prompt.thinking),
            ..common.request(prompt.ids, max_completion_tokens)
        },
        Endpoint::Chat,
    )?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let model = app.model_name.clone();
    let prompt_tokens = generation.prompt_tokens;
    if !stream {
        let Reply { text, reasoning, calls, reason, completion_tokens } = generation.collect().await?;
        let mut message = json!({ "role": "assistant", "content": text, "refusal": null });
        if !reasoning.is_empty() {
            message["reasoning_content"] = reasoning.into();
        }
        if !calls.is_empty() {
            message["tool_calls"] = calls.iter().map(tool_call).collect();
            if text.is_empty() {
                message["content"] = Value::Null;
            }
        }
        let mut reply = json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint(),
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason_of(reason, !calls.is_empty()),
            }],
            "usage": usage(prompt_tokens, completion_tokens),
        });
        if let Some(note) = cut_note(held, reason, !calls.is_empty()) {
            reply["choices"][0]["note"] = note.into();
        }
        return Ok(Json(reply).into_response());
    }
    let chunk = move |delta: Delta<'_>, finish: Option<&str>| {
        let delta = match delta {
            Delta::Text(text) => json!({ "content": text }),
            Delta::Reasoning(text) => json!({ "reasoning_content": text }),
            Delta::Call(index, call) => {
                let mut call = tool_call(call);
                call["index"] = index.into();
                json!({ "tool_calls": [call] })
            }
            Delta::None => json!({}),
        };
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint(),
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
        })
    };
    let mut first = chunk(Delta::None, None);
    first["choices"][0]["delta"] = json!({ "role": "assistant", "content": "" });
    let events = chunk_events(generation.into_stream(), include_usage, prompt_tokens, chunk);
    Ok(sse(futures_util::stream::once(async move { data(&first) }).chain(events)))
}

/// What one stream chunk carries.
enum Delta<'a> {
    None,
    Text(&'a str),
    Reasoning(&'a str),
    /// The `index`th call of the reply, whole (name and all its arguments).
    Call(usize, &'a ParsedCall),
}

/// An OpenAI stream's events: a chunk per piece of text or call, the chunk
/// with the finish reason, the usage chunk when asked for, and `[DONE]`; or
/// an error and `[DONE]`.
/// `chunk(delta, finish)` builds one chunk of the endpoint's kind.
fn chunk_events(
    pieces: impl futures_util::Stream<Item = Result<Piece, ApiError>> + Send + 'static,
    include_usage: bool,
    prompt_tokens: usize,
    chunk: impl Fn(Delta<'_>, Option<&str>) -> Value + Send + 'static,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let mut calls = 0;
    pieces.flat_map(move |piece| {
        let events = match piece {
            Ok(Piece::Text(text)) => vec![data(&chunk(Delta::Text(&text), None))],
            Ok(Piece::Reasoning(text)) => vec![data(&chunk(Delta::Reasoning(&text), None))],
            Ok(Piece::Call(call)) => {
                calls += 1;
                vec![data(&chunk(Delta::Call(calls - 1, &call), None))]
            }
            Ok(Piece::End { reason, completion_tokens }) => {
                let mut last = vec![data(&chunk(Delta::None, Some(finish_reason_of(reason, calls > 0))))];
                if include_usage {
                    let mut tail = chunk(Delta::None, None);
                    tail["choices"] = json!([]);
                    tail["usage"] = usage(prompt_tokens, completion_tokens);
                    last.push(data(&tail));
                }
                last.push(Ok(Event::default().data("[DONE]")));
                last
            }
            // `[DONE]` after the error too: the stream ended as the server
            // meant, not by a network fault.
            Err(e) => vec![data(&e.body()), Ok(Event::default().data("[DONE]"))],
        };
        futures_util::stream::iter(events)
    })
}

pub async fn completions(State(app): State<SharedApp>, body: JsonBody) -> Response {
    match completion(app, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn completion(app: SharedApp, body: JsonBody) -> Result<Response, ApiError> {
    let body = body.0?;
    // A queue slot before any work on the body (see `chat`).
    let admission = app.admit()?;
    let request: CompletionRequest = parse(&body)?;
    request.common.check(&app)?;
    if request.echo == Some(true) {
        return Err(ApiError::invalid_param("echo", "echo is not supported"));
    }
    if request.logprobs.as_ref().is_some_and(|l| !l.is_null()) {
        return Err(ApiError::invalid_param("logprobs", "logprobs are not supported"));
    }
    if request.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param("best_of", "only best_of = 1 is supported"));
    }
    let one = |n: usize| {
        if n == 1 { Ok(()) } else { Err(ApiError::invalid_param("prompt", "only one prompt per request is supported")) }
    };
    let prompt = match request.prompt {
        Prompt::Ids(ids) => ids,
        Prompt::IdLists(mut lists) => {
            one(lists.len())?;
            lists.remove(0)
        }
        Prompt::Text(text) => app.prepare(body.len(), move |app| app.text_prompt(&text)).await?,
        Prompt::Texts(mut texts) => {
            one(texts.len())?;
            let text = texts.remove(0);
            app.prepare(body.len(), move |app| app.text_prompt(&text)).await?
        }
    };
    let stream = request.common.stream.unwrap_or(false);
    let include_usage = request.common.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let generation = app.generate(admission, request.common.request(prompt, None), Endpoint::Completions)?;
    let id = new_id("cmpl");
    let created = unix_now();
    let model = app.model_name.clone();
    let prompt_tokens = generation.prompt_tokens;
    if !stream {
        let Reply { text, reason, completion_tokens, .. } = generation.collect().await?;
        return Ok(Json(json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint(),
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(reason) }],
            "usage": usage(prompt_tokens, completion_tokens),
        }))
        .into_response());
    }
    // Completions read no calls: their deltas are text or nothing.
    let chunk = move |delta: Delta<'_>, finish: Option<&str>| {
        let text = match delta {
            Delta::Text(text) => text,
            Delta::Reasoning(_) | Delta::Call(..) | Delta::None => "",
        };
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint(),
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
        })
    };
    Ok(sse(chunk_events(generation.into_stream(), include_usage, prompt_tokens, chunk)))
}

/// One SSE `data:` event holding `value`.
pub fn data(value: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(value.to_string()))
}

/// An SSE response; keep-alive comments stop proxies timing out a long prefill.
pub fn sse(events: impl futures_util::Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

fn fingerprint() -> String {
    format!("strata-{}", env!("CARGO_PKG_VERSION"))
}

fn model_object(app: &App) -> Value {
    json!({ "id": app.model_name, "object": "model", "created": app.created, "owned_by": "strata" })
}

pub async fn list_models(State(app): State<SharedApp>) -> Response {
    Json(json!({ "object": "list", "data": [model_object(&app)] })).into_response()
}

pub async fn get_model(State(app): State<SharedApp>, Path(id): Path<String>) -> Response {
    match app.check_model(&id) {
        Ok(()) => Json(model_object(&app)).into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_messages_take_the_function_name_of_the_call_they_answer() {
        let list: Vec<ChatMessage> = serde_json::from_value(json!([
            { "role": "user", "content": "Weather in Paris?" },
            { "role": "assistant", "content": null, "tool_calls": [
                { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
            ] },
            { "role": "tool", "tool_call_id": "call_1", "content": "18 degrees" },
        ]))
        .expect("messages");
        let conversation = messages(list).expect("converts");
        let call =
            ToolCall { id: "call_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() };
        assert_eq!(
            conversation,
            [
                Message::user("Weather in Paris?"),
                Message::assistant_calls("", vec![call]),
                Message::tool_result("call_1", "get_weather", "18 degrees"),
            ]
        );
    }
}
