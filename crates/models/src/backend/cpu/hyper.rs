//! Hyper-connections (mHC) on the CPU: the weights a block's streams give
//! it, the combine of its output with them, and the heads that collapse
//! them, in the order of transformers' `DeepseekV4HyperConnection`,
//! decoder layer and heads (GLM-5.3-Flash's are the same code), in f32.
//!
//! Streams are `[tokens, streams, hidden]`, one token's streams one row of
//! `streams · hidden` values.

use strata_kernels::{Matrix, Threads, ops};

/// A block's hyper-connection, its weights resolved.
pub struct Mixer<'a> {
    pub streams: usize,
    /// `fn`, `[(2 + streams) · streams, streams · hidden]`: each token's
    /// `pre`, `post` and `comb` logits from its normed streams.
    pub mixes: Matrix<'a>,
    /// `[(2 + streams) · streams]`, added to the scaled logits.
    pub base: &'a [f32],
    /// `[3]`: the scales of the `pre`, `post` and `comb` logits.
    pub scale: &'a [f32],
    pub sinkhorn_iters: usize,
    /// `hc_eps`.
    pub eps: f32,
    /// The unweighted input norm's.
    pub norm_eps: f32,
}

/// The σ-weighted head's weights, resolved.
pub struct SigmoidHead<'a> {
    pub streams: usize,
    /// `[streams, streams · hidden]`.
    pub mixes: Matrix<'a>,
    /// `[streams]`.
    pub base: &'a [f32],
    /// `[1]`.
    pub scale: &'a [f32],
    /// `hc_eps`.
    pub eps: f32,
    pub norm_eps: f32,
}

/// The block's input from the streams into `input` (`[tokens, hidden]`),
/// and each token's `post` (`[tokens, streams]`) and `comb` (`[tokens,
/// streams, streams]`) for the combine.
pub fn mix(
    threads: &Threads,
    mixer: &Mixer<'_>,
    streams: &[f32],
    input: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    let n = mixer.streams;
    let width = (2 + n) * n;
    assert_eq!(mixer.mixes.rows, width, "pre, post and comb logits per token");
    assert_eq!((mixer.base.len(), mixer.scale.len()), (width, 3), "a base per logit, a scale per kind");
    let logits = normed_logits(threads, &mixer.mixes, mixer.norm_eps, streams);
    let tokens = logits.len() / width;
    assert_eq!((post.len(), comb.len()), (tokens * n, tokens * n * n), "post and comb per token");
    let [pre_scale, post_scale, comb_scale] = [mixer.scale[0], mixer.scale[1], mixer.scale[2]];
    let (pre_base, rest) = mixer.base.split_at(n);
    let (post_base, comb_base) = rest.split_at(n);
    let mut pre = vec![0.0f32; tokens * n];
    for (t, row) in logits.chunks_exact(width).enumerate() {
        let (pre_logits, rest) = row.split_at(n);
        let (post_logits, comb_logits) = rest.split_at(n);
        for j in 0..n {
            pre[t * n + j] = ops::sigmoid(pre_logits[j] * pre_scale + pre_base[j]) + mixer.eps;
            post[t * n + j] = 2.0 * ops::sigmoid(post_logits[j] * post_scale + post_base[j]);
        }
        let comb = &mut comb[t * n * n..(t + 1) * n * n];
        for ((c, &logit), &base) in comb.iter_mut().zip(comb_logits).zip(comb_base) {
            *c = logit * comb_scale + base;
        }
        sinkhorn(comb, n, mixer.sinkhorn_iters, mixer.eps);
    }
    collapse(&pre, n, streams, input);
}

/// `comb` (`[streams, streams]`, row `j` the weights of input stream `j`):
/// a softmax over each row plus `eps`, then the columns normalised, then
/// `iters - 1` rounds of rows then columns, each sum plus `eps`.
fn sinkhorn(comb: &mut [f32], n: usize, iters: usize, eps: f32) {
    for row in comb.chunks_exact_mut(n) {
        ops::softmax_inplace(row);
        row.iter_mut().for_each(|c| *c += eps);
    }
    normalize_columns(comb, n, eps);
    for _ in 1..iters {
        for row in comb.chunks_exact_mut(n) {
            let sum = row.iter().sum::<f32>() + eps;
            row.iter_mut().for_each(|c| *c /= sum);
        }
        normalize_columns(comb, n, eps);
    }
}

fn normalize_columns(comb: &mut [f32], n: usize, eps: f32) {
    for k in 0..n {
        let sum = (0..n).map(|j| comb[j * n + k]).sum::<f32>() + eps;
        (0..n).for_each(|j| comb[j * n + k] /= sum);
    }
}

/// The block's output `out` (`[tokens, hidden]`) back into the streams:
/// stream `k` becomes `Σ_j comb[j][k] · x_j + post_k · out`.
pub fn combine(n: usize, hidden: usize, post: &[f32], comb: &[f32], out: &[f32], streams: &mut [f32]) {
    let tokens = out.len() / hidden;
    assert_eq!(out.len(), tokens * hidden, "the output is [tokens, hidden]");
    assert_eq!(streams.len(), out.len() * n, "streams are [tokens, {n}, hidden]");
    assert_eq!((post.len(), comb.len()), (tokens * n, tokens * n * n), "post and comb per token");
    let mut mixed = vec![0.0f32; n * hidden];
    for (t, (x, out)) in streams.chunks_exact_mut(n * hidden).zip(out.chunks_exact(hidden)).enumerate() {
        let (post, comb) = (&post[t * n..(t + 1) * n], &comb[t * n * n..(t + 1) * n * n]);
        for (k, target) in mixed.chunks_exact_mut(hidden).enumerate() {
            target.fill(0.0);
            for (j, source) in x.chunks_exact(hidden).enumerate() {
                let c = comb[j * n + k];
                target.iter_mut().zip(source).for_each(|(m, &s)| *m += c * s);
            }
            target.iter_mut().zip(out).for_each(|(m, &o)| *m += post[k] * o);
        }
        x.copy_from_slice(&mixed);
    }
}

/// The σ-weighted head: each token's streams weighted by `σ(logit · scale +
/// base) + eps` and summed into `out` (`[tokens, hidden]`).
pub fn sigmoid_head(threads: &Threads, head: &SigmoidHead<'_>, streams: &[f32], out: &mut [f32]) {
    let n = head.streams;
    assert_eq!((head.mixes.rows, head.base.len(), head.scale.len()), (n, n, 1), "a logit and a base per stream");
    let mut weights = normed_logits(threads, &head.mixes, head.norm_eps, streams);
    for row in weights.chunks_exact_mut(n) {
        for (w, &base) in row.iter_mut().zip(head.base) {
            *w = ops::sigmoid(*w * head.scale[0] + base) + head.eps;
        }
    }
    collapse(&weights, n, streams, out);
}

/// The mean of each token's `n` streams into `out` (`[tokens, hidden]`):
/// their sum times `1 / n`, as torch's `mean` reduces.
pub fn mean_head(n: usize, hidden: usize, streams: &[f32], out: &mut [f32]) {
    let ones = vec![1.0f32; streams.len() / hidden];
    collapse(&ones, n, streams, out);
    let factor = 1.0 / n as f32;
    out.iter_mut().for_each(|o| *o *= factor);
}

/// Each token's streams RMS-normed together without weight, then `mixes ·
/// normed`: `[tokens, mixes.rows]`.
fn normed_logits(threads: &Threads, mixes: &Matrix<'_>, norm_eps: f32, streams: &[f32]) -> Vec<f32> {
    let width = mixes.cols;
    assert_eq!(streams.len() % width, 0, "a token's streams are one row of the mix");
    let mut normed = streams.to_vec();
    normed.chunks_exact_mut(width).for_each(|row| ops::rmsnorm_unweighted_inplace(row, norm_eps));
    let tokens = streams.len() / width;
    let mut logits = vec![0.0f32; tokens * mixes.rows];
    threads.matmul(mixes, &normed, tokens, &mut logits);
    logits
}

/// `out[t] = Σ_j weights[t][j] · streams[t][j]`, in stream order.
fn collapse(weights: &[f32], n: usize, streams: &[f32], out: &mut [f32]) {
    let tokens = weights.len() / n;
    assert_eq!(weights.len(), tokens * n, "a weight per stream");
    let hidden = out.len() / tokens.max(1);
    assert_eq!((out.len(), streams.len()), (tokens * hidden, tokens * n * hidden), "streams are [tokens, {n}, hidden]");
    for ((o, x), w) in out.chunks_exact_mut(hidden).zip(streams.chunks_exact(n * hidden)).zip(weights.chunks_exact(n)) {
        o.fill(0.0);
        for (source, &w) in x.chunks_exact(hidden).zip(w) {
            o.iter_mut().zip(source).for_each(|(o, &s)| *o += w * s);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use strata_kernels::MatData;

    use super::super::torch_cases::{assert_close, case_dirs, load};
    use super::*;

    /// The cases `xtask/fixtures/hc_ref.py` wrote: every stream and token
    /// count it covers.
    fn cases() -> Vec<PathBuf> {
        case_dirs("hc", 3, "several stream and token counts")
    }

    /// A case's `[hc_sinkhorn_iters, hc_eps, rms_norm_eps]` and its
    /// `[tokens, streams, hidden]`.
    fn setup(case: &Path) -> ([f32; 3], [usize; 3]) {
        let (_, config) = load(case, "config");
        let (shape, _) = load(case, "x");
        ([config[0], config[1], config[2]], [shape[0], shape[1], shape[2]])
    }

    #[test]
    fn a_hyper_connection_mixes_and_combines_as_transformers_for_every_stream_and_token_count() {
        let threads = Threads::new(2).unwrap();
        for case in cases() {
            let ([iters, eps, norm_eps], [tokens, n, hidden]) = setup(&case);
            let ((fn_shape, mixes), (_, base), (_, scale)) =
                (load(&case, "fn"), load(&case, "base"), load(&case, "scale"));
            let mixer = Mixer {
                streams: n,
                mixes: Matrix::new(fn_shape[0], fn_shape[1], MatData::F32(&mixes)).unwrap(),
                base: &base,
                scale: &scale,
                sinkhorn_iters: iters as usize,
                eps,
                norm_eps,
            };
            let (_, mut streams) = load(&case, "x");
            let mut input = vec![f32::NAN; tokens * hidden];
            let (mut post, mut comb) = (vec![f32::NAN; tokens * n], vec![f32::NAN; tokens * n * n]);
            mix(&threads, &mixer, &streams, &mut input, &mut post, &mut comb);
            let what = |name: &str| format!("{} {name}", case.display());
            assert_close(&what("post"), &post, &load(&case, "post").1);
            assert_close(&what("comb"), &comb, &load(&case, "comb").1);
            assert_close(&what("collapsed"), &input, &load(&case, "collapsed").1);
            combine(n, hidden, &post, &comb, &load(&case, "out").1, &mut streams);
            assert_close(&what("combined"), &streams, &load(&case, "combined").1);
        }
    }

    #[test]
    fn the_sigmoid_and_mean_heads_collapse_streams_as_transformers() {
        let threads = Threads::new(2).unwrap();
        for case in cases() {
            let ([_, eps, norm_eps], [tokens, n, hidden]) = setup(&case);
            let (fn_shape, mixes) = load(&case, "head_fn");
            let ((_, base), (_, scale), (_, streams)) =
                (load(&case, "head_base"), load(&case, "head_scale"), load(&case, "x"));
            let head = SigmoidHead {
                streams: n,
                mixes: Matrix::new(fn_shape[0], fn_shape[1], MatData::F32(&mixes)).unwrap(),
                base: &base,
                scale: &scale,
                eps,
                norm_eps,
            };
            let mut out = vec![f32::NAN; tokens * hidden];
            sigmoid_head(&threads, &head, &streams, &mut out);
            assert_close(&format!("{} sigmoid head", case.display()), &out, &load(&case, "head_sigmoid").1);
            mean_head(n, hidden, &streams, &mut out);
            assert_close(&format!("{} mean head", case.display()), &out, &load(&case, "head_mean").1);
        }
    }
}
