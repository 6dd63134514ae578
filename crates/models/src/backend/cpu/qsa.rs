//! QSA, Qwen3.8-Flash-Next's block-sparse attention selection, on the CPU,
//! in the order of transformers' `Qwen4ExpTextQSAIndexer.forward`
//! (models/qwen4_exp/modeling_qwen4_exp.py:690), in f32.
//!
//! Per query, the keys it sees are cut, in order, into complete blocks of
//! `compress_ratio` tokens and an incomplete tail. Each block's raw indexer
//! keys are mean-pooled, RMS-normed with `1 + k_layernorm`, and rotated at
//! the block's first position; the block scores `Σ_h relu(q_h · k_blk) /
//! √dim`. The query attends to the tokens of its `budget / compress_ratio`
//! best blocks (torch's CPU `topk`, ties included) and to the whole tail.

use rayon::prelude::*;
use strata_kernels::{Threads, ops};

use crate::backend::QsaJob;
use crate::torch_topk::torch_topk;

/// The indexer's shape and its key norm, resolved.
pub struct QsaIndexer<'a> {
    /// Query heads (one key head, as transformers requires).
    pub heads: usize,
    pub head_dim: usize,
    /// `indexer_budget`, in tokens.
    pub budget_tokens: usize,
    /// `indexer_compress_ratio`: tokens per block.
    pub block_tokens: usize,
    /// `k_layernorm`'s weight, `[head_dim]`, applied as `1 + w`.
    pub k_norm: &'a [f32],
    pub norm_eps: f32,
}

impl QsaIndexer<'_> {
    /// The blocks a query keeps: `budget / compress_ratio`.
    fn kept_blocks(&self) -> usize {
        self.budget_tokens / self.block_tokens
    }

    /// Which keys each query of `job` attends to, `[n, start + n]`: a query
    /// sees every key up to its own position (causal, no padding). Queries
    /// are independent, so they are shared out across `threads`, each
    /// computed the same way on any thread.
    pub fn select_all(&self, threads: &Threads, job: &QsaJob<'_>) -> Vec<bool> {
        let width = self.heads * self.head_dim;
        let n = job.q.len() / width;
        let keys = job.start + n;
        assert_eq!(job.q.len(), n * width, "[n, heads · head_dim] queries");
        assert_eq!(job.angles.row_count(), keys, "angles for every key position");
        let (cos, sin) = job.angles.tables();
        let half = job.angles.dim() / 2;
        let mut selected = vec![false; n * keys];
        let query = |(i, row): (usize, &mut [bool])| {
            let seen = job.start + i + 1;
            let visible = vec![true; seen];
            let q = &job.q[i * width..(i + 1) * width];
            let raw_keys = &job.raw_keys[..seen * self.head_dim];
            let chosen = self.select(q, raw_keys, &cos[..seen * half], &sin[..seen * half], &visible);
            row[..seen].copy_from_slice(&chosen);
        };
        threads.pool().install(|| selected.par_chunks_mut(keys).enumerate().for_each(query));
        selected
    }

    /// Which keys one query attends to (`[keys]`): `q` is its normed,
    /// rotated query heads (`[heads, head_dim]`), `raw_keys` every key's raw
    /// indexer key (`[keys, head_dim]`), `cos`/`sin` the half-width rotary
    /// tables at every key position (`[keys, rotary_dim / 2]`; dimensions
    /// past `rotary_dim` are not rotated), `visible` the keys the attention
    /// mask lets the query see.
    pub fn select(&self, q: &[f32], raw_keys: &[f32], cos: &[f32], sin: &[f32], visible: &[bool]) -> Vec<bool> {
        let (dim, ratio) = (self.head_dim, self.block_tokens);
        assert!(ratio > 0 && dim > 0, "blocks and heads are not empty");
        assert_eq!((q.len(), self.k_norm.len()), (self.heads * dim, dim), "[heads, head_dim] queries");
        let keys = visible.len();
        assert_eq!(raw_keys.len(), keys * dim, "a raw key per position");
        assert_eq!((cos.len(), sin.len()), (sin.len(), cos.len()), "cos and sin tables match");
        assert_eq!(cos.len() % keys.max(1), 0, "a rotary row per position");
        let half = cos.len() / keys.max(1);
        assert!(2 * half <= dim, "the rotary part fits the head");

        let seen: Vec<usize> = (0..keys).filter(|&k| visible[k]).collect();
        let (blocks, tail) = seen.split_at(seen.len() / ratio * ratio);
        let inv_sqrt_dim = 1.0 / (dim as f32).sqrt();
        let scores: Vec<f32> = blocks
            .chunks_exact(ratio)
            .map(|block| {
                let key =
                    self.pooled_key(block, raw_keys, &cos[block[0] * half..][..half], &sin[block[0] * half..][..half]);
                q.chunks_exact(dim).map(|q_h| ops::dot(q_h, &key).max(0.0)).sum::<f32>() * inv_sqrt_dim
            })
            .collect();
        let mut selected = vec![false; keys];
        for b in torch_topk(&scores, self.kept_blocks()) {
            blocks[b * ratio..(b + 1) * ratio].iter().for_each(|&k| selected[k] = true);
        }
        tail.iter().for_each(|&k| selected[k] = true);
        selected
    }

    /// A block's key: the mean of its raw keys, normed, rotated at the
    /// block's first position (whose half-width tables are `cos`, `sin`).
    fn pooled_key(&self, block: &[usize], raw_keys: &[f32], cos: &[f32], sin: &[f32]) -> Vec<f32> {
        let dim = self.head_dim;
        let mut key = vec![0.0f32; dim];
        block.iter().for_each(|&k| key.iter_mut().zip(&raw_keys[k * dim..][..dim]).for_each(|(s, &r)| *s += r));
        let tokens = block.len() as f32;
        key.iter_mut().for_each(|s| *s /= tokens);
        ops::rmsnorm_unweighted_inplace(&mut key, self.norm_eps);
        key.iter_mut().zip(self.k_norm).for_each(|(x, &w)| *x *= 1.0 + w);
        ops::rope_neox(&mut key[..2 * cos.len()], cos, sin);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::super::torch_cases::{case_dirs, load};
    use super::*;

    /// Half of each row of a `[rows, width]` table whose halves repeat (as
    /// transformers' `cat((freqs, freqs))` cos and sin).
    fn first_halves(table: &[f32], width: usize) -> Vec<f32> {
        table.chunks_exact(width).flat_map(|row| row[..width / 2].to_vec()).collect()
    }

    #[test]
    fn qsa_keeps_the_blocks_and_tail_transformers_keeps_with_ties_holes_and_any_budget() {
        for case in case_dirs("qwen4_exp/qsa", 4, "budgets below and above the prompt, ties, holes") {
            let ((q_shape, q), (_, raw_keys), (_, k_norm), (_, config)) =
                (load(&case, "q"), load(&case, "raw_keys"), load(&case, "k_norm"), load(&case, "config"));
            let [tokens, heads, head_dim] = [q_shape[0], q_shape[1], q_shape[2]];
            let indexer = QsaIndexer {
                heads,
                head_dim,
                budget_tokens: config[0] as usize,
                block_tokens: config[1] as usize,
                k_norm: &k_norm,
                norm_eps: config[2],
            };
            let ((cos_shape, cos), (_, sin)) = (load(&case, "cos"), load(&case, "sin"));
            let (cos, sin) = (first_halves(&cos, cos_shape[1]), first_halves(&sin, cos_shape[1]));
            let ((_, visible), (_, want)) = (load(&case, "visible"), load(&case, "selected"));
            for t in 0..tokens {
                let row = |table: &[f32]| table[t * tokens..(t + 1) * tokens].iter().map(|&v| v != 0.0).collect();
                let visible: Vec<bool> = row(&visible);
                let got =
                    indexer.select(&q[t * heads * head_dim..][..heads * head_dim], &raw_keys, &cos, &sin, &visible);
                let want: Vec<bool> = row(&want);
                assert_eq!(got, want, "{} query {t}", case.display());
            }
        }
    }
}
