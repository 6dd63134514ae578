//! `tokenizer.json` through Hugging Face's `tokenizers` crate: the same Rust
//! code the Python library wraps, so text becomes the same ids.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::detok::Detokenizer;
use crate::{Error, Result};

/// The file Hugging Face writes a fast tokenizer to.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// A tokenizer read from `tokenizer.json`. Cheap to clone (shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("path", &self.path).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// The tokenizer of a model directory: `dir/tokenizer.json`, or `None`
    /// when the directory has none (a model can run on ids alone).
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>> {
        let path = dir.join(TOKENIZER_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => Self::from_bytes(&bytes, path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io { path, source }),
        }
    }

    /// A tokenizer from a `tokenizer.json` file anywhere.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(&bytes, path.to_path_buf())
    }

    /// A tokenizer from the bytes of a `tokenizer.json`; `path` names it in
    /// errors.
    pub fn from_bytes(bytes: &[u8], path: PathBuf) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| Error::Tokenizer { path: path.clone(), reason: format!("cannot load: {e}") })?;
        Ok(Tokenizer { inner: Arc::new(inner), path })
    }

    /// Where this tokenizer was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ids of `text`. Special tokens written in the text (`<|im_end|>`)
    /// become their ids, as in Python; `add_special_tokens` adds what the
    /// tokenizer's post-processor adds (e.g. a leading `<s>`). A rendered
    /// chat template already holds its special tokens: encode it with
    /// `add_special_tokens = false`, as transformers does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        // `encode_fast` skips the character offsets we never use; the ids are
        // the same as `encode`'s.
        let encoding = self.inner.encode_fast(text, add_special_tokens).map_err(|e| self.error("encode", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, as Python's `tokenizer.decode(ids,
    /// skip_special_tokens=...)`. Ids outside the vocabulary are skipped, as
    /// there (a model's embedding table is often padded past the vocabulary).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        // transformers 5 applies no `clean_up_tokenization_spaces` to BPE
        // tokenizers (every supported family's): the plain decode is its text.
        self.inner.decode(ids, skip_special_tokens).map_err(|e| self.error("decode", e))
    }

    /// A streaming decoder over this tokenizer.
    pub fn detokenizer(&self, skip_special_tokens: bool) -> Detokenizer {
        Detokenizer::new(self.clone(), skip_special_tokens)
    }

    /// Ids in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token (`"<|im_end|>"`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of an id, as the vocabulary spells it (byte-level tokens
    /// in their printable form, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    fn error(&self, what: &str, e: tokenizers::Error) -> Error {
        Error::Tokenizer { path: self.path.clone(), reason: format!("{what}: {e}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_is_none_and_bad_file_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Tokenizer::from_dir(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join(TOKENIZER_FILE), "{\"model\": 3}").unwrap();
        let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains(TOKENIZER_FILE), "{err}");
    }
}
