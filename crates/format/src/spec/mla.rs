//! The dimensions of Multi-head Latent Attention and of DeepSeek Sparse
//! Attention's indexer, as a spec stores them. The exact math is in
//! `docs/mla.md`.

use serde::{Deserialize, Serialize};

/// Epsilon of the latent norms (`q_a_layernorm`, `kv_a_layernorm`) where
/// the model builds them without one (DeepSeek-V3, Kimi K2.5, GLM-5,
/// Kimi-Linear): the RMSNorm class default, not `rms_norm_eps`.
pub const LATENT_NORM_EPS: f32 = 1e-6;

/// Multi-head Latent Attention dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaSpec {
    /// Rank of the compressed query (`q_a_proj` → `q_a_layernorm` →
    /// `q_b_proj`); `None`: a single `q_proj` (DeepSeek-V2-Lite style).
    pub q_lora_rank: Option<usize>,
    /// Width of the compressed key/value latent, which is what the KV cache
    /// holds.
    pub kv_lora_rank: usize,
    /// Per-head query/key width without position encoding.
    pub qk_nope_head_dim: usize,
    /// Per-head query width, and the one shared key width, that RoPE rotates.
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// RoPE rotates interleaved pairs `(x[2i], x[2i+1])` (DeepSeek's layout)
    /// instead of `(x[i], x[i + d/2])`.
    pub rope_interleave: bool,
}

impl MlaSpec {
    /// Per-head query/key width, `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// What one token caches per layer: the normalised latent and the
    /// rotated shared key, `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// Whether a layer runs its own DSA indexer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexerKind {
    /// The layer scores past tokens with its own indexer.
    Full,
    /// The layer reuses the selection of the closest full layer before it
    /// (and has no indexer weights).
    Shared,
}

/// DeepSeek Sparse Attention: a lightning indexer picks, per query, the
/// `index_topk` past tokens attention may see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsaSpec {
    pub index_topk: usize,
    pub index_head_dim: usize,
    pub index_n_heads: usize,
    /// One entry per decoder layer.
    pub indexer_types: Vec<IndexerKind>,
}
