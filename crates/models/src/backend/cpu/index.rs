//! The DSA lightning indexer's scoring and choice on the CPU (`crate::dsa`),
//! and the pooled indexer's key pooling.

use rayon::prelude::*;
use strata_kernels::simd::Isa;
use strata_kernels::{Threads, ops};

use crate::backend::{IndexJob, IndexShape};
use crate::torch_topk::torch_topk;

/// A candidate the query cannot see yet: below every score, equal to the
/// others like it (transformers adds the causal mask's `f32::MIN`, or fills
/// `-inf`, or `f32::MIN` for a pool not yet visible).
const MASKED: f32 = f32::NEG_INFINITY;

/// For each query of `job`, the positions it may attend to, ascending. The
/// candidates are the keys of `job` (one per `shape.pool` tokens); among
/// those whose last token is at or before the query's position, the
/// `topk / pool` best by `Σ_h w_h · relu(q_h · k_c / sqrt(d))`, or all of
/// them, each expanded to its tokens, then the query's own incomplete pool
/// (nothing with pools of one token). Ties go as `torch.topk` breaks them
/// on the row of every candidate complete within the pass, later ones
/// masked.
pub fn select(threads: &Threads, isa: Isa, shape: IndexShape, job: &IndexJob<'_>) -> Vec<Vec<usize>> {
    let (heads, d, pool) = (shape.heads, shape.head_dim, shape.pool);
    assert!(pool > 0 && shape.topk >= pool, "at least one candidate of {pool} tokens a query");
    let n = job.q.len() / (heads * d);
    let start = job.start;
    let candidates_in_pass = (start + n) / pool;
    assert_eq!(job.keys.len(), candidates_in_pass * d, "one key per candidate complete within the pass");
    let keep = shape.topk / pool;
    let scale = (d as f32).powf(-0.5);
    let score = |i: usize, c: usize| -> f32 {
        let key = &job.keys[c * d..][..d];
        let q_i = &job.q[i * heads * d..][..heads * d];
        let w_i = &job.weights[i * heads..][..heads];
        q_i.chunks_exact(d).zip(w_i).map(|(q_h, &w)| w * (isa.dot_f32(q_h, key) * scale).max(0.0)).sum()
    };
    // `scores` are the query's, for its visible candidates.
    let choose = |scores: &[f32]| -> Vec<usize> {
        if scores.len() <= keep {
            return (0..scores.len()).collect();
        }
        let mut row = scores.to_vec();
        row.resize(candidates_in_pass, MASKED);
        let mut chosen: Vec<usize> = torch_topk(&row, keep).into_iter().filter(|&c| c < scores.len()).collect();
        chosen.sort_unstable();
        chosen
    };
    // The chosen candidates' tokens, then the open pool's up to the query.
    let tokens = |chosen: Vec<usize>, position: usize| -> Vec<usize> {
        let open_from = (position + 1) / pool * pool;
        chosen.into_iter().flat_map(|c| c * pool..(c + 1) * pool).chain(open_from..=position).collect()
    };
    let visible = |position: usize| (position + 1) / pool;
    // Each score is computed by the same code whichever thread runs it,
    // so the choice does not depend on the thread count. One query (a
    // decode step) splits its candidates over threads; a batch splits
    // queries.
    threads.pool().install(|| {
        if n == 1 {
            let scores: Vec<f32> = (0..visible(start)).into_par_iter().map(|c| score(0, c)).collect();
            vec![tokens(choose(&scores), start)]
        } else {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let scores: Vec<f32> = (0..visible(start + i)).map(|c| score(i, c)).collect();
                    tokens(choose(&scores), start + i)
                })
                .collect()
        }
    })
}

/// The pooled indexer's key of each whole pool in `keys` and `gates`
/// (`[pools · pool, head_dim]`, `pool` the rows of `ape` `[pool,
/// head_dim]`): per channel, the mean of the pool's keys weighted by
/// `softmax(gate + ape)` over the pool's tokens, as `get_pooled_states`
/// computes it (the products rounded, then summed in token order).
pub fn pool_keys(ape: &[f32], pool: usize, keys: &[f32], gates: &[f32]) -> Vec<f32> {
    assert!(pool > 0 && ape.len().is_multiple_of(pool), "ape is [pool = {pool}, head_dim]");
    let d = ape.len() / pool;
    assert_eq!(keys.len(), gates.len(), "a gate logit per key value");
    assert!(keys.len().is_multiple_of(pool * d), "whole pools of {pool} keys of {d}");
    let mut pooled = Vec::with_capacity(keys.len() / pool);
    let mut weights = vec![0.0f32; pool];
    for (pool_keys, pool_gates) in keys.chunks_exact(pool * d).zip(gates.chunks_exact(pool * d)) {
        for c in 0..d {
            for (j, w) in weights.iter_mut().enumerate() {
                *w = pool_gates[j * d + c] + ape[j * d + c];
            }
            ops::softmax_inplace(&mut weights);
            pooled.push(weights.iter().enumerate().fold(0.0f32, |sum, (j, &w)| sum + w * pool_keys[j * d + c]));
        }
    }
    pooled
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use strata_format::npy;
    use strata_kernels::Threads;
    use strata_kernels::simd::Isa;

    use super::{pool_keys, select};
    use crate::backend::{IndexJob, IndexShape};

    /// testdata/dsa/pool_*.npy's indexer (xtask/fixtures/dsa_pool_ref.py).
    const HEADS: usize = 8;
    const POOL: usize = 4;

    fn load(name: &str) -> (Vec<usize>, Vec<f32>) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dsa").join(format!("{name}.npy"));
        npy::read_f32(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The pooled keys of every whole pool of the fixture's prompt.
    fn pooled() -> Vec<f32> {
        let (shape, keys) = load("pool_keys_in");
        let (_, gates) = load("pool_gates");
        let (_, ape) = load("pool_ape");
        let whole = shape[0] / POOL * POOL * shape[1];
        pool_keys(&ape, POOL, &keys[..whole], &gates[..whole])
    }

    #[test]
    fn pooled_keys_match_glm5_next_get_pooled_states() {
        let (_, want) = load("pool_keys");
        let got = pooled();
        assert_eq!(got.len(), want.len(), "one key per whole pool");
        let scale = want.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * scale, "pooled key [{i}]: {g} vs torch's {w}");
        }
    }

    /// Each query's tokens as `Glm5NextTextIndexer` returns them for
    /// `index_topk` below (two pools of seven) and above the prompt, in one
    /// pass and in two (the second starting inside a pool), from Strata's
    /// own pooled keys.
    #[test]
    fn pooled_choices_match_glm5_next_indexer_in_one_pass_or_two() {
        let (q_shape, q) = load("pool_q");
        let (_, weights) = load("pool_weights");
        let keys = pooled();
        let (tokens, head_dim) = (q_shape[0], q_shape[1] / HEADS);
        let threads = Threads::new(2).expect("a pool of two");
        for topk in [8, 40] {
            let (shape, want) = load(&format!("pool_topk_{topk}"));
            let want: Vec<Vec<usize>> = want
                .chunks_exact(shape[1])
                .map(|row| {
                    let mut row: Vec<usize> = row.iter().filter(|&&t| t >= 0.0).map(|&t| t as usize).collect();
                    row.sort_unstable();
                    row
                })
                .collect();
            let shape = IndexShape { heads: HEADS, head_dim, topk, pool: POOL };
            let pass = |start: usize, end: usize| {
                let job = IndexJob {
                    q: &q[start * HEADS * head_dim..end * HEADS * head_dim],
                    weights: &weights[start * HEADS..end * HEADS],
                    keys: &keys[..end / POOL * head_dim],
                    start,
                };
                select(&threads, Isa::detect(), shape, &job)
            };
            assert_eq!(pass(0, tokens), want, "top-{topk}, one pass");
            let split = 10;
            assert_eq!([pass(0, split), pass(split, tokens)].concat(), want, "top-{topk}, two passes");
        }
    }
}
