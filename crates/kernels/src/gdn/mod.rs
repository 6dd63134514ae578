//! Delta rule kernels: Gated DeltaNet (the linear-attention layers of
//! Qwen3-Next `qwen3_next` and Qwen3.5/3.6 `qwen3_5_moe`) and Kimi Delta
//! Attention (`kimi_linear`, and `glm5_next` with a bounded gate), which
//! differ only in the decay: one factor per value head and token in GDN,
//! one per key channel in KDA ([`LogDecay`]).
//! The delta rule for one value head, as a per-token recurrence (decode and
//! prefill) and, GDN only, in the chunked form, and the causal depthwise
//! conv1d + SiLU with its short state (and, without SiLU but plus its
//! input, Inkling's short convolutions). The math, shapes and the
//! transformers code they follow are in `docs/gdn.md`; the scalar
//! definitions in [`crate::scalar::gdn`].
//!
//! The l2norm of q and k and the gated RMSNorm of the output are in
//! [`crate::ops`] ([`crate::ops::l2norm`], [`crate::ops::rmsnorm_gated`]).
//!
//! # Shapes (one value head)
//! * state `S`: `[d_k, d_v]` f32, row-major (row `i` for key component `i`),
//!   the layout of transformers' `recurrent_states[b, h]`;
//! * `q`, `k`: `d_k` values per token, `v` and the output: `d_v`; `g` (log
//!   decay, `S *= exp(g)`) and `beta`: one scalar per token.
//!
//! `q` is expected l2-normalised *and* multiplied by [`query_scale`], `k`
//! l2-normalised: transformers does both inside its kernels
//! (`use_qk_l2norm_in_kernel=True`; then its chunked form multiplies q by
//! `d_k ** -0.5` and its recurrent form divides by `d_k ** 0.5`, one rounding
//! apart), here the caller does them once per key head, before the
//! `num_v_heads / num_k_heads` value heads that share it, and the same way
//! for prefill and decode.

mod chunk;
pub(crate) mod token;

use crate::scalar;
use crate::simd::{Isa, RowScale};

pub use chunk::{CHUNK_TOKENS, delta_rule_chunked};
pub use token::{DeltaToken, DeltaTokens, LogDecay, LogDecays};

/// Epsilon of transformers' `l2norm` on q and k (added to the sum of squares).
pub const L2NORM_EPS: f32 = 1e-6;

/// The factor on the l2-normalised query: `1 / sqrt(d_k)`, computed as
/// transformers' chunked form does (`d_k ** -0.5` in f64, rounded to f32 by
/// the `query * scaling` of an f32 tensor).
pub fn query_scale(d_k: usize) -> f32 {
    (d_k as f64).powf(-0.5) as f32
}

/// The log decay of one value head for one token, as the models derive it:
/// `g = -exp(a_log) * softplus(a + dt_bias)`, in f32, with torch's
/// `softplus` (`x` itself above 20, `log1p(exp(x))` below).
pub fn log_decay(a: f32, dt_bias: f32, a_log: f32) -> f32 {
    let x = a + dt_bias;
    let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
    -a_log.exp() * softplus
}

/// The log decay of one key channel for one token in Kimi Delta Attention
/// (`KimiLinearForgetGate`): `g = -exp(a_log) * softplus(f + dt_bias)`
/// with `f` the channel's low-rank forget-gate projection, in f32. Its
/// softplus is written out as `log(1 + exp(x))` (`x` itself above 20),
/// which rounds differently from torch's `softplus` (`log1p`) of
/// [`log_decay`].
pub fn channel_log_decay(f: f32, dt_bias: f32, a_log: f32) -> f32 {
    let x = f + dt_bias;
    let softplus = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
    -a_log.exp() * softplus
}

/// The log decay of one key channel for one token in GLM-5.3-Flash's Kimi
/// Delta Attention (`Glm5NextTextForgetGate` with `linear_lower_bound`):
/// `g = lower_bound · sigmoid(exp(a_log) · (f + dt_bias))`, in f32. For a
/// negative bound `g` lies in `(lower_bound, 0)`: no channel keeps less
/// than `exp(lower_bound)` of its state a token, whatever its gate says.
pub fn bounded_channel_log_decay(f: f32, dt_bias: f32, a_log: f32, lower_bound: f32) -> f32 {
    lower_bound * crate::ops::sigmoid(a_log.exp() * (f + dt_bias))
}

/// The write strength of one value head for one token: `sigmoid(b)`.
pub fn write_strength(b: f32) -> f32 {
    crate::ops::sigmoid(b)
}

/// Bytes of one value head's f32 state: a decode step reads all of them and
/// writes all of them back (`d_k * d_v * 4` each way), the traffic that
/// bounds decode once the states of all heads and layers outgrow the caches.
pub const fn state_bytes(d_k: usize, d_v: usize) -> usize {
    d_k * d_v * size_of::<f32>()
}

/// Columns of the state per rank-1 pass of [`delta_rule_step`] (their
/// delta lives on the stack): the models' `d_v = 128` in one pass, so tiers
/// that update row by row make one call per row, not one per block.
const DELTA_BLOCK_COLS: usize = 256;

/// Rows of the state per decay pass of [`delta_rule_step`] with per-channel
/// decay (their factors live on the stack): the models' `d_k = 128` in one.
const DECAY_BLOCK_ROWS: usize = 256;

/// One decode step of the delta rule for one value head, on `isa`: the
/// operations and order of [`scalar::gdn::delta_rule_step`] in two passes
/// over the `[d_k, d_v]` state with [`Isa::update_rows`] (decay and
/// `k^T S`; rank-1 update and `q^T S`), so the state is read and written
/// once from memory and once more from L2. Writes `q^T S` to `out`.
///
/// # Panics
/// If the lengths do not fit `d_k = k.len()`, `d_v = v.len()` (both > 0).
pub fn delta_rule_step(isa: Isa, state: &mut [f32], token: &DeltaToken<'_>, out: &mut [f32]) {
    let (d_k, d_v) = token.check(state, out);
    out.fill(0.0);
    match token.g {
        LogDecay::Head(g) => isa.update_rows(RowScale::Uniform(g.exp()), None, state, d_v, token.k, out),
        LogDecay::Channel(g) => {
            // Row blocks accumulate k^T S into `out` in row order, as one
            // call over every row would.
            let mut decay = [0.0f32; DECAY_BLOCK_ROWS];
            for r0 in (0..d_k).step_by(DECAY_BLOCK_ROWS) {
                let rows = DECAY_BLOCK_ROWS.min(d_k - r0);
                let decay = &mut decay[..rows];
                for (d, &gi) in decay.iter_mut().zip(&g[r0..r0 + rows]) {
                    *d = gi.exp();
                }
                let block = &mut state[r0 * d_v..(r0 + rows) * d_v];
                isa.update_rows(RowScale::PerRow(decay), None, block, d_v, &token.k[r0..r0 + rows], out);
            }
        }
    }
    // `out` holds kv_mem = k^T S; it becomes delta, then the output.
    for (o, &vj) in out.iter_mut().zip(token.v) {
        *o = (vj - *o) * token.beta;
    }
    // Column blocks are independent in the second pass, so each block's
    // delta moves to the stack and its part of `out` takes the output.
    let mut delta = [0.0f32; DELTA_BLOCK_COLS];
    for c0 in (0..d_v).step_by(DELTA_BLOCK_COLS) {
        let cols = DELTA_BLOCK_COLS.min(d_v - c0);
        let (delta, out) = (&mut delta[..cols], &mut out[c0..c0 + cols]);
        delta.copy_from_slice(out);
        out.fill(0.0);
        isa.update_rows(RowScale::Uniform(1.0), Some((token.k, &*delta)), &mut state[c0..], d_v, token.q, out);
    }
}

/// [`delta_rule_step`] for every token of `tokens` in turn (a prefill by
/// recurrence), from `state` (`[d_k, d_v]`, updated to the state after the
/// last token); `out` is `[tokens, d_v]`.
///
/// # Panics
/// If the lengths do not fit the state's `d_k` and `d_v`.
pub fn delta_rule_recurrent(isa: Isa, state: &mut [f32], d_v: usize, tokens: &DeltaTokens<'_>, out: &mut [f32]) {
    let (d_k, d_v) = tokens.check(state, d_v, out);
    for (t, out_t) in out.chunks_exact_mut(d_v).enumerate() {
        delta_rule_step(isa, state, &tokens.token(t, d_k, d_v), out_t);
    }
}

/// The causal depthwise conv1d + SiLU of one token, in place over its `C`
/// channels; `weight` is `[C, K]`, `state` `[C, K - 1]` (the last `K - 1`
/// inputs per channel, oldest first; transformers keeps `K` and never reads
/// the oldest). See [`scalar::gdn::causal_conv1d_silu_step`].
///
/// # Panics
/// If `weight.len()` is not a positive multiple `K` of `x.len()` or
/// `state.len() != x.len() * (K - 1)`.
pub fn causal_conv1d_silu_step(x: &mut [f32], weight: &[f32], state: &mut [f32]) {
    scalar::gdn::causal_conv1d_silu_step(x, weight, state);
}

/// The causal depthwise conv1d + SiLU over `x` = `[tokens, channels]`
/// token-major, in place, continuing from `state` and leaving in it the last
/// `K - 1` inputs. Equal bit for bit to [`causal_conv1d_silu_step`] token by
/// token (it is that loop: K multiply-adds and one `exp` per channel and
/// token are negligible next to the projections around them). A prefill
/// from scratch starts from a zero state, as transformers' left padding.
///
/// # Panics
/// If `channels` is 0 or does not divide `x.len()`, or as
/// [`causal_conv1d_silu_step`].
pub fn causal_conv1d_silu(x: &mut [f32], channels: usize, weight: &[f32], state: &mut [f32]) {
    for token in tokens_of(x, channels) {
        scalar::gdn::causal_conv1d_silu_step(token, weight, state);
    }
}

/// The causal depthwise conv1d plus its input, no activation (a short
/// convolution with its residual: Inkling's on k, v and the blocks'
/// outputs), over `x` = `[tokens, channels]` in place, its state as in
/// [`causal_conv1d_silu`] ([`scalar::gdn::causal_conv1d_residual_step`]
/// per token). Token by token or in one call, the same bits: chunked
/// prefill and decode agree.
///
/// # Panics
/// As [`causal_conv1d_silu`].
pub fn causal_conv1d_residual(x: &mut [f32], channels: usize, weight: &[f32], state: &mut [f32]) {
    for token in tokens_of(x, channels) {
        scalar::gdn::causal_conv1d_residual_step(token, weight, state);
    }
}

/// `x` as its `channels`-wide tokens.
fn tokens_of(x: &mut [f32], channels: usize) -> std::slice::ChunksExactMut<'_, f32> {
    assert!(channels > 0 && x.len().is_multiple_of(channels), "conv1d: x is not [tokens, {channels}]");
    x.chunks_exact_mut(channels)
}
