//! Structured outputs: grammars applied to the logits at each step, so that
//! what a sequence samples is always a prefix of something the grammar
//! accepts (`response_format` JSON, a forced tool call). Built on llguidance
//! (the grammar engine llama.cpp, vLLM and SGLang use): it compiles a JSON
//! schema or a Lark grammar lazily and computes each step's token mask over
//! the model's own vocabulary in tens of microseconds.
//!
//! [`GrammarCompiler`] is built once per model (the token trie of its
//! vocabulary); each request gets its own [`Grammar`], a
//! [`Constraint`] that the decode step asks for the mask
//! before sampling and tells the token chosen after.
//!
//! Near the length limit a grammar also gives the decode step its way out
//! (`Constraint::closing`): the shortest tokens that complete the reply from
//! where its JSON stands (`completion`, with `minimal` values for what is
//! missing), taken by a copy of its matcher before they are offered.

mod closed;
mod completion;
mod error;
mod minimal;
mod tool_call;
mod vocab;

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::{SimpleVob, TokenizerEnv};

use completion::Progress;
use strata_engine::{CLOSING_TOKENS_MAX, Constraint};
use strata_text::{Tokenizer, ToolSyntax};
use vocab::Vocab;

pub use error::{Error, Result};

/// JSON as llguidance writes it under our grammars: Python's `json.dumps`
/// separators, no free whitespace. Fixed separators keep a small model from
/// spending its tokens on whitespace, and match how chat templates print
/// JSON to the model.
fn json_options() -> Value {
    serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with our JSON options, unless it sets its own.
fn with_json_options(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_options);
    }
    schema
}

/// Tools one forced call may choose from (OpenAI's own limit). llguidance
/// asserts at 65535 grammar symbols, which about 4000 small tools reach.
pub const GRAMMAR_TOOLS_MAX: usize = 128;

/// The most bytes of JSON schema one grammar is built from (a response
/// format's schema, or all forced tools' `parameters` together). Compiling
/// takes about a second per megabyte, on the request's preparation budget;
/// hand-written schemas are a few kilobytes.
pub const GRAMMAR_SCHEMA_BYTES_MAX: usize = 128 << 10;

/// Compiles grammars over one model's vocabulary.
pub struct GrammarCompiler {
    vocab: Arc<Vocab>,
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// The compiler for a model with `tokenizer`, whose generation ends at
    /// `eos_ids` (a complete grammar allows exactly these next).
    pub fn new(tokenizer: &Tokenizer, eos_ids: &[u32]) -> Result<GrammarCompiler> {
        let vocab = Arc::new(Vocab::new(tokenizer, eos_ids)?);
        let env: toktrie::TokEnv = vocab.clone();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Vocabulary(e.to_string()))?;
        // Warnings and errors come back as values; nothing is printed.
        factory.quiet();
        // Errors go back to the client whose schema caused them: the reason,
        // not the parser's state and the grammar.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarCompiler { vocab, factory: Arc::new(factory) })
    }

    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn json_object(&self) -> Result<Grammar> {
        self.json_schema(&serde_json::json!({"type": "object"}), false)
    }

    /// A JSON value valid under `schema` (`response_format: {"type":
    /// "json_schema"}`); `strict` (its `strict: true`) closes every object
    /// that leaves extra keys unsaid (`closed::closed_objects`). A schema
    /// llguidance cannot compile is the request's error.
    pub fn json_schema(&self, schema: &Value, strict: bool) -> Result<Grammar> {
        if !schema.is_object() && !schema.is_boolean() {
            return Err(Error::InvalidRequest("a JSON schema must be an object".to_owned()));
        }
        check_schema_bytes(json_bytes(schema), "the JSON schema")?;
        let schema = if strict { closed::closed_objects(schema) } else { schema.clone() };
        let progress = Progress::new(vec![(Vec::new(), schema.clone())]);
        self.compile(TopLevelGrammar::from_json_schema(with_json_options(&schema)), Some(progress))
    }

    /// One call, in the model's `syntax`, of the function `name` (or of any
    /// of `tools` when `None`: `tool_choice: "required"`), its arguments
    /// valid under the function's `parameters` schema, read as strict (an
    /// object that leaves extra keys unsaid allows none, as
    /// `closed::closed_objects` says). `tools` are OpenAI
    /// tool objects (`{"type": "function", "function": {...}}`).
    pub fn tool_call(&self, syntax: ToolSyntax, tools: &[Value], name: Option<&str>) -> Result<Grammar> {
        if tools.len() > GRAMMAR_TOOLS_MAX {
            return Err(Error::InvalidRequest(format!(
                "{} tools given; a forced tool call chooses among at most {GRAMMAR_TOOLS_MAX}",
                tools.len()
            )));
        }
        let parameters_bytes = tools.iter().map(|tool| tool_call::parameters(tool).map_or(0, json_bytes)).sum();
        check_schema_bytes(parameters_bytes, "the tools' parameters")?;
        let call = tool_call::lark(syntax, tools, name, |marker| self.vocab.special_id(marker))?;
        self.compile(TopLevelGrammar::from_lark(call.lark), call.openings.map(Progress::new))
    }

    /// The grammar, with its first mask: a schema that compiles but cannot
    /// start (a `$ref` to itself) fails there, and that is the request's
    /// error as much as one that does not compile. `progress` follows the
    /// reply's JSON, when it holds JSON after a fixed opening.
    fn compile(&self, grammar: TopLevelGrammar, progress: Option<Progress>) -> Result<Grammar> {
        let parser = self.factory.create_parser(grammar).map_err(|e| refused(&e))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(refused(&error));
        }
        let first_mask = matcher.compute_mask_or_eos().map_err(|e| refused(&e))?;
        Ok(Grammar {
            matcher,
            vocab: self.vocab.clone(),
            progress,
            first_mask: Some(first_mask),
            mask_time: Duration::ZERO,
            masks: 0,
        })
    }
}

/// The bytes of `value` as compact JSON.
fn json_bytes(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |json| json.len())
}

fn check_schema_bytes(bytes: usize, what: &str) -> Result<()> {
    if bytes <= GRAMMAR_SCHEMA_BYTES_MAX {
        return Ok(());
    }
    Err(Error::InvalidRequest(format!(
        "{what} take {bytes} bytes of JSON; a grammar is built from at most {GRAMMAR_SCHEMA_BYTES_MAX}"
    )))
}

/// A grammar llguidance refused, as one line for the client: its errors
/// may carry a caught panic's backtrace on the lines after the reason.
fn refused(error: &dyn std::fmt::Display) -> Error {
    let text = error.to_string();
    let reason = text.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or("refused");
    Error::InvalidRequest(format!("grammar: {reason}"))
}

/// One sequence's grammar and where it stands.
pub struct Grammar {
    matcher: Matcher,
    vocab: Arc<Vocab>,
    /// Where the reply's JSON stands, for its way out (`Constraint::closing`);
    /// `None` for arguments written as XML.
    progress: Option<Progress>,
    /// The mask for the first token, computed when the grammar was built.
    first_mask: Option<SimpleVob>,
    /// Time spent computing masks, and how many: the grammar's cost per token.
    mask_time: Duration,
    masks: u64,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("masks", &self.masks).field("mask_time", &self.mask_time).finish()
    }
}

impl Grammar {
    /// Total time spent in [`Constraint::mask`] and the number of masks.
    pub fn mask_stats(&self) -> (Duration, u64) {
        (self.mask_time, self.masks)
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> strata_engine::Error {
        strata_engine::Error::Grammar(format!("{what}: {e}"))
    }

    /// The shortest tokens known that complete the reply once `next` are
    /// accepted (`Constraint::closing`): the text the grammar forces (a
    /// call's name, its close) and, where it forces none, the completion
    /// of the reply's JSON (`completion`), in turns; each piece tokenized
    /// and taken by a copy of the matcher, so that every token is one the
    /// grammar allows; then an end-of-sequence token where the grammar
    /// needs one to stop. `None` when no way out is known within
    /// `CLOSING_TOKENS_MAX` tokens.
    fn way_out(&self, next: &[u32]) -> Option<Vec<u32>> {
        let mut progress = self.progress.clone()?;
        let mut probe = self.matcher.clone();
        probe.consume_tokens(next).ok()?;
        let trie = self.vocab.tok_trie();
        progress.feed(&trie.decode_raw(next));
        let mut tokens = Vec::new();
        for _ in 0..WAY_OUT_ROUNDS_MAX {
            if probe.is_stopped() {
                break;
            }
            let forced = probe.compute_ff_bytes();
            let text = if forced.is_empty() { progress.completion()? } else { forced };
            if text.is_empty() {
                break;
            }
            let (piece, _) = self.vocab.tokenize_bytes_marker(&text);
            if tokens.len() + piece.len() > CLOSING_TOKENS_MAX || probe.try_consume_tokens(&piece).ok()? != piece.len()
            {
                return None;
            }
            progress.feed(&text);
            tokens.extend(piece);
        }
        if !probe.is_stopped() {
            // Whole, but the grammar would go on (a number may): the
            // end-of-sequence token ends it.
            let eos = trie.eos_token();
            if tokens.len() == CLOSING_TOKENS_MAX || probe.try_consume_tokens(&[eos]).ok()? != 1 {
                return None;
            }
            tokens.push(eos);
        }
        Some(tokens)
    }
}

/// Turns of forced text and completion in a way out: a forced call's name,
/// its arguments, its close, and room for a grammar that forces in pieces.
const WAY_OUT_ROUNDS_MAX: usize = 8;

impl Constraint for Grammar {
    fn mask(&mut self, logits: &mut [f32]) -> strata_engine::Result<()> {
        let start = Instant::now();
        let allowed = match self.first_mask.take() {
            Some(mask) => mask,
            None => self.matcher.compute_mask_or_eos().map_err(|e| self.error("mask", e))?,
        };
        let words = allowed.as_slice();
        let is_allowed = |token: usize| words.get(token / 32).is_some_and(|w| w >> (token % 32) & 1 == 1);
        // Refuse before touching the row: an error leaves the logits as they were.
        if !logits.iter().enumerate().any(|(token, logit)| logit.is_finite() && is_allowed(token)) {
            return Err(self.error("mask", "no token the model can sample is allowed"));
        }
        for (chunk_index, chunk) in logits.chunks_mut(32).enumerate() {
            let word = words.get(chunk_index).copied().unwrap_or(0);
            if word == u32::MAX && chunk.len() == 32 {
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if word >> bit & 1 == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        self.mask_time += start.elapsed();
        self.masks += 1;
        Ok(())
    }

    fn accept(&mut self, token: u32) -> strata_engine::Result<()> {
        self.matcher.consume_token(token).map_err(|e| self.error("accept", e))?;
        if let Some(progress) = &mut self.progress {
            progress.feed(&self.vocab.tok_trie().decode_raw(&[token]));
        }
        Ok(())
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn closing(&mut self, next: &[u32]) -> strata_engine::Result<Option<Vec<u32>>> {
        Ok(self.way_out(next))
    }
}
