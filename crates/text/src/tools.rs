//! Tool calls out of a model's text: each family writes its calls in a
//! syntax of its own, which its chat template shows (the template renders
//! past calls the way the model was trained to write them).
//!
//! [`ToolSyntax::detect`] picks the syntax from the template's text;
//! [`ToolCallParser`] reads a streamed answer piece by piece, handing out
//! plain text as soon as it cannot be the start of a call and each call once
//! its closing marker has arrived. A call that does not parse is handed out
//! as the text it was: malformed model output is never an error.

use serde_json::{Map, Value};

/// The tool-call syntaxes of the supported families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Qwen3 (Hermes style): `<tool_call>\n{"name": N, "arguments": {…}}\n</tool_call>`.
    JsonTags,
    /// Qwen3.5 / Qwen3-Coder: `<tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`.
    XmlFunction,
    /// GLM-4.5 / 4.6 / 5: `<tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>`.
    GlmArgs,
    /// DeepSeek-V3.1: `N<｜tool▁sep｜>{…}` per call, inside
    /// `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>` (either DeepSeek form parses).
    DeepSeek,
    /// DeepSeek-V3 / R1: `function<｜tool▁sep｜>N\n```json\n{…}\n```` per call,
    /// in the same section.
    DeepSeekFenced,
    /// Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.N:0<|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>`.
    Kimi,
    /// Mistral: `[TOOL_CALLS][{"name": N, "arguments": {…}, "id": …}]`, to the end of the answer.
    Mistral,
}

const TOOL_CALL_OPEN: &str = "<tool_call>";
const TOOL_CALL_CLOSE: &str = "</tool_call>";
const DEEPSEEK_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DEEPSEEK_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DEEPSEEK_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";
const KIMI_SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_SECTION_END: &str = "<|tool_calls_section_end|>";
const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_ARGUMENT_BEGIN: &str = "<|tool_call_argument_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";

impl ToolSyntax {
    /// Every syntax, in declaration order.
    pub const ALL: [ToolSyntax; 7] = [
        ToolSyntax::JsonTags,
        ToolSyntax::XmlFunction,
        ToolSyntax::GlmArgs,
        ToolSyntax::DeepSeek,
        ToolSyntax::DeepSeekFenced,
        ToolSyntax::Kimi,
        ToolSyntax::Mistral,
    ];

    /// The syntax a chat template writes calls in, from its text; `has_token`
    /// tells whether the vocabulary has a token, for templates that never
    /// render a call (Kimi K2's first template declares tools but prints no
    /// calls, while the model writes its section tokens). `None`: no syntax
    /// we know (the model's answers are plain text).
    pub fn detect(template: &str, has_token: impl Fn(&str) -> bool) -> Option<ToolSyntax> {
        // The specific markers first: GLM's and Qwen3.5's calls are also
        // wrapped in `<tool_call>`.
        if template.contains(DEEPSEEK_CALLS_BEGIN) && template.contains("```json") {
            Some(ToolSyntax::DeepSeekFenced)
        } else if template.contains(DEEPSEEK_CALLS_BEGIN) {
            Some(ToolSyntax::DeepSeek)
        } else if template.contains(KIMI_SECTION_BEGIN) || has_token(KIMI_SECTION_BEGIN) {
            Some(ToolSyntax::Kimi)
        } else if template.contains("<arg_key>") {
            Some(ToolSyntax::GlmArgs)
        } else if template.contains("<function=") {
            Some(ToolSyntax::XmlFunction)
        } else if template.contains(TOOL_CALL_OPEN) {
            Some(ToolSyntax::JsonTags)
        } else if template.contains(MISTRAL_CALLS) {
            Some(ToolSyntax::Mistral)
        } else {
            None
        }
    }

    /// The marker that opens the calls of an answer.
    pub fn open_marker(self) -> &'static str {
        match self {
            ToolSyntax::JsonTags | ToolSyntax::XmlFunction | ToolSyntax::GlmArgs => TOOL_CALL_OPEN,
            ToolSyntax::DeepSeek | ToolSyntax::DeepSeekFenced => DEEPSEEK_CALLS_BEGIN,
            ToolSyntax::Kimi => KIMI_SECTION_BEGIN,
            ToolSyntax::Mistral => MISTRAL_CALLS,
        }
    }

    /// The marker that closes them; `None` where the calls run to the end
    /// of the answer.
    pub fn close_marker(self) -> Option<&'static str> {
        match self {
            ToolSyntax::JsonTags | ToolSyntax::XmlFunction | ToolSyntax::GlmArgs => Some(TOOL_CALL_CLOSE),
            ToolSyntax::DeepSeek | ToolSyntax::DeepSeekFenced => Some(DEEPSEEK_CALLS_END),
            ToolSyntax::Kimi => Some(KIMI_SECTION_END),
            ToolSyntax::Mistral => None,
        }
    }

    /// The calls between an open and a close marker (both left out), or
    /// `None` when the text is not calls in this syntax.
    fn parse_block(self, block: &str, tools: &[Value]) -> Option<Vec<ParsedCall>> {
        let calls = match self {
            ToolSyntax::JsonTags => vec![parse_json_call(block.trim())?],
            ToolSyntax::XmlFunction => vec![parse_xml_function(block.trim(), tools)?],
            ToolSyntax::GlmArgs => vec![parse_glm_call(block.trim(), tools)?],
            ToolSyntax::DeepSeek | ToolSyntax::DeepSeekFenced => parse_deepseek_calls(block)?,
            ToolSyntax::Kimi => parse_kimi_calls(block)?,
            ToolSyntax::Mistral => parse_mistral_calls(block.trim())?,
        };
        (!calls.is_empty()).then_some(calls)
    }
}

/// One call read from the model's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The id the model wrote (Kimi, Mistral), if any; the caller makes one
    /// otherwise.
    pub id: Option<String>,
    pub name: String,
    /// The arguments, a JSON object as compact JSON text.
    pub arguments: String,
}

/// What the parser hands out, in the order of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text of the answer that is no call.
    Text(String),
    /// A complete call.
    Call(ParsedCall),
}

/// Reads an answer streamed in pieces: text is handed out as soon as it
/// cannot be the start of a call marker, a call once it is complete.
/// Cloned, it reads another stream of the same tools (a reply's thinking).
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    syntax: ToolSyntax,
    /// The `tools` offered (OpenAI tool objects); the XML syntaxes write
    /// every value as text, and a parameter's schema type says what it was.
    tools: Vec<Value>,
    /// Text not yet handed out: a possible marker start, or a call so far.
    pending: String,
    /// Inside a call: `pending` starts with the open marker.
    in_call: bool,
}

impl ToolCallParser {
    pub fn new(syntax: ToolSyntax, tools: &[Value]) -> ToolCallParser {
        ToolCallParser { syntax, tools: tools.to_vec(), pending: String::new(), in_call: false }
    }

    pub fn syntax(&self) -> ToolSyntax {
        self.syntax
    }

    /// The events that `text`, the next piece of the answer, completes.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.pending.push_str(text);
        let mut events = Vec::new();
        loop {
            if self.in_call {
                let open = self.syntax.open_marker();
                let Some(close) = self.syntax.close_marker() else { break };
                let Some(end) = self.pending[open.len()..].find(close).map(|at| at + open.len()) else { break };
                let block_end = end + close.len();
                let block = &self.pending[open.len()..end];
                match self.syntax.parse_block(block, &self.tools) {
                    Some(calls) => events.extend(calls.into_iter().map(ToolEvent::Call)),
                    None => push_text(&mut events, &self.pending[..block_end]),
                }
                self.pending.drain(..block_end);
                self.in_call = false;
            } else {
                let open = self.syntax.open_marker();
                if let Some(at) = self.pending.find(open) {
                    push_text(&mut events, &self.pending[..at]);
                    self.pending.drain(..at);
                    self.in_call = true;
                    continue;
                }
                let keep = partial_marker_len(&self.pending, open);
                let emit = self.pending.len() - keep;
                push_text(&mut events, &self.pending[..emit]);
                self.pending.drain(..emit);
                break;
            }
        }
        events
    }

    /// The events left at the end of the answer: held-back text, or a call
    /// without its closing marker (the model stopped there; Mistral's calls
    /// always end so), parsed if it parses, else as text.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        if self.in_call {
            let block = &rest[self.syntax.open_marker().len()..];
            match self.syntax.parse_block(block, &self.tools) {
                Some(calls) => events.extend(calls.into_iter().map(ToolEvent::Call)),
                None => push_text(&mut events, &rest),
            }
        } else {
            push_text(&mut events, &rest);
        }
        self.in_call = false;
        events
    }
}

fn push_text(events: &mut Vec<ToolEvent>, text: &str) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolEvent::Text(last)) = events.last_mut() {
        last.push_str(text);
    } else {
        events.push(ToolEvent::Text(text.to_owned()));
    }
}

/// The length of the longest end of `text` that is a proper start of
/// `marker` (the text that must wait for the next piece).
fn partial_marker_len(text: &str, marker: &str) -> usize {
    let longest = text.len().min(marker.len() - 1);
    (1..=longest)
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// `{"name": N, "arguments": {…}}` (or `"parameters"`, or arguments as a
/// JSON string holding an object).
fn parse_json_call(text: &str) -> Option<ParsedCall> {
    let value: Value = serde_json::from_str(text).ok()?;
    call_from_json(&value)
}

fn call_from_json(value: &Value) -> Option<ParsedCall> {
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None => Value::Object(Map::new()),
        Some(Value::String(text)) => serde_json::from_str(text).ok()?,
        Some(other) => other.clone(),
    };
    if !arguments.is_object() || name.is_empty() {
        return None;
    }
    let id = value.get("id").and_then(Value::as_str).map(str::to_owned);
    Some(ParsedCall { id, name, arguments: arguments.to_string() })
}

/// `<function=N>\n<parameter=K>\nV\n</parameter>…\n</function>`.
fn parse_xml_function(text: &str, tools: &[Value]) -> Option<ParsedCall> {
    let rest = text.strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let body = rest.trim_end().strip_suffix("</function>")?;
    let mut arguments = Map::new();
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<parameter=")?;
        let (key, after) = after.split_once('>')?;
        let (raw, after) = after.split_once("</parameter>")?;
        // The template writes `>\n` VALUE `\n<`: one newline each side is syntax.
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        arguments.insert(key.to_owned(), typed_value(raw, parameter_type(tools, name, key)));
        rest = after.trim_start();
    }
    valid_name(name).then(|| ParsedCall {
        id: None,
        name: name.to_owned(),
        arguments: Value::Object(arguments).to_string(),
    })
}

/// `N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>…`.
fn parse_glm_call(text: &str, tools: &[Value]) -> Option<ParsedCall> {
    let (name, mut rest) = match text.find("<arg_key>") {
        Some(at) => (text[..at].trim(), &text[at..]),
        None => (text.trim(), ""),
    };
    let mut arguments = Map::new();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<arg_key>")?;
        let (key, after) = after.split_once("</arg_key>")?;
        let after = after.trim_start().strip_prefix("<arg_value>")?;
        let (raw, after) = after.split_once("</arg_value>")?;
        arguments.insert(key.trim().to_owned(), typed_value(raw, parameter_type(tools, name, key.trim())));
        rest = after.trim_start();
    }
    valid_name(name).then(|| ParsedCall {
        id: None,
        name: name.to_owned(),
        arguments: Value::Object(arguments).to_string(),
    })
}

/// A function name as templates print it: one token of text, no markup.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(|c: char| c.is_whitespace() || c == '<' || c == '>')
}

/// The JSON schema `type` of parameter `key` of function `name` among the
/// offered tools, if it says one.
fn parameter_type<'a>(tools: &'a [Value], name: &str, key: &str) -> Option<&'a str> {
    let function = tools
        .iter()
        .map(|t| t.get("function").unwrap_or(t))
        .find(|f| f.get("name").and_then(Value::as_str) == Some(name))?;
    function.pointer(&format!("/parameters/properties/{}/type", key.replace('~', "~0").replace('/', "~1")))?.as_str()
}

/// A value the XML syntaxes wrote as text: a string where the schema says
/// so, else the JSON it spells (numbers, booleans, objects; Python's
/// `True`/`False`/`None` as templates print them), else the text.
fn typed_value(raw: &str, schema_type: Option<&str>) -> Value {
    if schema_type == Some("string") {
        return Value::String(raw.to_owned());
    }
    let trimmed = raw.trim();
    match trimmed {
        "True" => return Value::Bool(true),
        "False" => return Value::Bool(false),
        "None" => return Value::Null,
        _ => {}
    }
    match serde_json::from_str::<Value>(trimmed) {
        // A bare JSON string literal only where no schema asks for text.
        Ok(value) if !value.is_string() || schema_type.is_some() => value,
        _ => Value::String(raw.to_owned()),
    }
}

/// DeepSeek's `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>` calls.
fn parse_deepseek_calls(block: &str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = block.trim();
    while !rest.is_empty() {
        let after = rest.strip_prefix(DEEPSEEK_CALL_BEGIN)?;
        let (call, after) = after.split_once(DEEPSEEK_CALL_END)?;
        let (head, tail) = call.split_once(DEEPSEEK_SEP)?;
        let (name, arguments) = match tail.split_once("\n```json\n") {
            // V3 / R1: the call's type, then the name and a fenced block.
            Some((name, fenced)) if head == "function" => (name, fenced.trim_end().strip_suffix("```")?),
            // V3.1: the name, then the arguments.
            _ => (head, tail),
        };
        let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
        if !arguments.is_object() || !valid_name(name.trim()) {
            return None;
        }
        calls.push(ParsedCall { id: None, name: name.trim().to_owned(), arguments: arguments.to_string() });
        rest = after.trim_start();
    }
    Some(calls)
}

/// Kimi's `<|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>{…}<|tool_call_end|>` calls.
fn parse_kimi_calls(block: &str) -> Option<Vec<ParsedCall>> {
    let mut calls = Vec::new();
    let mut rest = block.trim();
    while !rest.is_empty() {
        let after = rest.strip_prefix(KIMI_CALL_BEGIN)?;
        let (call, after) = after.split_once(KIMI_CALL_END)?;
        let (id, arguments) = call.split_once(KIMI_ARGUMENT_BEGIN)?;
        let id = id.trim();
        let name = id.strip_prefix("functions.").unwrap_or(id);
        let name = name.rsplit_once(':').map_or(name, |(name, _)| name);
        let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
        if !arguments.is_object() || !valid_name(name) {
            return None;
        }
        calls.push(ParsedCall { id: Some(id.to_owned()), name: name.to_owned(), arguments: arguments.to_string() });
        rest = after.trim_start();
    }
    Some(calls)
}

/// Mistral's `[{"name": …, "arguments": …}, …]`.
fn parse_mistral_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let value: Value = serde_json::from_str(text).ok()?;
    value.as_array()?.iter().map(call_from_json).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn tools() -> Vec<Value> {
        serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}}}]"#,
        )
        .unwrap()
    }

    fn call(name: &str, arguments: &str) -> ToolEvent {
        ToolEvent::Call(ParsedCall { id: None, name: name.to_owned(), arguments: arguments.to_owned() })
    }

    fn text(text: &str) -> ToolEvent {
        ToolEvent::Text(text.to_owned())
    }

    /// All events of `output` fed in `pieces` (adjacent texts merged).
    fn parse(syntax: ToolSyntax, pieces: &[&str]) -> Vec<ToolEvent> {
        let mut parser = ToolCallParser::new(syntax, &tools());
        let mut events = Vec::new();
        for piece in pieces {
            for event in parser.push(piece) {
                merge(&mut events, event);
            }
        }
        for event in parser.finish() {
            merge(&mut events, event);
        }
        events
    }

    fn merge(events: &mut Vec<ToolEvent>, event: ToolEvent) {
        match (events.last_mut(), event) {
            (Some(ToolEvent::Text(last)), ToolEvent::Text(more)) => last.push_str(&more),
            (_, event) => events.push(event),
        }
    }

    /// `output` parses to `want` whole, split in two at every character
    /// boundary, and one character at a time.
    fn check(syntax: ToolSyntax, output: &str, want: &[ToolEvent]) {
        assert_eq!(parse(syntax, &[output]), want, "{syntax:?} whole: {output:?}");
        for (at, _) in output.char_indices().skip(1) {
            let (a, b) = output.split_at(at);
            assert_eq!(parse(syntax, &[a, b]), want, "{syntax:?} split at {at}: {output:?}");
        }
        let chars: Vec<String> = output.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(parse(syntax, &pieces), want, "{syntax:?} by characters: {output:?}");
    }

    #[test]
    fn qwen3_json_calls_between_text() {
        check(
            ToolSyntax::JsonTags,
            "Let me check <b>.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"東京\\\"}\"}\n</tool_call>",
            &[
                text("Let me check <b>.\n"),
                call("get_weather", r#"{"city":"Paris","days":2}"#),
                text("\n"),
                call("get_weather", r#"{"city":"東京"}"#),
            ],
        );
    }

    #[test]
    fn qwen35_xml_parameters_take_their_schema_types() {
        check(
            ToolSyntax::XmlFunction,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n<parameter=extra>\n{\"a\": [1, true]}\n</parameter>\n</function>\n</tool_call>",
            &[call("get_weather", r#"{"city":"New York","days":3,"zip":"10001","extra":{"a":[1,true]}}"#)],
        );
    }

    #[test]
    fn glm_arg_keys_and_values() {
        check(
            ToolSyntax::GlmArgs,
            "Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
            &[text("Sure.\n"), call("get_weather", r#"{"city":"Paris","days":2}"#)],
        );
    }

    #[test]
    fn deepseek_v3_and_v31_calls() {
        check(
            ToolSyntax::DeepSeek,
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            &[text("Checking."), call("get_weather", r#"{"city":"Paris"}"#), call("get_weather", r#"{"city":"Rome"}"#)],
        );
        check(
            ToolSyntax::DeepSeekFenced,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>noop\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            &[call("get_weather", r#"{"city":"Paris"}"#), call("noop", "{}")],
        );
    }

    #[test]
    fn kimi_section_keeps_the_model_ids() {
        let output = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
        let want = [ToolEvent::Call(ParsedCall {
            id: Some("functions.get_weather:0".to_owned()),
            name: "get_weather".to_owned(),
            arguments: r#"{"city":"Paris"}"#.to_owned(),
        })];
        check(ToolSyntax::Kimi, output, &want);
    }

    #[test]
    fn mistral_calls_run_to_the_end() {
        check(
            ToolSyntax::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]",
            &[ToolEvent::Call(ParsedCall {
                id: Some("abc123def".to_owned()),
                name: "get_weather".to_owned(),
                arguments: r#"{"city":"Paris"}"#.to_owned(),
            })],
        );
    }

    #[test]
    fn malformed_calls_stay_text() {
        for (syntax, output) in [
            (ToolSyntax::JsonTags, "a <tool_call>not json</tool_call> b"),
            (ToolSyntax::JsonTags, "a <tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>"),
            (ToolSyntax::JsonTags, "unterminated <tool_call>{\"name\": \"f\""),
            (ToolSyntax::XmlFunction, "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>"),
            (ToolSyntax::GlmArgs, "<tool_call>two words\n<arg_key>k</arg_key></tool_call>"),
            (ToolSyntax::DeepSeek, "<｜tool▁calls▁begin｜>oops<｜tool▁calls▁end｜>"),
            (
                ToolSyntax::Kimi,
                "<|tool_calls_section_begin|><|tool_call_begin|>f<|tool_call_end|><|tool_calls_section_end|>",
            ),
            (ToolSyntax::Mistral, "[TOOL_CALLS] nothing"),
            (ToolSyntax::JsonTags, "<tool_call"),
            (ToolSyntax::JsonTags, "a < b and <tool_ not a call"),
        ] {
            check(syntax, output, &[text(output)]);
        }
    }

    /// Pieces of the syntaxes' markup, so that random answers often come
    /// close to calls.
    const FRAGMENTS: [&str; 16] = [
        "<tool_call>",
        "</tool_call>",
        "{\"name\": \"f\", \"arguments\": {}}",
        "<function=f>",
        "<parameter=x>",
        "</parameter>",
        "</function>",
        "<arg_key>",
        "</arg_value>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<|tool_calls_section_begin|>",
        "[TOOL_CALLS]",
        "<",
        "\n",
    ];

    proptest! {
        /// Whatever the model writes and however it is streamed: the same
        /// events as in one piece, and an answer without calls comes back
        /// as exactly its text.
        #[test]
        fn any_answer_streams_as_it_parses_whole(
            parts in proptest::collection::vec(
                prop_oneof![
                    proptest::sample::select(FRAGMENTS.to_vec()).prop_map(str::to_owned),
                    "[a-z é🙂{}\":,]{0,6}",
                ],
                0..12,
            ),
            syntax in proptest::sample::select(ToolSyntax::ALL.to_vec()),
            cut in 0usize..64,
        ) {
            let output: String = parts.concat();
            let whole = parse(syntax, &[&output]);
            let at = (0..=cut.min(output.len())).rev().find(|&i| output.is_char_boundary(i)).unwrap_or(0);
            let (a, b) = output.split_at(at);
            prop_assert_eq!(&parse(syntax, &[a, b]), &whole);
            if !whole.iter().any(|e| matches!(e, ToolEvent::Call(_))) {
                let text: String = whole.iter().map(|e| match e { ToolEvent::Text(t) => t.as_str(), _ => "" }).collect();
                prop_assert_eq!(text, output);
            }
        }
    }

    #[test]
    fn text_streams_before_the_call_closes() {
        let mut parser = ToolCallParser::new(ToolSyntax::JsonTags, &[]);
        assert_eq!(parser.push("Hello <to"), [text("Hello ")]);
        assert_eq!(parser.push("ol_call>{\"name\": \"f\", "), []);
        assert_eq!(parser.push("\"arguments\": {}}</tool_call> bye"), [call("f", "{}"), text(" bye")]);
        assert_eq!(parser.finish(), []);
    }

    #[test]
    fn detection_reads_the_published_templates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/templates");
        let no_tokens = |_: &str| false;
        for (file, want) in [
            ("qwen3.jinja", Some(ToolSyntax::JsonTags)),
            ("qwen3.5.jinja", Some(ToolSyntax::XmlFunction)),
            ("glm-4.6.jinja", Some(ToolSyntax::GlmArgs)),
            ("deepseek-v3.1.jinja", Some(ToolSyntax::DeepSeek)),
            ("mistral-nemo-instruct.jinja", Some(ToolSyntax::Mistral)),
            ("mixtral-instruct.jinja", None),
            ("kimi-k2.jinja", None),
        ] {
            let source = std::fs::read_to_string(dir.join(file)).unwrap();
            assert_eq!(ToolSyntax::detect(&source, no_tokens), want, "{file}");
        }
        // DeepSeek-V3's first template (its calls in fenced JSON).
        let v3 = "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}";
        assert_eq!(ToolSyntax::detect(v3, no_tokens), Some(ToolSyntax::DeepSeekFenced));
        // Kimi K2's template prints no calls; its vocabulary has the markers.
        let kimi = std::fs::read_to_string(dir.join("kimi-k2.jinja")).unwrap();
        assert_eq!(ToolSyntax::detect(&kimi, |t| t == KIMI_SECTION_BEGIN), Some(ToolSyntax::Kimi));
    }
}
