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
    use crate::backend::cpu::{assert_close, fixture};
    use crate::backend::{Device, VectorHandle};

    /// The fixture's passes (xtask/fixtures/deepseek_v4_blocks.py), its
    /// window and its CSA ratio.
    const PASSES: [usize; 4] = [9, 1, 4, 7];
    const WINDOW: usize = 6;
    const RATIO: usize = 4;

    /// Each pass of the CSA layer: transformers' eager attention over the
    /// window's keys (the cache keeps `window - 1` and the pass's) and the
    /// entries the indexer chose (its mask's zeros), with sinks.
    #[test]
    fn attention_over_the_window_and_chosen_entries_matches_transformers_eager() {
        let load = |name: &str| fixture("deepseek_v4/blocks", name);
        let sinks = load("sinks").1;
        let mut start = 0;
        for (p, n) in PASSES.into_iter().enumerate() {
            let (q_shape, q) = load(&format!("attn{p}_q"));
            let (keys_shape, keys) = load(&format!("attn{p}_keys"));
            let (mask, want) = (load(&format!("attn{p}_mask")).1, load(&format!("attn{p}_out")).1);
            let [rows, heads, d] = q_shape[..] else { panic!("q shape {q_shape:?}") };
            assert_eq!(rows, n);
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
                visible.push((0..n_entries).filter(|&e| row[window_keys + e] == 0.0).collect::<Vec<_>>());
            }
            let shape = SharedKvShape {
                n_heads: heads,
                head_dim: d,
                window: WINDOW,
                sinks: VectorHandle { device: Device::Cpu, len: heads, slot: 0 },
            };
            let mut out = vec![f32::NAN; q.len()];
            let (rows, entries) = keys.split_at(window_keys * d);
            let job = SharedKvJob { q: &q, rows, first_key, start, entries, visible: &visible, out: &mut out };
            attend(Isa::detect(), &shape, &sinks, job);
            assert_close(&out, &want, &format!("pass {p}"));
            start += n;
        }
    }
}
