//! A conversation: its KV cache, the tokens so far, and generation.

use std::ops::ControlFlow;
use std::time::Instant;

use serde::Serialize;
use strata_kv::KvCache;
use strata_models::Logits;
use strata_tier::StoreStats;

use crate::{Engine, Error, Result, Sampler, SamplingOptions};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingOptions,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self { max_new_tokens: 128, sampling: SamplingOptions::default(), ignore_eos: false }
    }
}

/// Timings and expert-store counters of one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub bytes_read: u64,
}

impl RunStats {
    /// Generated tokens per second of decoding.
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_ms > 0.0 { self.generated_tokens as f64 / (self.decode_ms / 1e3) } else { 0.0 }
    }

    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        if self.prefill_ms > 0.0 { self.prompt_tokens as f64 / (self.prefill_ms / 1e3) } else { 0.0 }
    }

    fn add_store_delta(&mut self, before: StoreStats, after: StoreStats) {
        self.expert_hits += after.hits - before.hits;
        self.expert_misses += after.misses - before.misses;
        self.bytes_read += after.bytes_read - before.bytes_read;
    }
}

/// The outcome of [`Session::generate`].
#[derive(Debug, Clone, Default)]
pub struct GenerateReport {
    /// Generated ids only, in order.
    pub tokens: Vec<u32>,
    pub stats: RunStats,
}

/// One sequence being extended.
pub struct Session<'e> {
    engine: &'e Engine,
    cache: KvCache,
    tokens: Vec<u32>,
    /// Logits after the last fed token, not yet consumed by sampling.
    pending_logits: Option<Vec<f32>>,
    /// The last generated token: part of the sequence, not yet run through
    /// the model (running it is only needed if the sequence continues).
    unfed: Option<u32>,
}

impl<'e> Session<'e> {
    pub(crate) fn new(engine: &'e Engine, cache: KvCache) -> Self {
        Self { engine, cache, tokens: Vec::new(), pending_logits: None, unfed: None }
    }

    /// Every token of the sequence so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets the sequence.
    pub fn reset(&mut self) {
        self.cache.truncate(0);
        self.tokens.clear();
        self.pending_logits = None;
        self.unfed = None;
    }

    /// Appends `tokens` and returns the logits after the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let batch: Vec<u32> = self.unfed.iter().chain(tokens).copied().collect();
        if batch.is_empty() {
            return Err(Error::InvalidRequest("no tokens to feed".into()));
        }
        let logits = self.engine.model().forward(&self.engine.runtime(), &batch, &mut self.cache, Logits::Last)?;
        self.unfed = None;
        self.tokens.extend_from_slice(tokens);
        self.pending_logits = Some(logits.clone());
        Ok(logits)
    }

    /// Feeds `prompt` (may be empty if the session already holds tokens),
    /// then generates up to `max_new_tokens`, calling `on_token` with each
    /// new id; `ControlFlow::Break` stops early.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerateReport> {
        let mut report = GenerateReport::default();
        let before = self.engine.store_stats();
        let started = Instant::now();
        let mut logits = match self.pending_logits.take() {
            Some(logits) if prompt.is_empty() => logits,
            _ if prompt.is_empty() && self.unfed.is_none() => {
                return Err(Error::InvalidRequest("empty prompt and nothing to continue from".into()));
            }
            _ => self.feed(prompt)?,
        };
        report.stats.prompt_tokens = prompt.len();
        report.stats.prefill_ms = started.elapsed().as_secs_f64() * 1e3;
        let decode_started = Instant::now();
        let mut sampler = Sampler::new(options.sampling);
        let eos = &self.engine.spec().eos_token_ids;
        while report.tokens.len() < options.max_new_tokens {
            let token = sampler.sample(&logits);
            report.tokens.push(token);
            let stop = on_token(token).is_break() || (!options.ignore_eos && eos.contains(&token));
            if stop || report.tokens.len() == options.max_new_tokens {
                // The last token is part of the sequence but not yet run, so
                // a later call can continue from it.
                self.tokens.push(token);
                self.unfed = Some(token);
                break;
            }
            logits = self.feed(&[token])?;
        }
        report.stats.generated_tokens = report.tokens.len();
        report.stats.decode_ms = decode_started.elapsed().as_secs_f64() * 1e3;
        report.stats.add_store_delta(before, self.engine.store_stats());
        Ok(report)
    }
}
