//! The delta-rule block: Gated DeltaNet (the linear-attention layers of
//! Qwen3-Next and Qwen3.5/3.6) and Kimi Delta Attention (Kimi-Linear's,
//! the same block with a decay per key channel, low-rank forget and output
//! gates and a sigmoid-gated norm): input projections, a causal depthwise convolution + SiLU
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

use crate::backend::NormGate;
use strata_format::{CoreSpec, GateActivation, GateRank, GdnDims, GdnProjections, GdnSpec, names};
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
    /// The activation of the output norm's gate.
    gate_act: NormGate,
    /// How a Kimi layer projects its output gate (low rank, or K3's full).
    gate_rank: GateRank,
    hidden: usize,
    /// The input projections, in the order of [`GdnDims::projections`]:
    /// `in_proj_qkvz`, `in_proj_ba` (grouped), `in_proj_qkv`, `in_proj_z`,
    /// `in_proj_b`, `in_proj_a` (split), or `q_proj`, `k_proj`, `v_proj`,
    /// `b_proj`, `f_a_proj`, `f_b_proj`, `g_a_proj`, `g_b_proj` (Kimi; K3's
    /// one `g_proj` in place of the last two).
    inputs: Vec<Linear>,
    /// The delta rule and its convolution, dt bias and decay.
    rule: DeltaKind,
    norm: VectorHandle,
    out: Linear,
}

/// A pass's rows after the input projections, in the split layout: `qkv`
/// `[n, conv_dim]` (all q heads, all k heads, all v heads), `z` `[n,
/// value_dim]`, `b` `[n, num_v_heads]` and `a` `[n, a_width]` (see
/// [`a_width`]).
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
        let t = |suffix: &str| names::linear_attn_tensor(spec, d.projections, layer, suffix);
        let shapes: Vec<(&str, usize, usize)> = match d.projections {
            GdnProjections::Grouped => {
                vec![("in_proj_qkvz", 2 * d.key_dim() + 2 * d.value_dim(), h), ("in_proj_ba", 2 * d.num_v_heads, h)]
            }
            GdnProjections::Split => vec![
                ("in_proj_qkv", d.conv_dim(), h),
                ("in_proj_z", d.value_dim(), h),
                ("in_proj_b", d.num_v_heads, h),
                ("in_proj_a", d.num_v_heads, h),
            ],
            GdnProjections::Kimi => vec![
                ("q_proj", d.key_dim(), h),
                ("k_proj", d.key_dim(), h),
                ("v_proj", d.value_dim(), h),
                ("b_proj", d.num_v_heads, h),
                ("f_a_proj", d.head_k_dim, h),
                ("f_b_proj", d.key_dim(), d.head_k_dim),
            ],
        };
        let gate: &[(&str, usize, usize)] = match (d.projections, gdn.output_gate_rank) {
            (GdnProjections::Kimi, GateRank::Low) => {
                &[("g_a_proj", d.head_v_dim, h), ("g_b_proj", d.value_dim(), d.head_v_dim)]
            }
            (GdnProjections::Kimi, GateRank::Full) => &[("g_proj", d.value_dim(), h)],
            // GDN's gate `z` is one of its input projections.
            _ => &[],
        };
        let shapes = shapes.iter().chain(gate);
        let mut inputs = Vec::new();
        for &(name, rows, cols) in shapes {
            inputs.push(Linear::load(b, &t(&format!("{name}.weight")), None, rows, cols)?);
        }
        let (rule, norm, out) = if d.projections == GdnProjections::Kimi {
            assert_eq!(d.num_k_heads, d.num_v_heads, "KDA shares no key heads");
            // The hub keeps one convolution per input; the step runs one
            // over q | k | v, so they are joined here, once.
            let mut conv = Vec::with_capacity(d.conv_dim() * d.conv_kernel);
            for (name, channels) in names::KIMI_CONVS.into_iter().zip([d.key_dim(), d.key_dim(), d.value_dim()]) {
                let part = b.vector(&t(&format!("{name}.weight")), channels * d.conv_kernel)?;
                conv.extend_from_slice(b.vector_values(part));
            }
            let rule = DeltaKind::KimiDelta {
                dims: d,
                conv: b.upload_vector(conv),
                dt_bias: b.vector(&t("dt_bias"), d.key_dim())?,
                a_log: kimi_a_log(b, &t("A_log"), gdn)?,
                gate_lower_bound: gdn.gate_lower_bound,
            };
            (rule, b.vector(&t("o_norm.weight"), d.head_v_dim)?, t("o_proj.weight"))
        } else {
            let rule = DeltaKind::GatedDeltaNet {
                dims: d,
                conv: b.vector(&t("conv1d.weight"), d.conv_dim() * d.conv_kernel)?,
                dt_bias: b.vector(&t("dt_bias"), d.num_v_heads)?,
                a_log: b.vector(&t("A_log"), d.num_v_heads)?,
            };
            (rule, b.vector(&t("norm.weight"), d.head_v_dim)?, t("out_proj.weight"))
        };
        let out = Linear::load(b, &out, None, h, d.value_dim())?;
        let gate_act = match gdn.output_gate {
            GateActivation::Silu => NormGate::Silu,
            GateActivation::Sigmoid => NormGate::Sigmoid,
        };
        Ok(Self {
            dims: d,
            eps: gdn.eps,
            gate_act,
            gate_rank: gdn.output_gate_rank,
            hidden: h,
            inputs,
            rule,
            norm,
            out,
        })
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
        let a_width = a_width(d);
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let rows = row..row + seq.tokens.len();
            row = rows.end;
            let job = DeltaJob {
                qkv: &mut inputs.qkv[rows.start * d.conv_dim()..rows.end * d.conv_dim()],
                b: &inputs.b[rows.start * d.num_v_heads..],
                a: &inputs.a[rows.start * a_width..],
                state: seq.cache.stage_state(layer, STATE),
                out: &mut core[rows.start * d.value_dim()..rows.end * d.value_dim()],
            };
            b.delta_step(rt, &self.rule, job);
        }
        // The gated norm per head: weight · x̂ · act(z).
        b.rmsnorm_gated(self.norm, self.eps, &mut core, &inputs.z, self.gate_act);
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
            GdnProjections::Kimi => {
                let [q, k, v] = [0, 1, 2].map(|i| run(&self.inputs[i]));
                let (key_dim, value_dim) = (self.dims.key_dim(), self.dims.value_dim());
                let qkv = q
                    .chunks_exact(key_dim)
                    .zip(k.chunks_exact(key_dim))
                    .zip(v.chunks_exact(value_dim))
                    .flat_map(|((q, k), v)| [q, k, v].concat())
                    .collect();
                // The low-rank gates: f_b(f_a(x)) and g_b(g_a(x)); K3's
                // output gate is one full-rank g_proj.
                let low_rank = |first: usize| self.inputs[first + 1].apply(rt, b, &run(&self.inputs[first]));
                let z = match self.gate_rank {
                    GateRank::Low => low_rank(6),
                    GateRank::Full => run(&self.inputs[6]),
                };
                Inputs { qkv, b: run(&self.inputs[3]), a: low_rank(4), z }
            }
        }
    }
}

/// KDA's per-head `A_log`: the first `num_v_heads` values of K3's padded
/// tensor (docs/kimi_k3.md, inferred point 3), else the whole tensor.
fn kimi_a_log(b: &mut Backend, name: &str, gdn: &GdnSpec) -> Result<VectorHandle> {
    let heads = gdn.dims.num_v_heads;
    let Some(padded) = gdn.a_log_padded_to else { return b.vector(name, heads) };
    let stored = b.vector(name, padded)?;
    let first = b.vector_values(stored)[..heads].to_vec();
    Ok(b.upload_vector(first))
}

/// Values of `a` per row: GDN's one per value head, or KDA's forget-gate
/// projection, one per key channel.
fn a_width(d: &GdnDims) -> usize {
    match d.projections {
        GdnProjections::Grouped | GdnProjections::Split => d.num_v_heads,
        GdnProjections::Kimi => d.key_dim(),
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
