//! Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2, GLM-5).
//!
//! Every token caches one latent row per layer: the RMS-normalised
//! compressed key/value `c` (`kv_lora_rank`) followed by the rotated key
//! `k_pe` shared by all heads (`qk_rope_head_dim`). Heads see
//! `k_h = [W_uk_h c ; k_pe]` and `v_h = W_uv_h c`, where `W_uk_h`, `W_uv_h`
//! are row blocks of `kv_b_proj`.
//!
//! Two equivalent forms compute attention (`docs/mla.md` §1):
//! * **expanded**: up-project every cached latent to per-head keys and
//!   values, then attend as usual;
//! * **absorbed**: fold `W_uk_h` into the query (`q_lat = W_uk_h^T q_nope`)
//!   and `W_uv_h` into the output (`out = W_uv_h Σ p_t c_t`), attending over
//!   the latents themselves.
//!
//! Decoding one token uses the absorbed form: it reads only the cache and
//! never expands past tokens. A long prefill chunk may expand once instead,
//! when that is cheaper; [`Mla::attend`] picks by counting multiply-adds.

use strata_format::{Container, CoreSpec, MlaAttention, MlaSpec, names};
use strata_kernels::Matrix;
use strata_kernels::ops;

use crate::common::project;
use crate::rope::{Angles, rotate};
use crate::weights::{matrix, vector};
use crate::{Result, Runtime};

/// `q_a_layernorm` and `kv_a_layernorm` are built without an eps in every
/// MLA family, so they use the RMSNorm class default, not `rms_norm_eps`.
pub const LATENT_NORM_EPS: f32 = 1e-6;

/// Largest expansion (keys × heads × (nope + v) f32, 48 MiB) the prefill
/// may build instead of attending over the latents: the engine's cap on
/// one pass's activations (`strata_engine::ACTIVATION_BYTES_MAX`), which
/// live in the memory budget's slack.
const MAX_EXPANDED_FLOATS: usize = 12 << 20;

/// How the query is produced.
#[derive(Debug, Clone)]
enum Query {
    /// One projection `q_proj` (no `q_lora_rank`).
    Direct(String),
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))`.
    Compressed { a: String, a_bias: Option<String>, norm: String, b: String },
}

/// One layer's MLA tensors and dimensions.
#[derive(Debug, Clone)]
pub struct Mla {
    dims: MlaSpec,
    heads: usize,
    scale: f32,
    query: Query,
    kv_a: String,
    kv_a_bias: Option<String>,
    kv_norm: String,
    kv_b: String,
    o: String,
    o_bias: Option<String>,
}

/// A projected batch of queries.
pub struct Queries {
    /// `[n, heads * qk_head_dim]`, each head `[nope | rotated rope]`.
    pub q: Vec<f32>,
    /// The normalised compressed query `[n, q_lora_rank]` (the DSA indexer
    /// reads it), when the query is compressed.
    pub compressed: Option<Vec<f32>>,
}

impl Mla {
    /// The tensors of layer `layer`, shape-checked.
    pub fn load(c: &Container, spec: &CoreSpec, kind: &MlaAttention, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.{suffix}"));
        let bias = |name: &str| kind.bias.then(|| t(&format!("{name}.bias")));
        let (dims, heads) = (kind.dims, kind.num_heads);
        let h = spec.hidden_size;
        let query = match dims.q_lora_rank {
            None => Query::Direct(t("q_proj.weight")),
            Some(_) => Query::Compressed {
                a: t("q_a_proj.weight"),
                a_bias: bias("q_a_proj"),
                norm: t("q_a_layernorm.weight"),
                b: t("q_b_proj.weight"),
            },
        };
        // transformers: qk_head_dim^-0.5, times mscale^2 under YaRN.
        let scale = ((dims.qk_head_dim() as f64).powf(-0.5) * kind.rope.scaling.softmax_scale_factor()) as f32;
        let mla = Self {
            dims,
            heads,
            scale,
            query,
            kv_a: t("kv_a_proj_with_mqa.weight"),
            kv_a_bias: bias("kv_a_proj_with_mqa"),
            kv_norm: t("kv_a_layernorm.weight"),
            kv_b: t("kv_b_proj.weight"),
            o: t("o_proj.weight"),
            o_bias: bias("o_proj"),
        };
        let q_rows = heads * dims.qk_head_dim();
        match &mla.query {
            Query::Direct(q) => {
                matrix(c, q, q_rows, h)?;
            }
            Query::Compressed { a, a_bias, norm, b } => {
                let rank = dims.q_lora_rank.unwrap_or(0);
                matrix(c, a, rank, h)?;
                vector(c, norm, rank)?;
                matrix(c, b, q_rows, rank)?;
                if let Some(a_bias) = a_bias {
                    vector(c, a_bias, rank)?;
                }
            }
        }
        matrix(c, &mla.kv_a, dims.latent_dim(), h)?;
        vector(c, &mla.kv_norm, dims.kv_lora_rank)?;
        matrix(c, &mla.kv_b, heads * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank)?;
        matrix(c, &mla.o, h, heads * dims.v_head_dim)?;
        for (name, len) in [(&mla.kv_a_bias, dims.latent_dim()), (&mla.o_bias, h)] {
            if let Some(name) = name {
                vector(c, name, len)?;
            }
        }
        Ok(mla)
    }

    /// Queries of `xs` (`[n, hidden]`), rope applied at `angles`.
    pub fn queries(&self, rt: &Runtime<'_>, c: &Container, xs: &[f32], angles: &Angles) -> Result<Queries> {
        let (q, compressed) = match &self.query {
            Query::Direct(q) => (project(rt, c, q, None, xs)?, None),
            Query::Compressed { a, a_bias, norm, b } => {
                let mut qa = project(rt, c, a, a_bias.as_deref(), xs)?;
                let norm = c.dense_vec(norm)?;
                rt.ops().rmsnorm_rows(&mut qa, norm, LATENT_NORM_EPS, norm.len());
                (project(rt, c, b, None, &qa)?, Some(qa))
            }
        };
        let mut q = q;
        let (dq, dn) = (self.dims.qk_head_dim(), self.dims.qk_nope_head_dim);
        for (i, row) in q.chunks_exact_mut(self.heads * dq).enumerate() {
            let (cos, sin) = angles.at(i);
            for head in row.chunks_exact_mut(dq) {
                rotate(&mut head[dn..], cos, sin, self.dims.rope_interleave);
            }
        }
        Ok(Queries { q, compressed })
    }

    /// The cache rows of `xs`: `[n, kv_lora_rank + qk_rope_head_dim]`, the
    /// normalised latent then the rotated shared key.
    pub fn latents(&self, rt: &Runtime<'_>, c: &Container, xs: &[f32], angles: &Angles) -> Result<Vec<f32>> {
        let mut rows = project(rt, c, &self.kv_a, self.kv_a_bias.as_deref(), xs)?;
        let norm = c.dense_vec(&self.kv_norm)?;
        let r = self.dims.kv_lora_rank;
        for (i, row) in rows.chunks_exact_mut(self.dims.latent_dim()).enumerate() {
            let (latent, k_pe) = row.split_at_mut(r);
            rt.ops().rmsnorm_rows(latent, norm, LATENT_NORM_EPS, r);
            let (cos, sin) = angles.at(i);
            rotate(k_pe, cos, sin, self.dims.rope_interleave);
        }
        Ok(rows)
    }

    /// Attention of the queries at positions `start..start + n` over the
    /// cached latents of positions `0..start + n`, `[n, heads * v_head_dim]`.
    /// `selection[i]`, when given, lists the positions query `i` may see
    /// (DSA); otherwise every position up to its own.
    pub fn attend(
        &self,
        rt: &Runtime<'_>,
        c: &Container,
        q: &[f32],
        latents: &[f32],
        start: usize,
        selection: Option<&[Vec<usize>]>,
    ) -> Result<Vec<f32>> {
        let d = &self.dims;
        let n = q.len() / (self.heads * d.qk_head_dim());
        let keys = latents.len() / d.latent_dim();
        let kv_b = c.dense(&self.kv_b)?;
        let ctx = Ctx { mla: self, q, latents, start, selection, n };
        // Multiply-adds per head: expanding costs one up-projection per key
        // plus plain attention; absorbing costs two projections per query
        // plus attention over the wider latent. Expanding also holds every
        // key's heads at once, so it is only chosen while that stays small.
        let (r, dn, dv, dq) = (d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim, d.qk_head_dim());
        let expanded_cost = keys * (dn + dv) * r + n * keys * (dq + dv);
        let absorbed_cost = n * (dn + dv) * r + n * keys * (2 * r + d.qk_rope_head_dim);
        let expanded_floats = keys * kv_b.rows;
        let per_head: Vec<Vec<f32>> = if absorbed_cost <= expanded_cost || expanded_floats > MAX_EXPANDED_FLOATS {
            rt.ops().par_map(self.heads, |h| ctx.absorbed_head(&kv_b, h))
        } else {
            let mut latent = vec![0.0f32; keys * r];
            for (dst, row) in latent.chunks_exact_mut(r).zip(latents.chunks_exact(d.latent_dim())) {
                dst.copy_from_slice(&row[..r]);
            }
            let mut kv = vec![0.0f32; keys * kv_b.rows];
            rt.ops().matmul(&kv_b, &latent, keys, &mut kv);
            rt.ops().par_map(self.heads, |h| ctx.expanded_head(&kv, h))
        };
        let mut out = vec![0.0f32; n * self.heads * dv];
        for (h, head) in per_head.iter().enumerate() {
            for (i, o) in head.chunks_exact(dv).enumerate() {
                out[(i * self.heads + h) * dv..][..dv].copy_from_slice(o);
            }
        }
        Ok(out)
    }

    /// Width of one query's attention output, `heads * v_head_dim`.
    pub fn output_width(&self) -> usize {
        self.heads * self.dims.v_head_dim
    }

    /// `o_proj` of the attention output.
    pub fn output(&self, rt: &Runtime<'_>, c: &Container, attn: &[f32]) -> Result<Vec<f32>> {
        project(rt, c, &self.o, self.o_bias.as_deref(), attn)
    }
}

/// The positions one query attends to.
#[derive(Clone, Copy)]
enum Visible<'a> {
    /// Every position up to and including this one.
    UpTo(usize),
    /// Exactly these (DSA's choice).
    Only(&'a [usize]),
}

impl Visible<'_> {
    fn positions(self) -> impl Iterator<Item = usize> + Clone {
        let (up_to, only) = match self {
            Visible::UpTo(last) => (0..last + 1, &[][..]),
            Visible::Only(positions) => (0..0, positions),
        };
        up_to.chain(only.iter().copied())
    }
}

/// What one head's attention reads.
struct Ctx<'a> {
    mla: &'a Mla,
    q: &'a [f32],
    latents: &'a [f32],
    start: usize,
    selection: Option<&'a [Vec<usize>]>,
    n: usize,
}

impl Ctx<'_> {
    /// Positions query `i` attends to.
    fn visible(&self, i: usize) -> Visible<'_> {
        match self.selection {
            Some(selected) => Visible::Only(&selected[i]),
            None => Visible::UpTo(self.start + i),
        }
    }

    /// Head `h`'s query `i`: its no-position and rotated parts.
    fn query(&self, i: usize, h: usize) -> (&[f32], &[f32]) {
        let d = &self.mla.dims;
        let dq = d.qk_head_dim();
        let head = &self.q[(i * self.mla.heads + h) * dq..][..dq];
        head.split_at(d.qk_nope_head_dim)
    }

    /// The latent `c_t` and rotated key `k_pe_t` of cached position `t`.
    fn latent(&self, t: usize) -> (&[f32], &[f32]) {
        let d = &self.mla.dims;
        self.latents[t * d.latent_dim()..][..d.latent_dim()].split_at(d.kv_lora_rank)
    }

    /// Head `h` attending over the cached latents directly, `[n, v_head_dim]`.
    fn absorbed_head(&self, kv_b: &Matrix<'_>, h: usize) -> Vec<f32> {
        let d = &self.mla.dims;
        let (r, dn, dv) = (d.kv_lora_rank, d.qk_nope_head_dim, d.v_head_dim);
        let first_row = h * (dn + dv);
        // W_uk_h: dn rows of r, dequantized once for the batch.
        let mut w_uk = vec![0.0f32; dn * r];
        for (j, row) in w_uk.chunks_exact_mut(r).enumerate() {
            kv_b.row_to_f32(first_row + j, row);
        }
        let w_uv = kv_b.row_range(first_row + dn, dv).expect("kv_b_proj holds every head (checked at load)");
        let mut out = vec![0.0f32; self.n * dv];
        let mut q_lat = vec![0.0f32; r];
        let mut o_lat = vec![0.0f32; r];
        let mut scores = Vec::new();
        for (i, o) in out.chunks_exact_mut(dv).enumerate() {
            let (q_nope, q_pe) = self.query(i, h);
            q_lat.fill(0.0);
            for (&qj, row) in q_nope.iter().zip(w_uk.chunks_exact(r)) {
                ops::axpy(qj, row, &mut q_lat);
            }
            let visible = self.visible(i).positions();
            scores.clear();
            scores.extend(visible.clone().map(|t| {
                let (c_t, k_pe) = self.latent(t);
                (ops::dot(&q_lat, c_t) + ops::dot(q_pe, k_pe)) * self.mla.scale
            }));
            ops::softmax_inplace(&mut scores);
            o_lat.fill(0.0);
            for (t, &p) in visible.zip(&scores) {
                ops::axpy(p, self.latent(t).0, &mut o_lat);
            }
            w_uv.matvec(&o_lat, o);
        }
        out
    }

    /// Head `h` over keys and values expanded from every latent (`kv`,
    /// `[keys, heads * (nope + v)]`), `[n, v_head_dim]`.
    fn expanded_head(&self, kv: &[f32], h: usize) -> Vec<f32> {
        let d = &self.mla.dims;
        let (dn, dv) = (d.qk_nope_head_dim, d.v_head_dim);
        let stride = self.mla.heads * (dn + dv);
        let mut out = vec![0.0f32; self.n * dv];
        let mut scores = Vec::new();
        for (i, o) in out.chunks_exact_mut(dv).enumerate() {
            let (q_nope, q_pe) = self.query(i, h);
            let visible = self.visible(i).positions();
            scores.clear();
            scores.extend(visible.clone().map(|t| {
                let k_nope = &kv[t * stride + h * (dn + dv)..][..dn];
                (ops::dot(q_nope, k_nope) + ops::dot(q_pe, self.latent(t).1)) * self.mla.scale
            }));
            ops::softmax_inplace(&mut scores);
            for (t, &p) in visible.zip(&scores) {
                ops::axpy(p, &kv[t * stride + h * (dn + dv) + dn..][..dv], o);
            }
        }
        out
    }
}
