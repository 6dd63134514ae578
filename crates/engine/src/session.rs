//! A conversation: its KV cache, the tokens so far, and generation.

use std::ops::ControlFlow;
use std::time::Instant;

use serde::Serialize;
use strata_kv::KvCache;
use strata_models::Logits;
use strata_sched::LayerStats;
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

/// Timings and expert-store counters of one run (names documented in
/// docs/FORMAT.md, "generate --json").
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub decode_tokens_per_s: f64,
    pub prefill_tokens_per_s: f64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_hit_rate: f64,
    pub bytes_read: u64,
    /// Time spent waiting for expert loads.
    pub stall_ms: f64,
    /// Time spent computing routed experts.
    pub expert_compute_ms: f64,
    pub expert_cache_bytes: u64,
    /// Hit rate of each decoder layer (`null` for layers without experts or accesses).
    pub layer_hit_rates: Vec<Option<f64>>,
    /// The memory budget in force, and the process's peak resident memory
    /// (`VmHWM`) at the end of the run.
    pub ram_budget_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    /// One entry per forward pass: the prompt's prefill, then each decoded token.
    pub per_token: Vec<StepStats>,
}

/// Counters of one forward pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepStats {
    pub tokens: usize,
    pub ms: f64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub bytes_read: u64,
    pub stall_ms: f64,
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

}

/// Engine counters at one instant, to difference around a step or a run.
struct Snapshot {
    at: Instant,
    store: StoreStats,
    pipeline: LayerStats,
}

impl Snapshot {
    fn take(engine: &Engine) -> Self {
        Self { at: Instant::now(), store: engine.store_stats(), pipeline: engine.pipeline_stats() }
    }

    fn step_since(&self, engine: &Engine, tokens: usize) -> StepStats {
        let now = Snapshot::take(engine);
        StepStats {
            tokens,
            ms: ms(now.at - self.at),
            expert_hits: now.store.hits - self.store.hits,
            expert_misses: now.store.misses - self.store.misses,
            bytes_read: now.store.bytes_read - self.store.bytes_read,
            stall_ms: (now.pipeline.stall_ns - self.pipeline.stall_ns) as f64 / 1e6,
        }
    }

    fn fill_run(&self, engine: &Engine, stats: &mut RunStats) {
        let now = Snapshot::take(engine);
        stats.expert_hits = now.store.hits - self.store.hits;
        stats.expert_misses = now.store.misses - self.store.misses;
        let accesses = stats.expert_hits + stats.expert_misses;
        stats.expert_hit_rate = if accesses > 0 { stats.expert_hits as f64 / accesses as f64 } else { 0.0 };
        stats.bytes_read = now.store.bytes_read - self.store.bytes_read;
        stats.stall_ms = (now.pipeline.stall_ns - self.pipeline.stall_ns) as f64 / 1e6;
        stats.expert_compute_ms = (now.pipeline.compute_ns - self.pipeline.compute_ns) as f64 / 1e6;
        stats.expert_cache_bytes = engine.expert_cache_bytes() as u64;
        stats.layer_hit_rates = (0..now.store.layer_hits.len())
            .map(|l| {
                let hits = now.store.layer_hits[l] - self.store.layer_hits[l];
                let misses = now.store.layer_misses[l] - self.store.layer_misses[l];
                (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64)
            })
            .collect();
        stats.ram_budget_bytes = engine.budget().total_bytes;
        stats.peak_rss_bytes = strata_tier::peak_rss_bytes();
        stats.decode_tokens_per_s = stats.decode_tokens_per_s();
        stats.prefill_tokens_per_s = stats.prefill_tokens_per_s();
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
        let run_start = Snapshot::take(self.engine);
        let mut logits = match self.pending_logits.take() {
            Some(logits) if prompt.is_empty() => logits,
            _ if prompt.is_empty() && self.unfed.is_none() => {
                return Err(Error::InvalidRequest("empty prompt and nothing to continue from".into()));
            }
            _ => self.feed(prompt)?,
        };
        let prefill = run_start.step_since(self.engine, prompt.len());
        report.stats.prompt_tokens = prompt.len();
        report.stats.prefill_ms = prefill.ms;
        report.stats.per_token.push(prefill);
        let decode_started = Instant::now();
        let mut sampler = Sampler::new(options.sampling);
        let eos = &self.engine.spec().eos_token_ids;
        while report.tokens.len() < options.max_new_tokens {
            let token = sampler.sample(&logits, self.tokens.len());
            report.tokens.push(token);
            let stop = on_token(token).is_break() || (!options.ignore_eos && eos.contains(&token));
            if stop || report.tokens.len() == options.max_new_tokens {
                // The last token is part of the sequence but not yet run, so
                // a later call can continue from it.
                self.tokens.push(token);
                self.unfed = Some(token);
                break;
            }
            let step_start = Snapshot::take(self.engine);
            logits = self.feed(&[token])?;
            report.stats.per_token.push(step_start.step_since(self.engine, 1));
        }
        report.stats.generated_tokens = report.tokens.len();
        report.stats.decode_ms = ms(decode_started.elapsed());
        run_start.fill_run(self.engine, &mut report.stats);
        self.engine.persist_learning()?;
        Ok(report)
    }
}
