//! Anthropic's Messages API: `POST /v1/messages`, streamed with its event
//! sequence (`message_start`, `content_block_start`, `ping`,
//! `content_block_delta`..., `content_block_stop`, `message_delta`,
//! `message_stop`) or not. Errors use Anthropic's body.

use axum::Json;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use strata_engine::{Finish, Message};

use crate::body::JsonBody;
use crate::error::{ApiError, Style};
use crate::generate::{GenRequest, Piece};
use crate::metrics::Endpoint;
use crate::openai::{new_id, parse, sse};
use crate::state::SharedApp;

/// Content: a string, or blocks of which only text is understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

impl Content {
    fn text(self, field: &'static str) -> Result<String, ApiError> {
        match self {
            Content::Text(text) => Ok(text),
            Content::Blocks(blocks) => {
                let mut text = String::new();
                for block in blocks {
                    match (block.kind.as_str(), block.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid_param(
                                field,
                                format!("content blocks of type `{kind}` are not supported (text only)"),
                            ));
                        }
                    }
                }
                Ok(text)
            }
        }
    }
}

#[derive(Debug, Deserialize)]
struct InputMessage {
    role: String,
    content: Content,
}

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: String,
    messages: Vec<InputMessage>,
    max_tokens: u64,
    #[serde(default)]
    system: Option<Content>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<u64>,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: Option<bool>,
    /// Not Anthropic's: the same seed gives the same reply, as on the OpenAI endpoints.
    #[serde(default)]
    seed: Option<u64>,
}

fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        // A cancelled generation has nobody to tell.
        Finish::Stop | Finish::Cancelled => "end_turn",
        Finish::Length => "max_tokens",
        Finish::StopString(_) => "stop_sequence",
    }
}

pub async fn messages(State(app): State<SharedApp>, body: JsonBody) -> Response {
    match run(app, body).await {
        Ok(response) => response,
        Err(e) => e.style(Style::Anthropic).into_response(),
    }
}

async fn run(app: SharedApp, body: JsonBody) -> Result<Response, ApiError> {
    let body = body.0?;
    // A queue slot before any work on the body: a full server answers 429
    // without parsing, templating or tokenizing.
    let admission = app.admit()?;
    let request: MessagesRequest = parse(&body)?;
    app.check_model(&request.model)?;
    if request.temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        return Err(ApiError::invalid_param("temperature", "temperature must be between 0 and 1"));
    }
    if request.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    let mut conversation = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = request.system {
        conversation.push(Message::system(system.text("system")?));
    }
    for message in request.messages {
        if message.role != "user" && message.role != "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                format!("roles are `user` or `assistant`, not `{}`", message.role),
            ));
        }
        conversation.push(Message::new(message.role, message.content.text("messages")?));
    }
    // A last assistant turn is the start of the reply, for the model to continue.
    let continuation = match conversation.last() {
        Some(last) if last.role == "assistant" => conversation.pop().map(|m| m.content),
        _ => None,
    };
    let prompt = app.prepare(body.len(), move |app| app.chat_prompt(&conversation, continuation.as_deref())).await?;
    let generation = app.generate(
        admission,
        GenRequest {
            prompt,
            max_tokens: Some(request.max_tokens),
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            seed: request.seed,
            stop: request.stop_sequences.unwrap_or_default(),
            ignore_eos: false,
            cap_max_tokens: true,
        },
        Endpoint::Messages,
    )?;
    let id = new_id("msg");
    let model = app.model_name.clone();
    let input_tokens = generation.prompt_tokens;
    let stops = generation.stop.clone();
    let stop_sequence = move |finish: Finish| match finish {
        Finish::StopString(i) => Value::from(stops[i].clone()),
        _ => Value::Null,
    };
    if !request.stream.unwrap_or(false) {
        let (text, reason, output_tokens) = generation.collect().await?;
        return Ok(Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{ "type": "text", "text": text }],
            "stop_reason": stop_reason(reason),
            "stop_sequence": stop_sequence(reason),
            "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
        }))
        .into_response());
    }
    let start = [
        event(
            "message_start",
            json!({
                "type": "message_start",
                "message": {
                    "id": id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": { "input_tokens": input_tokens, "output_tokens": 0 },
                },
            }),
        ),
        event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
        ),
        event("ping", json!({ "type": "ping" })),
    ];
    let events = generation.into_stream().flat_map(move |piece| {
        let events = match piece {
            Ok(Piece::Text(text)) => vec![event(
                "content_block_delta",
                json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": text } }),
            )],
            Ok(Piece::End { reason, completion_tokens }) => vec![
                event("content_block_stop", json!({ "type": "content_block_stop", "index": 0 })),
                event(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": { "stop_reason": stop_reason(reason), "stop_sequence": stop_sequence(reason) },
                        "usage": { "output_tokens": completion_tokens },
                    }),
                ),
                event("message_stop", json!({ "type": "message_stop" })),
            ],
            Err(e) => vec![event("error", e.style(Style::Anthropic).body())],
        };
        futures_util::stream::iter(events)
    });
    Ok(sse(futures_util::stream::iter(start).chain(events)))
}

fn event(name: &str, data: Value) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default().event(name).data(data.to_string()))
}
