//! The Gated DeltaNet block (the linear-attention layers of Qwen3-Next and
//! Qwen3.5/3.6): input projections, a causal depthwise convolution + SiLU
//! over q, k and v, l2-normalised q and k, the gated delta rule per value
//! head over a fixed-size state, a gated RMSNorm per head, and `out_proj`.
//! Its state lives in the sequence's cache (`SequenceState::stage_state`):
//! per value head the `[d_k, d_v]` delta-rule state, then per channel the
//! convolution's last `kernel - 1` inputs. The math is in docs/gdn.md.
//!
//! Prefill runs the per-token recurrence, as decode does, never the
//! chunked form: on a CPU it is the faster of the two (docs/gdn.md), and
//! it makes every token's output the same bits however a prompt is split
//! into passes, so chunked prefill, prefix reuse and a reopened session
//! give exactly the logits of one pass.

use strata_format::{CoreSpec, GdnDims, GdnProjections, GdnSpec, names};
use strata_kv::StatePart;

use crate::backend::Runtime;
use crate::backend::{Backend, DeltaJob, DeltaKind, VectorHandle};
use crate::common::Linear;
use crate::error::Result;
use crate::lm::SeqBatch;

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
    inputs: Vec<Linear>,
    /// The delta rule and its convolution, dt bias and decay.
    rule: DeltaKind,
    norm: VectorHandle,
    out: Linear,
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
    pub fn load(b: &mut Backend, spec: &CoreSpec, gdn: &GdnSpec, layer: usize) -> Result<Self> {
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
            inputs.push(Linear::load(b, &t(&format!("{name}.weight")), None, rows, h)?);
        }
        let rule = DeltaKind::GatedDeltaNet {
            dims: d,
            conv: b.vector(&t("conv1d.weight"), d.conv_dim() * d.conv_kernel)?,
            dt_bias: b.vector(&t("dt_bias"), d.num_v_heads)?,
            a_log: b.vector(&t("A_log"), d.num_v_heads)?,
        };
        let norm = b.vector(&t("norm.weight"), d.head_v_dim)?;
        let out = Linear::load(b, &t("out_proj.weight"), None, h, d.value_dim())?;
        Ok(Self { dims: d, eps: gdn.eps, hidden: h, inputs, rule, norm, out })
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
        b: &Backend,
        layer: usize,
        xs: &[f32],
        seqs: &mut [SeqBatch<'_>],
    ) -> Vec<f32> {
        let d = &self.dims;
        let n = xs.len() / self.hidden;
        let mut inputs = self.project_inputs(rt, b, xs);
        let mut core = vec![0.0f32; n * d.value_dim()];
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let rows = row..row + seq.tokens.len();
            row = rows.end;
            let job = DeltaJob {
                qkv: &mut inputs.qkv[rows.start * d.conv_dim()..rows.end * d.conv_dim()],
                b: &inputs.b[rows.start * d.num_v_heads..],
                a: &inputs.a[rows.start * d.num_v_heads..],
                state: seq.cache.stage_state(layer, STATE),
                out: &mut core[rows.start * d.value_dim()..rows.end * d.value_dim()],
            };
            b.delta_step(rt, &self.rule, job);
        }
        // The gated norm per head: weight · x̂ · silu(z).
        b.rmsnorm_gated(self.norm, self.eps, &mut core, &inputs.z);
        self.out.apply(rt, b, &core)
    }

    /// The input projections of every row, rearranged into the split
    /// layout when the checkpoint groups them per key head.
    fn project_inputs(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32]) -> Inputs {
        let run = |input: &Linear| input.apply(rt, b, xs);
        match self.dims.projections {
            GdnProjections::Split => Inputs {
                qkv: run(&self.inputs[0]),
                z: run(&self.inputs[1]),
                b: run(&self.inputs[2]),
                a: run(&self.inputs[3]),
            },
            GdnProjections::Grouped => ungroup(&self.dims, &run(&self.inputs[0]), &run(&self.inputs[1])),
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
