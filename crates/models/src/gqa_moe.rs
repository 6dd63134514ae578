//! The forward graph of the grouped-query-attention MoE families: OLMoE,
//! Qwen3-MoE and Mixtral.
//!
//! The three share the Llama skeleton (pre-norm, RoPE, SwiGLU experts behind a
//! softmax router) and differ only in what their spec says: q/k norms over the
//! whole projection (OLMoE) or per head (Qwen3-MoE), `clip_qkv`, attention
//! biases, dense layers, sliding windows and top-k renormalisation. So one
//! graph serves all three, driven by [`ModelSpec`].

use std::sync::Arc;

use rayon::prelude::*;

use strata_format::{Container, Family, ModelSpec, QkNorm};
use strata_kv::{KEYS, KvCache, VALUES};
use strata_sched::swiglu;

use crate::attention::{AttnShape, attend};
use crate::common::{
    add_bias, batch_logits, batch_rows, decoder_stack, embed, output_logits, rmsnorm_rows, run_routed_experts,
};
use crate::rope::Rope;
use crate::router::softmax_top_k;
use crate::weights::{LayerNames, MlpNames, matrix, vector};
use crate::{CausalLm, Error, Logits, Result, Runtime, SeqBatch};

/// A loaded OLMoE, Qwen3-MoE or Mixtral model.
pub struct GqaMoe {
    container: Arc<Container>,
    spec: ModelSpec,
    rope: Rope,
    layers: Vec<LayerNames>,
    lm_head: String,
}

const EMBED: &str = "model.embed_tokens.weight";
const FINAL_NORM: &str = "model.norm.weight";

impl GqaMoe {
    /// Checks every tensor the graph will read, so a forward pass never meets
    /// a missing or misshapen one.
    pub fn load(container: Arc<Container>) -> Result<Self> {
        let spec = container.spec().clone();
        if !matches!(spec.family, Family::Olmoe | Family::Qwen3Moe | Family::Mixtral) {
            return Err(Error::UnsupportedFamily { family: spec.family.to_string() });
        }
        let rope = Rope::new(&spec.rope, spec.head_dim)?;
        let layers = (0..spec.num_layers).map(|l| LayerNames::new(&spec, l)).collect();
        let lm_head = if spec.tie_word_embeddings { EMBED } else { "lm_head.weight" }.to_owned();
        let model = Self { container, spec, rope, layers, lm_head };
        model.validate()?;
        Ok(model)
    }

    fn validate(&self) -> Result<()> {
        let s = &self.spec;
        let c = &*self.container;
        let (h, q_dim, kv_dim) = (s.hidden_size, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
        matrix(c, EMBED, s.vocab_size, h)?;
        matrix(c, &self.lm_head, s.vocab_size, h)?;
        vector(c, FINAL_NORM, h)?;
        for (l, names) in self.layers.iter().enumerate() {
            vector(c, &names.input_norm, h)?;
            vector(c, &names.post_attn_norm, h)?;
            matrix(c, &names.q, q_dim, h)?;
            matrix(c, &names.k, kv_dim, h)?;
            matrix(c, &names.v, kv_dim, h)?;
            matrix(c, &names.o, h, q_dim)?;
            for (bias, len) in
                [(&names.q_bias, q_dim), (&names.k_bias, kv_dim), (&names.v_bias, kv_dim), (&names.o_bias, h)]
            {
                if let Some(name) = bias {
                    vector(c, name, len)?;
                }
            }
            let (q_norm_len, k_norm_len) = match s.qk_norm {
                QkNorm::Full => (q_dim, kv_dim),
                QkNorm::PerHead | QkNorm::None => (s.head_dim, s.head_dim),
            };
            if let (Some(qn), Some(kn)) = (&names.q_norm, &names.k_norm) {
                vector(c, qn, q_norm_len)?;
                vector(c, kn, k_norm_len)?;
            }
            match &names.mlp {
                MlpNames::Dense([gate, up, down]) => {
                    matrix(c, gate, s.dense_intermediate_size, h)?;
                    matrix(c, up, s.dense_intermediate_size, h)?;
                    matrix(c, down, h, s.dense_intermediate_size)?;
                }
                MlpNames::Moe { router } => {
                    matrix(c, router, s.moe.num_experts, h)?;
                    c.expert_layout(l)?;
                }
            }
        }
        Ok(())
    }

    /// Attention of every row of `xs`, where `seqs` says which rows belong
    /// to which sequence (and so which cache they read and extend). The
    /// projections run once over all rows; only the attention itself is per
    /// sequence.
    fn attention(&self, rt: &Runtime<'_>, layer: usize, xs: &[f32], seqs: &mut [SeqBatch<'_>]) -> Result<Vec<f32>> {
        let s = &self.spec;
        let c = &*self.container;
        let names = &self.layers[layer];
        let n = xs.len() / s.hidden_size;
        let (q_dim, kv_dim) = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
        let project = |name: &str, bias: &Option<String>, rows: usize| -> Result<Vec<f32>> {
            let mut out = vec![0.0f32; n * rows];
            rt.threads.matmul(&c.dense(name)?, xs, n, &mut out);
            if let Some(bias) = bias {
                add_bias(&mut out, c.dense_vec(bias)?);
            }
            Ok(out)
        };
        let mut q = project(&names.q, &names.q_bias, q_dim)?;
        let mut k = project(&names.k, &names.k_bias, kv_dim)?;
        let mut v = project(&names.v, &names.v_bias, kv_dim)?;
        if let (Some(qn), Some(kn)) = (&names.q_norm, &names.k_norm) {
            let width = if s.qk_norm == QkNorm::Full { None } else { Some(s.head_dim) };
            rmsnorm_rows(&mut q, c.dense_vec(qn)?, s.rms_norm_eps, width.unwrap_or(q_dim));
            rmsnorm_rows(&mut k, c.dense_vec(kn)?, s.rms_norm_eps, width.unwrap_or(kv_dim));
        }
        if let Some(clip) = s.clip_qkv {
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *x = x.clamp(-clip, clip);
            }
        }
        let shape = AttnShape {
            n_heads: s.num_heads,
            n_kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            window: s.sliding_window,
        };
        // Positions and the cache first (cheap, and each sequence's own),
        // then every sequence's attention at once across the pool.
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let q = &mut q[row * q_dim..(row + m) * q_dim];
            let k = &mut k[row * kv_dim..(row + m) * kv_dim];
            for i in 0..m {
                self.rope.apply_neox(&mut q[i * q_dim..(i + 1) * q_dim], s.head_dim, start + i);
                self.rope.apply_neox(&mut k[i * kv_dim..(i + 1) * kv_dim], s.head_dim, start + i);
            }
            seq.cache.write(layer, KEYS, k);
            seq.cache.write(layer, VALUES, &v[row * kv_dim..(row + m) * kv_dim]);
            row += m;
        }
        let mut attn = vec![0.0f32; n * q_dim];
        let mut jobs = Vec::with_capacity(seqs.len());
        let (mut q_rest, mut out_rest) = (&q[..], &mut attn[..]);
        for seq in seqs.iter() {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let (q_seq, q_tail) = q_rest.split_at(m * q_dim);
            let (out_seq, out_tail) = out_rest.split_at_mut(m * q_dim);
            (q_rest, out_rest) = (q_tail, out_tail);
            let keys = seq.cache.rows(layer, KEYS, start + m);
            let values = seq.cache.rows(layer, VALUES, start + m);
            jobs.push((q_seq, keys, values, start, out_seq));
        }
        rt.threads.pool().install(|| {
            jobs.into_par_iter()
                .for_each(|(q, keys, values, start, out)| attend(rt.threads, shape, q, keys, values, start, out));
        });
        let mut out = vec![0.0f32; n * s.hidden_size];
        rt.threads.matmul(&c.dense(&names.o)?, &attn, n, &mut out);
        if let Some(bias) = &names.o_bias {
            add_bias(&mut out, c.dense_vec(bias)?);
        }
        Ok(out)
    }

    /// The final hidden states (before the last norm) of every row of every
    /// sequence, extending each sequence's cache.
    fn hidden_states(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<f32>> {
        let s = &self.spec;
        let c = &*self.container;
        let (tokens, positions) = batch_rows(seqs)?;
        let x = embed(c, s, EMBED, &tokens)?;
        let names = |l: usize| (self.layers[l].input_norm.as_str(), self.layers[l].post_attn_norm.as_str());
        decoder_stack(
            c,
            s,
            seqs,
            x,
            names,
            |l, xs, seqs| self.attention(rt, l, xs, seqs),
            |l, xs, out| self.mlp(rt, l, &positions, xs, out),
        )
    }

    fn mlp(&self, rt: &Runtime<'_>, layer: usize, positions: &[usize], xs: &[f32], out: &mut [f32]) -> Result<()> {
        let s = &self.spec;
        let c = &*self.container;
        let n = xs.len() / s.hidden_size;
        match &self.layers[layer].mlp {
            MlpNames::Dense(names) => {
                let [gate, up, down] = [&names[0], &names[1], &names[2]].map(|name| c.dense(name));
                let mut ys = vec![0.0f32; n * s.hidden_size];
                swiglu(rt.threads, &[gate?, up?, down?], xs, &mut ys);
                out.iter_mut().zip(&ys).for_each(|(o, y)| *o += y);
            }
            MlpNames::Moe { router } => {
                let mut logits = vec![0.0f32; n * s.moe.num_experts];
                rt.threads.matmul(&c.dense(router)?, xs, n, &mut logits);
                let renormalize = s.moe.norm_topk_prob || s.family == Family::Mixtral;
                let routes = softmax_top_k(&logits, s.moe.num_experts, s.moe.top_k, renormalize);
                let layout = c.expert_layout(layer)?;
                run_routed_experts(rt, layout, layer, positions, xs, s.hidden_size, &routes, s.moe.top_k, out)?;
            }
        }
        Ok(())
    }
}

impl CausalLm for GqaMoe {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn new_cache(&self, capacity_tokens: usize) -> KvCache {
        KvCache::gqa(self.spec.num_layers, self.spec.kv_dim(), capacity_tokens)
    }

    fn forward(&self, rt: &Runtime<'_>, tokens: &[u32], cache: &mut KvCache, logits: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let x = self.hidden_states(rt, &mut [SeqBatch { tokens, cache }])?;
        let s = &self.spec;
        output_logits(rt, &self.container, s, &x, logits, FINAL_NORM, &self.lm_head)
    }

    fn forward_batch(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> Result<Vec<Vec<f32>>> {
        if seqs.iter().any(|seq| seq.tokens.is_empty()) {
            return Err(Error::Unsupported("a sequence of a batch has no tokens".into()));
        }
        let x = self.hidden_states(rt, seqs)?;
        batch_logits(rt, &self.container, &self.spec, &x, seqs, FINAL_NORM, &self.lm_head)
    }
}
