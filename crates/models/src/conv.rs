//! Inkling's short convolutions (`InklingShortConvolution`): a depthwise
//! causal conv1d plus its input, in f32, over k, v and each block's output.
//! A sequence keeps its last `kernel - 1` inputs as a fixed part of its
//! cache, owned by the block the convolution belongs to.

use strata_format::ShortConv;
use strata_kv::StatePart;

use crate::backend::{Backend, VectorHandle};
use crate::error::Result;
use crate::lm::SeqBatch;

/// One short convolution: its `[channels, kernel]` weight and which part of
/// its layer's cache holds each sequence's state.
pub struct ShortConvolution {
    weight: VectorHandle,
    conv: ShortConv,
    part: usize,
}

impl ShortConvolution {
    /// The convolution whose `[channels, 1, kernel]` weight is `name`, its
    /// state in part `part` of the layer's cache.
    pub fn load(b: &mut Backend, name: &str, conv: ShortConv, part: usize) -> Result<Self> {
        let weight = b.vector(name, conv.channels * conv.kernel)?;
        Ok(Self { weight, conv, part })
    }

    /// What a sequence keeps of it.
    pub fn cache_part(&self) -> StatePart {
        StatePart::Fixed { floats: self.conv.state_floats() }
    }

    /// Convolves `rows` (`[n, channels]`, the batch's rows in sequence
    /// order) in place, each sequence's through its own state, staged in
    /// its cache until the pass commits.
    pub fn apply(&self, b: &Backend, layer: usize, rows: &mut [f32], seqs: &mut [SeqBatch<'_>]) {
        let channels = self.conv.channels;
        let mut rest = rows;
        for seq in seqs.iter_mut() {
            let (own, tail) = rest.split_at_mut(seq.tokens.len() * channels);
            b.short_conv(self.weight, channels, own, seq.cache.stage_state(layer, self.part));
            rest = tail;
        }
        assert!(rest.is_empty(), "a row per token of the batch");
    }
}
