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

use rayon::prelude::*;
use strata_format::{Container, CoreSpec, IndexerSpec, names};
use strata_kernels::ops;

use crate::common::project;
use crate::rope::{Angles, rotate};
use crate::torch_topk::torch_topk;
use crate::weights::{matrix, vector};
use crate::{Result, Runtime};

/// `nn.LayerNorm(index_head_dim, eps=1e-6)` of the indexer keys.
const KEY_NORM_EPS: f32 = 1e-6;

/// A position after the query: below every score, equal to the others like
/// it (transformers adds the causal mask's `f32::MIN`, or fills `-inf`).
const MASKED: f32 = f32::NEG_INFINITY;

/// One layer's indexer.
#[derive(Debug, Clone)]
pub struct Indexer {
    heads: usize,
    head_dim: usize,
    topk: usize,
    wq_b: String,
    wk: String,
    k_norm: String,
    k_norm_bias: String,
    weights_proj: String,
}

impl Indexer {
    /// The indexer tensors of layer `layer`, shape-checked.
    pub fn load(c: &Container, spec: &CoreSpec, dsa: &IndexerSpec, q_lora_rank: usize, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.indexer.{suffix}"));
        let indexer = Self {
            heads: dsa.n_heads,
            head_dim: dsa.head_dim,
            topk: dsa.topk,
            wq_b: t("wq_b.weight"),
            wk: t("wk.weight"),
            k_norm: t("k_norm.weight"),
            k_norm_bias: t("k_norm.bias"),
            weights_proj: t("weights_proj.weight"),
        };
        let (h, d) = (spec.hidden_size, dsa.head_dim);
        matrix(c, &indexer.wq_b, dsa.n_heads * d, q_lora_rank)?;
        matrix(c, &indexer.wk, d, h)?;
        vector(c, &indexer.k_norm, d)?;
        vector(c, &indexer.k_norm_bias, d)?;
        matrix(c, &indexer.weights_proj, dsa.n_heads, h)?;
        Ok(indexer)
    }

    /// The indexer keys of `xs` (`[n, hidden]`), `[n, index_head_dim]`.
    pub fn keys(&self, rt: &Runtime<'_>, c: &Container, xs: &[f32], angles: &Angles) -> Result<Vec<f32>> {
        let mut keys = project(rt, c, &self.wk, None, xs)?;
        let (w, b) = (c.dense_vec(&self.k_norm)?, c.dense_vec(&self.k_norm_bias)?);
        for (i, key) in keys.chunks_exact_mut(self.head_dim).enumerate() {
            layer_norm(key, w, b, KEY_NORM_EPS);
            let (cos, sin) = angles.at(i);
            rotate(&mut key[..angles.dim()], cos, sin, true);
        }
        Ok(keys)
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
        c: &Container,
        xs: &[f32],
        compressed: &[f32],
        keys: &[f32],
        start: usize,
        angles: &Angles,
    ) -> Result<Vec<Vec<usize>>> {
        let (heads, d) = (self.heads, self.head_dim);
        let mut q = project(rt, c, &self.wq_b, None, compressed)?;
        for (i, row) in q.chunks_exact_mut(heads * d).enumerate() {
            let (cos, sin) = angles.at(i);
            for head in row.chunks_exact_mut(d) {
                rotate(&mut head[..angles.dim()], cos, sin, true);
            }
        }
        let mut weights = project(rt, c, &self.weights_proj, None, xs)?;
        let head_weight = (heads as f32).powf(-0.5);
        weights.iter_mut().for_each(|w| *w *= head_weight);
        let n = q.len() / (heads * d);
        let scale = (d as f32).powf(-0.5);
        let score = |i: usize, t: usize| -> f32 {
            let key = &keys[t * d..][..d];
            let q_i = &q[i * heads * d..][..heads * d];
            let w_i = &weights[i * heads..][..heads];
            q_i.chunks_exact(d).zip(w_i).map(|(q_h, &w)| w * (ops::dot(q_h, key) * scale).max(0.0)).sum()
        };
        let keys_in_pass = start + n;
        // `scores` are query i's, for positions 0..=start + i.
        let choose = |scores: &[f32]| -> Vec<usize> {
            if scores.len() <= self.topk {
                return (0..scores.len()).collect();
            }
            let mut row = scores.to_vec();
            row.resize(keys_in_pass, MASKED);
            let mut chosen: Vec<usize> =
                torch_topk(&row, self.topk).into_iter().filter(|&t| t < scores.len()).collect();
            chosen.sort_unstable();
            chosen
        };
        // Each score is computed by the same code whichever thread runs it,
        // so the choice does not depend on the thread count. One query (a
        // decode step) splits its keys over threads; a batch splits queries.
        Ok(rt.threads.pool().install(|| {
            if n == 1 {
                let scores: Vec<f32> = (0..=start).into_par_iter().map(|t| score(0, t)).collect();
                vec![choose(&scores)]
            } else {
                (0..n)
                    .into_par_iter()
                    .map(|i| {
                        let scores: Vec<f32> = (0..=start + i).map(|t| score(i, t)).collect();
                        choose(&scores)
                    })
                    .collect()
            }
        }))
    }
}

/// `nn.LayerNorm`: `(x - mean) / sqrt(var + eps) * w + b`, biased variance.
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, &w), &b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * w + b;
    }
}
