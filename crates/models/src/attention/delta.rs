//! The Gated DeltaNet block (the linear-attention layers of Qwen3-Next and
//! Qwen3.5/3.6): input projections, a causal depthwise convolution + SiLU
//! over q, k and v, l2-normalised q and k, the gated delta rule per value
//! head over a fixed-size state, a gated RMSNorm per head, and `out_proj`.
//! Its state lives in the sequence's cache (`KvCache::stage_state`):
//! per value head the `[d_k, d_v]` delta-rule state, then per channel the
//! convolution's last `kernel - 1` inputs. The math is in docs/gdn.md.
//!
//! Prefill runs the per-token recurrence, as decode does, never the
//! chunked form: on a CPU it is the faster of the two (docs/gdn.md), and
//! it makes every token's output the same bits however a prompt is split
//! into passes, so chunked prefill, prefix reuse and a reopened session
//! give exactly the logits of one pass.

use strata_format::{Container, CoreSpec, GdnDims, GdnProjections, GdnSpec, names};
use strata_kernels::gdn::{self, DeltaTokens};
use strata_kernels::ops;
use strata_kv::StatePart;

use crate::common::project;
use crate::weights::{matrix, vector};
use crate::{Result, Runtime, SeqBatch};

/// The cache part of the state.
const STATE: usize = 0;

/// One layer's Gated DeltaNet tensors and shape.
pub struct DeltaNet {
    dims: GdnDims,
    eps: f32,
    hidden: usize,
    /// The input projections, in the order of [`GdnDims::projections`]:
    /// `in_proj_qkvz`, `in_proj_ba` (grouped) or `in_proj_qkv`, `in_proj_z`,
    /// `in_proj_b`, `in_proj_a` (split).
    inputs: Vec<String>,
    conv: String,
    dt_bias: String,
    a_log: String,
    norm: String,
    out: String,
}

/// A pass's rows after the input projections, in the split layout: `qkv`
/// `[n, conv_dim]` (all q heads, all k heads, all v heads), `z` `[n,
/// value_dim]`, `b` and `a` `[n, num_v_heads]`.
struct Inputs {
    qkv: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
}

impl DeltaNet {
    /// Layer `layer`'s tensors, shape-checked.
    pub fn load(c: &Container, spec: &CoreSpec, gdn: &GdnSpec, layer: usize) -> Result<Self> {
        let d = gdn.dims;
        let h = spec.hidden_size;
        let t = |suffix: &str| names::linear_attn_tensor(spec, layer, suffix);
        let shapes: Vec<(&str, usize)> = match d.projections {
            GdnProjections::Grouped => {
                vec![("in_proj_qkvz", 2 * d.key_dim() + 2 * d.value_dim()), ("in_proj_ba", 2 * d.num_v_heads)]
            }
            GdnProjections::Split => vec![
                ("in_proj_qkv", d.conv_dim()),
                ("in_proj_z", d.value_dim()),
                ("in_proj_b", d.num_v_heads),
                ("in_proj_a", d.num_v_heads),
            ],
        };
        let mut inputs = Vec::with_capacity(shapes.len());
        for (name, rows) in shapes {
            let weight = t(&format!("{name}.weight"));
            matrix(c, &weight, rows, h)?;
            inputs.push(weight);
        }
        let block = Self {
            dims: d,
            eps: gdn.eps,
            hidden: h,
            inputs,
            conv: t("conv1d.weight"),
            dt_bias: t("dt_bias"),
            a_log: t("A_log"),
            norm: t("norm.weight"),
            out: t("out_proj.weight"),
        };
        vector(c, &block.conv, d.conv_dim() * d.conv_kernel)?;
        vector(c, &block.dt_bias, d.num_v_heads)?;
        vector(c, &block.a_log, d.num_v_heads)?;
        vector(c, &block.norm, d.head_v_dim)?;
        matrix(c, &block.out, h, d.value_dim())?;
        Ok(block)
    }

    /// What a sequence keeps in this layer: the delta-rule and convolution
    /// state ([`STATE`]).
    pub fn cache_parts(&self) -> Vec<StatePart> {
        vec![StatePart::Fixed { floats: self.dims.state_floats() }]
    }

    /// See [`super::Attention::forward`]: each sequence's rows run through
    /// its own state, staged in its cache until the pass commits.
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        c: &Container,
        layer: usize,
        xs: &[f32],
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<Vec<f32>> {
        let d = &self.dims;
        let n = xs.len() / self.hidden;
        let mut inputs = self.project_inputs(rt, c, xs)?;
        let (conv_w, dt_bias, a_log) =
            (c.dense_vec(&self.conv)?, c.dense_vec(&self.dt_bias)?, c.dense_vec(&self.a_log)?);
        let mut core = vec![0.0f32; n * d.value_dim()];
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let rows = row..row + seq.tokens.len();
            row = rows.end;
            let state = seq.cache.stage_state(layer, STATE);
            let (recurrent, conv_state) = state.split_at_mut(d.num_v_heads * d.head_k_dim * d.head_v_dim);
            let qkv = &mut inputs.qkv[rows.start * d.conv_dim()..rows.end * d.conv_dim()];
            gdn::causal_conv1d_silu(qkv, d.conv_dim(), conv_w, conv_state);
            let gates = (&inputs.b[rows.start * d.num_v_heads..], &inputs.a[rows.start * d.num_v_heads..]);
            let out = &mut core[rows.start * d.value_dim()..rows.end * d.value_dim()];
            self.delta_rule(rt, qkv, gates, (dt_bias, a_log), recurrent, out);
        }
        // The gated norm per head: weight · x̂ · silu(z).
        let norm = c.dense_vec(&self.norm)?;
        for (head, z) in core.chunks_exact_mut(d.head_v_dim).zip(inputs.z.chunks_exact(d.head_v_dim)) {
            ops::rmsnorm_gated(head, z, norm, self.eps);
        }
        project(rt, c, &self.out, None, &core)
    }

    /// The input projections of every row, rearranged into the split
    /// layout when the checkpoint groups them per key head.
    fn project_inputs(&self, rt: &Runtime<'_>, c: &Container, xs: &[f32]) -> Result<Inputs> {
        let run = |name: &String| project(rt, c, name, None, xs);
        match self.dims.projections {
            GdnProjections::Split => Ok(Inputs {
                qkv: run(&self.inputs[0])?,
                z: run(&self.inputs[1])?,
                b: run(&self.inputs[2])?,
                a: run(&self.inputs[3])?,
            }),
            GdnProjections::Grouped => Ok(ungroup(&self.dims, &run(&self.inputs[0])?, &run(&self.inputs[1])?)),
        }
    }

    /// One sequence's tokens through the delta rule, every value head side
    /// by side across the pool: `qkv` `[m, conv_dim]` after the
    /// convolution, `(b, a)` from the sequence's first row on, `recurrent`
    /// the heads' states, `out` `[m, value_dim]`.
    fn delta_rule(
        &self,
        rt: &Runtime<'_>,
        qkv: &[f32],
        (b, a): (&[f32], &[f32]),
        (dt_bias, a_log): (&[f32], &[f32]),
        recurrent: &mut [f32],
        out: &mut [f32],
    ) {
        let d = &self.dims;
        let (d_k, d_v, n_v) = (d.head_k_dim, d.head_v_dim, d.num_v_heads);
        let m = qkv.len() / d.conv_dim();
        let per_key_head = n_v / d.num_k_heads;
        let scale = gdn::query_scale(d_k);
        // q and k per key head, l2-normalised (q also scaled) once for the
        // value heads that share them: `[k_head][token, d_k]`.
        let normed = |offset: usize, scale: Option<f32>| -> Vec<Vec<f32>> {
            (0..d.num_k_heads)
                .map(|head| {
                    let mut rows = Vec::with_capacity(m * d_k);
                    for token in qkv.chunks_exact(d.conv_dim()) {
                        let start = rows.len();
                        rows.extend_from_slice(&token[offset + head * d_k..offset + (head + 1) * d_k]);
                        ops::l2norm(&mut rows[start..], gdn::L2NORM_EPS);
                        if let Some(s) = scale {
                            rows[start..].iter_mut().for_each(|x| *x *= s);
                        }
                    }
                    rows
                })
                .collect()
        };
        let (qs, ks) = (normed(0, Some(scale)), normed(d.key_dim(), None));
        let heads = rt.ops().delta_heads(recurrent, d_k * d_v, |head, state| {
            let k_head = head / per_key_head;
            let v_offset = 2 * d.key_dim() + head * d_v;
            let v: Vec<f32> =
                qkv.chunks_exact(d.conv_dim()).flat_map(|token| &token[v_offset..v_offset + d_v]).copied().collect();
            let g: Vec<f32> = (0..m).map(|t| gdn::log_decay(a[t * n_v + head], dt_bias[head], a_log[head])).collect();
            let beta: Vec<f32> = (0..m).map(|t| gdn::write_strength(b[t * n_v + head])).collect();
            let tokens = DeltaTokens { q: &qs[k_head], k: &ks[k_head], v: &v, g: &g, beta: &beta };
            let mut head_out = vec![0.0f32; m * d_v];
            gdn::delta_rule_recurrent(strata_kernels::simd::Isa::detect(), state, d_v, &tokens, &mut head_out);
            head_out
        });
        for (head, head_out) in heads.iter().enumerate() {
            for (row, o) in out.chunks_exact_mut(d.value_dim()).zip(head_out.chunks_exact(d_v)) {
                row[head * d_v..(head + 1) * d_v].copy_from_slice(o);
            }
        }
    }
}

/// Qwen3-Next's per-key-head groups (`fix_query_key_value_ordering`) into
/// the split layout: per key head, `qkvz` holds `[q d_k | k d_k | v r·d_v |
/// z r·d_v]` and `ba` holds `[b r | a r]`, `r = num_v_heads / num_k_heads`.
fn ungroup(d: &GdnDims, qkvz: &[f32], ba: &[f32]) -> Inputs {
    let (d_k, n_k, r) = (d.head_k_dim, d.num_k_heads, d.num_v_heads / d.num_k_heads);
    let rv = r * d.head_v_dim;
    let n = ba.len() / (2 * d.num_v_heads);
    let mut out = Inputs {
        qkv: vec![0.0; n * d.conv_dim()],
        z: vec![0.0; n * d.value_dim()],
        b: vec![0.0; n * d.num_v_heads],
        a: vec![0.0; n * d.num_v_heads],
    };
    let group = 2 * d_k + 2 * rv;
    for t in 0..n {
        let src = &qkvz[t * n_k * group..(t + 1) * n_k * group];
        let qkv = &mut out.qkv[t * d.conv_dim()..(t + 1) * d.conv_dim()];
        let z = &mut out.z[t * d.value_dim()..(t + 1) * d.value_dim()];
        for (head, g) in src.chunks_exact(group).enumerate() {
            qkv[head * d_k..(head + 1) * d_k].copy_from_slice(&g[..d_k]);
            qkv[d.key_dim() + head * d_k..d.key_dim() + (head + 1) * d_k].copy_from_slice(&g[d_k..2 * d_k]);
            let v_at = 2 * d.key_dim() + head * rv;
            qkv[v_at..v_at + rv].copy_from_slice(&g[2 * d_k..2 * d_k + rv]);
            z[head * rv..(head + 1) * rv].copy_from_slice(&g[2 * d_k + rv..]);
        }
        let src = &ba[t * 2 * d.num_v_heads..(t + 1) * 2 * d.num_v_heads];
        for (head, g) in src.chunks_exact(2 * r).enumerate() {
            out.b[t * d.num_v_heads + head * r..t * d.num_v_heads + (head + 1) * r].copy_from_slice(&g[..r]);
            out.a[t * d.num_v_heads + head * r..t * d.num_v_heads + (head + 1) * r].copy_from_slice(&g[r..]);
        }
    }
    out
}
