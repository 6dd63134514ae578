//! What the engine sees of a model: token ids in, logits out, one sequence
//! or a batch.

use strata_format::CoreSpec;
use strata_kv::SequenceState;

use crate::backend::Runtime;
use crate::error::Result;

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

    /// What runs on which device, for a start-up line (`None`: all on the
    /// CPU).
    fn device_summary(&self) -> Option<String> {
        None
    }

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
