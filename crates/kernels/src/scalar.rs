//! Scalar reference implementations: the definition every faster path is
//! tested against, and the path used on CPUs (or architectures) without one.
//!
//! # Summation order
//!
//! Dot products are not summed left to right: a strictly sequential `f32`
//! sum cannot be vectorized by the compiler (float addition is not
//! associative), which would make this fallback needlessly slow on
//! non-x86 targets. Instead a *sequence* is summed in [`LANES`] interleaved
//! partial sums: element `i` of the sequence is added (`acc += a * b`, a
//! separate multiply and add, no FMA) to lane `i % LANES`, and the lanes are
//! then combined pairwise: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
//!
//! * f32 / bf16 rows: the sequence is the whole row (bf16 widened exactly).
//! * q8 / q4 rows: the sequence is one group, with terms `q as f32 * x`.
//!   Each group sum is multiplied by its scale and accumulated sequentially,
//!   group 0 first: `total += group_sum * scale[g]`. MXFP4 rows the same,
//!   a group being a block of 32 E2M1 values and its scale `2^(e - 127)`.
//!
//! The SIMD paths in [`crate::simd`] keep the per-group structure but may
//! reorder the additions (and use FMA), so they agree with this reference to
//! rounding error, not bit for bit.

pub mod gdn;

use crate::mxfp4;
use crate::quant::{Q4_OFFSET, bf16_to_f32};

/// Number of interleaved partial sums in the reference dot product.
pub const LANES: usize = 8;

/// Elements decoded to `f32` at a time before being summed; a multiple of
/// [`LANES`] so that block boundaries do not change lane assignment.
const DECODE_BLOCK: usize = 8 * LANES;

/// `LANES` partial sums of a sequence, filled in order from lane 0.
#[derive(Clone, Copy)]
struct Lanes([f32; LANES]);

impl Lanes {
    fn new() -> Self {
        Self([0.0; LANES])
    }

    /// Adds `a[i] * b[i]` to lane `i % LANES`. Calls continue the same
    /// sequence only if every earlier call had a multiple of `LANES` terms.
    #[inline(always)]
    fn add_products(&mut self, a: &[f32], b: &[f32]) {
        debug_assert_eq!(a.len(), b.len());
        let mut a_chunks = a.chunks_exact(LANES);
        let mut b_chunks = b.chunks_exact(LANES);
        for (ca, cb) in (&mut a_chunks).zip(&mut b_chunks) {
            for l in 0..LANES {
                self.0[l] += ca[l] * cb[l];
            }
        }
        for (l, (&va, &vb)) in a_chunks.remainder().iter().zip(b_chunks.remainder()).enumerate() {
            self.0[l] += va * vb;
        }
    }

    fn total(self) -> f32 {
        let l = self.0;
        ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
    }
}

/// Sums a sequence of `x.len()` products whose left factors are produced
/// block by block by `decode(start, out)` (writing `out.len()` values for
/// positions `start..start + out.len()`).
#[inline(always)]
fn decoded_dot(x: &[f32], mut decode: impl FnMut(usize, &mut [f32])) -> f32 {
    let mut lanes = Lanes::new();
    let mut buf = [0.0f32; DECODE_BLOCK];
    for (block, x_block) in x.chunks(DECODE_BLOCK).enumerate() {
        let w = &mut buf[..x_block.len()];
        decode(block * DECODE_BLOCK, w);
        lanes.add_products(w, x_block);
    }
    lanes.total()
}

/// `sum a[i] * b[i]` in the reference order.
///
/// # Panics
/// If the lengths differ.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: operand lengths differ");
    let mut lanes = Lanes::new();
    lanes.add_products(a, b);
    lanes.total()
}

/// Dot product of a bf16 row (`u16` bits) with an `f32` vector.
///
/// # Panics
/// If the lengths differ.
pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot_bf16: operand lengths differ");
    decoded_dot(x, |start, out| {
        for (o, &bits) in out.iter_mut().zip(&w[start..]) {
            *o = bf16_to_f32(bits);
        }
    })
}

/// Dot product of one q8 row (`x.len()` columns, `scales` for its groups)
/// with `x`.
///
/// # Panics
/// If `qs.len() != x.len()`, `group == 0` or
/// `scales.len() != ceil(x.len() / group)`.
pub fn dot_q8(qs: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    check_q8_row(qs, scales, group, x);
    let mut total = 0.0f32;
    for ((q_group, x_group), &scale) in qs.chunks(group).zip(x.chunks(group)).zip(scales) {
        let group_sum = decoded_dot(x_group, |start, out| {
            for (o, &q) in out.iter_mut().zip(&q_group[start..]) {
                *o = f32::from(q);
            }
        });
        total += group_sum * scale;
    }
    total
}

/// Dot product of one packed q4 row (`ceil(x.len() / 2)` bytes) with `x`.
///
/// # Panics
/// If `qs.len() != ceil(x.len() / 2)`, `group == 0` or
/// `scales.len() != ceil(x.len() / group)`.
pub fn dot_q4(qs: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    check_q4_row(qs, scales, group, x);
    let mut total = 0.0f32;
    for (g, (x_group, &scale)) in x.chunks(group).zip(scales).enumerate() {
        let group_col = g * group;
        let group_sum = decoded_dot(x_group, |start, out| {
            decode_q4(qs, group_col + start, out);
        });
        total += group_sum * scale;
    }
    total
}

/// Dot product of one MXFP4 row (`x.len()` columns, whole blocks: see
/// [`crate::mxfp4`]) with `x`: each block's codes in the reference order,
/// times the block's E8M0 scale, summed block 0 first as q4's groups are.
///
/// # Panics
/// If the row is not whole blocks or `codes`/`scales` do not match it.
pub fn dot_mxfp4(codes: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    mxfp4::check_row(codes, scales, x);
    let mut total = 0.0f32;
    for ((block_codes, x_block), &scale) in
        codes.chunks(mxfp4::BLOCK_BYTES).zip(x.chunks(mxfp4::BLOCK_VALUES)).zip(scales)
    {
        let block_sum = decoded_dot(x_block, |start, out| {
            for (pair, &byte) in out.chunks_mut(2).zip(&block_codes[start / 2..]) {
                pair[0] = mxfp4::e2m1_to_f32(byte & 0x0F);
                pair[1] = mxfp4::e2m1_to_f32(byte >> 4);
            }
        });
        total += block_sum * mxfp4::e8m0_to_f32(scale);
    }
    total
}

/// Writes the q4 values of columns `col0..col0 + out.len()` of a packed row
/// into `out` as `f32` (not yet scaled).
pub(crate) fn decode_q4(row_qs: &[u8], col0: usize, out: &mut [f32]) {
    let offset = Q4_OFFSET as f32;
    if col0.is_multiple_of(2) {
        // Byte-aligned start: one byte feeds two outputs.
        for (pair, &byte) in out.chunks_mut(2).zip(&row_qs[col0 / 2..]) {
            pair[0] = f32::from(byte & 0x0F) - offset;
            if let Some(hi) = pair.get_mut(1) {
                *hi = f32::from(byte >> 4) - offset;
            }
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = crate::quant::q4_at(row_qs, col0 + i) as f32;
        }
    }
}

/// Asserts the length invariants of one q8 row; the SIMD paths rely on them
/// for memory safety.
pub(crate) fn check_q8_row(qs: &[i8], scales: &[f32], group: usize, x: &[f32]) {
    assert!(group > 0, "q8 group must be at least 1 column");
    assert_eq!(qs.len(), x.len(), "q8 row: weight and x lengths differ");
    assert_eq!(scales.len(), x.len().div_ceil(group), "q8 row: wrong scale count");
}

/// Asserts the length invariants of one packed q4 row; the SIMD paths rely
/// on them for memory safety.
pub(crate) fn check_q4_row(qs: &[u8], scales: &[f32], group: usize, x: &[f32]) {
    assert!(group > 0, "q4 group must be at least 1 column");
    assert_eq!(qs.len(), x.len().div_ceil(2), "q4 row: packed bytes do not match x length");
    assert_eq!(scales.len(), x.len().div_ceil(group), "q4 row: wrong scale count");
}

/// `y[i] += alpha * x[i]` (separate multiply and add).
///
/// # Panics
/// If the lengths differ.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: operand lengths differ");
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `x[i] *= alpha`.
pub fn scale(alpha: f32, x: &mut [f32]) {
    for v in x {
        *v *= alpha;
    }
}

/// RMSNorm in the order of transformers' `LlamaRMSNorm`:
/// `weight * (x * rsqrt(mean(x^2) + eps))`, all in f32.
///
/// # Panics
/// If `weight` or `out` is not as long as `x`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let inv_rms = inv_rms(dot_f32(x, x), x.len(), eps);
    apply_rmsnorm(x, weight, inv_rms, out);
}

/// [`rmsnorm`] writing back into `x`.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let inv_rms = inv_rms(dot_f32(x, x), x.len(), eps);
    apply_rmsnorm_inplace(x, weight, inv_rms);
}

/// `1 / sqrt(sum_sq / n + eps)`; torch's CPU `rsqrt` is the same `1 / sqrt`.
pub(crate) fn inv_rms(sum_sq: f32, n: usize, eps: f32) -> f32 {
    let mean_sq = sum_sq / n as f32;
    1.0 / (mean_sq + eps).sqrt()
}

pub(crate) fn apply_rmsnorm(x: &[f32], weight: &[f32], inv_rms: f32, out: &mut [f32]) {
    assert_eq!(weight.len(), x.len(), "rmsnorm: weight length differs");
    assert_eq!(out.len(), x.len(), "rmsnorm: output length differs");
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(weight) {
        *o = wi * (xi * inv_rms);
    }
}

pub(crate) fn apply_rmsnorm_inplace(x: &mut [f32], weight: &[f32], inv_rms: f32) {
    assert_eq!(weight.len(), x.len(), "rmsnorm: weight length differs");
    for (xi, &wi) in x.iter_mut().zip(weight) {
        *xi = wi * (*xi * inv_rms);
    }
}

/// The activation on the gate of [`rmsnorm_gated`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormGate {
    /// `silu(gate)`: Gated DeltaNet (`Qwen3NextRMSNormGated`).
    Silu,
    /// `sigmoid(gate)`: Kimi Delta Attention (`KimiLinearRMSNormGated`).
    Sigmoid,
}

impl NormGate {
    fn apply(self, gate: f32) -> f32 {
        match self {
            NormGate::Silu => silu(gate),
            NormGate::Sigmoid => sigmoid(gate),
        }
    }
}

/// Gated RMSNorm in place, the order of transformers' `Qwen3NextRMSNormGated`
/// (and `Qwen3_5MoeRMSNormGated`, `KimiLinearRMSNormGated`): `(weight * (x *
/// rsqrt(mean(x^2) + eps))) * act(gate)`, all in f32, `act` as `gate_act`
/// says. The weight multiplies as is (initialised to ones), not as the
/// `(1 + w)` of the zero-centred decoder norms.
///
/// # Panics
/// If `gate` or `weight` is not as long as `x`.
pub fn rmsnorm_gated(x: &mut [f32], gate: &[f32], weight: &[f32], eps: f32, gate_act: NormGate) {
    let inv_rms = inv_rms(dot_f32(x, x), x.len(), eps);
    apply_rmsnorm_gated(x, gate, weight, inv_rms, gate_act);
}

pub(crate) fn apply_rmsnorm_gated(x: &mut [f32], gate: &[f32], weight: &[f32], inv_rms: f32, gate_act: NormGate) {
    assert_eq!(gate.len(), x.len(), "rmsnorm_gated: gate length differs");
    assert_eq!(weight.len(), x.len(), "rmsnorm_gated: weight length differs");
    for ((xi, &gi), &wi) in x.iter_mut().zip(gate).zip(weight) {
        *xi = (wi * (*xi * inv_rms)) * gate_act.apply(gi);
    }
}

/// L2 normalisation in place, transformers' `l2norm` (qwen3_next, qwen3_5_moe):
/// `x * rsqrt(sum(x^2) + eps)`. The epsilon is added to the sum of squares,
/// not to the norm (FLA's convention; `F.normalize` would differ).
pub fn l2norm(x: &mut [f32], eps: f32) {
    let inv_norm = inv_l2norm(dot_f32(x, x), eps);
    scale(inv_norm, x);
}

/// L2 normalisation in place, transformers' kimi_linear `l2norm`:
/// `x / sqrt(sum(x^2) + eps)`, a division per element (FLA's Triton
/// rounding), where [`l2norm`] multiplies by the reciprocal.
pub fn l2norm_divided(x: &mut [f32], eps: f32) {
    divide(l2_norm(dot_f32(x, x), eps), x);
}

/// `x[i] /= divisor`.
pub(crate) fn divide(divisor: f32, x: &mut [f32]) {
    for v in x {
        *v /= divisor;
    }
}

/// `sqrt(sum_sq + eps)`.
pub(crate) fn l2_norm(sum_sq: f32, eps: f32) -> f32 {
    (sum_sq + eps).sqrt()
}

/// `1 / sqrt(sum_sq + eps)`.
pub(crate) fn inv_l2norm(sum_sq: f32, eps: f32) -> f32 {
    1.0 / (sum_sq + eps).sqrt()
}

/// Numerically stable softmax: subtract the max, exponentiate, divide by the
/// sum (accumulated left to right). Like torch, a row that is entirely
/// `-inf` yields NaN.
pub fn softmax_inplace(x: &mut [f32]) {
    // A sink of -inf changes no bit: it is never the max, and its term is
    // `exp(-inf) = +0` (or NaN where the row's own sum is already NaN).
    softmax_with_sink_inplace(x, f32::NEG_INFINITY);
}

/// [`softmax_inplace`] over `x` and one more logit, `sink`, whose
/// probability is dropped: transformers' attention sinks (`cat` the sink
/// column, softmax, drop it). The sink joins the max and is added to the sum
/// last, as the last column.
pub fn softmax_with_sink_inplace(x: &mut [f32], sink: f32) {
    let max = x.iter().fold(sink, |m, &v| m.max(v));
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum += (sink - max).exp();
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Softmax over the log-sigmoids of `x`, in place, in torch's order:
/// `l = logsigmoid(x) = min(x, 0) - log1p(exp(-|x|))`, then
/// `exp(l - logsumexp(l))`, `logsumexp(l) = max + ln(sum exp(l - max))`
/// (summed left to right). That is each sigmoid over the sum of them all,
/// taken in log space, so logits whose sigmoids underflow keep their
/// ratios (Inkling's router weighs its chosen and shared experts so).
pub fn softmax_of_log_sigmoids_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = v.min(0.0) - (-v.abs()).exp().ln_1p();
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum: f32 = x.iter().map(|&v| (v - max).exp()).sum();
    let log_sum = max + sum.ln();
    for v in x.iter_mut() {
        *v = (*v - log_sum).exp();
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` with `silu(g) = g / (1 + exp(-g))`.
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: operand lengths differ");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `silu(x) = x / (1 + exp(-x))`.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`, as torch's `sigmoid` on f32.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The clamped SwiGLU of experts with a fused gate/up projection whose
/// columns interleave (gate in the even ones, up in the odd ones, as
/// gpt-oss's `gate_up_proj`): for each pair,
/// `gate = min(gate, limit)`, `up = clamp(up, -limit, limit)`,
/// `out = (up + 1) * (gate * sigmoid(gate * alpha))`, in that order, in f32.
/// A NaN stays NaN, as through torch's `clamp`.
///
/// # Panics
/// If `gate_up` does not hold two values per output, or `limit` is negative
/// or NaN.
pub fn clamped_swiglu_interleaved(gate_up: &[f32], alpha: f32, limit: f32, out: &mut [f32]) {
    assert_eq!(Some(gate_up.len()), out.len().checked_mul(2), "clamped swiglu: two inputs (gate, up) per output");
    assert!(limit >= 0.0, "clamped swiglu: limit {limit} must be a non-negative number");
    for (pair, o) in gate_up.chunks_exact(2).zip(out.iter_mut()) {
        let (gate, up) = clamp_gate_up(pair[0], pair[1], limit);
        *o = (up + 1.0) * (gate * sigmoid(gate * alpha));
    }
}

/// [`clamped_swiglu_interleaved`] over gate and up held apart (the fused
/// projection's even and odd columns, split at import):
/// `gate[i] = (clamp(up[i]) + 1) * (g * sigmoid(g * alpha))`,
/// `g = min(gate[i], limit)`, the same operations in the same order.
///
/// # Panics
/// If the lengths differ, or `limit` is negative or NaN.
pub fn clamped_swiglu(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    assert_eq!(gate.len(), up.len(), "clamped swiglu: operand lengths differ");
    assert!(limit >= 0.0, "clamped swiglu: limit {limit} must be a non-negative number");
    for (g, &u) in gate.iter_mut().zip(up) {
        let (gate, up) = clamp_gate_up(*g, u, limit);
        *g = (up + 1.0) * (gate * sigmoid(gate * alpha));
    }
}

/// The SwiGLU with a limit of GLM-5.3-Flash and DeepSeek V4 (`swiglu_limit`):
/// `gate[i] = silu(min(gate[i], limit)) * clamp(up[i], -limit, limit)`, the
/// clamps as [`clamped_swiglu`]'s, then [`silu_mul`]'s operations in its
/// order.
///
/// # Panics
/// If the lengths differ, or `limit` is negative or NaN.
pub fn silu_mul_limited(gate: &mut [f32], up: &[f32], limit: f32) {
    assert_eq!(gate.len(), up.len(), "silu_mul_limited: operand lengths differ");
    assert!(limit >= 0.0, "silu_mul_limited: limit {limit} must be a non-negative number");
    for (g, &u) in gate.iter_mut().zip(up) {
        let (gate, up) = clamp_gate_up(*g, u, limit);
        *g = silu(gate) * up;
    }
}

/// Kimi K3's SiTU-GLU: `gate[i] = b1·tanh(g/b1)·σ(g) · b2·tanh(u/b2)` with
/// `b1 = beta`, `b2 = linear_beta` (a SiLU whose gate saturates at ±b1,
/// times the up softly clamped to ±b2; docs/kimi_k3.md), in the order of
/// operations of the reference (`xtask/fixtures/kimi_k3_ref.py`,
/// `situ_glu`).
///
/// # Panics
/// If the lengths differ, or a beta is not a positive number.
pub fn situ_mul(gate: &mut [f32], up: &[f32], beta: f32, linear_beta: f32) {
    assert_eq!(gate.len(), up.len(), "situ_mul: operand lengths differ");
    assert!(beta > 0.0 && linear_beta > 0.0, "situ_mul: betas {beta}, {linear_beta} must be positive numbers");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = beta * (*g / beta).tanh() * sigmoid(*g) * (linear_beta * (u / linear_beta).tanh());
    }
}

/// `(min(gate, limit), clamp(up, -limit, limit))`, as torch's
/// `gate.clamp(max=limit)` and `up.clamp(-limit, limit)`: a NaN stays NaN.
/// `limit` is checked non-negative by the callers (`f32::clamp` panics on
/// bounds out of order).
#[inline]
fn clamp_gate_up(gate: f32, up: f32, limit: f32) -> (f32, f32) {
    // A comparison, not `f32::min`, which would turn a NaN gate into `limit`.
    let gate = if gate > limit { limit } else { gate };
    (gate, up.clamp(-limit, limit))
}

/// Rotary embedding, HF `rotate_half` convention: element `i` pairs with
/// `i + d/2`. `x` holds the `d` rotated dimensions; `cos`/`sin` hold `d/2`
/// angles' values.
///
/// # Panics
/// If `x.len() != 2 * cos.len()` or `sin.len() != cos.len()`.
pub fn rope_neox(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    check_rope(x, cos, sin);
    let (x1s, x2s) = x.split_at_mut(cos.len());
    for (((x1, x2), &c), &s) in x1s.iter_mut().zip(x2s).zip(cos).zip(sin) {
        let (a, b) = (*x1, *x2);
        *x1 = a * c - b * s;
        *x2 = b * c + a * s;
    }
}

/// Rotary embedding, GPT-J / Meta convention: pairs `(x[2i], x[2i+1])` are
/// rotated by angle `i`.
///
/// # Panics
/// As [`rope_neox`].
pub fn rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    check_rope(x, cos, sin);
    for ((pair, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = b * c + a * s;
    }
}

fn check_rope(x: &[f32], cos: &[f32], sin: &[f32]) {
    assert_eq!(sin.len(), cos.len(), "rope: cos and sin lengths differ");
    assert_eq!(x.len(), 2 * cos.len(), "rope: x must hold two values per angle");
}
