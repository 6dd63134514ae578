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

use crate::minimal::{for_kind, item_schema, minimal, property_schema, quoted, required};

/// The longest completion written, in bytes.
const COMPLETION_BYTES_MAX: usize = 1024;

/// The bytes of a string kept to complete it (to one of its enum's values,
/// a key to a declared name); a longer one is closed as it is.
const STRING_KEPT_BYTES_MAX: usize = 256;

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
    Number { digit_due: bool },
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

/// A string being written.
#[derive(Debug, Clone, Default)]
struct Text {
    key: bool,
    /// Its bytes as written (escapes as written), while within
    /// [`STRING_KEPT_BYTES_MAX`].
    kept: Vec<u8>,
    kept_all: bool,
    /// Characters written whole or begun (an escape counts one).
    chars: u64,
    /// Inside an escape: the bytes after the backslash so far.
    escape: Option<Vec<u8>>,
    /// Inside a multi-byte character: its lead byte and the continuation
    /// bytes written and still due.
    utf8: Option<(u8, u8, u8)>,
    /// The last escape was a high surrogate (`\uD83D`): a low one is due.
    low_surrogate_due: bool,
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
                let declared = map.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.keys());
                let unwritten = |key: &String| !keys.contains(key);
                let key = required(map).into_iter().find(unwritten).or_else(|| declared.cloned().find(unwritten))?;
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

impl Text {
    fn new(key: bool) -> Text {
        Text { key, kept_all: true, ..Text::default() }
    }

    /// Takes the string's next byte; `false` at its closing quote.
    fn push(&mut self, byte: u8) -> bool {
        if byte == b'"' && self.escape.is_none() && self.utf8.is_none() {
            return false;
        }
        self.keep(byte);
        if let Some(escape) = &mut self.escape {
            escape.push(byte);
            if escape[0] != b'u' || escape.len() == 5 {
                self.low_surrogate_due = escape.len() == 5 && is_high_surrogate(&escape[1..]);
                self.escape = None;
            }
            return true;
        }
        if let Some((lead, written, due)) = self.utf8 {
            self.utf8 = (due > 1).then_some((lead, written + 1, due - 1));
            return true;
        }
        match byte {
            b'\\' => self.escape = Some(Vec::new()),
            0xC0..=0xDF => self.utf8 = Some((byte, 0, 1)),
            0xE0..=0xEF => self.utf8 = Some((byte, 0, 2)),
            0xF0..=0xF7 => self.utf8 = Some((byte, 0, 3)),
            _ => {}
        }
        if byte != b'\\' {
            self.low_surrogate_due = false;
        }
        self.chars += 1;
        true
    }

    fn keep(&mut self, byte: u8) {
        if self.kept_all && self.kept.len() < STRING_KEPT_BYTES_MAX {
            self.kept.push(byte);
        } else {
            self.kept_all = false;
        }
    }

    /// The bytes that end the escape or character begun (a low surrogate
    /// after a high one), then the closing quote.
    fn close(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match (&self.escape, self.utf8) {
            (Some(escape), _) if escape.is_empty() => {
                out.extend_from_slice(if self.low_surrogate_due { b"uDC00" } else { b"n" });
            }
            (Some(escape), _) => {
                out.resize(5 - escape.len(), b'0');
                let hex: Vec<u8> = escape[1..].iter().chain(&out).copied().collect();
                if is_high_surrogate(&hex) {
                    out.extend_from_slice(b"\\uDC00");
                }
            }
            (None, Some((lead, written, due))) => {
                // The smallest continuation that is not an overlong form.
                let first = match lead {
                    0xE0 => 0xA0,
                    0xF0 => 0x90,
                    _ => 0x80,
                };
                out.extend((0..due).map(|i| if written == 0 && i == 0 { first } else { 0x80 }));
            }
            (None, None) if self.low_surrogate_due => out.extend_from_slice(b"\\uDC00"),
            (None, None) => {}
        }
        out.push(b'"');
        out
    }

    /// The end of a value string under `schema`: to the first of its enum's
    /// (or its const's) strings that begins as it does, or padded to its
    /// `minLength`; with the closing quote.
    fn finish_value(&self, schema: &Value) -> Option<Vec<u8>> {
        let choices: Vec<&Value> = match (schema.get("const"), schema.get("enum").and_then(Value::as_array)) {
            (Some(constant), _) => vec![constant],
            (None, Some(choices)) => choices.iter().collect(),
            (None, None) => Vec::new(),
        };
        if !choices.is_empty() {
            let written = self.written_quoted()?;
            let choice = choices.iter().filter_map(|c| c.as_str()).map(quoted).find(|q| q.starts_with(&written))?;
            return Some(choice.as_bytes()[written.len()..].to_vec());
        }
        let min_chars = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
        let padding = usize::try_from(min_chars.saturating_sub(self.chars)).ok()?;
        if padding > COMPLETION_BYTES_MAX {
            return None;
        }
        // The padding goes after what ends the character begun, before the quote.
        let mut out = self.close();
        let quote = out.pop();
        out.extend(std::iter::repeat_n(b'a', padding));
        out.extend(quote);
        Some(out)
    }

    /// The rest of the key this one completes to under its object's
    /// `schema`, and the key: the first declared name not among `keys` that
    /// begins as it does, or itself (for an object that allows others).
    fn finish_key(&self, schema: &Value, keys: &[String]) -> Option<(Vec<u8>, String)> {
        let written = self.written_quoted();
        let declared = schema.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.keys());
        let mut unwritten = declared.filter(|k| !keys.contains(k));
        let name = written.as_ref().and_then(|w| unwritten.find(|k| quoted(k).starts_with(w.as_str())));
        match (name, written) {
            (Some(name), Some(written)) => Some((quoted(name).as_bytes()[written.len()..].to_vec(), name.clone())),
            _ => Some((self.close(), String::from_utf8_lossy(&self.kept).into_owned())),
        }
    }

    /// The string as written so far with its opening quote, when all of it
    /// is kept and it ends on a character.
    fn written_quoted(&self) -> Option<String> {
        let text = std::str::from_utf8(&self.kept).ok().filter(|_| self.kept_all)?;
        Some(format!("\"{text}"))
    }
}

/// Whether four hex digits name a high surrogate (`D800`..`DBFF`).
fn is_high_surrogate(hex: &[u8]) -> bool {
    std::str::from_utf8(hex).ok().and_then(|h| u16::from_str_radix(h, 16).ok()).is_some_and(|u| (0xD800..0xDC00).contains(&u))
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
