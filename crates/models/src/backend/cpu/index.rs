//! The lightning indexer's scoring and choice on the CPU: DSA's over every
//! position (`crate::dsa`) or over pools of positions (GLM-5.3-Flash), and
//! DeepSeek V4's over compressed entries; and the pooled indexer's key
//! pooling.

use rayon::prelude::*;
use strata_kernels::simd::Isa;
use strata_kernels::{Threads, ops};

use crate::backend::{IndexJob, IndexShape};
use crate::torch_topk::torch_topk;

/// A candidate the query cannot see yet: below every score, equal to the
/// others like it (transformers adds the causal mask's `f32::MIN`, or fills
/// `-inf`, or `f32::MIN` for a pool not yet visible).
const MASKED: f32 = f32::NEG_INFINITY;

/// For each query of `job`, what it may attend to, ascending. The
/// candidates are the keys of `job`, one per `job.every` tokens; a query at
/// `p` sees keys `0..(p + 1) / every`, the `topk` best of them by
/// `Σ_h w_h · relu(q_h · k_c / sqrt(d))`, or all of them: DSA's positions
/// (`every` 1), V4's compressed entries. With `shape.pools` the keys are
/// pools and `topk` counts tokens: the `topk / every` best pools, each
/// expanded to its tokens, then the query's own incomplete pool. Ties go as
/// `torch.topk` breaks them on the row of all the pass's keys, the unseen
/// ones masked.
pub fn select(threads: &Threads, isa: Isa, shape: IndexShape, job: &IndexJob<'_>) -> Vec<Vec<usize>> {
    let (heads, d, every) = (shape.heads, shape.head_dim, job.every);
    assert!(every > 0, "a key stands for at least one token");
    let n = job.q.len() / (heads * d);
    let start = job.start;
    let keys_in_pass = (start + n) / every;
    assert_eq!(job.keys.len(), keys_in_pass * d, "one key per {every} tokens complete within the pass");
    // Pools are chosen whole, so `topk` tokens are `topk / every` pools.
    let keep = if shape.pools {
        assert!(shape.topk >= every, "at least one pool of {every} tokens a query");
        shape.topk / every
    } else {
        shape.topk
    };
    let scale = (d as f32).powf(-0.5);
    let score = |i: usize, c: usize| -> f32 {
        let key = &job.keys[c * d..][..d];
        let q_i = &job.q[i * heads * d..][..heads * d];
        let w_i = &job.weights[i * heads..][..heads];
        q_i.chunks_exact(d).zip(w_i).map(|(q_h, &w)| w * (isa.dot_f32(q_h, key) * scale).max(0.0)).sum()
    };
    let seen = |i: usize| (start + i + 1) / every;
    // `scores` are query i's, for the keys it sees.
    let choose = |scores: &[f32]| -> Vec<usize> {
        if scores.len() <= keep {
            return (0..scores.len()).collect();
        }
        let mut row = scores.to_vec();
        row.resize(keys_in_pass, MASKED);
        let mut chosen: Vec<usize> = torch_topk(&row, keep).into_iter().filter(|&c| c < scores.len()).collect();
        chosen.sort_unstable();
        chosen
    };
    // Pools stand for their tokens, then the query's open pool's up to it;
    // other keys stand for themselves.
    let expand = |chosen: Vec<usize>, position: usize| -> Vec<usize> {
        if !shape.pools {
            return chosen;
        }
        let open_from = (position + 1) / every * every;
        chosen.into_iter().flat_map(|c| c * every..(c + 1) * every).chain(open_from..=position).collect()
    };
    // Each score is computed by the same code whichever thread runs it,
    // so the choice does not depend on the thread count. One query (a
    // decode step) splits its candidates over threads; a batch splits
    // queries.
    threads.pool().install(|| {
        if n == 1 {
            let scores: Vec<f32> = (0..seen(0)).into_par_iter().map(|c| score(0, c)).collect();
            vec![expand(choose(&scores), start)]
        } else {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let scores: Vec<f32> = (0..seen(i)).map(|c| score(i, c)).collect();
                    expand(choose(&scores), start + i)
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
    use super::*;
    use crate::backend::cpu::{assert_close, fixture};

    /// testdata/dsa/pool_*.npy's indexer (xtask/fixtures/dsa_pool_ref.py).
    const HEADS: usize = 8;
    const POOL: usize = 4;

    /// The pooled keys of every whole pool of the fixture's prompt.
    fn pooled() -> Vec<f32> {
        let load = |name: &str| fixture("dsa", name);
        let (shape, keys) = load("pool_keys_in");
        let (_, gates) = load("pool_gates");
        let (_, ape) = load("pool_ape");
        let whole = shape[0] / POOL * POOL * shape[1];
        pool_keys(&ape, POOL, &keys[..whole], &gates[..whole])
    }

    /// A `[rows, k]` index fixture's rows, `-1` (none) dropped, ascending.
    fn kept_rows(shape: &[usize], values: &[f32]) -> Vec<Vec<usize>> {
        values
            .chunks_exact(shape[1])
            .map(|row| {
                let mut kept: Vec<usize> = row.iter().filter(|&&e| e >= 0.0).map(|&e| e as usize).collect();
                kept.sort_unstable();
                kept
            })
            .collect()
    }

    #[test]
    fn pooled_keys_match_glm5_next_get_pooled_states() {
        assert_close(&pooled(), &fixture("dsa", "pool_keys").1, "pooled keys");
    }

    /// Each query's tokens as `Glm5NextTextIndexer` returns them for
    /// `index_topk` below (two pools of seven) and above the prompt, in one
    /// pass and in two (the second starting inside a pool), from Strata's
    /// own pooled keys.
    #[test]
    fn pooled_choices_match_glm5_next_indexer_in_one_pass_or_two() {
        let (q_shape, q) = fixture("dsa", "pool_q");
        let (_, weights) = fixture("dsa", "pool_weights");
        let keys = pooled();
        let (tokens, head_dim) = (q_shape[0], q_shape[1] / HEADS);
        let threads = Threads::new(2).expect("a pool of two");
        for topk in [8, 40] {
            let (want_shape, want) = fixture("dsa", &format!("pool_topk_{topk}"));
            let want = kept_rows(&want_shape, &want);
            let shape = IndexShape { heads: HEADS, head_dim, topk, pools: true };
            let pass = |start: usize, end: usize| {
                let job = IndexJob {
                    q: &q[start * HEADS * head_dim..end * HEADS * head_dim],
                    weights: &weights[start * HEADS..end * HEADS],
                    keys: &keys[..end / POOL * head_dim],
                    start,
                    every: POOL,
                };
                select(&threads, Isa::detect(), shape, &job)
            };
            assert_eq!(pass(0, tokens), want, "top-{topk}, one pass");
            let split = 10;
            assert_eq!([pass(0, split), pass(split, tokens)].concat(), want, "top-{topk}, two passes");
        }
    }

    /// Each pass of the fixture's CSA layer (xtask/fixtures/
    /// deepseek_v4_blocks.py: passes of 9, 1, 4 and 7 tokens, a window of 4
    /// tokens per entry, 8 heads, top 2): the entries transformers' indexer
    /// keeps for each query (`-1`: none), from its scorer's inputs.
    #[test]
    fn compressed_entries_are_chosen_as_transformers_indexer_chooses_them() {
        let load = |name: &str| fixture("deepseek_v4/blocks", name);
        let mut start = 0;
        for (p, n) in [9, 1, 4, 7].into_iter().enumerate() {
            let (q_shape, q) = load(&format!("index{p}_q"));
            let (weights, keys) = (load(&format!("index{p}_weights")).1, load(&format!("index{p}_keys")).1);
            let (topk_shape, topk) = load(&format!("index{p}_topk"));
            let [rows, heads, head_dim] = q_shape[..] else { panic!("q shape {q_shape:?}") };
            assert_eq!(rows, n);
            let want = kept_rows(&topk_shape, &topk);
            let shape = IndexShape { heads, head_dim, topk: 2, pools: false };
            let job = IndexJob { q: &q, weights: &weights, keys: &keys, start, every: 4 };
            let got = select(&Threads::new(2).expect("a pool of two"), Isa::detect(), shape, &job);
            assert_eq!(got, want, "pass {p}");
            start += n;
        }
    }
}
