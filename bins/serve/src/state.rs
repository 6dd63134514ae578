//! What the HTTP handlers share: the model's text side (tokenizer, chat
//! template), the limits, and the engine's batcher.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use strata_engine::{
    Batcher, ChatTemplate, Engine, GrammarCompiler, Message, SamplingDefaults, ThinkingStart, Tokenizer, ToolSyntax,
};
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// The model as the info panel and `/info` describe it.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    pub family: String,
    pub layers: usize,
    pub moe_layers: usize,
    pub hidden_size: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub vocab_size: usize,
    pub quant: String,
    pub context_tokens: usize,
    pub ram_budget_bytes: u64,
    pub dense_bytes: u64,
    pub expert_cache_bytes: u64,
    pub expert_bytes: u64,
    /// `--activations`: `exact` or the lossy `q8`.
    pub activations: &'static str,
}

impl ModelInfo {
    pub fn of(engine: &Engine) -> ModelInfo {
        let arch = engine.arch();
        let manifest = engine.container().manifest();
        let budget = engine.budget();
        ModelInfo {
            family: arch.core.family.to_string(),
            layers: arch.layers.len(),
            moe_layers: manifest.expert_layers.len(),
            hidden_size: arch.core.hidden_size,
            experts: arch.num_experts(),
            experts_per_token: arch.experts_per_token(),
            vocab_size: arch.core.vocab_size,
            quant: manifest.quant.preset.to_string(),
            context_tokens: engine.context_tokens(),
            ram_budget_bytes: budget.total_bytes,
            dense_bytes: budget.dense_bytes,
            expert_cache_bytes: engine.expert_cache_bytes() as u64,
            expert_bytes: manifest.expert_layers.iter().map(|l| l.record_bytes * l.num_experts as u64).sum(),
            activations: engine.activations().name(),
        }
    }
}

/// Everything a handler needs.
pub struct App {
    pub model_name: String,
    /// Unix time the server started (OpenAI's `created` of the model).
    pub created: u64,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// How the model writes tool calls (its template's syntax; Qwen3's
    /// JSON in `<tool_call>` for a template that shows none).
    pub tool_syntax: ToolSyntax,
    /// Built on first use by a request with a grammar (see `App::constraint`);
    /// the error, if building failed, as text.
    pub grammars: OnceLock<Result<GrammarCompiler, String>>,
    pub defaults: SamplingDefaults,
    pub vocab_size: usize,
    pub context_tokens: usize,
    pub max_tokens_limit: usize,
    pub max_batch: usize,
    pub info: ModelInfo,
    pub batcher: Batcher,
    /// Every id that ends generation (config.json and generation_config.json).
    pub eos_token_ids: Vec<u32>,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// Host names accepted besides `localhost` and IP addresses, lowercase.
    pub allowed_hosts: Vec<String>,
    /// The longest a client may take to send a request body.
    pub body_timeout: Duration,
    /// Request bytes being templated and tokenized at once, at most (see
    /// `App::prepare`).
    pub tokenize_bytes_in_flight: usize,
    /// Holds `tokenize_bytes_in_flight` permits, one per byte.
    pub tokenizing: Semaphore,
    /// Prompt text longer than this cannot fit the context whatever it
    /// says, and is refused without tokenizing (see `max_prompt_bytes`).
    pub max_prompt_bytes: usize,
    /// Turns true when shutdown's deadline has passed: replies still
    /// running end with an error (see `Generation::next`) rather than be
    /// cut off mid-stream.
    pub cut: tokio::sync::watch::Receiver<bool>,
}

/// How much a tokenizer's normalizer may shrink text before it is split
/// (Unicode normalization composes characters; some normalizers drop
/// control characters): a margin on the bound below, so that no prompt that
/// would fit is refused by it.
const NORMALIZED_SHRINK_MAX: usize = 4;

/// The most bytes of prompt text that can fit in `context_tokens`: no token
/// covers more bytes than the longest token's spelling (byte-level tokens
/// spell each byte with one or two bytes), times the normalizer's margin.
pub fn max_prompt_bytes(tokenizer: &Tokenizer, context_tokens: usize) -> usize {
    let longest_token_bytes =
        (0..tokenizer.vocab_size() as u32).filter_map(|id| tokenizer.id_to_token(id)).map(|t| t.len()).max();
    longest_token_bytes.unwrap_or(1).max(1).saturating_mul(context_tokens).saturating_mul(NORMALIZED_SHRINK_MAX)
}

pub type SharedApp = Arc<App>;

/// A conversation's prompt.
#[derive(Debug)]
pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// Where it leaves the reply as to the model's thinking.
    pub thinking: ThinkingStart,
}

impl App {
    /// Checks that `model` names the model served.
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.model_name {
            return Ok(());
        }
        Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("the model `{model}` does not exist; this server serves `{}`", self.model_name),
        )
        .code("model_not_found"))
    }

    /// The prompt ids of a conversation, through the model's chat template,
    /// which is shown `tools` (OpenAI tool objects) when there are any and
    /// the client's `kwargs` (`chat_template_kwargs`, checked by
    /// `thinking::template_kwargs`); `continuation` is appended after the
    /// assistant's opening (a reply the model is to continue).
    pub fn chat_prompt(
        &self,
        messages: &[Message],
        tools: &[Value],
        continuation: Option<&str>,
        kwargs: &serde_json::Map<String, Value>,
    ) -> Result<ChatPrompt, ApiError> {
        let Some(template) = &self.template else {
            return Err(ApiError::invalid("this model has no chat template; use /v1/completions with a plain prompt"));
        };
        let mut variables = kwargs.clone();
        if !tools.is_empty() {
            variables.insert("tools".to_owned(), Value::from(tools.to_vec()));
        }
        let mut text = template.render_with(messages, true, &variables)?;
        if let Some(rest) = continuation {
            text.push_str(rest);
        }
        self.check_prompt_bytes(&text)?;
        // A rendered template holds its own special tokens (transformers
        // encodes it without adding any).
        let ids = self.tokenizer.encode(&text, false)?;
        Ok(ChatPrompt { ids, thinking: ThinkingStart::of_prompt(&text) })
    }

    /// The ids of a plain-text prompt, with the tokenizer's own special
    /// tokens (as transformers' `tokenizer(text)`).
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.check_prompt_bytes(text)?;
        Ok(self.tokenizer.encode(text, true)?)
    }

    /// Refuses, before tokenizing it, text too long for the context whatever
    /// its tokens: tokenizing costs tens of bytes of memory per byte.
    fn check_prompt_bytes(&self, text: &str) -> Result<(), ApiError> {
        if text.len() <= self.max_prompt_bytes {
            return Ok(());
        }
        Err(ApiError::invalid_param(
            "messages",
            format!(
                "this model's maximum context length is {} tokens, and the prompt is {} bytes, more than that \
                 many tokens can spell (at most {} bytes); shorten it",
                self.context_tokens,
                text.len(),
                self.max_prompt_bytes
            ),
        )
        .code("context_length_exceeded"))
    }
}
