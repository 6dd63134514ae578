//! Text in, text out: what turns a conversation into token ids and
//! generated ids back into text, read from a Hugging Face model directory.
//!
//! - [`Tokenizer`]: `tokenizer.json`, through the same Rust code Hugging
//!   Face's Python `tokenizers` library wraps, so ids are identical.
//! - [`ChatTemplate`]: the Jinja chat template of `tokenizer_config.json` or
//!   `chat_template.jinja`, rendered the way transformers'
//!   `apply_chat_template(..., tokenize=False)` renders it.
//! - [`Detokenizer`]: streaming decode that only ever hands out complete
//!   characters, and whose pieces add up to a full decode.
//! - [`StopStrings`]: stop sequences matched across streamed chunks.
//! - [`ToolCallParser`]: tool calls out of a streamed answer, in the
//!   [`ToolSyntax`] the model's template shows.
//! - [`ReasoningSplitter`], [`ThinkingBudget`]: a reasoning model's thinking
//!   kept apart from its answer, and held to a budget of tokens.
//! - [`eos_ids_from_dir`]: every id that ends generation.
//! - [`Chat`]: a conversation in text over an engine's session.
//!
//! Nothing here downloads anything: every file is read from the directory.
//! The engine knows token ids only; this crate is what a program that takes
//! and gives text adds to it.

mod chat;
mod detok;
mod error;
mod reasoning;
mod stop;
mod template;
mod tokenizer;
mod tools;

use std::path::Path;

use serde_json::Value;

pub use chat::{Chat, Reply, ReplyOptions, SaveCounts, TextModel};
pub use detok::Detokenizer;
pub use error::{Error, Result};
pub use reasoning::{
    ReasoningSplitter, Split, THINK_CLOSE, THINK_OPEN, ThinkingBudget, ThinkingMarkers, ThinkingStart, template_thinks,
};
pub use stop::{StopOutput, StopStrings};
pub use template::{
    CHAT_TEMPLATE_FILE, ChatTemplate, Message, RENDER_OUTPUT_BYTES_MAX, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE,
    ToolCall,
};
pub use tokenizer::{TOKENIZER_FILE, Tokenizer};
pub use tools::{ParsedCall, ToolCallParser, ToolEvent, ToolSyntax};

/// The file Hugging Face writes generation defaults to.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Every file of a Hugging Face model directory this module reads: what a
/// converted model must keep beside its weights to take and give text.
pub const TEXT_FILES: [&str; 5] =
    [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE, SPECIAL_TOKENS_MAP_FILE, GENERATION_CONFIG_FILE];

/// Refuses a model directory whose tokenizer.json or chat template cannot
/// be used (malformed, or a template that loops without end), naming the
/// file: conversion copies them, and a bad one would otherwise fail every
/// start of the converted model instead.
pub fn check_text_files(dir: &Path) -> Result<()> {
    Tokenizer::from_dir(dir)?;
    ChatTemplate::from_dir(dir)?;
    Ok(())
}

/// Every token id that ends generation: `spec_ids` (the `eos_token_id` of
/// `config.json`, as `CoreSpec::eos_token_ids` holds them) followed by those
/// of `dir/generation_config.json` (an int, a list, or null) not already
/// there.
///
/// transformers' `generate` takes its ids from `generation_config.json` when
/// there is one; many chat models list the end-of-turn token only there
/// (Qwen3: `<|im_end|>` besides config.json's `<|endoftext|>`), so the union
/// stops where either would. A missing file adds nothing.
pub fn eos_ids_from_dir(dir: &Path, spec_ids: &[u32]) -> Result<Vec<u32>> {
    let mut ids = Vec::with_capacity(spec_ids.len() + 2);
    for &id in spec_ids {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let path = dir.join(GENERATION_CONFIG_FILE);
    let Some(config) = read_json(&path)? else {
        return Ok(ids);
    };
    let bad = |reason: String| Error::ModelFile { path: path.clone(), reason };
    let Value::Object(map) = &config else {
        return Err(bad("expected a JSON object".to_owned()));
    };
    let listed = match map.get("eos_token_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().collect(),
        Some(single) => vec![single],
    };
    for value in listed {
        let id = value
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| bad(format!("eos_token_id {value} is not a token id")))?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// The JSON in `path`, or `None` when there is no such file. An unreadable
/// file or invalid JSON is an error naming it.
fn read_json(path: &Path) -> Result<Option<Value>> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::ModelFile { path: path.to_path_buf(), reason: format!("invalid JSON: {e}") })
}

/// The UTF-8 text of `path`, or `None` when it does not exist.
fn read_text(path: &Path) -> Result<Option<String>> {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|e| Error::ModelFile { path: path.to_path_buf(), reason: format!("not UTF-8: {e}") }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io { path: path.to_path_buf(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(generation_config: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = generation_config {
            std::fs::write(dir.path().join(GENERATION_CONFIG_FILE), text).unwrap();
        }
        dir
    }

    #[test]
    fn eos_ids_are_the_union_in_order() {
        let dir = dir_with(Some(r#"{"eos_token_id": [151645, 151643], "bos_token_id": 151643}"#));
        assert_eq!(eos_ids_from_dir(dir.path(), &[151643]).unwrap(), vec![151643, 151645]);
        let dir = dir_with(Some(r#"{"eos_token_id": 2}"#));
        assert_eq!(eos_ids_from_dir(dir.path(), &[]).unwrap(), vec![2]);
        let dir = dir_with(Some(r#"{"eos_token_id": null}"#));
        assert_eq!(eos_ids_from_dir(dir.path(), &[7, 7]).unwrap(), vec![7]);
        let dir = dir_with(Some(r#"{"do_sample": true}"#));
        assert_eq!(eos_ids_from_dir(dir.path(), &[1]).unwrap(), vec![1]);
        let dir = dir_with(None);
        assert_eq!(eos_ids_from_dir(dir.path(), &[3, 4]).unwrap(), vec![3, 4]);
    }

    #[test]
    fn bad_generation_config_names_the_file() {
        for text in [r#"{"eos_token_id": -1}"#, r#"{"eos_token_id": ["x"]}"#, "[1]", "{not json"] {
            let dir = dir_with(Some(text));
            let err = eos_ids_from_dir(dir.path(), &[]).unwrap_err().to_string();
            assert!(err.contains(GENERATION_CONFIG_FILE), "{text}: {err}");
        }
    }
}
