//! One decoder stack ([`Decoder`]) runs every family: each layer is the
//! attention block and feed-forward block its
//! [`strata_format::LayerSpec`] names, so a family is data, not a graph.
//!
//! A family adds blocks, never a cache: routed experts always come from the
//! one generic [`strata_tier::ExpertStore`] through [`strata_sched`], and KV
//! state from [`strata_kv`].
//!
//! **Architecture invariant:** a block registers its weights with the
//! `backend` at load and runs only its operations on them (the routed
//! experts too, through the expert store); it never opens files, never
//! calls a kernel itself, and never branches on the model family.

mod attention;
mod backend;
mod common;
mod decoder;
mod dsa;
mod error;
mod ffn;
mod mla;
mod norm;
mod residual;
mod rope;
mod torch_topk;

pub use decoder::Decoder;
pub use error::{Error, Result};

use std::sync::Mutex;

use backend::Threads;
use strata_format::{Container, CoreSpec};
use strata_kv::SequenceState;
use strata_sched::LayerStats;
use strata_tier::{ExpertStore, TraceWriter};

/// What a forward pass needs besides the model: the thread pool, the
/// routed-expert store, and where to account time and record routing.
pub struct Runtime<'a> {
    pub threads: &'a Threads,
    pub store: &'a ExpertStore,
    /// Stall and compute time of the MoE pipeline, accumulated.
    pub stats: &'a Mutex<LayerStats>,
    /// Where to record every routing decision, if anywhere.
    pub trace: Option<&'a Mutex<TraceWriter>>,
}

/// Which positions' logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every position of the batch, `[n_tokens, vocab]`.
    All,
    /// Only the last position, `[vocab]`.
    Last,
}

/// A causal language model: token ids in, next-token logits out.
pub trait CausalLm: Send + Sync {
    /// The model's common part (vocabulary, widths, special tokens).
    fn core(&self) -> &CoreSpec;

    /// An empty KV cache for this model holding at most `capacity_tokens`.
    fn new_cache(&self, capacity_tokens: usize) -> SequenceState;

    /// Runs `tokens` at positions `cache.len()..`, appends their keys and
    /// values to `cache`, and returns the requested logits.
    fn forward(&self, rt: &Runtime<'_>, tokens: &[u32], cache: &mut SequenceState, logits: Logits) -> Result<Vec<f32>>;

    /// Runs several sequences' new tokens in one pass and returns each
    /// sequence's last-position logits. Every weight is read, and each MoE
    /// layer's expert union fetched, once for all sequences; only attention
    /// runs per sequence, over its own cache. Each sequence's logits are
    /// bit-identical to running it alone.
    fn forward_batch(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<Vec<f32>>>;
}

/// One sequence's part of a batched forward pass.
pub struct SeqBatch<'a> {
    /// New tokens, at positions `cache.len()..`.
    pub tokens: &'a [u32],
    pub cache: &'a mut SequenceState,
}

/// Builds the container's model: its layers' blocks, every tensor checked.
pub fn load(container: std::sync::Arc<Container>) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::load(container)?))
}
