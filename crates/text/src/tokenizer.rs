//! `tokenizer.json` through Hugging Face's `tokenizers` crate: the same Rust
//! code the Python library wraps, so text becomes the same ids.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_format::spec::{MAX_TOKENIZER_BYTES, read_at_most};

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
        match read_at_most(&path, MAX_TOKENIZER_BYTES) {
            Ok(bytes) => Self::from_bytes(&bytes, path).map(Some),
            Err(strata_format::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A tokenizer from a `tokenizer.json` file anywhere.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = read_at_most(path, MAX_TOKENIZER_BYTES)?;
        Self::from_bytes(&bytes, path.to_path_buf())
    }

    /// A tokenizer from the bytes of a `tokenizer.json`; `path` names it in
    /// errors.
    pub fn from_bytes(bytes: &[u8], path: PathBuf) -> Result<Tokenizer> {
        let inner = unpanic(&path, "load", || tokenizers::Tokenizer::from_bytes(bytes))?
            .map_err(|e| Error::Tokenizer { path: path.clone(), reason: format!("cannot load: {e}") })?;
        let tokenizer = Tokenizer { inner: Arc::new(inner), path };
        // A post-processor whose template names a special token it does not
        // define loads, then panics on every encode that adds special tokens
        // (found by fuzz/'s tokenizer_json): refuse it now, not per request.
        // Only a panic refuses it: an encode error is the text's, not the file's.
        let _ = unpanic(&tokenizer.path, "encode", || tokenizer.inner.encode_fast("a", true))?;
        Ok(tokenizer)
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
        let encoding = unpanic(&self.path, "encode", || self.inner.encode_fast(text, add_special_tokens))?
            .map_err(|e| self.error("encode", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, as Python's `tokenizer.decode(ids,
    /// skip_special_tokens=...)`. Ids outside the vocabulary are skipped, as
    /// there (a model's embedding table is often padded past the vocabulary).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        // transformers 5 applies no `clean_up_tokenization_spaces` to BPE
        // tokenizers (every supported family's): the plain decode is its text.
        unpanic(&self.path, "decode", || self.inner.decode(ids, skip_special_tokens))?
            .map_err(|e| self.error("decode", e))
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

    /// The `tokenizers` crate's tokenizer, for what reads its vocabulary's
    /// spelling (the grammar's token trie).
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    fn error(&self, what: &str, e: tokenizers::Error) -> Error {
        Error::Tokenizer { path: self.path.clone(), reason: format!("{what}: {e}") }
    }
}

/// Runs `call` into the tokenizers crate, turning a panic into an error:
/// it panics on some malformed tokenizer.json files instead of refusing them
/// (a JSON syntax error inside `decoder` hits an `expect` there, found by
/// fuzz/'s tokenizer_json), and a tokenizer file is outside input.
fn unpanic<T>(path: &Path, action: &str, call: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|m| (*m).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Error::Tokenizer {
            path: path.to_path_buf(),
            reason: format!("cannot {action}: the tokenizers crate panicked: {message}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    #[test]
    fn missing_file_is_none_and_bad_file_names_itself() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Tokenizer::from_dir(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join(TOKENIZER_FILE), "{\"model\": 3}").unwrap();
        let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains(TOKENIZER_FILE), "{err}");
    }

    #[test]
    fn a_tokenizer_json_over_its_size_limit_is_refused_naming_the_file_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TOKENIZER_FILE);
        // Sparse: one byte over the limit without using the disk.
        File::create(&path).unwrap().set_len(MAX_TOKENIZER_BYTES + 1).unwrap();
        for err in [Tokenizer::from_dir(dir.path()).unwrap_err(), Tokenizer::from_file(&path).unwrap_err()] {
            let err = err.to_string();
            assert!(err.contains(TOKENIZER_FILE) && err.contains(&MAX_TOKENIZER_BYTES.to_string()), "{err}");
        }
    }

    /// A tokenizer.json as fuzz/'s tokenizer_json mutated it, `replace`d
    /// into a minimal valid one.
    fn minimal_with(from: &str, to: &str) -> String {
        let valid = r#"{"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "<s>": 1}, "unk_token": "a"}}"#;
        assert!(Tokenizer::from_bytes(valid.as_bytes(), PathBuf::from("valid.json")).is_ok());
        assert!(valid.contains(from));
        valid.replace(from, to)
    }

    #[test]
    fn a_syntax_error_inside_the_decoder_is_an_error_not_a_panic() {
        let broken = minimal_with(r#""decoder": null"#, r#""decoder": {"type": "ByteLevel", "add_prefix_space": tru}"#);
        let err = Tokenizer::from_bytes(broken.as_bytes(), PathBuf::from("broken.json")).unwrap_err().to_string();
        assert!(err.contains("broken.json") && err.contains("cannot load"), "{err}");
    }

    #[test]
    fn a_post_processor_naming_an_undefined_special_token_is_refused_at_load() {
        let template = r#""post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {}}"#;
        let broken = minimal_with(r#""post_processor": null"#, template);
        let err = Tokenizer::from_bytes(broken.as_bytes(), PathBuf::from("broken.json")).unwrap_err().to_string();
        assert!(err.contains("broken.json") && err.contains("panicked"), "{err}");
    }
}
