//! A forced tool call as a Lark grammar (llguidance's dialect): the model's
//! own call syntax around arguments held to the function's `parameters`
//! schema, so that what the model writes is what its parser reads.

use std::fmt::Write as _;

use serde_json::Value;

use super::closed::closed_objects;
use super::with_json_options;
use strata_text::ToolSyntax;

use crate::{Error, Result};

/// A forced call's grammar, and where each call's JSON arguments begin.
pub(super) struct ToolGrammar {
    pub(super) lark: String,
    /// Each call's text before its arguments (special tokens as the token
    /// trie spells them, `\xff[id]`) and its arguments' schema, read as
    /// strict; `None` for the syntaxes that write arguments as XML.
    pub(super) openings: Option<Vec<(Vec<u8>, Value)>>,
}

/// A piece of a call's text around its arguments.
enum Piece {
    /// A marker, a special token where the vocabulary has it.
    Marker(&'static str),
    Text(String),
}

/// The text of a call of `fname` in `syntax` before and after its JSON
/// arguments; `None` for the syntaxes that write arguments as XML.
fn json_call(syntax: ToolSyntax, fname: &str) -> Option<(Vec<Piece>, Vec<Piece>)> {
    use Piece::{Marker, Text};
    Some(match syntax {
        ToolSyntax::JsonTags => (
            vec![Marker("<tool_call>"), Text(format!("\n{{\"name\": \"{fname}\", \"arguments\": "))],
            vec![Text("}\n".to_owned()), Marker("</tool_call>")],
        ),
        ToolSyntax::DeepSeek => (
            vec![
                Marker("<｜tool▁calls▁begin｜>"),
                Marker("<｜tool▁call▁begin｜>"),
                Text(fname.to_owned()),
                Marker("<｜tool▁sep｜>"),
            ],
            vec![Marker("<｜tool▁call▁end｜>"), Marker("<｜tool▁calls▁end｜>")],
        ),
        ToolSyntax::DeepSeekFenced => (
            vec![
                Marker("<｜tool▁calls▁begin｜>"),
                Marker("<｜tool▁call▁begin｜>"),
                Text("function".to_owned()),
                Marker("<｜tool▁sep｜>"),
                Text(format!("{fname}\n```json\n")),
            ],
            vec![Text("\n```".to_owned()), Marker("<｜tool▁call▁end｜>"), Marker("<｜tool▁calls▁end｜>")],
        ),
        ToolSyntax::Kimi => (
            vec![
                Marker("<|tool_calls_section_begin|>"),
                Marker("<|tool_call_begin|>"),
                Text(format!("functions.{fname}:0")),
                Marker("<|tool_call_argument_begin|>"),
            ],
            vec![Marker("<|tool_call_end|>"), Marker("<|tool_calls_section_end|>")],
        ),
        ToolSyntax::Mistral => (
            vec![Marker("[TOOL_CALLS]"), Text(format!("[{{\"name\": \"{fname}\", \"arguments\": "))],
            vec![Text("}]".to_owned())],
        ),
        ToolSyntax::XmlFunction | ToolSyntax::GlmArgs => return None,
    })
}

/// The grammar of one call of `name` (any of `tools` when `None`) in
/// `syntax`. `special_id` gives the id of a marker that is a special token
/// (named `<[id]>` in the grammar, as no text spells it).
pub(super) fn lark(
    syntax: ToolSyntax,
    tools: &[Value],
    name: Option<&str>,
    special_id: impl Fn(&str) -> Option<u32>,
) -> Result<ToolGrammar> {
    let functions: Vec<(&str, Value)> = tools
        .iter()
        .map(|tool| {
            let fname = function(tool).get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
            let fname = fname.ok_or_else(|| Error::InvalidRequest("a tool has no function name".to_owned()))?;
            // Strict: a call that may add keys nobody declared need never end.
            // A tool without parameters takes none.
            let parameters = closed_objects(parameters(tool).unwrap_or(&serde_json::json!({"type": "object"})));
            Ok((fname, parameters))
        })
        .collect::<Result<_>>()?;
    let chosen: Vec<&(&str, Value)> = functions.iter().filter(|(fname, _)| name.is_none_or(|n| n == *fname)).collect();
    if chosen.is_empty() {
        return Err(Error::InvalidRequest(match name {
            Some(name) => format!("tool_choice names {name:?}, which is not among the tools"),
            None => "tool_choice requires a tool call but no tools were given".to_owned(),
        }));
    }
    let marker = |text: &str| match special_id(text) {
        Some(id) => format!("<[{id}]>"),
        None => literal(text),
    };
    let rendered = |pieces: &[Piece]| -> Vec<String> {
        pieces
            .iter()
            .map(|piece| match piece {
                Piece::Marker(text) => marker(text),
                Piece::Text(text) => literal(text),
            })
            .collect()
    };
    let spelled = |pieces: &[Piece]| -> Vec<u8> {
        pieces
            .iter()
            .flat_map(|piece| match piece {
                Piece::Marker(text) => special_id(text).map_or_else(|| text.as_bytes().to_vec(), special_bytes),
                Piece::Text(text) => text.as_bytes().to_vec(),
            })
            .collect()
    };
    let mut grammar = String::new();
    let mut openings = Some(Vec::with_capacity(chosen.len()));
    let alternatives: Vec<String> = (0..chosen.len()).map(|i| format!("call_{i}")).collect();
    let _ = writeln!(grammar, "start: {}", alternatives.join(" | "));
    for (i, (fname, parameters)) in chosen.iter().enumerate() {
        let rule = match json_call(syntax, fname) {
            Some((before, after)) => {
                if let Some(openings) = openings.as_mut() {
                    openings.push((spelled(&before), parameters.clone()));
                }
                let args = format!("%json {}", with_json_options(parameters));
                format!("{} {args} {}", rendered(&before).join(" "), rendered(&after).join(" "))
            }
            None => {
                openings = None;
                let (open, close) = match syntax {
                    ToolSyntax::GlmArgs => (literal(&format!("{fname}\n")), String::new()),
                    _ => (literal(&format!("\n<function={fname}>\n")), literal("</function>\n")),
                };
                let arguments = match syntax {
                    ToolSyntax::GlmArgs => parameters_rules(&mut grammar, i, parameters, |key| {
                        (literal(&format!("<arg_key>{key}</arg_key>\n<arg_value>")), literal("</arg_value>\n"), "[^<]")
                    }),
                    _ => parameters_rules(&mut grammar, i, parameters, |key| {
                        (literal(&format!("<parameter={key}>\n")), literal("\n</parameter>\n"), "[^<\\n]")
                    }),
                };
                format!("{} {open} {arguments} {close} {}", marker("<tool_call>"), marker("</tool_call>"))
            }
        };
        let _ = writeln!(grammar, "call_{i}: {rule}");
    }
    Ok(ToolGrammar { lark: grammar, openings })
}

/// A special token as the token trie spells it in a reply's bytes.
fn special_bytes(id: u32) -> Vec<u8> {
    let mut bytes = vec![toktrie::TokTrie::SPECIAL_TOKEN_MARKER];
    bytes.extend_from_slice(format!("[{id}]").as_bytes());
    bytes
}

/// The function object of an OpenAI tool (`{"type": "function", "function":
/// {...}}`), or the tool itself when it is a bare function.
fn function(tool: &Value) -> &Value {
    tool.get("function").unwrap_or(tool)
}

/// The schema of a tool's arguments, if it gives one.
pub(super) fn parameters(tool: &Value) -> Option<&Value> {
    function(tool).get("parameters")
}

/// The XML syntaxes write each argument as text between tags: one rule per
/// property of the schema, in its order, optional unless required; strings
/// as plain text (characters of `text_char`, which keeps markup out, within
/// the schema's length bounds, or one of its `enum`), everything else as
/// the JSON its own schema allows. Returns the sequence of rules for the
/// call.
fn parameters_rules(
    grammar: &mut String,
    call: usize,
    parameters: &Value,
    tags: impl Fn(&str) -> (String, String, &'static str),
) -> String {
    let required: Vec<&str> =
        parameters.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let mut sequence = Vec::new();
    let properties = parameters.get("properties").and_then(Value::as_object).into_iter().flatten();
    for (k, (key, schema)) in properties.enumerate() {
        let (open, close, text_char) = tags(key);
        let value = text_value(schema, text_char).unwrap_or_else(|| format!("%json {}", with_json_options(schema)));
        let _ = writeln!(grammar, "arg_{call}_{k}: {open} {value} {close}");
        let optional = if required.contains(&key.as_str()) { "" } else { "?" };
        sequence.push(format!("arg_{call}_{k}{optional}"));
    }
    sequence.join(" ")
}

/// A string parameter as the XML syntaxes write it, bare: one of its enum's
/// strings, or `text_char`s within its length bounds. `None` for anything
/// else (written as JSON).
fn text_value(schema: &Value, text_char: &str) -> Option<String> {
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        let strings: Option<Vec<String>> = choices.iter().map(|c| c.as_str().map(literal)).collect();
        return strings.filter(|s| !s.is_empty()).map(|s| format!("({})", s.join(" | ")));
    }
    if schema.get("type").and_then(Value::as_str) != Some("string") {
        return None;
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(1).max(1);
    let max = schema.get("maxLength").and_then(Value::as_u64);
    Some(match max {
        Some(max) => format!("/{text_char}{{{min},{}}}/", max.max(min)),
        None => format!("/{text_char}{{{min},}}/"),
    })
}

/// `text` as a Lark string literal (JSON's escapes, which Lark reads).
fn literal(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Value> {
        serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "noop"}}]"#,
        )
        .unwrap()
    }

    #[test]
    fn named_call_in_qwen_syntax_uses_special_ids_for_markers() {
        let ids = |m: &str| (m == "<tool_call>").then_some(7).or((m == "</tool_call>").then_some(8));
        let grammar = lark(ToolSyntax::JsonTags, &tools(), Some("get_weather"), ids).unwrap().lark;
        assert!(grammar.starts_with("start: call_0\n"), "{grammar}");
        assert!(
            grammar.contains("<[7]> \"\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": \" %json"),
            "{grammar}"
        );
        assert!(grammar.contains("<[8]>"), "{grammar}");
    }

    #[test]
    fn forced_arguments_allow_no_keys_the_tool_does_not_declare() {
        let grammar = lark(ToolSyntax::JsonTags, &tools(), None, |_| None).unwrap().lark;
        let call_lines: Vec<&str> = grammar.lines().filter(|line| line.starts_with("call_")).collect();
        assert_eq!(call_lines.len(), 2, "{grammar}");
        for line in call_lines {
            assert!(line.contains("\"additionalProperties\":false"), "{line}");
        }
    }

    #[test]
    fn xml_syntax_has_a_rule_per_parameter() {
        let grammar = lark(ToolSyntax::XmlFunction, &tools(), None, |_| None).unwrap().lark;
        assert!(grammar.starts_with("start: call_0 | call_1\n"), "{grammar}");
        assert!(grammar.contains("arg_0_0: \"<parameter=city>\\n\" /[^<\\n]{1,}/"), "{grammar}");
        assert!(grammar.contains("arg_0_0 arg_0_1?"), "{grammar}");
    }

    #[test]
    fn json_calls_say_where_their_arguments_begin() {
        let ids = |m: &str| (m == "<tool_call>").then_some(7);
        let openings = lark(ToolSyntax::JsonTags, &tools(), None, ids).unwrap().openings.expect("JSON arguments");
        assert_eq!(openings.len(), 2);
        assert_eq!(openings[0].0, b"\xff[7]\n{\"name\": \"get_weather\", \"arguments\": ");
        assert_eq!(openings[0].1["additionalProperties"], false);
        assert!(lark(ToolSyntax::XmlFunction, &tools(), None, ids).unwrap().openings.is_none());
    }

    #[test]
    fn unknown_or_missing_tools_are_the_request_error() {
        let err = lark(ToolSyntax::JsonTags, &tools(), Some("nope"), |_| None).err().expect("refused").to_string();
        assert!(err.contains("nope"), "{err}");
        assert!(lark(ToolSyntax::JsonTags, &[], None, |_| None).is_err());
    }
}
