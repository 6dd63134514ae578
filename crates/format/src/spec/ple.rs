//! Qwen3.8-Flash-Next's n-gram Per-Layer Embedding (transformers'
//! `Qwen4ExpTextPLELayer`, models/qwen4_exp/modeling_qwen4_exp.py:1179):
//! before a Gated DeltaNet layer, each token's hashed 2- to `ngram_size`-gram
//! rows of a table (one row per head) are projected to a key per residual
//! stream and one value, gated per stream by the streams themselves, and
//! added to the streams with the SiLU of a dilated depthwise convolution of
//! a normed copy. The table (51 B parameters in the released model) is the
//! only part of it that is large; the hashing is in `strata_models::ngram`.

use crate::error::{Error, Result};

/// Longest n-gram (`ngram_size`; the released model hashes 2- and 3-grams).
pub const MAX_NGRAM_SIZE: usize = 16;
/// `ngram_vocab_size_base`, the first prime's lower bound (released:
/// 20,000,000): bounds the table and the trial divisions finding primes.
pub const MAX_NGRAM_VOCAB_BASE: u64 = 1 << 32;

/// One PLE layer, as `Qwen4ExpTextConfig` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PleSpec {
    /// `ple_embed_dim`: a token's rows, concatenated (every head's).
    pub embed_dim: usize,
    /// `ple_conv_kernel_size`: taps of the dilated convolution.
    pub conv_kernel: usize,
    /// `ngram_size`: n-grams of 2 to this many tokens are hashed; also the
    /// convolution's dilation.
    pub ngram_size: usize,
    /// `heads_per_ngram`: heads (table rows) per n-gram length.
    pub heads_per_ngram: usize,
    /// `ngram_vocab_size_base`: the heads' primes are the first ones from
    /// here on, counted across every PLE layer.
    pub vocab_base: u64,
    /// `make_ngram_vocab_size_divisible_by`: the table's rows are padded to
    /// a multiple of this.
    pub rows_multiple: usize,
    /// `seed`, of the multipliers.
    pub seed: u64,
    /// The layer's place among `ple_layer_ids` (0-based).
    pub layer_index: usize,
    /// `eos_token_id` (the first, if a list): the n-gram history restarts
    /// after it.
    pub eos: u32,
    /// Channels of the keys, gates and convolution: every stream's
    /// (`hc_count · hidden_size`).
    pub channels: usize,
}

impl PleSpec {
    /// Heads (table rows) per token: `(ngram_size - 1) · heads_per_ngram`.
    pub fn heads(&self) -> usize {
        (self.ngram_size - 1) * self.heads_per_ngram
    }

    /// Width of one table row.
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.heads()
    }

    /// Token ids a sequence keeps: the `ngram_size - 1` before the next.
    pub fn context_tokens(&self) -> usize {
        self.ngram_size - 1
    }

    /// Inputs the dilated convolution keeps per channel:
    /// `(kernel - 1) · dilation`.
    pub fn conv_state_rows(&self) -> usize {
        (self.conv_kernel - 1) * self.ngram_size
    }

    /// f32 values of the convolution's state one sequence keeps.
    pub fn conv_state_floats(&self) -> usize {
        self.conv_state_rows() * self.channels
    }

    /// Each head's prime (its rows in the table), heads of shorter n-grams
    /// first.
    pub fn head_primes(&self) -> Result<Vec<u64>> {
        let heads = self.heads();
        let before = self.layer_index.checked_mul(heads).ok_or_else(|| Error::invalid("ple_layer_ids", "too many"))?;
        let primes: Vec<u64> = (self.vocab_base.max(1)..).filter(|&p| is_prime(p)).skip(before).take(heads).collect();
        Ok(primes)
    }

    /// Rows of the layer's table: the heads' primes summed, padded to a
    /// multiple of `rows_multiple`.
    pub fn table_rows(&self) -> Result<usize> {
        let too_many = || Error::invalid("ngram_vocab_size_base", "the n-gram table's rows overflow");
        let total = self.head_primes()?.iter().try_fold(0u64, |sum, &p| sum.checked_add(p)).ok_or_else(too_many)?;
        let multiple = self.rows_multiple as u64;
        let padded = total.div_ceil(multiple).checked_mul(multiple).ok_or_else(too_many)?;
        usize::try_from(padded).map_err(|_| too_many())
    }

    pub(super) fn validate(&self) -> Result<()> {
        if !(2..=MAX_NGRAM_SIZE).contains(&self.ngram_size) {
            return Err(Error::invalid("ngram_size", format!("{} is not in 2..={MAX_NGRAM_SIZE}", self.ngram_size)));
        }
        if self.heads_per_ngram == 0 || self.heads() > super::MAX_HEADS {
            return Err(Error::invalid("heads_per_ngram", format!("{} is not in 1..", self.heads_per_ngram)));
        }
        if self.embed_dim == 0 || !self.embed_dim.is_multiple_of(self.heads()) {
            return Err(Error::invalid(
                "ple_embed_dim",
                format!("{} is not a positive multiple of the {} n-gram heads", self.embed_dim, self.heads()),
            ));
        }
        if self.conv_kernel < 2 || self.conv_kernel > super::limits::MAX_CONV_KERNEL {
            return Err(Error::invalid("ple_conv_kernel_size", format!("{} is not in 2..=64", self.conv_kernel)));
        }
        if self.rows_multiple == 0 {
            return Err(Error::invalid("make_ngram_vocab_size_divisible_by", "must be >= 1"));
        }
        if self.vocab_base > MAX_NGRAM_VOCAB_BASE {
            return Err(Error::invalid("ngram_vocab_size_base", format!("more than {MAX_NGRAM_VOCAB_BASE}")));
        }
        self.table_rows().map(|_| ())
    }
}

/// Trial division, as transformers' `_is_prime`.
pub fn is_prime(value: u64) -> bool {
    if value < 2 {
        return false;
    }
    if value.is_multiple_of(2) {
        return value == 2;
    }
    (3..).step_by(2).take_while(|d| d * d <= value).all(|d| !value.is_multiple_of(d))
}
