//! Inkling's blocks (docs/inkling.md): attention without RoPE whose keys
//! and values pass short convolutions and whose scores carry a bias by
//! backward distance, and the short convolution itself, which every block
//! output passes too.

use super::limits::{MAX_CONV_KERNEL, MAX_HEAD_DIM, MAX_HEADS, MAX_POSITIONS};
use crate::error::{Error, Result};

/// A depthwise causal conv1d over `channels`, `kernel` taps, no bias, no
/// activation, plus its input (`InklingShortConvolution`): a sequence keeps
/// its last `kernel - 1` inputs per channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortConv {
    pub kernel: usize,
    pub channels: usize,
}

impl ShortConv {
    /// f32 values of the inputs one sequence keeps.
    pub fn state_floats(&self) -> usize {
        (self.kernel - 1) * self.channels
    }

    pub(super) fn validate(&self) -> Result<()> {
        // One tap would be no convolution; the state is the other taps.
        if self.kernel < 2 {
            return Err(Error::invalid("conv_kernel_size", format!("{} must be >= 2", self.kernel)));
        }
        Ok(())
    }
}

/// The log scaling of a full layer's queries and bias: those of the query
/// at position `p` times `1 + alpha · ln(max((p + 1) / n_floor, 1))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogScaling {
    /// `log_scaling_n_floor`: the position count from which it grows.
    pub n_floor: usize,
    /// `log_scaling_alpha`.
    pub alpha: f32,
}

/// Inkling's attention (`InklingAttention`): per-head RMSNorm of q and k
/// (the layer's eps), scores `q · k / head_dim` plus `(r_h @ proj)[d]` for a
/// key `d < rel_extent` positions back (`r_h` the head's `d_rel` values of
/// `r_proj(x)`), k and v each through a [`ShortConv`] before attending and
/// the output through another before the residual add.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InklingAttention {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Keys visible to a query, itself included (`hybrid_sliding` layers);
    /// `None`: all earlier keys (`hybrid`).
    pub sliding_window: Option<usize>,
    /// Values of `r_proj(x)` per head.
    pub d_rel: usize,
    /// Backward distances with a bias (the window on sliding layers).
    pub rel_extent: usize,
    /// Full layers only, when the config sets `log_scaling_n_floor`.
    pub log_scaling: Option<LogScaling>,
    /// Taps of the k, v and output convolutions.
    pub conv_kernel: usize,
    /// Width of the output (`o_proj`'s rows, the output conv's channels).
    pub hidden_size: usize,
}

impl InklingAttention {
    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The convolution of the keys (the values' is alike).
    pub fn kv_conv(&self) -> ShortConv {
        ShortConv { kernel: self.conv_kernel, channels: self.kv_dim() }
    }

    /// The convolution of the block's output.
    pub fn output_conv(&self) -> ShortConv {
        ShortConv { kernel: self.conv_kernel, channels: self.hidden_size }
    }

    /// f32 values one token adds: its convolved key and value (none under
    /// a sliding window, whose ring is fixed state).
    pub fn cache_floats_per_token(&self) -> usize {
        if self.sliding_window.is_some() { 0 } else { 2 * self.kv_dim() }
    }

    /// f32 values of fixed state per sequence: the ring of a sliding
    /// window's keys and values, then the k, v and output convolutions'.
    pub fn state_floats(&self) -> usize {
        let ring = self.sliding_window.map_or(0, |window| 2 * self.kv_dim() * window);
        ring + 2 * self.kv_conv().state_floats() + self.output_conv().state_floats()
    }

    /// Every size with the config field that gives it and its maximum.
    pub(super) fn sizes(&self) -> [(&'static str, usize, usize); 7] {
        [
            ("num_attention_heads", self.num_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_kv_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            ("sliding_window_size", self.sliding_window.unwrap_or(0), MAX_POSITIONS),
            ("d_rel", self.d_rel, MAX_HEAD_DIM),
            ("rel_extent", self.rel_extent, MAX_POSITIONS),
            ("conv_kernel_size", self.conv_kernel, MAX_CONV_KERNEL),
        ]
    }

    pub(super) fn validate(&self) -> Result<()> {
        let zero = [
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("d_rel", self.d_rel),
            ("rel_extent", self.rel_extent),
            ("sliding_window_size", self.sliding_window.unwrap_or(1)),
        ];
        if let Some((field, _)) = zero.iter().find(|(_, value)| *value == 0) {
            return Err(Error::invalid(*field, "must be > 0"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Error::invalid(
                "num_key_value_heads",
                format!("{} does not divide num_attention_heads {}", self.num_kv_heads, self.num_heads),
            ));
        }
        if let Some(scaling) = self.log_scaling {
            // transformers scales full layers only.
            if self.sliding_window.is_some() {
                return Err(Error::invalid("log_scaling_n_floor", "applies to full layers only"));
            }
            if scaling.n_floor == 0 {
                return Err(Error::invalid("log_scaling_n_floor", "must be > 0"));
            }
            if !scaling.alpha.is_finite() {
                return Err(Error::invalid("log_scaling_alpha", "must be finite"));
            }
        }
        self.output_conv().validate()
    }
}
