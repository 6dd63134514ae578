//! A JSON string as far as it is written: inside an escape or a multi-byte
//! character or not, how many characters, its bytes while short; and the
//! text that ends it (to an enum's value, a declared key, a `minLength`).

use serde_json::Value;

use super::COMPLETION_BYTES_MAX;
use crate::minimal::quoted;

/// The bytes of a string kept to complete it (to one of its enum's values,
/// a key to a declared name); a longer one is closed as it is.
const STRING_KEPT_BYTES_MAX: usize = 256;

/// A string being written.
#[derive(Debug, Clone, Default)]
pub(super) struct Text {
    pub(super) key: bool,
    /// Its bytes as written (escapes as written), while within
    /// [`STRING_KEPT_BYTES_MAX`].
    pub(super) kept: Vec<u8>,
    pub(super) kept_all: bool,
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

impl Text {
    pub(super) fn new(key: bool) -> Text {
        Text { key, kept_all: true, ..Text::default() }
    }

    /// Takes the string's next byte; `false` at its closing quote.
    pub(super) fn push(&mut self, byte: u8) -> bool {
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
    pub(super) fn finish_value(&self, schema: &Value) -> Option<Vec<u8>> {
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
    pub(super) fn finish_key(&self, schema: &Value, keys: &[String]) -> Option<(Vec<u8>, String)> {
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
    std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u16::from_str_radix(h, 16).ok())
        .is_some_and(|u| (0xD800..0xDC00).contains(&u))
}
