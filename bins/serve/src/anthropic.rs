//! Anthropic's Messages API: `POST /v1/messages`, streamed with its event
//! sequence (`message_start`, `content_block_start`, `ping`,
//! `content_block_delta`..., `content_block_stop`, `message_delta`,
//! `message_stop`) or not. Errors use Anthropic's body. Tools (`tools`,
//! `tool_choice`, `tool_use` and `tool_result` blocks) as OpenAI's tools
//! underneath (see `tools`). A thinking model's reasoning comes back as
//! `thinking` blocks; `thinking: {"type": "enabled", "budget_tokens": N}`
//! turns it on in the template and ends it after N tokens, `disabled` turns
//! it off (see `thinking`).

use axum::Json;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use strata_engine::Finish;
use strata_text::{Message, ParsedCall, ToolCall};

use crate::body::JsonBody;
use crate::error::{ApiError, Style};
use crate::generate::{GenRequest, Piece, Reply};
use crate::metrics::Endpoint;
use crate::openai::{new_id, parse, sse};
use crate::state::SharedApp;
use crate::thinking::{Thinking, template_kwargs};
use crate::tools::{Structure, ToolChoice, called_function, cut_note};

/// Content: a string, or blocks: text, and the tool blocks of the turns
/// around a call (`tool_use` in the assistant's, `tool_result` in the user's).
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
    /// `tool_use`: the call's id, function and arguments.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    /// `tool_result`: the call answered, and its result (text or text blocks).
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    content: Option<Content>,
    /// `thinking`: an earlier reply's reasoning.
    #[serde(default)]
    thinking: Option<String>,
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

impl InputMessage {
    /// The conversation's messages this turn is: its text (and calls), and
    /// one `tool` message per result it carries.
    fn into_messages(self, conversation: &mut Vec<Message>) -> Result<(), ApiError> {
        let blocks = match self.content {
            Content::Text(text) => {
                conversation.push(Message::new(self.role, text));
                return Ok(());
            }
            Content::Blocks(blocks) => blocks,
        };
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        let mut results = 0;
        for block in blocks {
            match block.kind.as_str() {
                "text" => text.push_str(&block.text.unwrap_or_default()),
                "thinking" => reasoning.push_str(&block.thinking.unwrap_or_default()),
                // Encrypted by Anthropic: nothing a template can show.
                "redacted_thinking" => {}
                "tool_use" => {
                    let (Some(id), Some(name)) = (block.id, block.name) else {
                        return Err(ApiError::invalid_param(
                            "messages",
                            "a `tool_use` block needs its `id` and `name`",
                        ));
                    };
                    let arguments = block.input.unwrap_or_else(|| json!({})).to_string();
                    calls.push(ToolCall { id, name, arguments });
                }
                "tool_result" => {
                    let Some(id) = block.tool_use_id else {
                        return Err(ApiError::invalid_param(
                            "messages",
                            "a `tool_result` block needs its `tool_use_id`",
                        ));
                    };
                    let result = block.content.map(|c| c.text("messages")).transpose()?.unwrap_or_default();
                    let name = called_function(conversation, &id);
                    conversation.push(Message::tool_result(id, name, result));
                    results += 1;
                }
                kind => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!(
                            "content blocks of type `{kind}` are not supported (text, thinking, tool_use, tool_result)"
                        ),
                    ));
                }
            }
        }
        // A turn of results alone is those `tool` messages.
        if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() || results == 0 {
            let reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
            conversation.push(Message { role: self.role, reasoning_content, ..Message::assistant_calls(text, calls) });
        }
        Ok(())
    }
}

/// A tool as Anthropic describes it.
#[derive(Debug, Deserialize)]
struct Tool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    input_schema: Value,
}

impl Tool {
    /// The same tool as an OpenAI tool object.
    fn function(self) -> Value {
        let mut function = json!({ "name": self.name });
        if let Some(description) = self.description {
            function["description"] = description.into();
        }
        function["parameters"] = self.input_schema;
        json!({ "type": "function", "function": function })
    }
}

/// `tool_choice`: `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name": N}`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicToolChoice {
    Auto,
    Any,
    None,
    Tool { name: String },
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ThinkingConfig {
    Enabled { budget_tokens: u64 },
    Disabled,
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
    #[serde(default)]
    tools: Option<Vec<Tool>>,
    #[serde(default)]
    tool_choice: Option<AnthropicToolChoice>,
    #[serde(default)]
    thinking: Option<ThinkingConfig>,
    /// Not Anthropic's: variables for the chat template, as on the OpenAI endpoint.
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
}

fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        // A cancelled generation has nobody to tell.
        Finish::Stop | Finish::Cancelled => "end_turn",
        Finish::Length => "max_tokens",
        Finish::StopString(_) => "stop_sequence",
    }
}

/// A Messages body decoded as far as the body alone allows (the model
/// name and the limits are checked against the server after): the request's
/// other fields, the conversation, the start of the reply if the last turn
/// is the assistant's, and the tools with their forced choice.
pub struct MessagesBody {
    request: MessagesRequest,
    pub conversation: Vec<Message>,
    pub continuation: Option<String>,
    pub structure: Structure,
    pub thinking: Thinking,
}

/// Decodes a Messages body; every check that needs no server (the fuzz
/// target's entry too).
pub fn parse_messages(body: &[u8]) -> Result<MessagesBody, ApiError> {
    let mut request: MessagesRequest = parse(body)?;
    if request.temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        return Err(ApiError::invalid_param("temperature", "temperature must be between 0 and 1"));
    }
    if request.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages must not be empty"));
    }
    let mut conversation = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = request.system.take() {
        conversation.push(Message::system(system.text("system")?));
    }
    for message in std::mem::take(&mut request.messages) {
        if message.role != "user" && message.role != "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                format!("roles are `user` or `assistant`, not `{}`", message.role),
            ));
        }
        message.into_messages(&mut conversation)?;
    }
    // A last assistant turn is the start of the reply, for the model to continue.
    let continuation = match conversation.last() {
        Some(last) if last.role == "assistant" && last.tool_calls.is_empty() => conversation.pop().map(|m| m.content),
        _ => None,
    };
    let structure = Structure {
        tools: request.tools.take().unwrap_or_default().into_iter().map(Tool::function).collect(),
        choice: match request.tool_choice.take() {
            None | Some(AnthropicToolChoice::Auto) => ToolChoice::Auto,
            Some(AnthropicToolChoice::Any) => ToolChoice::Required,
            Some(AnthropicToolChoice::None) => ToolChoice::None,
            Some(AnthropicToolChoice::Tool { name }) => ToolChoice::Named(name),
        },
        ..Structure::default()
    };
    structure.check()?;
    let thinking = thinking(&mut request)?;
    Ok(MessagesBody { request, conversation, continuation, structure, thinking })
}

/// The template's variables and the thinking's budget: `thinking` sets
/// `enable_thinking` (unless `chat_template_kwargs` does), and its budget
/// must leave room for an answer, as Anthropic requires.
fn thinking(request: &mut MessagesRequest) -> Result<Thinking, ApiError> {
    let mut kwargs = template_kwargs(request.chat_template_kwargs.take())?;
    let budget_tokens = match request.thinking.take() {
        None => None,
        Some(ThinkingConfig::Disabled) => {
            kwargs.entry("enable_thinking").or_insert(false.into());
            None
        }
        Some(ThinkingConfig::Enabled { budget_tokens }) => {
            if budget_tokens == 0 || budget_tokens >= request.max_tokens {
                return Err(ApiError::invalid_param(
                    "thinking",
                    format!(
                        "thinking.budget_tokens ({budget_tokens}) must be at least 1 and less than max_tokens ({})",
                        request.max_tokens
                    ),
                ));
            }
            kwargs.entry("enable_thinking").or_insert(true.into());
            Some(budget_tokens)
        }
    };
    Ok(Thinking { kwargs, budget_tokens })
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
    let MessagesBody { request, conversation, continuation, structure, thinking } = parse_messages(&body)?;
    app.check_model(&request.model)?;
    let (prompt, structure, constraint, held) = app
        .prepare(body.len(), move |app| {
            let prompt = app.chat_prompt(&conversation, &structure.tools, continuation.as_deref(), &thinking.kwargs)?;
            let inner = app.constraint(&structure)?;
            let held = inner.is_some();
            let constraint = app.thinking_constraint(prompt.thinking, thinking.budget_tokens, inner)?;
            Ok((prompt, structure, constraint, held))
        })
        .await?;
    let reasoning = app.reasoning_splitter(prompt.thinking);
    let thinks = reasoning.is_some();
    let generation = app.generate(
        admission,
        GenRequest {
            prompt: prompt.ids,
            max_tokens: Some(request.max_tokens),
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            seed: request.seed,
            stop: request.stop_sequences.unwrap_or_default(),
            ignore_eos: false,
            cap_max_tokens: true,
            calls: app.call_parser(&structure),
            constraint,
            reasoning,
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
        let Reply { text, reasoning, calls, reason, completion_tokens: output_tokens } = generation.collect().await?;
        let mut content = Vec::new();
        if !reasoning.is_empty() {
            content.push(json!({ "type": "thinking", "thinking": reasoning, "signature": "" }));
        }
        if !text.is_empty() || calls.is_empty() {
            content.push(json!({ "type": "text", "text": text }));
        }
        content.extend(calls.iter().map(tool_use));
        let mut message = json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason_of(reason, !calls.is_empty()),
            "stop_sequence": stop_sequence(reason),
            "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
        });
        if let Some(note) = cut_note(held, reason, !calls.is_empty()) {
            message["note"] = note.into();
        }
        return Ok(Json(message).into_response());
    }
    let start = [event(
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
    )];
    let mut blocks = Blocks::default();
    // A reply without thinking opens its text block at once, as Anthropic's
    // does, before the ping.
    let first = (!thinks).then(|| blocks.open(Open::Text)).into_iter().flatten();
    let ping = event("ping", json!({ "type": "ping" }));
    let start: Vec<_> = start.into_iter().chain(first).chain([ping]).collect();
    let mut called = false;
    let events = generation.into_stream().flat_map(move |piece| {
        let events = match piece {
            Ok(Piece::Text(text)) => blocks.delta(Open::Text, json!({ "type": "text_delta", "text": text })),
            Ok(Piece::Reasoning(text)) => {
                blocks.delta(Open::Thinking, json!({ "type": "thinking_delta", "thinking": text }))
            }
            Ok(Piece::Call(call)) => {
                called = true;
                let mut events = blocks.close();
                let mut block = tool_use(&call);
                let input = std::mem::replace(&mut block["input"], json!({}));
                let index = blocks.next;
                events.push(event(
                    "content_block_start",
                    json!({ "type": "content_block_start", "index": index, "content_block": block }),
                ));
                events.push(event(
                    "content_block_delta",
                    json!({
                        "type": "content_block_delta",
                        "index": index,
                        "delta": { "type": "input_json_delta", "partial_json": input.to_string() },
                    }),
                ));
                events.push(block_stop(index));
                blocks.next += 1;
                events
            }
            Ok(Piece::End { reason, completion_tokens }) => {
                // Every reply has a block: an empty one is an empty text.
                let mut events = if blocks.next == 0 && blocks.open.is_none() { blocks.open(Open::Text) } else { Vec::new() };
                events.extend(blocks.close());
                events.push(event(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": { "stop_reason": stop_reason_of(reason, called), "stop_sequence": stop_sequence(reason) },
                        "usage": { "output_tokens": completion_tokens },
                    }),
                ));
                events.push(event("message_stop", json!({ "type": "message_stop" })));
                events
            }
            Err(e) => vec![event("error", e.style(Style::Anthropic).body())],
        };
        futures_util::stream::iter(events)
    });
    Ok(sse(futures_util::stream::iter(start).chain(events)))
}

type SseEvent = Result<Event, std::convert::Infallible>;

/// The kinds of block a streamed reply writes piece by piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

/// Where a streamed reply's blocks stand: the one open, and the index of
/// the next (a call is a block of its own, opened and closed at once).
#[derive(Debug, Default)]
struct Blocks {
    open: Option<Open>,
    next: usize,
}

impl Blocks {
    /// Opens a block of `kind` at the next index.
    fn open(&mut self, kind: Open) -> Vec<SseEvent> {
        let block = match kind {
            Open::Text => json!({ "type": "text", "text": "" }),
            Open::Thinking => json!({ "type": "thinking", "thinking": "", "signature": "" }),
        };
        self.open = Some(kind);
        vec![event(
            "content_block_start",
            json!({ "type": "content_block_start", "index": self.next, "content_block": block }),
        )]
    }

    /// Closes the open block, if any.
    fn close(&mut self) -> Vec<SseEvent> {
        match self.open.take() {
            Some(_) => {
                self.next += 1;
                vec![block_stop(self.next - 1)]
            }
            None => Vec::new(),
        }
    }

    /// `delta` in a block of `kind`, opening one (and closing another) if needed.
    fn delta(&mut self, kind: Open, delta: Value) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if self.open != Some(kind) {
            events.extend(self.close());
            events.extend(self.open(kind));
        }
        events.push(event(
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": self.next, "delta": delta }),
        ));
        events
    }
}

fn block_stop(index: usize) -> Result<Event, std::convert::Infallible> {
    event("content_block_stop", json!({ "type": "content_block_stop", "index": index }))
}

/// A call as a `tool_use` block; arguments that are no JSON object (the
/// parsers hand out objects) become an empty input.
fn tool_use(call: &ParsedCall) -> Value {
    let input =
        serde_json::from_str::<Value>(&call.arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
    json!({
        "type": "tool_use",
        "id": call.id.clone().unwrap_or_else(|| new_id("toolu")),
        "name": call.name,
        "input": input,
    })
}

/// The reason a reply ended: its calls, if it made any, else how it stopped.
fn stop_reason_of(finish: Finish, called: bool) -> &'static str {
    if called { "tool_use" } else { stop_reason(finish) }
}

fn event(name: &str, data: Value) -> Result<Event, std::convert::Infallible> {
    Ok(Event::default().event(name).data(data.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
        let turns: Vec<InputMessage> = serde_json::from_value(json!([
            { "role": "user", "content": "Weather in Paris?" },
            { "role": "assistant", "content": [
                { "type": "text", "text": "Checking." },
                { "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "city": "Paris" } },
            ] },
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "toolu_1", "content": [{ "type": "text", "text": "18 degrees" }] },
            ] },
        ]))
        .expect("turns");
        let mut conversation = Vec::new();
        for turn in turns {
            turn.into_messages(&mut conversation).expect("converts");
        }
        let call =
            ToolCall { id: "toolu_1".into(), name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() };
        assert_eq!(
            conversation,
            [
                Message::user("Weather in Paris?"),
                Message::assistant_calls("Checking.", vec![call]),
                Message::tool_result("toolu_1", "get_weather", "18 degrees"),
            ]
        );
    }
}
