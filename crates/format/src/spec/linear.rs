//! The linear-attention (Gated DeltaNet) layers of the hybrid families
//! (Qwen3-Next `qwen3_next`, Qwen3.5/3.6 `qwen3_5_moe`): which layers they
//! are and their dimensions. The math is in docs/gdn.md.

use serde::{Deserialize, Serialize};

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Softmax attention over every earlier token (`full_attention`).
    Full,
    /// A Gated DeltaNet layer (`linear_attention`).
    Linear,
}

/// How a Gated DeltaNet layer's input projections are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GdnProjections {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, their rows grouped per
    /// key head (`[q d_k | k d_k | v r·d_v | z r·d_v]` and `[b r | a r]`
    /// with `r = num_v_heads / num_k_heads`).
    Grouped,
    /// Qwen3.5/3.6: `in_proj_qkv` (all q heads, all k heads, all v heads),
    /// `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split,
    /// Kimi Delta Attention (`kimi_linear`): `q_proj`, `k_proj`, `v_proj`
    /// (one head count, no key-head sharing, `d_k = d_v`), each with its own
    /// `[C, 1, K]` convolution, `b_proj`, a low-rank forget gate (`f_a_proj`,
    /// `f_b_proj`) whose decay is per key channel, a low-rank output gate
    /// (`g_a_proj`, `g_b_proj`) through a sigmoid, under `self_attn.`. The
    /// state has GDN's shape, so [`GdnDims::state_floats`] holds for it.
    Kimi,
}

impl GdnProjections {
    /// The module the layer's tensors sit under: Qwen's `linear_attn`,
    /// Kimi-Linear's `self_attn` (the name its MLA layers use too).
    pub fn module(self) -> &'static str {
        match self {
            GdnProjections::Grouped | GdnProjections::Split => "linear_attn",
            GdnProjections::Kimi => "self_attn",
        }
    }
}

/// The dimensions every Gated DeltaNet layer of a model shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GdnDims {
    /// `linear_num_key_heads`.
    pub num_k_heads: usize,
    /// `linear_num_value_heads`, a multiple of `num_k_heads`: key head `i`
    /// serves value heads `i·r .. (i+1)·r`.
    pub num_v_heads: usize,
    /// `linear_key_head_dim`.
    pub head_k_dim: usize,
    /// `linear_value_head_dim`.
    pub head_v_dim: usize,
    /// `linear_conv_kernel_dim`: taps of the causal depthwise convolution.
    pub conv_kernel: usize,
    pub projections: GdnProjections,
}

impl GdnDims {
    /// Width of all key (or query) heads together.
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    /// Width of all value heads together.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// Channels of the short convolution: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of one sequence's state in one layer: the `[d_k, d_v]` delta
    /// rule state per value head and the convolution's last `kernel - 1`
    /// inputs per channel.
    pub fn state_floats(&self) -> usize {
        self.num_v_heads * self.head_k_dim * self.head_v_dim + self.conv_dim() * (self.conv_kernel - 1)
    }
}
