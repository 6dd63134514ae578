//! The n-gram Per-Layer Embedding's gate and convolution on the CPU
//! (Qwen3.8-Flash-Next), in the order of transformers'
//! `Qwen4ExpTextPLELayer.forward` (models/qwen4_exp/modeling_qwen4_exp.py:1232),
//! in f32.
//!
//! Per token: the key (one per stream) and the streams are each normed per
//! stream with `1 + w`; stream `s`'s gate is `g = ⟨k̂_s, q̂_s⟩ / √hidden`,
//! taken as `sign(g)·√max(|g|, 1e-6)`; the gated value `σ(g_s)·v` is added
//! to stream `s` together with the SiLU of a dilated depthwise causal
//! convolution of its own normed copy. Rows are `[tokens, streams · hidden]`.

use strata_kernels::ops;

/// One PLE layer's gate and convolution weights, resolved.
pub struct PleMixer<'a> {
    pub hidden: usize,
    /// `1 + norm_key`, `1 + norm_query`, `1 + norm_conv`, each
    /// `[streams · hidden]`.
    pub norm_key: &'a [f32],
    pub norm_query: &'a [f32],
    pub norm_conv: &'a [f32],
    /// `conv1d`'s weight, `[streams · hidden, kernel]`.
    pub conv: &'a [f32],
    pub kernel: usize,
    /// Tokens between two taps (`ngram_size`).
    pub dilation: usize,
    pub eps: f32,
}

/// transformers' floor under the gate's magnitude before its square root.
const GATE_FLOOR: f32 = 1e-6;

/// Adds the PLE's output to `streams`, from `keys` (`key_proj` of the
/// tokens' n-gram rows, `[tokens, channels]`, normed here in place) and
/// `values` (`value_proj`, `[tokens, hidden]`); `state` holds the
/// convolution's last `(kernel - 1) · dilation` inputs, oldest first
/// (`[rows, channels]`), and is moved on past the tokens.
pub fn inject(mixer: &PleMixer<'_>, keys: &mut [f32], values: &[f32], streams: &mut [f32], state: &mut [f32]) {
    let (hidden, channels) = (mixer.hidden, mixer.norm_key.len());
    assert!(hidden > 0 && channels.is_multiple_of(hidden), "the channels are whole streams");
    let tokens = values.len() / hidden;
    assert_eq!((keys.len(), streams.len()), (tokens * channels, tokens * channels), "a key and streams per token");
    let state_rows = (mixer.kernel - 1) * mixer.dilation;
    assert_eq!(state.len(), state_rows * channels, "the convolution keeps (kernel - 1) · dilation rows");
    assert_eq!(mixer.conv.len(), channels * mixer.kernel, "a tap per channel and kernel position");

    let norm = |rows: &mut [f32], weight: &[f32]| {
        for row in rows.chunks_exact_mut(channels) {
            for (stream, w) in row.chunks_exact_mut(hidden).zip(weight.chunks_exact(hidden)) {
                ops::rmsnorm_unweighted_inplace(stream, mixer.eps);
                stream.iter_mut().zip(w).for_each(|(x, &w)| *x *= w);
            }
        }
    };
    norm(keys, mixer.norm_key);
    let mut queries = streams.to_vec();
    norm(&mut queries, mixer.norm_query);
    let scale = (hidden as f32).sqrt();
    let mut gated = vec![0.0f32; tokens * channels];
    for (((gated, key), query), value) in gated
        .chunks_exact_mut(channels)
        .zip(keys.chunks_exact(channels))
        .zip(queries.chunks_exact(channels))
        .zip(values.chunks_exact(hidden))
    {
        let per_stream = gated.chunks_exact_mut(hidden).zip(key.chunks_exact(hidden).zip(query.chunks_exact(hidden)));
        for (gated, (k, q)) in per_stream {
            let g = k.iter().zip(q).map(|(k, q)| k * q).sum::<f32>() / scale;
            // torch's `sign` is 0 at 0.
            let g = if g == 0.0 { 0.0 } else { g.abs().max(GATE_FLOOR).sqrt() * g.signum() };
            let weight = ops::sigmoid(g);
            gated.iter_mut().zip(value).for_each(|(o, &v)| *o = weight * v);
        }
    }
    let mut normed = gated.clone();
    norm(&mut normed, mixer.norm_conv);

    // The convolution's inputs: the state's rows, then the tokens'.
    let mut inputs = state.to_vec();
    inputs.extend_from_slice(&normed);
    for (t, (stream_row, gated_row)) in streams.chunks_exact_mut(channels).zip(gated.chunks_exact(channels)).enumerate()
    {
        for (c, (x, &gv)) in stream_row.iter_mut().zip(gated_row).enumerate() {
            let taps = &mixer.conv[c * mixer.kernel..(c + 1) * mixer.kernel];
            let conv: f32 =
                taps.iter().enumerate().map(|(j, w)| w * inputs[(t + j * mixer.dilation) * channels + c]).sum();
            *x += gv + conv * ops::sigmoid(conv);
        }
    }
    state.copy_from_slice(&inputs[inputs.len() - state.len()..]);
}
