//! Where a constrained reply stands, byte by byte, and the shortest text
//! that completes its JSON: the way out a reply near its length limit is
//! forced through (`Grammar::closing`). A small incremental state, not a
//! parser: inside a string (an escape, a multi-byte character), a number or
//! a literal; the stack of open objects and arrays with their schemas; the
//! keys each object has. The completion finishes what is open, writes each
//! open object's required keys still missing (with their schemas' shortest
//! values, `minimal`) and closes every container. The grammar checks it
//! before it is used: this module guesses, the matcher decides.

use std::sync::Arc;

use serde_json::Value;

mod text;

use crate::minimal::{for_kind, item_schema, minimal, property_schema, quoted, required};
use text::Text;

/// The longest completion written, in bytes.
const COMPLETION_BYTES_MAX: usize = 1024;

/// A reply that holds JSON after a fixed opening: a forced call's markers
/// and name before its arguments (none for a response format). The text
/// after the JSON is the grammar's to force.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    /// Each possible opening (with special tokens as the token trie spells
    /// them) and the schema of the JSON after it.
    openings: Arc<Vec<(Vec<u8>, Arc<Value>)>>,
    /// The reply's bytes until an opening is complete.
    opening: Vec<u8>,
    json: Option<JsonProgress>,
}

impl Progress {
    /// A reply that opens with one of `openings`, then holds JSON under its schema.
    pub(crate) fn new(openings: Vec<(Vec<u8>, Value)>) -> Progress {
        assert!(!openings.is_empty(), "a reply has an opening");
        let openings = openings.into_iter().map(|(text, schema)| (text, Arc::new(schema))).collect();
        let mut progress = Progress { openings: Arc::new(openings), opening: Vec::new(), json: None };
        progress.feed(&[]);
        progress
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if let Some(json) = &mut self.json {
            return json.feed(bytes);
        }
        self.opening.extend_from_slice(bytes);
        let matched = self.openings.iter().find(|(text, _)| self.opening.starts_with(text));
        if let Some((text, schema)) = matched {
            let mut json = JsonProgress::new(schema.clone());
            json.feed(&self.opening[text.len()..]);
            self.json = Some(json);
        } else {
            // Bytes past the longest opening can match none.
            let longest = self.openings.iter().map(|(text, _)| text.len()).max().unwrap_or(0);
            self.opening.truncate(longest + 1);
        }
    }

    /// The shortest text that completes the reply's JSON (and its opening,
    /// the first that fits what was written): empty once the JSON is whole,
    /// `None` when no completion is known.
    pub(crate) fn completion(&self) -> Option<Vec<u8>> {
        if let Some(json) = &self.json {
            return json.completion();
        }
        let (text, schema) = self.openings.iter().find(|(text, _)| text.starts_with(&self.opening))?;
        let mut out = text[self.opening.len()..].to_vec();
        out.extend_from_slice(minimal(schema, schema)?.as_bytes());
        Some(out)
    }
}

/// An open object or array.
#[derive(Debug, Clone)]
enum Frame {
    /// Its schema, and the keys written so far (the last one's value is
    /// being written, or next).
    Object { schema: Arc<Value>, keys: Vec<String> },
    /// Its schema, and the items written whole so far.
    Array { schema: Arc<Value>, items: u64 },
}

/// What the innermost level is in, or expects next.
#[derive(Debug, Clone)]
enum At {
    /// A value (the document's, a member's after `: `, an item).
    Value,
    String(Text),
    /// A number; a digit is due after `-`, `.`, `e` and its sign.
    Number {
        digit_due: bool,
    },
    /// `true`, `false` or `null`, with the bytes still to come.
    Literal(&'static [u8]),
    /// After `{`: a key or `}`.
    ObjectStart,
    /// After an object's `,`: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `[`: an item or `]`.
    ArrayStart,
    /// After a value in a container: `,` or its close.
    AfterValue,
    /// The document is whole; what follows is not its.
    Done,
    /// Bytes this state does not follow: no completion is known.
    Lost,
}

/// A JSON document under a schema, as far as it is written.
#[derive(Debug, Clone)]
pub(crate) struct JsonProgress {
    root: Arc<Value>,
    stack: Vec<Frame>,
    at: At,
    /// The schema of the value expected or being written.
    value: Arc<Value>,
    /// A separator's space is still due (the grammar writes `", "` and `": "`).
    space_due: bool,
}

impl JsonProgress {
    pub(crate) fn new(schema: Arc<Value>) -> JsonProgress {
        JsonProgress { root: schema.clone(), stack: Vec::new(), at: At::Value, value: schema, space_due: false }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.push(byte);
        }
    }

    fn push(&mut self, byte: u8) {
        let at = std::mem::replace(&mut self.at, At::Lost);
        if byte == b' ' && !matches!(at, At::String(_) | At::Number { .. } | At::Literal(_)) {
            self.space_due = false;
            self.at = at;
            return;
        }
        self.at = match at {
            At::Lost | At::Done => at,
            At::Value => self.begin_value(byte),
            At::String(mut text) => {
                if text.push(byte) {
                    At::String(text)
                } else if text.key {
                    self.written_key(&text)
                } else {
                    self.after_value()
                }
            }
            At::Number { digit_due } => match byte {
                b'0'..=b'9' => At::Number { digit_due: false },
                b'.' | b'e' | b'E' | b'+' | b'-' => At::Number { digit_due: true },
                _ if digit_due => At::Lost,
                // A number ends at the first byte that is not its.
                _ => {
                    self.at = self.after_value();
                    return self.push(byte);
                }
            },
            At::Literal(rest) => match rest.split_first() {
                Some((&next, [])) if next == byte => self.after_value(),
                Some((&next, rest)) if next == byte => At::Literal(rest),
                _ => At::Lost,
            },
            At::ObjectStart | At::Key if byte == b'"' => At::String(Text::new(true)),
            At::ObjectStart if byte == b'}' => self.close(),
            At::Colon if byte == b':' => {
                self.value = Arc::new(self.member_schema());
                self.space_due = true;
                At::Value
            }
            At::ArrayStart if byte == b']' => self.close(),
            At::ArrayStart => {
                self.value = Arc::new(self.item_schema(0));
                self.begin_value(byte)
            }
            At::AfterValue => match (self.stack.last(), byte) {
                (Some(Frame::Object { .. }), b',') => {
                    self.space_due = true;
                    At::Key
                }
                (Some(Frame::Array { items, .. }), b',') => {
                    self.value = Arc::new(self.item_schema(*items));
                    self.space_due = true;
                    At::Value
                }
                (Some(Frame::Object { .. }), b'}') | (Some(Frame::Array { .. }), b']') => self.close(),
                _ => At::Lost,
            },
            At::ObjectStart | At::Key | At::Colon => At::Lost,
        };
    }

    fn begin_value(&mut self, byte: u8) -> At {
        self.space_due = false;
        match byte {
            b'{' => {
                let schema = Arc::new(for_kind(&self.root, &self.value, "object"));
                self.stack.push(Frame::Object { schema, keys: Vec::new() });
                At::ObjectStart
            }
            b'[' => {
                let schema = Arc::new(for_kind(&self.root, &self.value, "array"));
                self.stack.push(Frame::Array { schema, items: 0 });
                At::ArrayStart
            }
            b'"' => {
                self.value = Arc::new(for_kind(&self.root, &self.value, "string"));
                At::String(Text::new(false))
            }
            b'-' => At::Number { digit_due: true },
            b'0'..=b'9' => At::Number { digit_due: false },
            b't' => At::Literal(b"rue"),
            b'f' => At::Literal(b"alse"),
            b'n' => At::Literal(b"ull"),
            _ => At::Lost,
        }
    }

    fn written_key(&mut self, text: &Text) -> At {
        match (self.stack.last_mut(), text.kept_all) {
            (Some(Frame::Object { keys, .. }), true) => {
                keys.push(String::from_utf8_lossy(&text.kept).into_owned());
                At::Colon
            }
            _ => At::Lost,
        }
    }

    /// Where a value just ended leaves its container.
    fn after_value(&mut self) -> At {
        match self.stack.last_mut() {
            None => At::Done,
            Some(Frame::Array { items, .. }) => {
                *items += 1;
                At::AfterValue
            }
            Some(Frame::Object { .. }) => At::AfterValue,
        }
    }

    fn close(&mut self) -> At {
        self.stack.pop();
        self.after_value()
    }

    /// The schema of the innermost object's last key's value.
    fn member_schema(&self) -> Value {
        match self.stack.last() {
            Some(Frame::Object { schema, keys }) => match (schema.as_object(), keys.last()) {
                (Some(map), Some(key)) => property_schema(map, key),
                _ => Value::Bool(true),
            },
            _ => Value::Bool(true),
        }
    }

    fn item_schema(&self, index: u64) -> Value {
        match self.stack.last().map(|frame| match frame {
            Frame::Array { schema, .. } => schema.as_object(),
            Frame::Object { .. } => None,
        }) {
            Some(Some(map)) => item_schema(map, index),
            _ => Value::Bool(true),
        }
    }

    /// The shortest text that makes the document whole: empty once it is,
    /// `None` when none is known (or it would pass [`COMPLETION_BYTES_MAX`]).
    pub(crate) fn completion(&self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut stack = self.stack.clone();
        let root = &*self.root;
        let space = |out: &mut Vec<u8>| {
            if self.space_due {
                out.push(b' ');
            }
        };
        // Whether a value of the innermost container is being written.
        let mut in_value = true;
        match &self.at {
            At::Lost => return None,
            At::Done => return Some(out),
            At::Value => {
                space(&mut out);
                out.extend_from_slice(minimal(root, &self.value)?.as_bytes());
            }
            At::String(text) if text.key => {
                let Some(Frame::Object { schema, keys }) = stack.last_mut() else { return None };
                let (rest, name) = text.finish_key(schema, keys)?;
                out.extend(rest);
                out.extend_from_slice(b": ");
                out.extend_from_slice(minimal(root, &property_schema(schema.as_object()?, &name))?.as_bytes());
                keys.push(name);
            }
            At::String(text) => out.extend(text.finish_value(&self.value)?),
            At::Number { digit_due: true } => out.push(b'0'),
            At::Number { digit_due: false } => {}
            At::Literal(rest) => out.extend_from_slice(rest),
            At::Colon => {
                out.extend_from_slice(b": ");
                out.extend_from_slice(minimal(root, &self.member_schema())?.as_bytes());
            }
            At::Key => {
                // After a comma a key must come: the next one required, or
                // the next one declared.
                let Some(Frame::Object { schema, keys }) = stack.last_mut() else { return None };
                let map = schema.as_object()?;
                let mut declared = map.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.keys());
                let unwritten = |key: &String| !keys.contains(key);
                let key =
                    required(map).into_iter().find(unwritten).or_else(|| declared.find(|k| unwritten(k)).cloned())?;
                space(&mut out);
                let member = format!("{}: {}", quoted(&key), minimal(root, &property_schema(map, &key))?);
                out.extend_from_slice(member.as_bytes());
                keys.push(key);
            }
            At::ObjectStart | At::ArrayStart | At::AfterValue => in_value = false,
        }
        while let Some(frame) = stack.pop() {
            match frame {
                Frame::Object { schema, keys } => {
                    let map = schema.as_object();
                    let mut written = !keys.is_empty();
                    for key in map.map(required).unwrap_or_default().into_iter().filter(|k| !keys.contains(k)) {
                        if written {
                            out.extend_from_slice(b", ");
                        }
                        written = true;
                        let value = minimal(root, &property_schema(map?, &key))?;
                        out.extend_from_slice(format!("{}: {value}", quoted(&key)).as_bytes());
                    }
                    out.push(b'}');
                }
                Frame::Array { schema, items } => {
                    let map = schema.as_object();
                    let min_items = map.and_then(|m| m.get("minItems")).and_then(Value::as_u64).unwrap_or(0);
                    let mut count = items + u64::from(in_value);
                    while count < min_items {
                        if count > 0 {
                            out.extend_from_slice(b", ");
                        }
                        out.extend_from_slice(minimal(root, &item_schema(map?, count))?.as_bytes());
                        count += 1;
                    }
                    out.push(b']');
                }
            }
            in_value = true;
            if out.len() > COMPLETION_BYTES_MAX {
                return None;
            }
        }
        (out.len() <= COMPLETION_BYTES_MAX).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn weather() -> Value {
        json!({"type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["fahrenheit", "celsius"]},
            "days": {"type": "integer", "minimum": 1},
            "ok": {"type": "boolean"}
        }, "required": ["city", "unit"], "additionalProperties": false})
    }

    /// The completion of `written` under `schema`, as text (bytes that are
    /// not UTF-8 escaped).
    fn complete(schema: &Value, written: &[u8]) -> Option<String> {
        let mut progress = JsonProgress::new(Arc::new(schema.clone()));
        progress.feed(written);
        progress.completion().map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    #[test]
    fn strings_are_closed_after_the_escape_or_character_they_are_in() {
        let schema = weather();
        assert_eq!(complete(&schema, br#"{"city": "Par"#).unwrap(), r#"", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city": "Pa\"#).unwrap(), r#"n", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city": "\u00"#).unwrap(), r#"00", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city": "\uD83D"#).unwrap(), r#"\uDC00", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city": "\""#).unwrap(), r#"", "unit": "celsius"}"#);
        let mut cut_character = br#"{"city": ""#.to_vec();
        cut_character.push(0xE4);
        let mut progress = JsonProgress::new(Arc::new(schema));
        progress.feed(&cut_character);
        let completion = progress.completion().unwrap();
        assert_eq!(completion[..3], [0x80, 0x80, b'"']);
        cut_character.extend(completion);
        let whole: Value = serde_json::from_slice(&cut_character).expect("valid JSON");
        assert_eq!(whole["city"], "\u{4000}");
    }

    #[test]
    fn numbers_and_literals_are_finished_mid_way() {
        let schema = weather();
        let cases: [(&[u8], &str); 6] = [
            (br#"{"city": "", "unit": "celsius", "days": -"#, "0}"),
            (br#"{"city": "", "unit": "celsius", "days": 1"#, "}"),
            (br#"{"city": "", "unit": "celsius", "days": 1e+"#, "0}"),
            (br#"{"city": "", "unit": "celsius", "days": 12, "ok": t"#, "rue}"),
            (br#"{"city": "", "unit": "celsius", "ok": fal"#, "se}"),
            (br#"{"city": "", "unit": "celsius""#, "}"),
        ];
        for (written, expected) in cases {
            assert_eq!(complete(&schema, written).as_deref(), Some(expected), "{}", String::from_utf8_lossy(written));
        }
    }

    #[test]
    fn missing_required_keys_are_written_with_their_shortest_values() {
        let schema = weather();
        assert_eq!(complete(&schema, b"").unwrap(), r#"{"city": "", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, b"{").unwrap(), r#""city": "", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"ci"#).unwrap(), r#"ty": "", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city""#).unwrap(), r#": "", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city":"#).unwrap(), r#" "", "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city": "P","#).unwrap(), r#" "unit": "celsius"}"#);
        assert_eq!(complete(&schema, br#"{"city": "P", "unit": "fahr"#).unwrap(), r#"enheit"}"#);
        assert_eq!(complete(&schema, br#"{"city": "P", "unit": "kel"#), None);
    }

    #[test]
    fn nested_objects_and_arrays_are_closed_innermost_first() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {
                "b": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"]}, "minItems": 2}
            }, "required": ["b"]},
            "d": {"$ref": "#/$defs/d"}
        }, "required": ["a", "d"], "$defs": {"d": {"type": "array", "prefixItems": [{"const": "x"}], "minItems": 1}}});
        assert_eq!(complete(&schema, br#"{"a": {"b": [{"c": 1}, {"#).unwrap(), r#""c": 0}]}, "d": ["x"]}"#);
        assert_eq!(complete(&schema, br#"{"a": {"b": ["#).unwrap(), r#"{"c": 0}, {"c": 0}]}, "d": ["x"]}"#);
        assert_eq!(complete(&schema, br#"{"a": {"b": [{"c": 1}, {"c": 2}]}, "d": []"#).unwrap(), "}");
        assert_eq!(complete(&schema, br#"{"a": {"b": [{"c": 1}, {"c": 2}]}, "d": ["x"]}"#).unwrap(), "");
    }

    #[test]
    fn text_the_state_does_not_follow_has_no_completion() {
        assert_eq!(complete(&weather(), b"{]"), None);
        let endless = json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}}, "$ref": "#/$defs/n"});
        assert_eq!(complete(&endless, b"{"), None);
    }

    #[test]
    fn a_call_is_completed_from_its_opening_to_the_end_of_its_arguments() {
        let openings = vec![(b"<a>f: ".to_vec(), json!({"enum": [1]})), (b"<a>g: ".to_vec(), weather())];
        let mut progress = Progress::new(openings);
        progress.feed(b"<a>");
        assert_eq!(progress.completion().unwrap(), b"f: 1");
        progress.feed(b"g: {\"city\": \"Par");
        assert_eq!(progress.completion().unwrap(), br#"", "unit": "celsius"}"#);
    }
}
