//! DeepSeek V4's attention on the CPU: every query head over the one shared
//! key-value head's window rows and the compressed entries it sees, with a
//! sink logit.

use rayon::prelude::*;
use strata_kernels::simd::Isa;
use strata_kernels::{Threads, ops};

use crate::backend::{SharedKvJob, SharedKvShape};

/// Several sequences' attention at once, shared out across the pool.
pub fn attend_all(threads: &Threads, isa: Isa, shape: &SharedKvShape, sinks: &[f32], jobs: Vec<SharedKvJob<'_>>) {
    assert_eq!(sinks.len(), shape.n_heads, "one sink logit per query head");
    threads.pool().install(|| {
        jobs.into_par_iter().for_each(|job| attend(isa, shape, sinks, job));
    });
}

/// Attention of `n` queries at positions `start..start + n`: query `i`'s
/// keys are the rows of positions `start + i + 1 - window ..= start + i`
/// then the entries `visible[i]`, in that order (transformers concatenates
/// the entries after the window's keys), each key its own value. `rows`
/// holds positions `first_key..start + n`.
///
/// Each (query, head) pair is computed by the same code whichever thread
/// runs it, so the result does not depend on the thread count.
fn attend(isa: Isa, shape: &SharedKvShape, sinks: &[f32], job: SharedKvJob<'_>) {
    let SharedKvJob { q, rows, first_key, start, entries, visible, out } = job;
    let d = shape.head_dim;
    let n = q.len() / (shape.n_heads * d);
    assert_eq!(visible.len(), n, "the entries each query sees");
    assert_eq!(rows.len(), (start + n - first_key) * d, "rows cover every position from the first");
    assert_eq!(out.len(), q.len(), "output matches queries");
    assert!(first_key <= (start + 1).saturating_sub(shape.window), "rows from {first_key} miss the window of {start}");
    let scale = (d as f32).powf(-0.5);
    out.par_chunks_mut(d).enumerate().for_each_init(Vec::new, |scores: &mut Vec<f32>, (pair, oh)| {
        let (i, head) = (pair / shape.n_heads, pair % shape.n_heads);
        let pos = start + i;
        let qh = &q[pair * d..(pair + 1) * d];
        let first = (pos + 1).saturating_sub(shape.window);
        let window = &rows[(first - first_key) * d..(pos + 1 - first_key) * d];
        let seen = &visible[i];
        scores.clear();
        scores.resize(pos + 1 - first, 0.0);
        isa.dot_rows_f32(qh, window, d, scores);
        scores.extend(seen.iter().map(|&e| isa.dot_f32(qh, &entries[e * d..(e + 1) * d])));
        scores.iter_mut().for_each(|s| *s *= scale);
        ops::softmax_with_sink_inplace(scores, sinks[head]);
        let (on_window, on_entries) = scores.split_at(pos + 1 - first);
        oh.fill(0.0);
        isa.axpy_rows(on_window, window, d, oh);
        for (&p, &e) in on_entries.iter().zip(seen) {
            isa.axpy(p, &entries[e * d..(e + 1) * d], oh);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{COMPRESS_ROTARY_DIM, assert_close, compress_rope, fixture};
    use crate::backend::{Device, VectorHandle};
    use crate::rope::Angles;

    /// The fixture's passes (xtask/fixtures/deepseek_v4_blocks.py), its
    /// CSA layer's shape, window and ratio, and its norms' eps.
    const PASSES: [usize; 4] = [9, 1, 4, 7];
    const HEADS: usize = 4;
    const HEAD_DIM: usize = 32;
    const O_GROUPS: usize = 2;
    const WINDOW: usize = 6;
    const RATIO: usize = 4;
    const EPS: f32 = 1e-6;

    fn load(name: &str) -> (Vec<usize>, Vec<f32>) {
        fixture("deepseek_v4/blocks", name)
    }

    /// What transformers' eager attention saw in pass `p` of `n` queries
    /// from `start`: the keys (the window's, `window - 1` kept and the
    /// pass's, then every entry) and, from its mask, the entries each query
    /// sees, after checking that the mask's window is the ring's.
    struct Pass {
        keys: Vec<f32>,
        window_keys: usize,
        first_key: usize,
        visible: Vec<Vec<usize>>,
    }

    fn pass(p: usize, start: usize, n: usize) -> Pass {
        let (keys_shape, keys) = load(&format!("attn{p}_keys"));
        let mask = load(&format!("attn{p}_mask")).1;
        let (n_keys, n_entries) = (keys_shape[0], (start + n) / RATIO);
        let window_keys = n_keys - n_entries;
        let first_key = start + n - window_keys;
        let mut visible = Vec::with_capacity(n);
        for (i, row) in mask.chunks_exact(n_keys).enumerate() {
            let pos = start + i;
            for (j, &m) in row[..window_keys].iter().enumerate() {
                let key = first_key + j;
                assert_eq!(m == 0.0, key <= pos && pos - key < WINDOW, "pass {p}: query {pos} key {key}");
            }
            visible.push((0..n_entries).filter(|&e| row[window_keys + e] == 0.0).collect());
        }
        Pass { keys, window_keys, first_key, visible }
    }

    fn shape() -> SharedKvShape {
        let sinks = VectorHandle { device: Device::Cpu, len: HEADS, slot: 0 };
        SharedKvShape { n_heads: HEADS, head_dim: HEAD_DIM, window: WINDOW, sinks }
    }

    /// Each pass of the CSA layer: transformers' eager attention over the
    /// window's keys and the entries the indexer chose, with sinks.
    #[test]
    fn attention_over_the_window_and_chosen_entries_matches_transformers_eager() {
        let sinks = load("sinks").1;
        let mut start = 0;
        for (p, n) in PASSES.into_iter().enumerate() {
            let (q, want) = (load(&format!("attn{p}_q")).1, load(&format!("attn{p}_out")).1);
            let Pass { keys, window_keys, first_key, visible } = pass(p, start, n);
            let mut out = vec![f32::NAN; q.len()];
            let (rows, entries) = keys.split_at(window_keys * HEAD_DIM);
            let job = SharedKvJob { q: &q, rows, first_key, start, entries, visible: &visible, out: &mut out };
            attend(Isa::detect(), &shape(), &sinks, job);
            assert_close(&out, &want, &format!("pass {p}"));
            start += n;
        }
    }

    /// `xs W^T` for `[n, cols]` rows and a `[rows, cols]` weight.
    fn linear(xs: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
        xs.chunks_exact(cols).flat_map(|x| w.chunks_exact(cols).map(|row| ops::dot(x, row))).collect()
    }

    /// Each `weight`-wide head of `rows` RMS-normalised by `weight`.
    fn norm_heads(rows: &mut [f32], weight: &[f32]) {
        rows.chunks_exact_mut(weight.len()).for_each(|head| ops::rmsnorm_inplace(head, weight, EPS));
    }

    /// The trailing values of each head of row `t` of `rows` rotated at
    /// position `t` by `angles`.
    fn rotate_heads(rows: &mut [f32], row_width: usize, angles: &Angles) {
        for (t, row) in rows.chunks_exact_mut(row_width).enumerate() {
            let (cos, sin) = angles.at(t);
            for head in row.chunks_exact_mut(HEAD_DIM) {
                ops::rope_interleaved(&mut head[HEAD_DIM - COMPRESS_ROTARY_DIM..], cos, sin);
            }
        }
    }

    /// The CSA layer's whole output over the passes against transformers',
    /// composed from the operations `attention::shared_kv` runs: the
    /// q-LoRA with its weighted and unweighted norms, the shared key-value
    /// head, the trailing rotation, this backend's attention over the
    /// window's rows and the entries (the compressor's and the indexer's
    /// work, checked on their own), the rotation back and the grouped
    /// output projection.
    #[test]
    fn the_csa_layer_composes_to_transformers_output() {
        let (x_shape, x) = load("csa_x");
        let [tokens, hidden] = x_shape[..] else { panic!("x shape {x_shape:?}") };
        let w = |name: &str| load(&format!("csa_{name}")).1;
        let q_a_norm = w("q_a_norm");
        let rank = q_a_norm.len();
        let angles = Angles::new(&compress_rope(), &(0..tokens).collect::<Vec<_>>());
        let mut residual = linear(&x, &w("q_a_proj"), hidden);
        residual.chunks_exact_mut(rank).for_each(|row| ops::rmsnorm_inplace(row, &q_a_norm, EPS));
        let mut q = linear(&residual, &w("q_b_proj"), rank);
        norm_heads(&mut q, &[1.0; HEAD_DIM]);
        rotate_heads(&mut q, HEADS * HEAD_DIM, &angles);
        let mut kv = linear(&x, &w("kv_proj"), hidden);
        norm_heads(&mut kv, &w("kv_norm"));
        rotate_heads(&mut kv, HEAD_DIM, &angles);
        let (sinks, q_dim) = (load("sinks").1, HEADS * HEAD_DIM);
        let mut attn = vec![f32::NAN; tokens * q_dim];
        let mut start = 0;
        for (p, n) in PASSES.into_iter().enumerate() {
            let Pass { keys, window_keys, first_key, visible } = pass(p, start, n);
            let job = SharedKvJob {
                q: &q[start * q_dim..(start + n) * q_dim],
                rows: &kv[first_key * HEAD_DIM..(start + n) * HEAD_DIM],
                first_key,
                start,
                entries: &keys[window_keys * HEAD_DIM..],
                visible: &visible,
                out: &mut attn[start * q_dim..(start + n) * q_dim],
            };
            attend(Isa::detect(), &shape(), &sinks, job);
            start += n;
        }
        rotate_heads(&mut attn, q_dim, &angles.inverse());
        let (o_a, group_width) = (w("o_a_proj"), q_dim / O_GROUPS);
        let rows_per_group = o_a.len() / group_width / O_GROUPS;
        let grouped: Vec<f32> = attn
            .chunks_exact(q_dim)
            .flat_map(|row| {
                let blocks = o_a.chunks_exact(rows_per_group * group_width);
                row.chunks_exact(group_width)
                    .zip(blocks)
                    .flat_map(|(x, w)| linear(x, w, group_width))
                    .collect::<Vec<_>>()
            })
            .collect();
        let out = linear(&grouped, &w("o_b_proj"), O_GROUPS * rows_per_group);
        assert_close(&out, &load("csa_out").1, "the CSA layer");
    }
}
