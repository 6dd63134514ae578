//! The grouped-query attention block (OLMoE, Qwen3-MoE, Mixtral): q/k/v
//! projections with optional biases, q/k norms over the whole projection or
//! per head, `clip_qkv`, RoPE, causal (optionally sliding-window) attention
//! over the cached keys and values, and o_proj. Every refinement is data in
//! the layer's [`GqaSpec`], none a family branch.

use strata_format::{Container, GqaSpec, ModelSpec, QkNorm, names};
use strata_kv::{KEYS, VALUES};

use super::grouped::AttnShape;
use crate::backend::AttendJob;
use crate::common::project;
use crate::rope::{Angles, rotate};
use crate::weights::{matrix, vector};
use crate::{Result, Runtime, SeqBatch};

/// One layer's GQA tensors and shape.
pub struct Gqa {
    dims: GqaSpec,
    hidden: usize,
    /// Epsilon of the q/k norms (the model's `rms_norm_eps`).
    eps: f32,
    q: Projection,
    k: Projection,
    v: Projection,
    o: Projection,
    /// q and k norm weights, when the layer normalises them.
    qk_norm: Option<(String, String)>,
}

/// A weight and its optional bias.
struct Projection {
    weight: String,
    bias: Option<String>,
}

impl Gqa {
    /// Layer `layer`'s tensors, shape-checked.
    pub fn load(c: &Container, spec: &ModelSpec, dims: GqaSpec, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.{suffix}"));
        let proj = |name: &str| Projection {
            weight: t(&format!("{name}.weight")),
            bias: dims.bias.then(|| t(&format!("{name}.bias"))),
        };
        let qk_norm = (dims.qk_norm != QkNorm::None).then(|| (t("q_norm.weight"), t("k_norm.weight")));
        let gqa = Self {
            dims,
            hidden: spec.hidden_size,
            eps: spec.rms_norm_eps,
            q: proj("q_proj"),
            k: proj("k_proj"),
            v: proj("v_proj"),
            o: proj("o_proj"),
            qk_norm,
        };
        let (h, q_dim, kv_dim) = (gqa.hidden, dims.q_dim(), dims.kv_dim());
        for (p, rows, cols) in [(&gqa.q, q_dim, h), (&gqa.k, kv_dim, h), (&gqa.v, kv_dim, h), (&gqa.o, h, q_dim)] {
            matrix(c, &p.weight, rows, cols)?;
            if let Some(bias) = &p.bias {
                vector(c, bias, rows)?;
            }
        }
        if let Some((qn, kn)) = &gqa.qk_norm {
            let (q_len, k_len) = match dims.qk_norm {
                QkNorm::Full => (q_dim, kv_dim),
                QkNorm::PerHead | QkNorm::None => (dims.head_dim, dims.head_dim),
            };
            vector(c, qn, q_len)?;
            vector(c, kn, k_len)?;
        }
        Ok(gqa)
    }

    /// Keys and values, each `kv_dim` wide.
    pub fn cache_row_dims(&self) -> Vec<usize> {
        vec![self.dims.kv_dim(), self.dims.kv_dim()]
    }

    /// RoPE rotates whole heads.
    pub fn rotary_dim(&self) -> usize {
        self.dims.head_dim
    }

    /// See [`super::Attention::forward`]; `angles` are the rows' rope angles.
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        c: &Container,
        layer: usize,
        xs: &[f32],
        angles: &Angles,
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<Vec<f32>> {
        let d = &self.dims;
        let n = xs.len() / self.hidden;
        let (q_dim, kv_dim) = (d.q_dim(), d.kv_dim());
        let run = |p: &Projection| project(rt, c, &p.weight, p.bias.as_deref(), xs);
        let (mut q, mut k, mut v) = (run(&self.q)?, run(&self.k)?, run(&self.v)?);
        if let Some((qn, kn)) = &self.qk_norm {
            let per_head = d.qk_norm == QkNorm::PerHead;
            rt.ops().rmsnorm_rows(&mut q, c.dense_vec(qn)?, self.eps, if per_head { d.head_dim } else { q_dim });
            rt.ops().rmsnorm_rows(&mut k, c.dense_vec(kn)?, self.eps, if per_head { d.head_dim } else { kv_dim });
        }
        if let Some(clip) = d.clip_qkv {
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *x = x.clamp(-clip, clip);
            }
        }
        let rotated = angles.dim();
        for (i, (q_row, k_row)) in q.chunks_exact_mut(q_dim).zip(k.chunks_exact_mut(kv_dim)).enumerate() {
            let (cos, sin) = angles.at(i);
            for head in q_row.chunks_exact_mut(d.head_dim).chain(k_row.chunks_exact_mut(d.head_dim)) {
                rotate(&mut head[..rotated], cos, sin, false);
            }
        }
        let shape = AttnShape {
            n_heads: d.num_heads,
            n_kv_heads: d.num_kv_heads,
            head_dim: d.head_dim,
            window: d.sliding_window,
        };
        // The cache first (cheap, and each sequence's own), then every
        // sequence's attention at once across the pool.
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let rows = row..row + seq.tokens.len();
            seq.cache.write(layer, KEYS, &k[rows.start * kv_dim..rows.end * kv_dim]);
            seq.cache.write(layer, VALUES, &v[rows.start * kv_dim..rows.end * kv_dim]);
            row = rows.end;
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
            jobs.push(AttendJob { q: q_seq, keys, values, start, out: out_seq });
        }
        rt.ops().attend(shape, jobs);
        project(rt, c, &self.o.weight, self.o.bias.as_deref(), &attn)
    }
}
