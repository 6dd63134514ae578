//! What the engine sees of a model: token ids in, logits out, one sequence
//! or a batch.

use strata_format::CoreSpec;
use strata_kv::SequenceState;

use crate::backend::Runtime;
use crate::error::{Error, Result};

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

    /// What the tier of routed experts in VRAM did (`None`: no GPU).
    fn vram_stats(&self) -> Option<crate::VramStats> {
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

    /// As [`CausalLm::forward`] with every row's logits, also returning
    /// each row's hidden state after the final norm (`[n, hidden]`): what a
    /// multi-token-prediction layer drafts from.
    fn forward_hidden(
        &self,
        _rt: &Runtime<'_>,
        _tokens: &[u32],
        _cache: &mut SequenceState,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        Err(Error::Unsupported("the model has no MTP layer".into()))
    }

    /// [`CausalLm::forward_batch`] for speculative decoding: each
    /// sequence's logits of the rows its `which` asks for, and every row's
    /// hidden state after the final norm (what the MTP layer drafts from).
    /// The default runs [`CausalLm::forward_hidden`] per sequence; a model
    /// overrides it to read each MoE layer's expert union once for all.
    fn forward_batch_rows(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>], which: &[Logits]) -> Result<Vec<Rows>> {
        assert_eq!(seqs.len(), which.len(), "one choice of logits per sequence");
        let vocab = self.core().logits_width();
        seqs.iter_mut()
            .zip(which)
            .map(|(seq, &which)| {
                let (mut logits, hidden) = self.forward_hidden(rt, seq.tokens, seq.cache)?;
                if which == Logits::Last {
                    logits.drain(..logits.len() - vocab);
                }
                Ok(Rows { logits, hidden })
            })
            .collect()
    }

    /// Multi-token-prediction layers the model drafts with (0: none).
    fn mtp_layers(&self) -> usize {
        0
    }

    /// Why the model's multi-token-prediction layers do not draft, where it
    /// has some it cannot run (a form or a state the decoder does not
    /// implement): the model runs, without speculation.
    fn mtp_refused(&self) -> Option<&str> {
        None
    }

    /// An empty cache for the MTP layer (the draft cache), holding at most
    /// `capacity_tokens`.
    fn new_draft_cache(&self, capacity_tokens: usize) -> SequenceState {
        SequenceState::with_layers(Vec::new(), capacity_tokens)
    }

    /// The MTP layer's logits for the tokens after `next` (`which`: every
    /// row's, `[n, vocab]`, or the last's, `[1, vocab]`), from `hidden`, the
    /// rows [`CausalLm::forward_hidden`] gave for the tokens before `next`,
    /// extending the draft cache `cache`, whose row 0 took the stack's row
    /// `first_row` (row r is position `first_row + r + 1`; 0 unless the
    /// drafter restarted its cache over a window of recent rows). A
    /// drafter asks for the last row's only: it catches up on every row the
    /// stack ran since its last draft, and the lm head over each of them
    /// would cost a small model about a plain step a row.
    fn draft(
        &self,
        _rt: &Runtime<'_>,
        _hidden: &[f32],
        _next: &[u32],
        _cache: &mut SequenceState,
        _first_row: usize,
        _which: Logits,
    ) -> Result<Draft> {
        Err(Error::Unsupported("the model has no MTP layer".into()))
    }
}

/// What an MTP layer drafts: the logits asked for and its output rows after
/// its head norm `[n, hidden]` (the hidden state a further draft step
/// starts from).
pub struct Draft {
    pub logits: Vec<f32>,
    pub hidden: Vec<f32>,
}

/// One sequence's part of [`CausalLm::forward_batch_rows`]: the logits
/// asked for (`[rows, logits_width]`) and every row's hidden state after the
/// final norm (`[n, hidden]`).
pub struct Rows {
    pub logits: Vec<f32>,
    pub hidden: Vec<f32>,
}

/// One sequence's part of a batched forward pass.
pub struct SeqBatch<'a> {
    /// New tokens, at positions `cache.len()..`.
    pub tokens: &'a [u32],
    pub cache: &'a mut SequenceState,
}
