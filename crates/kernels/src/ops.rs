//! Element-wise and reduction operators of a transformer layer, dispatching
//! to the best instruction set of this CPU.
//!
//! The definitions (and exact orders of operations) are in
//! [`crate::scalar`]. Reductions (`dot`, the sum of squares in `rmsnorm`) use
//! the vector kernels of [`crate::simd`]; the purely element-wise operators
//! are written so the compiler vectorizes them and need no dispatch. Each call
//! detects the instruction set anew; that is a few cached atomic loads, and
//! spares callers from threading an [`Isa`] through attention code.

use crate::scalar;
pub use crate::scalar::NormGate;
use crate::simd::Isa;

/// `out = weight * (x * rsqrt(mean(x^2) + eps))` in f32, the operation order
/// of transformers' `LlamaRMSNorm`.
///
/// # Panics
/// If `weight` or `out` is not as long as `x`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let inv_rms = scalar::inv_rms(Isa::detect().dot_f32(x, x), x.len(), eps);
    scalar::apply_rmsnorm(x, weight, inv_rms, out);
}

/// [`rmsnorm`] writing back into `x`.
///
/// # Panics
/// If `weight` is not as long as `x`.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let inv_rms = scalar::inv_rms(Isa::detect().dot_f32(x, x), x.len(), eps);
    scalar::apply_rmsnorm_inplace(x, weight, inv_rms);
}

/// `x *= rsqrt(mean(x^2) + eps)` in place: an RMSNorm without weight
/// (transformers' `UnweightedRMSNorm`, hyper-connections' input norm).
pub fn rmsnorm_unweighted_inplace(x: &mut [f32], eps: f32) {
    let isa = Isa::detect();
    let inv_rms = scalar::inv_rms(isa.dot_f32(x, x), x.len(), eps);
    isa.scale(inv_rms, x);
}

/// Gated RMSNorm in place: `(weight * (x * rsqrt(mean(x^2) + eps))) *
/// act(gate)` in f32 (see [`scalar::rmsnorm_gated`]; plain `weight`, not
/// `1 + weight`).
///
/// # Panics
/// If `gate` or `weight` is not as long as `x`.
pub fn rmsnorm_gated(x: &mut [f32], gate: &[f32], weight: &[f32], eps: f32, gate_act: NormGate) {
    let inv_rms = scalar::inv_rms(Isa::detect().dot_f32(x, x), x.len(), eps);
    scalar::apply_rmsnorm_gated(x, gate, weight, inv_rms, gate_act);
}

/// `x *= rsqrt(sum(x^2) + eps)` in place (see [`scalar::l2norm`]).
pub fn l2norm(x: &mut [f32], eps: f32) {
    let isa = Isa::detect();
    let inv_norm = scalar::inv_l2norm(isa.dot_f32(x, x), eps);
    isa.scale(inv_norm, x);
}

/// `x /= sqrt(sum(x^2) + eps)` in place (see [`scalar::l2norm_divided`]).
pub fn l2norm_divided(x: &mut [f32], eps: f32) {
    scalar::divide(scalar::l2_norm(Isa::detect().dot_f32(x, x), eps), x);
}

/// `1 / (1 + exp(-x))`, as torch's `sigmoid` on f32 (routers, output and
/// shared-expert gates, the delta rule's write strength).
pub fn sigmoid(x: f32) -> f32 {
    scalar::sigmoid(x)
}

/// Numerically stable softmax in place (see [`scalar::softmax_inplace`]).
pub fn softmax_inplace(x: &mut [f32]) {
    scalar::softmax_inplace(x);
}

/// Softmax with an attention sink's logit in the denominator only (see
/// [`scalar::softmax_with_sink_inplace`]).
pub fn softmax_with_sink_inplace(x: &mut [f32], sink: f32) {
    scalar::softmax_with_sink_inplace(x, sink);
}

/// Each sigmoid of `x` over their sum, in log space (see
/// [`scalar::softmax_of_log_sigmoids_inplace`]).
pub fn softmax_of_log_sigmoids_inplace(x: &mut [f32]) {
    scalar::softmax_of_log_sigmoids_inplace(x);
}

/// `gate[i] = silu(gate[i]) * up[i]`, `silu(g) = g / (1 + exp(-g))`.
///
/// # Panics
/// If the lengths differ.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    scalar::silu_mul(gate, up);
}

/// [`silu_mul`] with the gate at most `limit` and the up within `±limit`
/// (see [`scalar::silu_mul_limited`]); scalar only.
///
/// # Panics
/// If the lengths differ, or `limit` is negative or NaN.
pub fn silu_mul_limited(gate: &mut [f32], up: &[f32], limit: f32) {
    scalar::silu_mul_limited(gate, up, limit);
}

/// Kimi K3's SiTU-GLU (see [`scalar::situ_mul`]), in place in `gate`;
/// scalar only, like [`silu_mul`].
///
/// # Panics
/// If the lengths differ, or a beta is not a positive number.
pub fn situ_mul(gate: &mut [f32], up: &[f32], beta: f32, linear_beta: f32) {
    scalar::situ_mul(gate, up, beta, linear_beta);
}

/// gpt-oss's clamped SwiGLU over interleaved gate/up columns (see
/// [`scalar::clamped_swiglu_interleaved`]); scalar only, like [`silu_mul`].
///
/// # Panics
/// If `gate_up.len() != 2 * out.len()`, or `limit` is negative or NaN.
pub fn clamped_swiglu_interleaved(gate_up: &[f32], alpha: f32, limit: f32, out: &mut [f32]) {
    scalar::clamped_swiglu_interleaved(gate_up, alpha, limit, out);
}

/// gpt-oss's clamped SwiGLU over gate and up held apart (see
/// [`scalar::clamped_swiglu`]), in place in `gate`; scalar only.
///
/// # Panics
/// If the lengths differ, or `limit` is negative or NaN.
pub fn clamped_swiglu(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    scalar::clamped_swiglu(gate, up, alpha, limit);
}

/// Rotary embedding, HF `rotate_half` convention (see [`scalar::rope_neox`]).
///
/// # Panics
/// If `x.len() != 2 * cos.len()` or `sin.len() != cos.len()`.
pub fn rope_neox(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    scalar::rope_neox(x, cos, sin);
}

/// Rotary embedding on interleaved pairs `(x[2i], x[2i+1])`.
///
/// # Panics
/// As [`rope_neox`].
pub fn rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    scalar::rope_interleaved(x, cos, sin);
}

/// `sum a[i] * b[i]`.
///
/// # Panics
/// If the lengths differ.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    Isa::detect().dot_f32(a, b)
}

/// `y[i] += alpha * x[i]`.
///
/// # Panics
/// If the lengths differ.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    Isa::detect().axpy(alpha, x, y);
}

/// `x[i] *= alpha`.
pub fn scale(alpha: f32, x: &mut [f32]) {
    Isa::detect().scale(alpha, x);
}
