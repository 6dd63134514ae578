//! Gated residual hyper-connections on the CPU (Qwen3.8-Flash-Next), in the
//! order of transformers' `Qwen4ExpTextGatedResidual` and its decoder
//! layer's combine (models/qwen4_exp/modeling_qwen4_exp.py:997, :1290), in
//! f32.
//!
//! Unlike mHC there is no stream-to-stream mixing: each stream is normed on
//! its own, the block's input is the mean over streams of a per-channel
//! σ-gate times the normed stream, and the block's output is added to every
//! un-normed stream with a per-stream weight in (0, 2).
//!
//! Streams are `[tokens, streams, hidden]`, one token's streams one row of
//! `streams · hidden` values.

use strata_kernels::{Matrix, Threads, ops};

/// One block's gated residual (or the final mixer), its weights resolved.
pub struct GatedMixer<'a> {
    pub streams: usize,
    /// `hc_norm`'s weight, `[streams · hidden]`, applied as `1 + w` to each
    /// stream's own RMS norm.
    pub norm: &'a [f32],
    /// `input_mix_weight_down`, `[hc_lowrank, streams · hidden]`.
    pub down: Matrix<'a>,
    /// `input_mix_weight_up`, `[streams · hidden, hc_lowrank]`.
    pub up: Matrix<'a>,
    /// `block_inject_weight`, `[streams, streams · hidden]`; `None` for the
    /// final mixer before `lm_head`, which has no block to inject.
    pub inject: Option<Matrix<'a>>,
    pub norm_eps: f32,
}

/// The block's input from the streams into `input` (`[tokens, hidden]`),
/// and, when the mixer injects, each token's injection weights
/// `2σ(inject(x̂)/streams)` (`[tokens, streams]`) for [`combine`].
pub fn mix(threads: &Threads, mixer: &GatedMixer<'_>, streams: &[f32], input: &mut [f32]) -> Vec<f32> {
    let n = mixer.streams;
    let width = mixer.norm.len();
    assert!(n > 0 && width.is_multiple_of(n), "the norm covers whole streams");
    let hidden = width / n;
    assert_eq!(streams.len() % width, 0, "a token's streams are one row of the norm");
    let tokens = streams.len() / width;
    assert_eq!(input.len(), tokens * hidden, "the input is [tokens, hidden]");
    assert_eq!((mixer.down.cols, mixer.up.rows, mixer.up.cols), (width, width, mixer.down.rows), "low-rank shapes");
    // torch's `mean` over the streams: their sum times `1 / n`.
    let inv_streams = 1.0 / n as f32;

    let mut normed = streams.to_vec();
    for row in normed.chunks_exact_mut(width) {
        for (stream, weight) in row.chunks_exact_mut(hidden).zip(mixer.norm.chunks_exact(hidden)) {
            ops::rmsnorm_unweighted_inplace(stream, mixer.norm_eps);
            stream.iter_mut().zip(weight).for_each(|(x, &w)| *x *= 1.0 + w);
        }
    }
    let mut low = vec![0.0f32; tokens * mixer.down.rows];
    threads.matmul(&mixer.down, &normed, tokens, &mut low);
    low.iter_mut().for_each(|v| {
        let scaled = *v / n as f32;
        *v = scaled * ops::sigmoid(scaled);
    });
    let mut gates = vec![0.0f32; tokens * width];
    threads.matmul(&mixer.up, &low, tokens, &mut gates);
    for ((o, x), g) in input.chunks_exact_mut(hidden).zip(normed.chunks_exact(width)).zip(gates.chunks_exact(width)) {
        o.fill(0.0);
        for (x, g) in x.chunks_exact(hidden).zip(g.chunks_exact(hidden)) {
            o.iter_mut().zip(x.iter().zip(g)).for_each(|(o, (&x, &g))| *o += ops::sigmoid(g) * x);
        }
        o.iter_mut().for_each(|o| *o *= inv_streams);
    }

    let Some(inject) = &mixer.inject else { return Vec::new() };
    assert_eq!((inject.rows, inject.cols), (n, width), "an injection logit per stream");
    let mut injection = vec![0.0f32; tokens * n];
    threads.matmul(inject, &normed, tokens, &mut injection);
    injection.iter_mut().for_each(|w| *w = 2.0 * ops::sigmoid(*w / n as f32));
    injection
}

/// The block's output `out` (`[tokens, hidden]`) into the streams: stream
/// `k` gains `injection[k] · out`.
pub fn combine(n: usize, injection: &[f32], out: &[f32], streams: &mut [f32]) {
    let tokens = injection.len() / n;
    assert_eq!(injection.len(), tokens * n, "an injection weight per stream");
    assert_eq!(out.len() % tokens.max(1), 0, "the output is [tokens, hidden]");
    let hidden = out.len() / tokens.max(1);
    assert_eq!(streams.len(), out.len() * n, "streams are [tokens, {n}, hidden]");
    for ((x, out), w) in
        streams.chunks_exact_mut(n * hidden).zip(out.chunks_exact(hidden)).zip(injection.chunks_exact(n))
    {
        for (stream, &w) in x.chunks_exact_mut(hidden).zip(w) {
            ops::axpy(w, out, stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use strata_kernels::MatData;

    use super::super::torch_cases::{assert_close, case_dirs, load};
    use super::*;

    /// The cases `xtask/fixtures/qwen4_ref.py` wrote.
    fn cases() -> Vec<PathBuf> {
        case_dirs("qwen4_exp/gated_residual", 4, "several stream and token counts and the final mixer")
    }

    #[test]
    fn a_gated_residual_mixes_injects_and_combines_as_transformers_for_every_stream_count() {
        let threads = Threads::new(2).unwrap();
        let mut final_mixers = 0;
        for case in cases() {
            let what = |name: &str| format!("{} {name}", case.display());
            let ((x_shape, mut streams), (_, norm), (_, config)) =
                (load(&case, "x"), load(&case, "norm"), load(&case, "config"));
            let [tokens, width] = [x_shape[0], x_shape[1]];
            let (out_shape, out) = load(&case, "out");
            let (hidden, n) = (out_shape[1], width / out_shape[1]);
            let ((down_shape, down), (up_shape, up)) = (load(&case, "down"), load(&case, "up"));
            let inject = case.join("inject.npy").exists().then(|| load(&case, "inject"));
            let mixer = GatedMixer {
                streams: n,
                norm: &norm,
                down: Matrix::new(down_shape[0], down_shape[1], MatData::F32(&down)).unwrap(),
                up: Matrix::new(up_shape[0], up_shape[1], MatData::F32(&up)).unwrap(),
                inject: inject.as_ref().map(|(s, w)| Matrix::new(s[0], s[1], MatData::F32(w)).unwrap()),
                norm_eps: config[0],
            };
            let mut input = vec![f32::NAN; tokens * hidden];
            let injection = mix(&threads, &mixer, &streams, &mut input);
            assert_close(&what("mixed"), &input, &load(&case, "mixed").1);
            if mixer.inject.is_none() {
                assert!(injection.is_empty(), "the final mixer injects nothing");
                final_mixers += 1;
                continue;
            }
            assert_close(&what("injection"), &injection, &load(&case, "injection").1);
            combine(n, &injection, &out, &mut streams);
            assert_close(&what("combined"), &streams, &load(&case, "combined").1);
        }
        assert_eq!(final_mixers, 1, "the final mixer is one of the cases");
    }
}
