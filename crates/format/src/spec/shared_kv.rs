//! DeepSeek V4's attention block ([`SharedKvAttention`]): one key-value
//! head shared by every query head and read as both key and value, over a
//! sliding window, and on compressed layers the entries of a compressor
//! ([`Compression`]): CSA (overlapping windows of `ratio` tokens, a
//! lightning indexer choosing the entries each query sees) or HCA
//! (non-overlapping windows, every entry seen).
//!
//! What a sequence keeps here (strata-kv's `layout_of`) is the
//! window's rows, and per compressor its entries (one row per `ratio`
//! tokens) and the per-token projections of the windows not yet closed.

use super::RopeSpec;
use crate::error::{Error, Result};

/// DeepSeek V4's attention: a q-LoRA query whose heads are RMS-normalised
/// without a weight, one shared key-value head of `head_dim`, RoPE on the
/// trailing `rope.rotary_dim` values of every head (interleaved pairs), a
/// learned sink logit per head, a sliding window of `window` keys (itself
/// included), the attention output's rope part rotated back, and a grouped
/// low-rank output projection (`o_groups` groups of heads each to
/// `o_lora_rank`, then one projection to the hidden width).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedKvAttention {
    pub num_heads: usize,
    pub head_dim: usize,
    pub q_lora_rank: usize,
    /// Plain on sliding layers; on compressed layers the compressor's
    /// rotation (its own base, YaRN), which its entries and indexer share.
    pub rope: RopeSpec,
    pub window: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    /// Epsilon of every norm of the block (`rms_norm_eps`).
    pub eps: f32,
    /// Compressed entries beside the window's keys, on CSA and HCA layers.
    pub compression: Option<Compression>,
}

/// How a layer's compressor turns windows of tokens into entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// CSA: entry `w` pools window `w - 1`'s first half-projection with
    /// window `w`'s second, and the indexer keeps each query's `topk`
    /// best.
    Sparse { ratio: usize, indexer: CompressedIndexer },
    /// HCA: entry `w` pools window `w` alone; a query sees every closed one.
    Heavy { ratio: usize },
}

/// The lightning indexer of a CSA layer: its own compressor of `head_dim`
/// keys, `n_heads` query heads from the q-LoRA residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedIndexer {
    pub n_heads: usize,
    pub head_dim: usize,
    pub topk: usize,
}

/// The state one compressor keeps per sequence, `width` its entries' width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressorState {
    /// Tokens per entry.
    pub ratio: usize,
    pub width: usize,
    /// Whether an entry also pools the previous window (CSA).
    pub overlap: bool,
}

impl CompressorState {
    /// Values of the projection each token contributes beside the one
    /// kept with the entries (pending, until its window closes): its
    /// gate for the window it closes, and with overlap its kv and gate for
    /// the next.
    pub fn rest_width(&self) -> usize {
        if self.overlap { 3 * self.width } else { self.width }
    }

    /// The tokens whose projections closing a window reads: its own, and
    /// with overlap the previous window's.
    pub fn span(&self) -> usize {
        if self.overlap { 2 * self.ratio } else { self.ratio }
    }

    /// Values of each token's kv (and gate) projection: both halves with
    /// overlap.
    pub fn projection_width(&self) -> usize {
        if self.overlap { 2 * self.width } else { self.width }
    }

    /// f32s per token, amortized: an entry per `ratio` tokens, rounded up.
    fn floats_per_token(&self) -> usize {
        self.width.div_ceil(self.ratio)
    }

    /// f32s of the per-sequence state: the open window's kv kept with the
    /// entries, and the rest of the last `span` tokens' projections.
    fn state_floats(&self) -> usize {
        (self.ratio - 1) * self.width + self.span() * self.rest_width()
    }
}

impl SharedKvAttention {
    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// The compressors of the layer: the attention's, then the indexer's.
    pub fn compressors(&self) -> Vec<CompressorState> {
        match self.compression {
            None => Vec::new(),
            Some(Compression::Heavy { ratio }) => vec![CompressorState { ratio, width: self.head_dim, overlap: false }],
            Some(Compression::Sparse { ratio, indexer }) => vec![
                CompressorState { ratio, width: self.head_dim, overlap: true },
                CompressorState { ratio, width: indexer.head_dim, overlap: true },
            ],
        }
    }

    /// f32s one token adds: the compressors' entries, amortized (the
    /// window's ring is fixed state).
    pub fn cache_floats_per_token(&self) -> usize {
        self.compressors().iter().map(CompressorState::floats_per_token).sum()
    }

    /// f32s of fixed state per sequence: the window's ring and every
    /// compressor's open windows.
    pub fn state_floats(&self) -> usize {
        self.window * self.head_dim + self.compressors().iter().map(CompressorState::state_floats).sum::<usize>()
    }

    /// The block's invariants.
    pub(crate) fn validate(&self) -> Result<()> {
        let sizes = [
            ("num_attention_heads", self.num_heads),
            ("head_dim", self.head_dim),
            ("q_lora_rank", self.q_lora_rank),
            ("sliding_window", self.window),
            ("o_groups", self.o_groups),
            ("o_lora_rank", self.o_lora_rank),
        ];
        if let Some((field, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return Err(Error::invalid(*field, "must be > 0"));
        }
        if !self.num_heads.is_multiple_of(self.o_groups) {
            return Err(Error::invalid(
                "o_groups",
                format!("{} does not divide num_attention_heads {}", self.o_groups, self.num_heads),
            ));
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::invalid("rms_norm_eps", "must be finite and > 0"));
        }
        let (ratio, indexer) = match self.compression {
            None => return Ok(()),
            Some(Compression::Heavy { ratio }) => (ratio, None),
            Some(Compression::Sparse { ratio, indexer }) => (ratio, Some(indexer)),
        };
        if ratio == 0 {
            return Err(Error::invalid("compress_rates", "must be > 0"));
        }
        if let Some(indexer) = indexer {
            let sizes = [("index_n_heads", indexer.n_heads), ("index_topk", indexer.topk)];
            if let Some((field, _)) = sizes.iter().find(|(_, size)| *size == 0) {
                return Err(Error::invalid(*field, "must be > 0"));
            }
            // The indexer's keys and queries turn with the block's rotation.
            if indexer.head_dim < self.rope.rotary_dim {
                return Err(Error::invalid(
                    "index_head_dim",
                    format!("{} is narrower than the rotary dimension {}", indexer.head_dim, self.rope.rotary_dim),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RopeScaling;

    /// A layer of DeepSeek V4 Flash (its published config: 64 heads of 512,
    /// q-LoRA 1024, window 128, 8 output groups of 1024, indexer 64 x 128
    /// top 512), compressed as `compression` says.
    fn flash(compression: Option<Compression>) -> SharedKvAttention {
        SharedKvAttention {
            num_heads: 64,
            head_dim: 512,
            q_lora_rank: 1024,
            rope: RopeSpec { theta: 160_000.0, scaling: RopeScaling::None, rotary_dim: 64 },
            window: 128,
            o_groups: 8,
            o_lora_rank: 1024,
            eps: 1e-6,
            compression,
        }
    }

    const INDEXER: CompressedIndexer = CompressedIndexer { n_heads: 64, head_dim: 128, topk: 512 };

    #[test]
    fn flash_layers_keep_an_entry_per_window_and_a_ring_of_the_window() {
        let (sliding, csa) = (flash(None), flash(Some(Compression::Sparse { ratio: 4, indexer: INDEXER })));
        let hca = flash(Some(Compression::Heavy { ratio: 128 }));
        // (512 + 128) / 4 and 512 / 128 floats a token; none on sliding layers.
        let per_token: Vec<usize> = [sliding, csa, hca].iter().map(SharedKvAttention::cache_floats_per_token).collect();
        assert_eq!(per_token, [0, 160, 4]);
        let ring = 128 * 512;
        assert_eq!(sliding.state_floats(), ring);
        // CSA: 3 pending kv rows and 8 tokens' rest (3 x width) per compressor.
        assert_eq!(csa.state_floats(), ring + 3 * 512 + 8 * 3 * 512 + 3 * 128 + 8 * 3 * 128);
        // HCA: 127 pending kv rows and 128 tokens' gates.
        assert_eq!(hca.state_floats(), ring + 127 * 512 + 128 * 512);
        for layer in [sliding, csa, hca] {
            layer.validate().unwrap();
        }
    }

    #[test]
    fn output_groups_that_do_not_divide_the_heads_are_refused() {
        let err = SharedKvAttention { o_groups: 3, ..flash(None) }.validate().unwrap_err().to_string();
        assert!(err.contains("o_groups"), "{err}");
        let narrow = CompressedIndexer { head_dim: 32, ..INDEXER };
        let err = flash(Some(Compression::Sparse { ratio: 4, indexer: narrow })).validate().unwrap_err().to_string();
        assert!(err.contains("index_head_dim"), "{err}");
        let err = flash(Some(Compression::Heavy { ratio: 0 })).validate().unwrap_err().to_string();
        assert!(err.contains("compress_rates"), "{err}");
    }
}
