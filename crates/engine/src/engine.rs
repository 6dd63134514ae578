//! Opening a model: container, expert store, threads and graph.

use std::path::Path;
use std::sync::Arc;

use strata_format::{Container, ModelSpec};
use strata_kernels::Threads;
use strata_models::{CausalLm, Logits, Runtime};
use strata_tier::{ExpertSource, ExpertStore, StoreStats};

use crate::{Error, Result, Session};

/// How to open a model.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Worker threads for the kernels (0: one per available core).
    pub threads: usize,
    /// Bytes of RAM that may hold routed experts.
    pub expert_cache_bytes: u64,
    /// The most tokens a session may hold (`None`: the model's
    /// `max_position_embeddings`, capped at [`CONTEXT_TOKENS_DEFAULT_MAX`]).
    pub context_tokens: Option<usize>,
}

/// The default context is the model's, but no more than this, so that a
/// model advertising a million positions does not promise a KV cache that
/// cannot exist.
pub const CONTEXT_TOKENS_DEFAULT_MAX: usize = 32_768;

impl Default for EngineOptions {
    fn default() -> Self {
        Self { threads: 0, expert_cache_bytes: 1 << 30, context_tokens: None }
    }
}

/// A model ready to run.
pub struct Engine {
    container: Arc<Container>,
    model: Box<dyn CausalLm>,
    threads: Threads,
    store: ExpertStore,
    context_tokens: usize,
}

impl Engine {
    /// Opens the container in `dir`.
    pub fn open(dir: &Path, options: &EngineOptions) -> Result<Self> {
        let container = Arc::new(Container::open(dir)?);
        let spec = container.spec();
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let context_tokens = match options.context_tokens {
            Some(0) => {
                return Err(Error::InvalidOption { option: "context", reason: "must be at least 1 token".into() });
            }
            Some(n) => n,
            None => spec.max_position_embeddings.clamp(1, CONTEXT_TOKENS_DEFAULT_MAX),
        };
        let sources = (0..spec.num_layers)
            .map(|layer| expert_source(&container, layer))
            .collect::<Result<Vec<_>>>()?;
        let capacity_bytes = usize::try_from(options.expert_cache_bytes).unwrap_or(usize::MAX);
        let store = ExpertStore::open(sources, capacity_bytes)?;
        let model = strata_models::load(Arc::clone(&container))?;
        Ok(Self { container, model, threads: Threads::new(threads)?, store, context_tokens })
    }

    /// The model's spec.
    pub fn spec(&self) -> &ModelSpec {
        self.model.spec()
    }

    /// The opened container.
    pub fn container(&self) -> &Container {
        &self.container
    }

    /// The most tokens a session may hold.
    pub fn context_tokens(&self) -> usize {
        self.context_tokens
    }

    /// Expert-store counters since the engine opened.
    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// A fresh conversation.
    pub fn session(&self) -> Session<'_> {
        Session::new(self, self.model.new_cache(self.context_tokens))
    }

    /// Teacher-forced logits at every position of `tokens`, `[n, vocab]`.
    pub fn logits(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::InvalidRequest("no tokens given".into()));
        }
        let mut cache = self.model.new_cache(tokens.len());
        Ok(self.model.forward(&self.runtime(), tokens, &mut cache, Logits::All)?)
    }

    pub(crate) fn model(&self) -> &dyn CausalLm {
        &*self.model
    }

    pub(crate) fn runtime(&self) -> Runtime<'_> {
        Runtime { threads: &self.threads, store: &self.store }
    }
}

fn expert_source(container: &Container, layer: usize) -> Result<Option<ExpertSource>> {
    if container.spec().layers[layer] != strata_format::LayerKind::Moe {
        return Ok(None);
    }
    let layout = container.expert_layout(layer)?;
    Ok(Some(ExpertSource {
        path: layout.path.clone(),
        record_bytes: usize::try_from(layout.record_bytes)
            .map_err(|_| Error::InvalidRequest(format!("layer {layer}: expert records too large for this machine")))?,
        num_experts: layout.num_experts,
    }))
}
