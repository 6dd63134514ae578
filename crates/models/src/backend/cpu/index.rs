//! The DSA lightning indexer's scoring and choice on the CPU (`crate::dsa`).

use rayon::prelude::*;
use strata_kernels::Threads;
use strata_kernels::simd::Isa;

use crate::backend::{IndexJob, IndexShape};
use crate::torch_topk::torch_topk;

/// A position after the query: below every score, equal to the others like
/// it (transformers adds the causal mask's `f32::MIN`, or fills `-inf`).
const MASKED: f32 = f32::NEG_INFINITY;

/// For each query of `job`, the positions it may attend to, ascending: the
/// `topk` best by `Σ_h w_h · relu(q_h · k_t / sqrt(d))` among
/// `0..=position`, or all of them. Ties go as `torch.topk` breaks them on
/// the row of all `start + n` keys of the pass, later positions masked.
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
    let keys_in_pass = start + n;
    // `scores` are query i's, for positions 0..=start + i.
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
            let scores: Vec<f32> = (0..=start).into_par_iter().map(|t| score(0, t)).collect();
            vec![choose(&scores)]
        } else {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    let scores: Vec<f32> = (0..=start + i).map(|t| score(i, t)).collect();
                    choose(&scores)
                })
                .collect()
        }
    })
}
