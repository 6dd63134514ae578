//! The DeepSeek Sparse Attention lightning indexer (GLM-5's `glm_moe_dsa`).
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
    wq_b: Linear,
    wk: Linear,
    k_norm: VectorHandle,
    k_norm_bias: VectorHandle,
    weights_proj: Linear,
}

impl Indexer {
    /// The indexer tensors of layer `layer`, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, dsa: &IndexerSpec, q_lora_rank: usize, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.indexer.{suffix}"));
        let (h, d) = (spec.hidden_size, dsa.head_dim);
        Ok(Self {
            shape: IndexShape { heads: dsa.n_heads, head_dim: d, topk: dsa.topk },
            wq_b: Linear::load(b, &t("wq_b.weight"), None, dsa.n_heads * d, q_lora_rank)?,
            wk: Linear::load(b, &t("wk.weight"), None, d, h)?,
            k_norm: b.vector(&t("k_norm.weight"), d)?,
            k_norm_bias: b.vector(&t("k_norm.bias"), d)?,
            weights_proj: Linear::load(b, &t("weights_proj.weight"), None, dsa.n_heads, h)?,
        })
    }

    /// The indexer keys of `xs` (`[n, hidden]`), `[n, index_head_dim]`.
    pub fn keys(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], angles: &Angles) -> Vec<f32> {
        let mut keys = self.wk.apply(rt, b, xs);
        b.layer_norm(self.k_norm, self.k_norm_bias, KEY_NORM_EPS, &mut keys);
        b.rotate(&mut keys, angles, rotary(self.shape.head_dim));
        keys
    }

    /// For each query at positions `start..start + n`, the positions it may
    /// attend to, ascending: the `index_topk` best by index score among
    /// `0..=position`, or all of them. Ties go as `torch.topk` breaks them on
    /// the row of all `start + n` keys of this pass, with the positions after
    /// the query masked as the causal mask masks them: the same choice as
    /// transformers for the same passes (a whole prompt, then one token at a
    /// time). `compressed` is the normalised compressed query
    /// `[n, q_lora_rank]`, `keys` the cached indexer keys of positions
    /// `0..start + n`.
    pub fn select(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        xs: &[f32],
        compressed: &[f32],
        keys: &[f32],
        start: usize,
        angles: &Angles,
    ) -> Vec<Vec<usize>> {
        let mut q = self.wq_b.apply(rt, b, compressed);
        b.rotate(&mut q, angles, rotary(self.shape.head_dim));
        let mut weights = self.weights_proj.apply(rt, b, xs);
        let head_weight = (self.shape.heads as f32).powf(-0.5);
        weights.iter_mut().for_each(|w| *w *= head_weight);
        b.index_select(rt, self.shape, IndexJob { q: &q, weights: &weights, keys, start, every: 1 })
    }
}
