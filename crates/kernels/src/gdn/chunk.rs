//! The chunked form of the gated delta rule (prefill), after transformers'
//! `torch_chunk_gated_delta_rule` (qwen3_next): tokens are taken in chunks of
//! [`CHUNK_TOKENS`]; inside a chunk the recurrence is rewritten with a
//! unit lower-triangular solve (the WY / UT form), so the state is read
//! twice per token and updated once per chunk instead of read and written
//! twice per token.
//!
//! **On CPU it does not beat the recurrence at the models' sizes** (measured
//! with `examples/gdn_timing.rs`, `d_k = d_v = 128`, 512 tokens, one thread:
//! 0.54x the speed of [`super::delta_rule_recurrent`] on AVX-512, 0.8x on
//! AVX2 and scalar). The passes it saves over the state are paid back in its
//! own multiply-adds (the UT system, the solves, the intra-chunk attention),
//! and its `W S` and `q S` products still stream the state once per token:
//! winning needs a register-blocked matrix product, or a GPU. It is kept,
//! and tested against the recurrence and transformers, for parity with
//! transformers' prefill; CPU prefill should run the recurrence.
//!
//! Per chunk of `L` tokens, with `G_i = g_0 + ... + g_i` and
//! `D_ij = exp(G_i - G_j)` for `j <= i`:
//!
//! ```text
//! L_ij  = (beta_i k_i . k_j) D_ij                (j < i; 0 elsewhere)
//! U     = (I + L)^-1 (beta v)                    [L, d_v]
//! W     = (I + L)^-1 (beta exp(G) k)             [L, d_k]
//! V_new = U - W S
//! out_i = exp(G_i) q_i S + sum_{j <= i} (q_i . k_j) D_ij V_new_j
//! S     = exp(G_last) S + sum_i exp(G_last - G_i) k_i V_new_i^T
//! ```
//!
//! (transformers 5.23 `models/qwen3_next/modeling_qwen3_next.py`:370, the
//! same function as `qwen3_5_moe`'s at :282; the unit-triangular solves are
//! its `torch.linalg.solve_triangular` calls.)
//!
//! A last chunk shorter than `L` is what transformers computes on its
//! zero-padded chunk: padded tokens have `k = v = beta = g = 0` and change
//! neither the real outputs nor the state.

use super::{DeltaTokens, LogDecays};
use crate::simd::Isa;

/// Tokens per chunk, transformers' `chunk_size` default.
pub const CHUNK_TOKENS: usize = 64;

/// The gated delta rule over `tokens` for one value head in the chunked
/// form, from `state` (`[d_k, d_v]` row-major, updated to the state after
/// the last token); `out` is `[tokens, d_v]`. Agrees with
/// [`super::delta_rule_recurrent`] to rounding (within 1e-5 of the largest
/// value in the tests; see `docs/gdn.md`).
///
/// Gated DeltaNet only: Kimi Delta Attention's per-channel decay runs the
/// recurrence (docs/gdn.md says why).
///
/// # Panics
/// If the lengths do not fit the state's `d_k` and `d_v`, or the decay is
/// per channel.
pub fn delta_rule_chunked(isa: Isa, state: &mut [f32], d_v: usize, tokens: &DeltaTokens<'_>, out: &mut [f32]) {
    let (d_k, d_v) = tokens.check(state, d_v, out);
    let LogDecays::Head(g) = tokens.g else {
        panic!("delta rule: the chunked form takes one decay per head, not per channel");
    };
    let mut scratch = Scratch::new(d_k, d_v);
    let mut start = 0;
    while start < tokens.len() {
        let len = CHUNK_TOKENS.min(tokens.len() - start);
        let chunk = DeltaTokens {
            q: &tokens.q[start * d_k..(start + len) * d_k],
            k: &tokens.k[start * d_k..(start + len) * d_k],
            v: &tokens.v[start * d_v..(start + len) * d_v],
            g: LogDecays::Head(&g[start..start + len]),
            beta: &tokens.beta[start..start + len],
        };
        scratch.chunk(isa, state, &chunk, &g[start..start + len], &mut out[start * d_v..(start + len) * d_v]);
        start += len;
    }
}

/// Buffers of one chunk, allocated once per call. `[L, L]` matrices have a
/// row stride of [`CHUNK_TOKENS`].
struct Scratch {
    d_k: usize,
    d_v: usize,
    /// Cumulative log decay `G` within the chunk.
    g_cum: Vec<f32>,
    /// `-L`, the strictly lower UT system negated.
    neg_ut: Vec<f32>,
    /// `(q_i . k_j) D_ij`, `j <= i`.
    attn: Vec<f32>,
    /// `beta k`, then `beta exp(G) k`, then solved in place into `W`.
    w: Vec<f32>,
    /// `beta v`, solved in place into `U`, then `V_new`.
    u: Vec<f32>,
    /// `exp(G_last - G_i) k_i`, transposed: `[d_k, L]`.
    k_decay_t: Vec<f32>,
    /// One row of `d_k` and of `d_v` values.
    row_k: Vec<f32>,
    row_v: Vec<f32>,
}

impl Scratch {
    fn new(d_k: usize, d_v: usize) -> Self {
        let c = CHUNK_TOKENS;
        Self {
            d_k,
            d_v,
            g_cum: vec![0.0; c],
            neg_ut: vec![0.0; c * c],
            attn: vec![0.0; c * c],
            w: vec![0.0; c * d_k],
            u: vec![0.0; c * d_v],
            k_decay_t: vec![0.0; d_k * c],
            row_k: vec![0.0; d_k],
            row_v: vec![0.0; d_v],
        }
    }

    /// One chunk of `L <= CHUNK_TOKENS` tokens, `g` their per-head log
    /// decays.
    fn chunk(&mut self, isa: Isa, state: &mut [f32], tokens: &DeltaTokens<'_>, g: &[f32], out: &mut [f32]) {
        let (d_k, d_v, l, c) = (self.d_k, self.d_v, tokens.len(), CHUNK_TOKENS);
        debug_assert!((1..=c).contains(&l));
        let mut acc = 0.0f32;
        for (gc, &g) in self.g_cum.iter_mut().zip(g) {
            acc += g;
            *gc = acc;
        }
        let g_cum = &self.g_cum[..l];
        for i in 0..l {
            scaled(tokens.beta[i], &tokens.k[i * d_k..(i + 1) * d_k], &mut self.w[i * d_k..(i + 1) * d_k]);
            scaled(tokens.beta[i], &tokens.v[i * d_v..(i + 1) * d_v], &mut self.u[i * d_v..(i + 1) * d_v]);
        }

        // The UT system L_ij = (beta_i k_i . k_j) D_ij (j < i), negated so
        // the solve below is a sum of products.
        for i in 0..l {
            let row = &mut self.neg_ut[i * c..i * c + i];
            isa.dot_rows_f32(&self.w[i * d_k..(i + 1) * d_k], tokens.k, d_k, row);
            for (j, a) in row.iter_mut().enumerate() {
                *a = -(*a * (g_cum[i] - g_cum[j]).exp());
            }
        }
        for (i, &gc) in g_cum.iter().enumerate() {
            isa.scale(gc.exp(), &mut self.w[i * d_k..(i + 1) * d_k]);
        }
        // (I + L) U = beta v and (I + L) W = beta exp(G) k by forward
        // substitution, in place: row i subtracts the final rows above it
        // (transformers' `solve_triangular(..., unitriangular=True)`).
        for i in 1..l {
            let neg_row = &self.neg_ut[i * c..i * c + i];
            let (above, rest) = self.u.split_at_mut(i * d_v);
            isa.axpy_rows(neg_row, above, d_v, &mut rest[..d_v]);
            let (above, rest) = self.w.split_at_mut(i * d_k);
            isa.axpy_rows(neg_row, above, d_k, &mut rest[..d_k]);
        }

        // Intra-chunk attention (q_i . k_j) D_ij, j <= i.
        for i in 0..l {
            let row = &mut self.attn[i * c..i * c + i + 1];
            isa.dot_rows_f32(&tokens.q[i * d_k..(i + 1) * d_k], tokens.k, d_k, row);
            for (j, a) in row.iter_mut().enumerate() {
                *a *= (g_cum[i] - g_cum[j]).exp();
            }
        }

        // V_new = U - W S, in place of U; every row reads the old state.
        for i in 0..l {
            self.row_v.fill(0.0);
            isa.axpy_rows(&self.w[i * d_k..(i + 1) * d_k], state, d_v, &mut self.row_v);
            for (u, &vp) in self.u[i * d_v..(i + 1) * d_v].iter_mut().zip(&self.row_v) {
                *u -= vp;
            }
        }
        let v_new = &self.u[..l * d_v];

        // out_i = (exp(G_i) q_i) S + attn_i V_new.
        for (i, out_i) in out.chunks_exact_mut(d_v).enumerate() {
            scaled(g_cum[i].exp(), &tokens.q[i * d_k..(i + 1) * d_k], &mut self.row_k);
            out_i.fill(0.0);
            isa.axpy_rows(&self.row_k, state, d_v, out_i);
            self.row_v.fill(0.0);
            isa.axpy_rows(&self.attn[i * c..i * c + i + 1], v_new, d_v, &mut self.row_v);
            for (o, &a) in out_i.iter_mut().zip(&self.row_v) {
                *o += a;
            }
        }

        // S = exp(G_last) S + (exp(G_last - G) k)^T V_new, one state row at a
        // time.
        let g_last = g_cum[l - 1];
        for (i, &gc) in g_cum.iter().enumerate() {
            let decay = (g_last - gc).exp();
            for (r, &kr) in tokens.k[i * d_k..(i + 1) * d_k].iter().enumerate() {
                self.k_decay_t[r * c + i] = kr * decay;
            }
        }
        let chunk_decay = g_last.exp();
        for (r, s_row) in state.chunks_exact_mut(d_v).enumerate() {
            self.row_v.fill(0.0);
            isa.axpy_rows(&self.k_decay_t[r * c..r * c + l], v_new, d_v, &mut self.row_v);
            for (s, &kv) in s_row.iter_mut().zip(&self.row_v) {
                *s = *s * chunk_decay + kv;
            }
        }
    }
}

/// `out = alpha * x`.
fn scaled(alpha: f32, x: &[f32], out: &mut [f32]) {
    for (o, &xi) in out.iter_mut().zip(x) {
        *o = xi * alpha;
    }
}
