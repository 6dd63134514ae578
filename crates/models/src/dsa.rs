//! The DeepSeek Sparse Attention lightning indexer (GLM-5's `glm_moe_dsa`),
//! and GLM-5.3-Flash's pooled one (`glm5_next`).
//!
//! Each token gets one indexer key (`wk`, LayerNorm, rope on its first
//! `qk_rope_head_dim` values), cached next to its MLA latent. A query scores
//! every visible key with `Σ_h w_h · relu(q_h · k_t / sqrt(d))`, where the
//! `q_h` come from the compressed query (`wq_b`) and the head weights `w`
//! from the hidden state (`weights_proj`); attention then sees only the
//! `index_topk` best keys, or all of them while there are no more than that
//! (`docs/mla.md` §4). Equal scores are common (every head's ReLU at zero),
//! so the choice among them follows torch's CPU `topk` exactly
//! ([`crate::torch_topk`]), over the row transformers scores: every key of
//! the current forward pass, later positions masked.
//!
//! Pooled (`index_kpool`, docs/mla.md §5), the keys are not rotated and
//! the candidates are pools of `k` tokens, whose key is their keys' mean
//! weighted per channel by `softmax(gate · x + ape)` over the pool: a query
//! scores the pools it has seen whole, keeps the `index_topk / k` best (or
//! all), expanded to their tokens, and its own incomplete pool.

use strata_format::{CoreSpec, IndexerSpec, names};

use crate::backend::Runtime;
use crate::backend::{Backend, IndexJob, IndexShape, Rotary, VectorHandle};
use crate::common::Linear;
use crate::error::Result;
use crate::rope::Angles;

/// `nn.LayerNorm(index_head_dim, eps=1e-6)` of the indexer keys.
const KEY_NORM_EPS: f32 = 1e-6;

/// Indexer queries and keys rotate interleaved pairs over their leading
/// `qk_rope_head_dim` values.
const fn rotary(head_dim: usize) -> Rotary {
    Rotary { head_width: head_dim, offset: 0, interleaved: true }
}

/// One layer's indexer.
#[derive(Debug, Clone)]
pub struct Indexer {
    shape: IndexShape,
    /// Tokens per candidate key (1 unless pooled).
    pool: usize,
    wq_b: Linear,
    wk: Linear,
    k_norm: VectorHandle,
    k_norm_bias: VectorHandle,
    weights_proj: Linear,
    /// The pooled indexer's weights.
    pooling: Option<Pooling>,
}

/// How a pooled indexer weighs the keys of a pool.
#[derive(Debug, Clone)]
struct Pooling {
    /// `index_kpool_compress_gate`: `[head_dim, hidden]`, a logit per key
    /// channel and token.
    gate: Linear,
    /// `index_kpool_compress_ape`: `[pool, head_dim]`, added to the logits
    /// by position within the pool.
    ape: VectorHandle,
}

impl Indexer {
    /// The indexer tensors of layer `layer`, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, dsa: &IndexerSpec, q_lora_rank: usize, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.indexer.{suffix}"));
        let (h, d) = (spec.hidden_size, dsa.head_dim);
        let pooling = match dsa.pool {
            None => None,
            Some(pool) => Some(Pooling {
                gate: Linear::load(b, &t("index_kpool_compress_gate"), None, d, h)?,
                ape: b.vector(&t("index_kpool_compress_ape"), pool * d)?,
            }),
        };
        Ok(Self {
            shape: IndexShape { heads: dsa.n_heads, head_dim: d, topk: dsa.topk, pools: dsa.pool.is_some() },
            pool: dsa.pool.unwrap_or(1),
            wq_b: Linear::load(b, &t("wq_b.weight"), None, dsa.n_heads * d, q_lora_rank)?,
            wk: Linear::load(b, &t("wk.weight"), None, d, h)?,
            k_norm: b.vector(&t("k_norm.weight"), d)?,
            k_norm_bias: b.vector(&t("k_norm.bias"), d)?,
            weights_proj: Linear::load(b, &t("weights_proj.weight"), None, dsa.n_heads, h)?,
            pooling,
        })
    }

    /// Tokens per candidate key (1 unless pooled).
    pub fn pool(&self) -> usize {
        self.pool
    }

    /// Width of a key.
    pub fn head_dim(&self) -> usize {
        self.shape.head_dim
    }

    /// The indexer keys of `xs` (`[n, hidden]`), `[n, index_head_dim]`,
    /// rotated by `angles` where the layer has RoPE.
    pub fn keys(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], angles: Option<&Angles>) -> Vec<f32> {
        let mut keys = self.wk.apply(rt, b, xs);
        b.layer_norm(self.k_norm, self.k_norm_bias, KEY_NORM_EPS, &mut keys);
        if let Some(angles) = angles {
            b.rotate(&mut keys, angles, rotary(self.shape.head_dim));
        }
        keys
    }

    /// A pooled indexer's gate logits of `xs`, `[n, index_head_dim]` (the
    /// position bias is added when a pool closes); `None` unless pooled.
    pub fn gate_logits(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32]) -> Option<Vec<f32>> {
        self.pooling.as_ref().map(|p| p.gate.apply(rt, b, xs))
    }

    /// The key of each whole pool of `keys` and `gate_logits` (`[pools ·
    /// pool, index_head_dim]`, from a pool's first token), `[pools,
    /// index_head_dim]`.
    ///
    /// # Panics
    /// If the indexer is not pooled.
    pub fn pool_keys(&self, b: &Backend, keys: &[f32], gate_logits: &[f32]) -> Vec<f32> {
        let pooling = self.pooling.as_ref().expect("a pooled indexer");
        b.pool_index_keys(pooling.ape, self.pool, keys, gate_logits)
    }

    /// For each query at positions `start..start + n`, the positions it may
    /// attend to, ascending: the `index_topk` best by index score among
    /// `0..=position` (whole pools of them, and the query's own incomplete
    /// pool, when pooled), or all of them. Ties go as `torch.topk` breaks
    /// them on the row of all candidates of this pass, with those after the
    /// query masked as the causal mask masks them: the same choice as
    /// transformers for the same passes (a whole prompt, then one token at
    /// a time). `compressed` is the normalised compressed query `[n,
    /// q_lora_rank]`, `keys` the candidate keys complete within `0..start +
    /// n` (a key per position, or per pool).
    pub fn select(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        xs: &[f32],
        compressed: &[f32],
        keys: &[f32],
        start: usize,
        angles: Option<&Angles>,
    ) -> Vec<Vec<usize>> {
        let mut q = self.wq_b.apply(rt, b, compressed);
        if let Some(angles) = angles {
            b.rotate(&mut q, angles, rotary(self.shape.head_dim));
        }
        let mut weights = self.weights_proj.apply(rt, b, xs);
        let head_weight = (self.shape.heads as f32).powf(-0.5);
        weights.iter_mut().for_each(|w| *w *= head_weight);
        b.index_select(rt, self.shape, IndexJob { q: &q, weights: &weights, keys, start, every: self.pool })
    }
}
