//! The model's vocabulary as llguidance sees it: every token as the bytes it
//! spells, special tokens marked apart (a grammar can name them by id but no
//! text matches them), built from our own `Tokenizer` rather than through
//! `toktrie_hf_tokenizers`, which would pull in a second `tokenizers` crate.

use std::collections::HashMap;

use tokenizers::DecoderWrapper;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use strata_text::Tokenizer;

use crate::{Error, Result};

/// A tokenizer and the trie of its tokens' bytes.
pub(super) struct Vocab {
    tokenizer: Tokenizer,
    trie: TokTrie,
    /// The tokens matched only by id, by their text (`<|im_end|>`).
    special_ids: HashMap<String, u32>,
}

/// How a vocabulary spells bytes: GPT-2's printable byte alphabet
/// (`Ġthe`), or SentencePiece's `▁` for a space with `<0xNN>` byte tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    ByteLevel,
    ByteFallback { space: char },
}

impl Vocab {
    /// The vocabulary of `tokenizer`, ending generation at `eos_ids` (the
    /// model's, all of them: a grammar that is complete allows exactly these).
    pub(super) fn new(tokenizer: &Tokenizer, eos_ids: &[u32]) -> Result<Vocab> {
        let bad = |reason: String| Error::Vocabulary(format!("{}: {reason}", tokenizer.path().display()));
        let hf = tokenizer.hf();
        let spelling = hf
            .get_decoder()
            .and_then(spelling_of)
            .ok_or_else(|| bad("neither a byte-level nor a byte-fallback decoder".to_owned()))?;
        let vocab_size = u32::try_from(tokenizer.vocab_size()).map_err(|_| bad("vocabulary too large".to_owned()))?;
        let Some((&first_eos, _)) = eos_ids.split_first() else {
            return Err(bad("the model has no end-of-sequence token".to_owned()));
        };
        if let Some(eos) = eos_ids.iter().find(|&&id| id >= vocab_size) {
            return Err(bad(format!("end-of-sequence token {eos} is outside the vocabulary of {vocab_size}")));
        }
        let added: HashMap<u32, (String, bool)> =
            hf.get_added_tokens_decoder().into_iter().map(|(id, token)| (id, (token.content, token.special))).collect();
        let byte_of = byte_level_alphabet();
        let mut words = Vec::with_capacity(vocab_size as usize);
        let mut special_ids = HashMap::new();
        for id in 0..vocab_size {
            let word = match (added.get(&id), hf.id_to_token(id)) {
                // An added token with the look of markup is special, as
                // llguidance's own loader decides: `<tool_call>` and
                // `<|im_end|>` are matched by id, never spelled from text.
                (Some((content, special)), _) if *special || (content.starts_with('<') && content.ends_with('>')) => {
                    special_ids.insert(content.clone(), id);
                    special_word(content)
                }
                (Some((content, _)), _) => content.as_bytes().to_vec(),
                (None, Some(token)) => spell(&token, spelling, &byte_of).unwrap_or_else(|| special_word(&token)),
                // A hole in the ids: a token no text can produce.
                (None, None) => special_word(&format!("<[{id}]>")),
            };
            words.push(word);
        }
        let mut info = TokRxInfo::new(vocab_size, first_eos);
        info.tok_end_of_turn = None;
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_ids);
        Ok(Vocab { tokenizer: tokenizer.clone(), trie, special_ids })
    }

    /// The id of the special token spelled `text`, if there is one: a
    /// grammar must name it by id (`<[id]>`), as no text matches it.
    pub(super) fn special_id(&self, text: &str) -> Option<u32> {
        self.special_ids.get(text).copied()
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode(text, false).unwrap_or_default())
    }
}

fn special_word(name: &str) -> Vec<u8> {
    let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    word.extend_from_slice(name.as_bytes());
    word
}

fn spelling_of(decoder: &DecoderWrapper) -> Option<Spelling> {
    match decoder {
        DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) => Some(Spelling::ByteFallback { space: '▁' }),
        DecoderWrapper::Metaspace(m) => Some(Spelling::ByteFallback { space: m.get_replacement() }),
        DecoderWrapper::Sequence(sequence) => {
            let found: Vec<Spelling> = sequence.get_decoders().iter().filter_map(spelling_of).collect();
            found.first().copied()
        }
        _ => None,
    }
}

/// A token's bytes; `None` when its spelling has a character outside the
/// byte-level alphabet (such a token cannot be produced from text).
fn spell(token: &str, spelling: Spelling, byte_of: &HashMap<char, u8>) -> Option<Vec<u8>> {
    match spelling {
        Spelling::ByteLevel => token.chars().map(|c| byte_of.get(&c).copied()).collect(),
        Spelling::ByteFallback { space } => {
            if let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
                return u8::from_str_radix(hex, 16).ok().map(|byte| vec![byte]);
            }
            Some(token.replace(space, " ").into_bytes())
        }
    }
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the
/// rest are shifted to U+0100 and up, in byte order.
fn byte_level_alphabet() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                let c = char::from_u32(next).expect("U+0100..U+0143 are characters");
                next += 1;
                (c, b)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_covers_every_byte_once() {
        let alphabet = byte_level_alphabet();
        assert_eq!(alphabet.len(), 256);
        assert_eq!(alphabet[&'Ġ'], b' ');
        assert_eq!(alphabet[&'Ċ'], b'\n');
        assert_eq!(alphabet[&'a'], b'a');
    }

    #[test]
    fn byte_fallback_spells_bytes_and_spaces() {
        let fallback = Spelling::ByteFallback { space: '▁' };
        let none = HashMap::new();
        assert_eq!(spell("<0x0A>", fallback, &none), Some(vec![b'\n']));
        assert_eq!(spell("▁the", fallback, &none), Some(b" the".to_vec()));
    }
}
