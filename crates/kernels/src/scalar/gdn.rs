//! Scalar references of the delta rule kernels of [`crate::gdn`].
//!
//! The order of operations is that of transformers'
//! `torch_recurrent_gated_delta_rule` and `torch_causal_conv1d_update`
//! (qwen3_next; kimi_linear's `recurrent_kimi_delta_attention` is the same
//! with the decay per key channel), with sums over the key dimension taken in index order and
//! separate multiplies and adds (no FMA).

use crate::gdn::token::{DeltaToken, LogDecay};

/// One step of the delta rule for one value head; `state` is
/// `[d_k, d_v]` row-major (row `i` belongs to key component `i`):
///
/// ```text
/// S      = S * exp(g)                (row i by exp(g_i) with LogDecay::Channel)
/// kv_mem = k^T S                     (d_v)
/// delta  = (v - kv_mem) * beta
/// S      = S + k delta^T             (rank-1 update)
/// out    = q^T S                     (d_v)
/// ```
///
/// `q` must already be l2-normalised and multiplied by
/// [`crate::gdn::query_scale`]; `k` l2-normalised.
///
/// # Panics
/// If the lengths do not fit `d_k = k.len()`, `d_v = v.len()` (both > 0).
pub fn delta_rule_step(state: &mut [f32], token: &DeltaToken<'_>, out: &mut [f32]) {
    let (d_k, d_v) = token.check(state, out);
    match token.g {
        LogDecay::Head(g) => {
            let decay = g.exp();
            for s in state.iter_mut() {
                *s *= decay;
            }
        }
        LogDecay::Channel(g) => {
            for (row, &gi) in state.chunks_exact_mut(d_v).zip(g) {
                let decay = gi.exp();
                for s in row {
                    *s *= decay;
                }
            }
        }
    }
    // kv_mem, accumulated in `out` row by row (key index order).
    out.fill(0.0);
    for (row, &ki) in state.chunks_exact(d_v).zip(token.k) {
        for (o, &s) in out.iter_mut().zip(row) {
            *o += s * ki;
        }
    }
    // delta replaces kv_mem in `out`.
    for (o, &vj) in out.iter_mut().zip(token.v) {
        *o = (vj - *o) * token.beta;
    }
    for (row, &ki) in state.chunks_exact_mut(d_v).zip(token.k) {
        for (s, &dj) in row.iter_mut().zip(out.iter()) {
            *s += ki * dj;
        }
    }
    out.fill(0.0);
    for (row, &qi) in state.chunks_exact(d_v).zip(token.q) {
        for (o, &s) in out.iter_mut().zip(row) {
            *o += s * qi;
        }
    }
    debug_assert_eq!(state.len(), d_k * d_v);
}

/// One token of the causal depthwise conv1d + SiLU, in place over the `C`
/// channels of `x`. `weight` is `[C, K]` (the checkpoint's `[C, 1, K]`),
/// `state` `[C, K - 1]`, oldest input first. Per channel:
/// `x = silu(sum_j w[j] * window[j])` over the window `state ++ [x]`
/// (summed left to right), then the window's last `K - 1` inputs become the
/// state.
///
/// # Panics
/// If `weight.len()` is not a positive multiple `K` of `x.len()` or
/// `state.len() != x.len() * (K - 1)`.
pub fn causal_conv1d_silu_step(x: &mut [f32], weight: &[f32], state: &mut [f32]) {
    causal_conv1d_step(x, weight, state, |conv, _| super::silu(conv));
}

/// One token of the causal depthwise conv1d plus its input (no
/// activation), in place: per channel `x = sum_j w[j] * window[j] + x`, the
/// window and state as in [`causal_conv1d_silu_step`] (transformers'
/// `InklingShortConvolution`, in f32).
///
/// # Panics
/// As [`causal_conv1d_silu_step`].
pub fn causal_conv1d_residual_step(x: &mut [f32], weight: &[f32], state: &mut [f32]) {
    causal_conv1d_step(x, weight, state, |conv, input| conv + input);
}

/// The conv1d step both kinds share: per channel the window's weighted sum,
/// then `x = finish(sum, x)` and the state shifted by one input.
fn causal_conv1d_step(x: &mut [f32], weight: &[f32], state: &mut [f32], finish: impl Fn(f32, f32) -> f32) {
    let kernel = conv_kernel(x.len(), weight, state);
    let hist = kernel - 1;
    for (c, xc) in x.iter_mut().enumerate() {
        let w = &weight[c * kernel..(c + 1) * kernel];
        let s = &mut state[c * hist..(c + 1) * hist];
        let mut acc = 0.0f32;
        for (&wj, &sj) in w.iter().zip(s.iter()) {
            acc += wj * sj;
        }
        acc += w[hist] * *xc;
        if hist > 0 {
            s.copy_within(1.., 0);
            s[hist - 1] = *xc;
        }
        *xc = finish(acc, *xc);
    }
}

/// The kernel size `K` of a conv1d over `channels` channels, after checking
/// the weight and state lengths against it.
pub(crate) fn conv_kernel(channels: usize, weight: &[f32], state: &[f32]) -> usize {
    assert!(channels > 0, "conv1d: no channels");
    assert!(
        !weight.is_empty() && weight.len().is_multiple_of(channels),
        "conv1d: weight length {} is not a positive multiple of {channels} channels",
        weight.len()
    );
    let kernel = weight.len() / channels;
    assert_eq!(state.len(), channels * (kernel - 1), "conv1d: state must hold kernel - 1 = {} inputs", kernel - 1);
    kernel
}
