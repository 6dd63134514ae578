//! The lightning indexer's scoring and choice on the CPU: DSA's over every
//! position (`crate::dsa`), DeepSeek V4's over compressed entries.

use rayon::prelude::*;
use strata_kernels::Threads;
use strata_kernels::simd::Isa;

use crate::backend::{IndexJob, IndexShape};
use crate::torch_topk::torch_topk;

/// A position after the query: below every score, equal to the others like
/// it (transformers adds the causal mask's `f32::MIN`, or fills `-inf`).
const MASKED: f32 = f32::NEG_INFINITY;

/// For each query of `job`, the keys it may attend to, ascending: the `topk`
/// best by `Σ_h w_h · relu(q_h · k_t / sqrt(d))` among those it sees (keys
/// `0..(position + 1) / every`), or all of them. Ties go as `torch.topk`
/// breaks them on the row of all the pass's keys, the unseen ones masked.
pub fn select(threads: &Threads, isa: Isa, shape: IndexShape, job: &IndexJob<'_>) -> Vec<Vec<usize>> {
    let (heads, d) = (shape.heads, shape.head_dim);
    let n = job.q.len() / (heads * d);
    let start = job.start;
    let scale = (d as f32).powf(-0.5);
    let score = |i: usize, t: usize| -> f32 {
        let key = &job.keys[t * d..][..d];
        let q_i = &job.q[i * heads * d..][..heads * d];
        let w_i = &job.weights[i * heads..][..heads];
        q_i.chunks_exact(d).zip(w_i).map(|(q_h, &w)| w * (isa.dot_f32(q_h, key) * scale).max(0.0)).sum()
    };
    let keys_in_pass = job.keys.len() / d;
    let seen = |i: usize| (start + i + 1) / job.every;
    assert!(seen(n.saturating_sub(1)) <= keys_in_pass, "every key a query sees is in the row");
    // `scores` are query i's, for the keys it sees.
    let choose = |scores: &[f32]| -> Vec<usize> {
        if scores.len() <= shape.topk {
            return (0..scores.len()).collect();
        }
        let mut row = scores.to_vec();
        row.resize(keys_in_pass, MASKED);
        let mut chosen: Vec<usize> = torch_topk(&row, shape.topk).into_iter().filter(|&t| t < scores.len()).collect();
        chosen.sort_unstable();
        chosen
    };
    // Each score is computed by the same code whichever thread runs it,
    // so the choice does not depend on the thread count. One query (a
    // decode step) splits its keys over threads; a batch splits queries.
    threads.pool().install(|| {
        if n == 1 {
            let scores: Vec<f32> = (0..seen(0)).into_par_iter().map(|t| score(0, t)).collect();
            vec![choose(&scores)]
        } else {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let scores: Vec<f32> = (0..seen(i)).map(|t| score(i, t)).collect();
                    choose(&scores)
                })
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::fixture;

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
            let want: Vec<Vec<usize>> = topk
                .chunks_exact(topk_shape[1])
                .map(|row| {
                    let mut kept: Vec<usize> = row.iter().filter(|&&e| e >= 0.0).map(|&e| e as usize).collect();
                    kept.sort_unstable();
                    kept
                })
                .collect();
            let shape = IndexShape { heads, head_dim, topk: 2 };
            let job = IndexJob { q: &q, weights: &weights, keys: &keys, start, every: 4 };
            let got = select(&Threads::new(2).expect("a pool of two"), Isa::detect(), shape, &job);
            assert_eq!(got, want, "pass {p}");
            start += n;
        }
    }
}
