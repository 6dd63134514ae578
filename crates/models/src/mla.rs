//! Multi-head Latent Attention (DeepSeek-V2/V3, Kimi K2, GLM-5).
//!
//! Every token caches one latent row per layer: the RMS-normalised
//! compressed key/value `c` (`kv_lora_rank`) followed by the rotated key
//! `k_pe` shared by all heads (`qk_rope_head_dim`; unrotated in a layer
//! without RoPE, Kimi-Linear's, where it may also be empty). Heads see
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
//! when that is cheaper; the backend picks by counting multiply-adds.

use strata_format::{CoreSpec, MlaAttention, MlaSpec, names};

use crate::backend::Runtime;
use crate::backend::{Backend, LatentJob, LatentShape, Rotary, VectorHandle};
use crate::common::Linear;
use crate::error::Result;
use crate::rope::Angles;

/// How the query is produced.
#[derive(Debug, Clone)]
enum Query {
    /// One projection `q_proj` (no `q_lora_rank`).
    Direct(Linear),
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))`.
    Compressed { a: Linear, norm: VectorHandle, b: Linear },
}

/// One layer's MLA tensors and dimensions.
#[derive(Debug, Clone)]
pub struct Mla {
    shape: LatentShape,
    query: Query,
    kv_a: Linear,
    kv_norm: VectorHandle,
    /// Epsilon of `q_a_layernorm` and `kv_a_layernorm`.
    latent_norm_eps: f32,
    o: Linear,
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
    pub fn load(b: &mut Backend, spec: &CoreSpec, kind: &MlaAttention, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.{suffix}"));
        let bias = |name: &str| kind.bias.then(|| t(&format!("{name}.bias")));
        let (dims, heads) = (kind.dims, kind.num_heads);
        let h = spec.hidden_size;
        let q_rows = heads * dims.qk_head_dim();
        let query = match dims.q_lora_rank {
            None => Query::Direct(Linear::load(b, &t("q_proj.weight"), None, q_rows, h)?),
            Some(rank) => Query::Compressed {
                a: Linear::load(b, &t("q_a_proj.weight"), bias("q_a_proj").as_deref(), rank, h)?,
                norm: b.vector(&t("q_a_layernorm.weight"), rank)?,
                b: Linear::load(b, &t("q_b_proj.weight"), None, q_rows, rank)?,
            },
        };
        let kv_a = Linear::load(
            b,
            &t("kv_a_proj_with_mqa.weight"),
            bias("kv_a_proj_with_mqa").as_deref(),
            dims.latent_dim(),
            h,
        )?;
        let kv_norm = b.vector(&t("kv_a_layernorm.weight"), dims.kv_lora_rank)?;
        let kv_b =
            b.matrix(&t("kv_b_proj.weight"), heads * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank)?;
        let o = Linear::load(b, &t("o_proj.weight"), bias("o_proj").as_deref(), h, heads * dims.v_head_dim)?;
        // transformers: qk_head_dim^-0.5, times mscale^2 under YaRN.
        let softmax_factor = kind.rope.map_or(1.0, |rope| rope.scaling.softmax_scale_factor());
        let scale = ((dims.qk_head_dim() as f64).powf(-0.5) * softmax_factor) as f32;
        let latent_norm_eps = kind.latent_norm_eps;
        Ok(Self { shape: LatentShape { heads, dims, scale, kv_b }, query, kv_a, kv_norm, latent_norm_eps, o })
    }

    fn dims(&self) -> &MlaSpec {
        &self.shape.dims
    }

    /// Queries of `xs` (`[n, hidden]`), rope applied at `angles` (none
    /// without RoPE).
    pub fn queries(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], angles: Option<&Angles>) -> Queries {
        let (mut q, compressed) = match &self.query {
            Query::Direct(q) => (q.apply(rt, b, xs), None),
            Query::Compressed { a, norm, b: q_b } => {
                let mut qa = a.apply(rt, b, xs);
                b.rmsnorm_rows(*norm, self.latent_norm_eps, &mut qa);
                (q_b.apply(rt, b, &qa), Some(qa))
            }
        };
        let d = self.dims();
        if let Some(angles) = angles {
            let rotary =
                Rotary { head_width: d.qk_head_dim(), offset: d.qk_nope_head_dim, interleaved: d.rope_interleave };
            b.rotate(&mut q, angles, rotary);
        }
        Queries { q, compressed }
    }

    /// The cache rows of `xs`: `[n, kv_lora_rank + qk_rope_head_dim]`, the
    /// normalised latent then the shared key, rotated at `angles` (not
    /// without RoPE).
    pub fn latents(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], angles: Option<&Angles>) -> Vec<f32> {
        let mut rows = self.kv_a.apply(rt, b, xs);
        let d = self.dims();
        let r = d.kv_lora_rank;
        for row in rows.chunks_exact_mut(d.latent_dim()) {
            b.rmsnorm_rows(self.kv_norm, self.latent_norm_eps, &mut row[..r]);
        }
        if let Some(angles) = angles {
            let rotary = Rotary { head_width: d.latent_dim(), offset: r, interleaved: d.rope_interleave };
            b.rotate(&mut rows, angles, rotary);
        }
        rows
    }

    /// Attention of the queries at positions `start..start + n` over the
    /// cached latents of positions `0..start + n`, `[n, heads * v_head_dim]`.
    /// `selection[i]`, when given, lists the positions query `i` may see
    /// (DSA); otherwise every position up to its own.
    pub fn attend(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        q: &[f32],
        latents: &[f32],
        start: usize,
        selection: Option<&[Vec<usize>]>,
    ) -> Vec<f32> {
        b.attend_latent(rt, &self.shape, LatentJob { q, latents, start, selection })
    }

    /// Width of one query's attention output, `heads * v_head_dim`.
    pub fn output_width(&self) -> usize {
        self.shape.heads * self.dims().v_head_dim
    }

    /// `o_proj` of the attention output.
    pub fn output(&self, rt: &Runtime<'_>, b: &Backend, attn: &[f32]) -> Vec<f32> {
        self.o.apply(rt, b, attn)
    }
}
