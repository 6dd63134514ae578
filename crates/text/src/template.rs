//! Chat templates: the Jinja program in a model's `tokenizer_config.json`
//! (or `chat_template.jinja`) that turns a conversation into the prompt the
//! model was trained on, rendered as transformers'
//! `apply_chat_template(..., tokenize=False)` renders it.
//!
//! transformers renders with Jinja2 (`trim_blocks`, `lstrip_blocks`, loop
//! controls) and adds `raise_exception`, `strftime_now` and a `tojson` that
//! is Python's `json.dumps`. minijinja is close to Jinja2; where Python shows
//! through (printing a list or `None`, `.strip()` and friends, `|string`)
//! this module makes it print as Python would.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::value::{Rest, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, Output, State, UndefinedBehavior, Value};
use serde::{Deserialize, Serialize};

use super::{read_json, read_text};
use crate::{Error, Result};

/// The file transformers saves a model's tokenizer settings to.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The legacy file of special tokens, still read by transformers.
pub const SPECIAL_TOKENS_MAP_FILE: &str = "special_tokens_map.json";
/// The file transformers saves a single chat template to; it wins over a
/// template inside `tokenizer_config.json`.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// What template functions and filters return.
type JinjaResult<T> = std::result::Result<T, minijinja::Error>;

/// The name of the template inside the environment; shows in error
/// locations (`chat_template:12`).
const TEMPLATE_NAME: &str = "chat_template";

/// One turn of a conversation, in the shape transformers' templates read:
/// OpenAI's chat messages (`role`, `content`, an assistant's `tool_calls`,
/// a tool result's `tool_call_id` and `name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool` (templates decide what they accept).
    pub role: String,
    pub content: String,
    /// The calls an assistant turn made (empty: none, and the key is left out,
    /// as templates test `message.tool_calls is defined`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Which call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a `tool` message is the result of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's thinking, kept apart from its content (the field
    /// Qwen3's, Qwen3.5's and GLM's templates read; each decides which
    /// turns' thinking it shows again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }

    /// An assistant turn that called tools (with whatever text came first).
    pub fn assistant_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message { tool_calls, ..Message::new("assistant", content) }
    }

    /// The result of the call `tool_call_id` to the function `name`.
    pub fn tool_result(
        tool_call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Message {
        Message { tool_call_id: Some(tool_call_id.into()), name: Some(name.into()), ..Message::new("tool", content) }
    }
}

/// One call of a function, as OpenAI's `tool_calls` carry it: `{"id",
/// "type": "function", "function": {"name", "arguments"}}`. `arguments` is
/// JSON text; read from a mapping (as transformers' users often write it),
/// it is that mapping's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireToolCall", into = "WireToolCall")]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Serialize, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: String,
    #[serde(rename = "type", default = "function_type")]
    kind: String,
    function: WireFunction,
}

#[derive(Serialize, Deserialize)]
struct WireFunction {
    name: String,
    arguments: serde_json::Value,
}

fn function_type() -> String {
    "function".to_owned()
}

impl TryFrom<WireToolCall> for ToolCall {
    type Error = String;

    fn try_from(wire: WireToolCall) -> std::result::Result<ToolCall, String> {
        let arguments = match wire.function.arguments {
            serde_json::Value::String(text) => text,
            serde_json::Value::Object(map) => serde_json::Value::Object(map).to_string(),
            other => return Err(format!("tool call arguments must be a string or an object, not {other}")),
        };
        Ok(ToolCall { id: wire.id, name: wire.function.name, arguments })
    }
}

impl From<ToolCall> for WireToolCall {
    fn from(call: ToolCall) -> WireToolCall {
        WireToolCall {
            id: call.id,
            kind: function_type(),
            function: WireFunction { name: call.name, arguments: serde_json::Value::String(call.arguments) },
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special_tokens: BTreeMap<String, String>,
    path: PathBuf,
    /// Whether calls' arguments reach the template as a mapping rather than
    /// JSON text (see [`ChatTemplate::arguments_as_mapping`]).
    arguments_as_mapping: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The chat template of a model directory, as transformers finds it:
    /// `chat_template.jinja` if present, else `chat_template` in
    /// `tokenizer_config.json` (a string, or a list of `{name, template}`
    /// of which the one named `default` is used). The special tokens
    /// (`bos_token`, `eos_token`, ...) come from `tokenizer_config.json`,
    /// plain strings or AddedToken objects (`{"content": "<s>", ...}`).
    /// `None` when the directory has no template.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = read_json(&config_path)?.unwrap_or(serde_json::Value::Null);
        let bad_config = |reason: String| Error::Template { path: config_path.clone(), reason };
        let config = match config {
            serde_json::Value::Object(map) => map,
            serde_json::Value::Null => serde_json::Map::new(),
            _ => return Err(bad_config("expected a JSON object".to_owned())),
        };
        let mut special_tokens = config_special_tokens(&config);
        // Legacy: transformers merges special_tokens_map.json in for keys the
        // config leaves unset.
        if let Some(serde_json::Value::Object(map)) = read_json(&dir.join(SPECIAL_TOKENS_MAP_FILE))? {
            for (key, token) in config_special_tokens(&map) {
                special_tokens.entry(key).or_insert(token);
            }
        }

        let jinja_path = dir.join(CHAT_TEMPLATE_FILE);
        if let Some(source) = read_text(&jinja_path)? {
            return Self::compile(source, special_tokens, jinja_path).map(Some);
        }
        let source = match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(source)) => source.clone(),
            Some(serde_json::Value::Array(named)) => default_of_named(named).map_err(bad_config)?,
            Some(_) => return Err(bad_config("chat_template is neither a string nor a list".to_owned())),
        };
        Self::compile(source, special_tokens, config_path).map(Some)
    }

    /// A template from its source and the special tokens it sees
    /// (`{"bos_token": "<s>", ...}`).
    pub fn new(source: impl Into<String>, special_tokens: BTreeMap<String, String>) -> Result<ChatTemplate> {
        Self::compile(source.into(), special_tokens, PathBuf::from("<chat template>"))
    }

    fn compile(source: String, special_tokens: BTreeMap<String, String>, path: PathBuf) -> Result<ChatTemplate> {
        let mut env = environment();
        let jinja = generation_blocks_as_plain_blocks(&source);
        env.add_template_owned(TEMPLATE_NAME, jinja)
            .map_err(|e| Error::Template { path: path.clone(), reason: describe(&e) })?;
        env.set_fuel(Some(SAMPLE_FUEL));
        let mut template = ChatTemplate { env, source, special_tokens, path, arguments_as_mapping: false };
        template.check_sample()?;
        template.env.set_fuel(Some(RENDER_FUEL));
        template.arguments_as_mapping = template.probe_arguments_as_mapping();
        Ok(template)
    }

    /// Refuses, at load, a template that a short ordinary conversation drives
    /// past [`SAMPLE_FUEL`] or [`RENDER_OUTPUT_BYTES_MAX`]: a loop that never
    /// ends (nested `range(100000)`) would otherwise hang whoever loads it,
    /// and one that costs that much on three messages fails most requests.
    /// Other errors are the sample conversation's (templates may refuse
    /// roles or orders), not the template's.
    fn check_sample(&self) -> Result<()> {
        let sample_text = SAMPLE_SENTENCE.repeat(SAMPLE_MESSAGE_BYTES / SAMPLE_SENTENCE.len());
        let messages =
            [Message::user(sample_text.as_str()), Message::assistant(sample_text.as_str()), Message::user("And?")];
        match self.render_bounded(&messages, true, false, &serde_json::Map::new()) {
            Err(RenderError::OutOfFuel) => Err(self.refused(format!(
                "refused: rendering a sample conversation of {} messages ran past {SAMPLE_FUEL} template \
                 instructions (a loop without end, or one far larger than a chat needs)",
                messages.len()
            ))),
            Err(RenderError::TooLong) => Err(self.refused(format!(
                "refused: rendering a sample conversation of {} messages wrote more than {} bytes",
                messages.len(),
                RENDER_OUTPUT_BYTES_MAX
            ))),
            Ok(_) | Err(RenderError::Template(_)) => Ok(()),
        }
    }

    fn refused(&self, reason: String) -> Error {
        Error::Template { path: self.path.clone(), reason }
    }

    /// Templates disagree on what a call's `arguments` is: Qwen3.5's and
    /// GLM's iterate a mapping (`arguments.items()`), DeepSeek's concatenate
    /// a string (`name + '<｜tool▁sep｜>' + arguments`), Qwen3's take either.
    /// transformers passes what the caller gave; the caller picks what the
    /// template reads, and so do we: a probe call with mapping arguments must
    /// render and show its argument's name, or arguments stay JSON text.
    fn probe_arguments_as_mapping(&self) -> bool {
        const ARGUMENT: &str = "probe_argument_7f3a";
        let call = ToolCall {
            // Nine characters: Mistral's templates refuse other ids.
            id: "probe0001".to_owned(),
            name: "probe_function".to_owned(),
            arguments: format!("{{\"{ARGUMENT}\": \"value\"}}"),
        };
        let messages = [
            Message::user("probe"),
            Message::assistant_calls("", vec![call.clone()]),
            Message::tool_result(call.id, call.name, "result"),
        ];
        self.render_messages(&messages, true, true, &serde_json::Map::new())
            .is_ok_and(|prompt| prompt.contains(ARGUMENT))
    }

    /// Whether this template reads a call's `arguments` as a mapping (the
    /// JSON object) rather than as JSON text; [`ChatTemplate::render`] passes
    /// them so.
    pub fn arguments_as_mapping(&self) -> bool {
        self.arguments_as_mapping
    }

    /// The template's Jinja source, as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The special tokens the template sees, by name.
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }

    /// The prompt for `messages`; `add_generation_prompt` opens the
    /// assistant's turn for it to be generated. The template's own
    /// `raise_exception(...)` (e.g. roles out of order) is an error carrying
    /// its message.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// [`ChatTemplate::render`] with extra template variables, as keyword
    /// arguments to `apply_chat_template` (e.g. `enable_thinking: false`, or
    /// `tools`: the list of OpenAI tool objects, `{"type": "function",
    /// "function": {"name", "description", "parameters"}}`). They override
    /// special tokens of the same name, as there. Objects keep their key
    /// order, as Python dicts do (templates print tools with `tojson`).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        self.render_messages(messages, add_generation_prompt, self.arguments_as_mapping, variables)
    }

    fn render_messages(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        arguments_as_mapping: bool,
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        self.render_bounded(messages, add_generation_prompt, arguments_as_mapping, variables).map_err(|e| {
            self.refused(match e {
                RenderError::OutOfFuel => format!(
                    "rendering this conversation ran past {RENDER_FUEL} template instructions (the template loops \
                     more than a chat needs)"
                ),
                RenderError::TooLong => {
                    format!("rendering this conversation wrote more than {RENDER_OUTPUT_BYTES_MAX} bytes")
                }
                RenderError::Template(reason) => reason,
            })
        })
    }

    /// The render, within the environment's fuel and [`RENDER_OUTPUT_BYTES_MAX`].
    fn render_bounded(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        arguments_as_mapping: bool,
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> std::result::Result<String, RenderError> {
        let mut context: BTreeMap<String, Value> =
            self.special_tokens.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
        // What `render_jinja_template` always passes; `tools` and
        // `documents` are None unless given.
        context.insert("tools".to_owned(), Value::from(()));
        context.insert("documents".to_owned(), Value::from(()));
        for (key, value) in variables {
            context.insert(key.clone(), Value::from_serialize(value));
        }
        context.insert("messages".to_owned(), messages_value(messages, arguments_as_mapping));
        context.insert("add_generation_prompt".to_owned(), Value::from(add_generation_prompt));
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| RenderError::Template(describe(&e)))?;
        let mut out = CappedOutput { bytes: Vec::new(), over: false };
        // minijinja 2.24 panics on some inputs Python renders (a backward
        // slice of an empty string, `''[::-1]`, indexes past its end): a
        // conversation is outside input, so that is the template's error.
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render_captured_to(Value::from(context), &mut out).map(drop)
        }))
        .map_err(|_| RenderError::Template("the template engine panicked on this conversation".to_owned()))?;
        match rendered {
            Ok(()) => Ok(String::from_utf8(out.bytes).expect("minijinja writes whole UTF-8 strings")),
            Err(_) if out.over => Err(RenderError::TooLong),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(RenderError::OutOfFuel),
            Err(e) => Err(RenderError::Template(describe(&e))),
        }
    }
}

/// Instructions one render may run (minijinja's fuel, about one per
/// template operation). The published templates of testdata/templates take
/// 36 to 74 per message, so this lets through conversations of 100,000
/// messages, more than a 1 MiB request holds; a template that loops without
/// end stops after about a second of one core.
pub const RENDER_FUEL: u64 = 10_000_000;

/// The fuel a template may take at load on its sample conversation (three
/// messages, which those templates render in 120 to 300).
const SAMPLE_FUEL: u64 = RENDER_FUEL / 10;

/// The most bytes one render may write. Prompts longer than a context
/// holds are refused after rendering anyway; this stops a template that
/// repeats a message in a loop (300 MB from 1 KB) while it writes.
pub const RENDER_OUTPUT_BYTES_MAX: usize = 64 << 20;

/// The sample conversation's long messages: long enough that a loop which
/// grows with a message's length shows at load.
const SAMPLE_MESSAGE_BYTES: usize = 4096;
const SAMPLE_SENTENCE: &str = "A sample sentence of an ordinary chat. ";

/// Why a render stopped.
enum RenderError {
    /// It ran past [`RENDER_FUEL`] (or [`SAMPLE_FUEL`] at load).
    OutOfFuel,
    /// It wrote more than [`RENDER_OUTPUT_BYTES_MAX`].
    TooLong,
    /// The template's own error (`raise_exception`, a bad operation), described.
    Template(String),
}

/// A render's output, refused past [`RENDER_OUTPUT_BYTES_MAX`].
struct CappedOutput {
    bytes: Vec<u8>,
    /// Set when a write went past the cap (minijinja reports the failed
    /// write as its own error kind, without ours).
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().checked_add(buf.len()).is_none_or(|total| total > RENDER_OUTPUT_BYTES_MAX) {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `messages` as the template sees them: each a mapping in transformers'
/// shape, calls' arguments as JSON text, or as the object it holds when
/// `arguments_as_mapping` (arguments that are no JSON object stay text).
fn messages_value(messages: &[Message], arguments_as_mapping: bool) -> Value {
    if !arguments_as_mapping || messages.iter().all(|m| m.tool_calls.is_empty()) {
        return Value::from_serialize(messages);
    }
    let mut json = serde_json::to_value(messages).unwrap_or(serde_json::Value::Null);
    for message in json.as_array_mut().into_iter().flatten() {
        let calls = message.get_mut("tool_calls").and_then(serde_json::Value::as_array_mut);
        for call in calls.into_iter().flatten() {
            let Some(arguments) = call.pointer_mut("/function/arguments") else { continue };
            let parsed = arguments.as_str().and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok());
            if let Some(object @ serde_json::Value::Object(_)) = parsed {
                *arguments = object;
            }
        }
    }
    Value::from_serialize(json)
}

/// The Jinja environment transformers builds (`_compile_jinja_template`).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Jinja2's default, which transformers keeps: one trailing newline of
    // the template is dropped.
    env.set_keep_trailing_newline(false);
    // Prompts are not HTML.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // Jinja2's default `Undefined`: prints as nothing, iterates as empty,
    // errors on attribute access.
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_filter("string", |value: Value| python_str(&value));
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// The template named `default` of a `[{name, template}, ...]` list.
fn default_of_named(named: &[serde_json::Value]) -> std::result::Result<String, String> {
    let mut names = Vec::new();
    for entry in named {
        let name = entry.get("name").and_then(serde_json::Value::as_str);
        let template = entry.get("template").and_then(serde_json::Value::as_str);
        match (name, template) {
            (Some("default"), Some(template)) => return Ok(template.to_owned()),
            (Some(name), Some(_)) => names.push(name.to_owned()),
            _ => return Err("chat_template list entries need a string name and template".to_owned()),
        }
    }
    Err(format!("chat_template lists no template named \"default\" (has {})", names.join(", ")))
}

/// The special tokens of a tokenizer config, as transformers gives them to
/// templates: every `*_token` key holding a token (the named
/// `bos_token`...`mask_token`, and model-specific ones like `image_token`),
/// and the entries of an `extra_special_tokens` object. A token is a string
/// or an AddedToken object (`{"__type": "AddedToken", "content": ...}`);
/// `add_bos_token: true` and `pad_token: null` are not tokens.
fn config_special_tokens(config: &serde_json::Map<String, serde_json::Value>) -> BTreeMap<String, String> {
    let mut tokens = BTreeMap::new();
    for (key, value) in config {
        if let Some(token) = token_content(value).filter(|_| key.ends_with("_token")) {
            tokens.insert(key.clone(), token.to_owned());
        }
    }
    if let Some(serde_json::Value::Object(extra)) = config.get("extra_special_tokens") {
        for (key, value) in extra {
            if let Some(token) = token_content(value) {
                tokens.entry(key.clone()).or_insert_with(|| token.to_owned());
            }
        }
    }
    tokens
}

fn token_content(value: &serde_json::Value) -> Option<&str> {
    match value {
        serde_json::Value::String(token) => Some(token),
        serde_json::Value::Object(added) => added.get("content").and_then(serde_json::Value::as_str),
        _ => None,
    }
}

/// transformers' `{% generation %}...{% endgeneration %}` (marking the
/// assistant's tokens for training masks) renders its body unchanged when
/// no mask is asked for. minijinja has no such tag: rewrite it as an
/// always-true `if`, which keeps the same whitespace control (`{%-`, `-%}`,
/// `trim_blocks`, `lstrip_blocks` treat all block tags alike).
fn generation_blocks_as_plain_blocks(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        // After the opening `{%`: in `{%}` its `%` is not also the close.
        let Some(close) = tag[2..].find("%}").map(|at| at + 2) else {
            // Unclosed: left for the parser to report.
            rest = tag;
            break;
        };
        let inner = &tag[2..close];
        let (lead, body) = inner.strip_prefix(['-', '+']).map_or(("", inner), |b| (&inner[..1], b));
        let (body, trail) = body.strip_suffix(['-', '+']).map_or((body, ""), |b| (b, &body[b.len()..]));
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(word) => {
                let _ = write!(out, "{{%{lead} {word} {trail}%}}");
            }
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// The error of a filter or function given what it cannot use.
fn invalid(message: impl Into<String>) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, message.into())
}

/// A minijinja error with everything it knows (kind, detail, line).
fn describe(error: &minijinja::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// transformers' `raise_exception(message)`: the template refuses the
/// conversation.
fn raise_exception(message: String) -> JinjaResult<Value> {
    Err(invalid(message))
}

/// `{{ value }}` as Jinja2 prints it: Python's `str(value)` (`None`,
/// `True`, `['a', 1]`, `1e+20`); strings as they are.
fn python_formatter(out: &mut Output<'_>, state: &State<'_, '_>, value: &Value) -> JinjaResult<()> {
    match value.kind() {
        ValueKind::Seq | ValueKind::Map | ValueKind::Number => {
            out.write_str(&python_str(value)).map_err(|_| minijinja::Error::from(ErrorKind::WriteFailure))
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `str(value)`.
fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        _ => python_repr(value),
    }
}

/// Python's `repr(value)` for the values a template meets.
fn python_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&python_number(value)),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's string repr: single quotes unless the text has `'` and no `"`;
/// control and other unprintable characters escaped.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !python_printable(c) => {
                let code = u32::from(c);
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character, for the characters that
/// matter in practice: controls, separators other than the space, and the
/// common invisible format characters. (Python consults the full Unicode
/// category table; unassigned and private-use characters are printed here.)
fn python_printable(c: char) -> bool {
    !matches!(u32::from(c),
        0x00..=0x1f | 0x7f..=0xa0 | 0xad | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f
        | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000 | 0xfeff | 0xfff9..=0xfffb)
}

/// A number as Python prints it: integers in decimal, floats as `repr`
/// (`2.0`, `0.1`, `1e+20`, `1e-07`, `inf`, `nan`).
fn python_number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(x) => python_float(x, "inf", "nan"),
        Err(_) => value.to_string(),
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, in plain
/// notation for exponents -4..16 and scientific (`1e+16`, `1.5e-05`)
/// outside.
fn python_float(x: f64, inf: &str, nan: &str) -> String {
    if x.is_nan() {
        return nan.to_owned();
    }
    if x.is_infinite() {
        return if x < 0.0 { format!("-{inf}") } else { inf.to_owned() };
    }
    // `{:e}` gives the shortest round-tripping digits: "-1.2345e-5".
    let sci = format!("{x:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.unsigned_abs())
    }
}

/// transformers' `tojson` filter: Python's `json.dumps(value,
/// ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// taking those four arguments by position or by name. Unlike Jinja2's own
/// filter, nothing is HTML-escaped.
fn tojson(value: Value, args: Rest<Value>) -> JinjaResult<String> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    // Keyword arguments arrive as one last map argument (a Kwargs value).
    let (positional, kwargs) = match args.split_last() {
        Some((last, rest)) if last.is_kwargs() => (rest, Some(last)),
        _ => (&args[..], None),
    };
    if positional.len() > NAMES.len() {
        return Err(minijinja::Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, arg) in given.iter_mut().zip(positional) {
        *slot = Some(arg.clone());
    }
    if let Some(kwargs) = kwargs {
        for key in kwargs.try_iter()? {
            let name = key.as_str().unwrap_or_default();
            let Some(i) = NAMES.iter().position(|n| *n == name) else {
                return Err(minijinja::Error::new(
                    ErrorKind::TooManyArguments,
                    format!("tojson got an unexpected keyword argument {name:?}"),
                ));
            };
            if given[i].is_some() {
                return Err(invalid(format!("tojson got {name} twice")));
            }
            given[i] = Some(kwargs.get_item(&key)?);
        }
    }
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let indent = match indent.filter(|v| !v.is_none()) {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        // Python: `' ' * indent`, so a negative indent is no indentation.
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => return Err(invalid("tojson indent must be an int or a string")),
        },
    };
    let (item_sep, key_sep) = match separators.filter(|v| !v.is_none()) {
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_owned(), b.as_str().unwrap_or_default().to_owned())
                }
                _ => return Err(invalid("tojson separators must be two strings")),
            }
        }
    };
    let json = Json {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    json.write(&mut out, &value, 0)?;
    Ok(out)
}

/// The settings of one `json.dumps` call.
struct Json {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl Json {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> JinjaResult<()> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&self.number(value)),
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, '[', ']', items.len(), depth, |out, i| self.write(out, &items[i], depth + 1))?;
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((self.key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, '{', '}', entries.len(), depth, |out, i| {
                    self.string(out, &entries[i].0);
                    out.push_str(&self.key_sep);
                    self.write(out, &entries[i].1, depth + 1)
                })?;
            }
            kind => {
                return Err(invalid(format!("Object of type {kind} is not JSON serializable")));
            }
        }
        Ok(())
    }

    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize) -> JinjaResult<()>,
    ) -> JinjaResult<()> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            if let Some(indent) = &self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(depth + 1));
            }
            item(out, i)?;
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
        out.push(close);
        Ok(())
    }

    /// A dict key as `json.dumps` writes it: strings as they are, numbers,
    /// booleans and None spelled as JSON.
    fn key(&self, key: &Value) -> JinjaResult<String> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
            ValueKind::Number => self.number(key),
            ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
            ValueKind::None => "null".to_owned(),
            kind => {
                return Err(invalid(format!("keys must be str, int, float, bool or None, not {kind}")));
            }
        })
    }

    fn number(&self, value: &Value) -> String {
        if value.is_integer() {
            return value.to_string();
        }
        match f64::try_from(value.clone()) {
            Ok(x) => python_float(x, "Infinity", "NaN"),
            Err(_) => value.to_string(),
        }
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if u32::from(c) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// transformers' `strftime_now(format)`: the current time, formatted.
/// transformers uses the local time zone; here it is UTC (the engine reads
/// no time zone settings). The common `strftime` directives are supported,
/// with glibc's `%-d`-style unpadded forms; others are left as written.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(&format, i64::try_from(secs).unwrap_or(0))
}

/// `format` for the UTC time `secs` after the Unix epoch.
fn strftime(format: &str, secs: i64) -> String {
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let second_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (second_of_day / 3600, second_of_day / 60 % 60, second_of_day % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |n: i64, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        let text = match directive {
            'Y' => year.to_string(),
            'y' => num(year.rem_euclid(100), 2),
            'm' => num(i64::from(month), 2),
            'd' => num(i64::from(day), 2),
            'e' => format!("{day:>2}"),
            'H' => num(hour, 2),
            'I' => num(hour12, 2),
            'M' => num(minute, 2),
            'S' => num(second, 2),
            'p' => (if hour < 12 { "AM" } else { "PM" }).to_owned(),
            'j' => num(day_of_year, 3),
            'B' => MONTHS[month as usize - 1].to_owned(),
            'b' | 'h' => MONTHS[month as usize - 1][..3].to_owned(),
            'A' => DAYS[weekday].to_owned(),
            'a' => DAYS[weekday][..3].to_owned(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            '%' => "%".to_owned(),
            other => format!("%{}{other}", if unpadded { "-" } else { "" }),
        };
        out.push_str(&text);
    }
    out
}

/// (year, month, day) of a day count from 1970-01-01, proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (x, want) in [
            (2.0, "2.0"),
            (0.1, "0.1"),
            (-1.5, "-1.5"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1e-7, "1e-07"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (1.5e-5, "1.5e-05"),
            (-0.0, "-0.0"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(python_float(x, "inf", "nan"), want, "{x}");
        }
        assert_eq!(python_float(f64::NEG_INFINITY, "Infinity", "NaN"), "-Infinity");
        assert_eq!(python_float(f64::NAN, "inf", "nan"), "nan");
    }

    #[test]
    fn generation_tags_become_plain_blocks() {
        assert_eq!(
            generation_blocks_as_plain_blocks("a{% generation %}b{%- endgeneration -%}c{% if x %}{% endif %}"),
            "a{% if true %}b{%- endif -%}c{% if x %}{% endif %}"
        );
        assert_eq!(generation_blocks_as_plain_blocks("{{ 'generation' }}{%"), "{{ 'generation' }}{%");
    }

    /// Found by the `template_source` fuzz target: in `{%}` the search for
    /// the tag's end found the `%}` overlapping its start and sliced
    /// backwards, a panic while loading a model's template. Now the tag's
    /// end is looked for after its start, and such a template is the
    /// parser's error.
    #[test]
    fn a_block_tag_closed_by_its_own_percent_is_an_error_not_a_panic() {
        let source = "{%}{% generation %}x{% endgeneration %}";
        // The first tag runs to the next `%}`, as the parser reads it.
        assert_eq!(generation_blocks_as_plain_blocks(source), "{%}{% generation %}x{% endif %}");
        let err = ChatTemplate::new(source, BTreeMap::new()).unwrap_err();
        assert!(matches!(err, Error::Template { .. }), "{err}");
    }

    #[test]
    fn strftime_matches_known_dates() {
        // 2024-02-29T13:05:09Z, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %B %Y, %A %a %b %j %I%p %y", t), "29 February 2024, Thursday Thu Feb 060 01PM 24");
        assert_eq!(strftime("%-d %-m %e|%% %Q", 0), "1 1  1|% %Q");
        for days in [-800_000, -1, 0, 59, 10_957, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn special_tokens_take_strings_and_added_token_objects() {
        let config: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
                "eos_token": "</s>", "pad_token": null, "add_bos_token": true, "image_token": "<img>",
                "extra_special_tokens": {"audio_token": "<audio>"}, "chat_template": "x"}"#,
        )
        .unwrap();
        let tokens = config_special_tokens(&config);
        let expected: BTreeMap<String, String> =
            [("audio_token", "<audio>"), ("bos_token", "<s>"), ("eos_token", "</s>"), ("image_token", "<img>")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        assert_eq!(tokens, expected);
    }

    #[test]
    fn syntax_errors_and_missing_default_name_the_file() {
        let err = ChatTemplate::new("{% for %}", BTreeMap::new()).unwrap_err().to_string();
        assert!(err.contains("chat template"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#,
        )
        .unwrap();
        let err = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains(TOKENIZER_CONFIG_FILE) && err.contains("default"), "{err}");
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), r#"{"eos_token": "</s>"}"#).unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
    }

    #[test]
    fn a_minijinja_panic_is_the_templates_error() {
        let template = ChatTemplate::new("{{ messages[0].content[::-1] }}", BTreeMap::new()).unwrap();
        let err = template.render(&[Message::user("")], false).unwrap_err().to_string();
        assert!(err.contains("panicked"), "{err}");
        assert_eq!(template.render(&[Message::user("ab")], false).unwrap(), "ba");
    }

    /// `f`'s result, or a panic naming `what` if it takes longer than a
    /// minute (a render that does not end would hang the test run).
    fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} did not end"))
    }

    #[test]
    fn a_template_that_loops_without_end_is_refused_at_load_naming_the_limit() {
        let source = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x";
        let err = within_a_minute("loading the template", move || ChatTemplate::new(source, BTreeMap::new()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("<chat template>") && err.contains(&SAMPLE_FUEL.to_string()), "{err}");
    }

    #[test]
    fn a_template_that_repeats_a_message_past_the_output_cap_is_refused_at_load() {
        let source = "{% for a in range(100000) %}{{ messages[0].content ~ messages[0].content }}{% endfor %}";
        let err = within_a_minute("loading the template", move || ChatTemplate::new(source, BTreeMap::new()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&RENDER_OUTPUT_BYTES_MAX.to_string()), "{err}");
    }

    /// A loop that only a long message sets off passes the load check; the
    /// render of such a message stops at the fuel, and others go on.
    #[test]
    fn a_render_past_its_fuel_is_refused_and_the_next_one_renders() {
        let source = "{% for m in messages %}{% if m.content|length > 5000 %}{% for a in range(100000) %}\
                      {% for b in range(100000) %}{% endfor %}{% endfor %}{% endif %}{{ m.content }}{% endfor %}";
        let template = std::sync::Arc::new(ChatTemplate::new(source, BTreeMap::new()).unwrap());
        let bombed = std::sync::Arc::clone(&template);
        let long = Message::user("x".repeat(6000));
        let err = within_a_minute("rendering", move || bombed.render(&[long], true)).unwrap_err().to_string();
        assert!(err.contains(&RENDER_FUEL.to_string()) && !err.contains('\n'), "{err}");
        assert_eq!(template.render(&[Message::user("short")], true).unwrap(), "short");
    }

    #[test]
    fn strftime_now_renders_a_date() {
        let template = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", BTreeMap::new()).unwrap();
        let out = template.render(&[], false).unwrap();
        assert_eq!(out.len(), 10, "{out}");
        assert!(out.starts_with("20"), "{out}");
    }
}
