//! Streaming detokenization: ids arrive one at a time, text leaves in
//! pieces that are always whole characters and add up to the full decode.
//!
//! Two things make the naive "decode each id alone" wrong:
//!
//! - a token can be part of a character: byte-level BPE (GPT-2, Qwen, OLMoE)
//!   and byte fallback (`<0xE6>`, Llama, Mixtral) split emoji and CJK into
//!   byte pieces, which decode to U+FFFD until the rest arrives;
//! - a token's text depends on its neighbours: decoders strip the leading
//!   space of the first token (`Strip`, `Metaspace`), so `"▁world"` alone is
//!   `"world"` but after `"Hello"` is `" world"`.
//!
//! So each step decodes a short window that starts one emitted piece back
//! (the *prefix*), and hands out only what the window adds beyond the
//! prefix's own decode; the prefix gives the decoder the context a full
//! decode would have. Text ending in U+FFFD (an incomplete character) is
//! held back until the character completes.

use super::tokenizer::Tokenizer;
use crate::Result;

const REPLACEMENT: char = '\u{FFFD}';

/// Decodes a stream of ids into text pieces. Made by
/// [`Tokenizer::detokenizer`].
///
/// Every piece is whole characters: a character split across tokens comes
/// out once complete. Concatenated, the pieces of [`Detokenizer::push`] and
/// [`Detokenizer::finish`] equal `tokenizer.decode(all_ids)`.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// The window: ids from the start of the prefix on (older ids are
    /// dropped, so memory stays bounded over a long stream).
    ids: Vec<u32>,
    /// `ids[..read]` is the prefix: ids whose text was already handed out.
    read: usize,
    /// The decode of the prefix alone.
    prefix_text: String,
    /// Bytes of the window's decode past `prefix_text` already handed out,
    /// while the window cannot move on (its text ends mid-character).
    emitted: usize,
}

impl Tokenizer {
    /// A streaming decoder over this tokenizer.
    pub fn detokenizer(&self, skip_special_tokens: bool) -> Detokenizer {
        Detokenizer::new(self.clone(), skip_special_tokens)
    }
}

impl Detokenizer {
    pub(super) fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Detokenizer {
        Detokenizer { tokenizer, skip_special_tokens, ids: Vec::new(), read: 0, prefix_text: String::new(), emitted: 0 }
    }

    /// Adds one id; returns the text it completes (often empty while a
    /// character is incomplete, sometimes several characters at once).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.push_many(&[id])
    }

    /// Adds several ids at once; returns the text they complete.
    pub fn push_many(&mut self, ids: &[u32]) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.ids.extend_from_slice(ids);
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        let Some(new) = text.strip_prefix(self.prefix_text.as_str()) else {
            // The decoder rewrote the prefix's text given what follows; no
            // decoder of the supported tokenizers does. Hold the text back:
            // `finish` hands out whatever differs.
            return Ok(String::new());
        };
        if new.is_empty() {
            // Nothing new (a skipped special token): keep the window as it
            // is. Moving on would make these ids the next prefix, and a
            // prefix that decodes to nothing gives the decoder no context:
            // it would strip the next word's space as if it began the text.
            return Ok(String::new());
        }
        let complete = !new.ends_with(REPLACEMENT);
        // Up to where the text is certainly final: a trailing run of U+FFFD
        // may be bytes of a character still arriving (byte fallback turns
        // every byte of an incomplete run into U+FFFD, even those of
        // complete characters before it).
        let stable = if complete { new.len() } else { new.trim_end_matches(REPLACEMENT).len() };
        let piece = new.get(self.emitted..stable).unwrap_or_default().to_owned();
        if complete {
            // Everything up to here is out: the ids just handed out become
            // the next prefix. Its decode is recomputed alone so that the
            // next window starts from exactly what the decoder makes of it.
            self.ids.drain(..self.read);
            self.read = self.ids.len();
            self.prefix_text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
            self.emitted = 0;
        } else {
            self.emitted = self.emitted.max(stable);
        }
        Ok(piece)
    }

    /// Ends the stream: the text still held back (an incomplete character
    /// at the very end comes out as U+FFFD, as in the full decode). The
    /// detokenizer starts over afterwards.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        let rest = match text.strip_prefix(self.prefix_text.as_str()) {
            Some(new) => new.get(self.emitted..).unwrap_or_default().to_owned(),
            // See `push_many`: what differs from what was handed out.
            None => {
                let common = common_prefix_len(&text, &self.prefix_text);
                text[common..].to_owned()
            }
        };
        self.ids.clear();
        self.read = 0;
        self.prefix_text.clear();
        self.emitted = 0;
        Ok(rest)
    }
}

/// Bytes of the longest common prefix of `a` and `b`, on a char boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices().zip(b.chars()).find(|((_, x), y)| x != y).map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_is_on_char_boundaries() {
        assert_eq!(common_prefix_len("héllo", "hélp"), 4);
        assert_eq!(common_prefix_len("日本", "日本語"), 6);
        assert_eq!(common_prefix_len("", "x"), 0);
        assert_eq!(common_prefix_len("a東", "a京"), 1);
    }
}
