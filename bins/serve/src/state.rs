//! What the HTTP handlers share: the model's text side (tokenizer, chat
//! template), the limits, and the scheduler's handle.

use std::sync::Arc;

use serde::Serialize;
use strata_engine::{ChatTemplate, Engine, Message, Tokenizer};

use crate::error::ApiError;
use crate::generate::Defaults;
use crate::metrics::Metrics;
use crate::scheduler::Handle;

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
}

impl ModelInfo {
    pub fn of(engine: &Engine) -> ModelInfo {
        let spec = engine.spec();
        let manifest = engine.container().manifest();
        let budget = engine.budget();
        ModelInfo {
            family: spec.family.to_string(),
            layers: spec.num_layers,
            moe_layers: manifest.expert_layers.len(),
            hidden_size: spec.hidden_size,
            experts: spec.moe.num_experts,
            experts_per_token: spec.moe.top_k,
            vocab_size: spec.vocab_size,
            quant: manifest.quant.preset.to_string(),
            context_tokens: engine.context_tokens(),
            ram_budget_bytes: budget.total_bytes,
            dense_bytes: budget.dense_bytes,
            expert_cache_bytes: engine.expert_cache_bytes() as u64,
            expert_bytes: manifest.expert_layers.iter().map(|l| l.record_bytes * l.num_experts as u64).sum(),
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
    pub defaults: Defaults,
    pub vocab_size: usize,
    pub context_tokens: usize,
    pub max_tokens_limit: usize,
    pub max_batch: usize,
    pub info: ModelInfo,
    pub scheduler: Handle,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// Host names accepted besides `localhost` and IP addresses, lowercase.
    pub allowed_hosts: Vec<String>,
}

pub type SharedApp = Arc<App>;

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

    /// The prompt ids of a conversation, through the model's chat template;
    /// `continuation` is appended after the assistant's opening (a reply
    /// the model is to continue).
    pub fn chat_prompt(&self, messages: &[Message], continuation: Option<&str>) -> Result<Vec<u32>, ApiError> {
        let Some(template) = &self.template else {
            return Err(ApiError::invalid("this model has no chat template; use /v1/completions with a plain prompt"));
        };
        let mut text = template.render(messages, true)?;
        if let Some(rest) = continuation {
            text.push_str(rest);
        }
        // A rendered template holds its own special tokens (transformers
        // encodes it without adding any).
        Ok(self.tokenizer.encode(&text, false)?)
    }

    /// The ids of a plain-text prompt, with the tokenizer's own special
    /// tokens (as transformers' `tokenizer(text)`).
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        Ok(self.tokenizer.encode(text, true)?)
    }
}
