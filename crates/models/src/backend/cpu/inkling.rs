//! Inkling's operations (docs/inkling.md): the short convolution with its
//! residual, the bias by backward distance, the shared-expert sink router
//! and the shared experts it weighs.

use std::ops::Range;

use strata_kernels::{Threads, gdn, ops};
use strata_sched::Route;

use super::Cpu;
use crate::backend::{MatrixHandle, VectorHandle};

/// The shared-expert sink's constants (`InklingTopkRouter`).
#[derive(Debug, Clone, Copy)]
pub struct Sink<'a> {
    /// Gate rows after the routed experts', one per shared expert.
    pub n_shared: usize,
    pub top_k: usize,
    /// `route_scale`, then the learned `global_scale`, applied in that
    /// order as transformers multiplies.
    pub scale: [f32; 2],
    /// Added to the routed sigmoids for choosing only.
    pub bias: &'a [f32],
}

/// `InklingTopkRouter` over `logits` (`[n_tokens, n_rows]`, the routed
/// experts' rows first): the `top_k` routed experts by `sigmoid + bias`
/// (ties to the lower index), then the softmax over the log-sigmoids of
/// [their logits, the shared logits], times both scales. Returns the routes
/// (`[n_tokens][top_k]`, in choice order) and the shared experts' weights
/// (`[n_tokens, n_shared]`).
pub fn shared_expert_sink(logits: &[f32], n_rows: usize, sink: &Sink<'_>) -> (Vec<Route>, Vec<f32>) {
    assert!(sink.n_shared >= 1 && sink.n_shared < n_rows, "the sink has shared rows after routed ones");
    let n_routed = n_rows - sink.n_shared;
    assert!(sink.top_k >= 1 && sink.top_k <= n_routed, "top-k within the routed experts");
    assert_eq!(sink.bias.len(), n_routed, "one correction bias per routed expert");
    let n_tokens = logits.len() / n_rows;
    let mut routes = Vec::with_capacity(n_tokens * sink.top_k);
    let mut shares = Vec::with_capacity(n_tokens * sink.n_shared);
    let mut choice = vec![0.0f32; n_routed];
    let mut order: Vec<usize> = Vec::with_capacity(n_routed);
    let mut weights = Vec::with_capacity(sink.top_k + sink.n_shared);
    for row in logits.chunks_exact(n_rows) {
        let (routed, shared) = row.split_at(n_routed);
        for ((c, &logit), &b) in choice.iter_mut().zip(routed).zip(sink.bias) {
            *c = ops::sigmoid(logit) + b;
        }
        order.clear();
        order.extend(0..n_routed);
        order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
        let chosen = &order[..sink.top_k];
        weights.clear();
        weights.extend(chosen.iter().map(|&e| routed[e]).chain(shared.iter().copied()));
        ops::softmax_of_log_sigmoids_inplace(&mut weights);
        for w in weights.iter_mut() {
            *w = *w * sink.scale[0] * sink.scale[1];
        }
        routes.extend(chosen.iter().zip(&weights).map(|(&expert, &weight)| Route { expert, weight }));
        shares.extend_from_slice(&weights[sink.top_k..]);
    }
    (routes, shares)
}

impl Cpu {
    pub fn short_conv(&self, weight: VectorHandle, channels: usize, rows: &mut [f32], state: &mut [f32]) {
        gdn::causal_conv1d_residual(rows, channels, self.vector(weight), state);
    }

    pub fn relative_bias(&self, proj: VectorHandle, d_rel: usize, relative: &[f32]) -> Vec<f32> {
        let proj = self.vector(proj);
        assert!(d_rel > 0 && proj.len().is_multiple_of(d_rel), "proj is [d_rel, extent]");
        let extent = proj.len() / d_rel;
        let mut bias = Vec::with_capacity(relative.len() / d_rel * extent);
        for rel in relative.chunks_exact(d_rel) {
            bias.extend(
                (0..extent).map(|d| rel.iter().enumerate().map(|(j, &rj)| rj * proj[j * extent + d]).sum::<f32>()),
            );
        }
        bias
    }

    pub fn weighted_shared_experts(
        &self,
        threads: &Threads,
        [gate, up, down]: &[MatrixHandle; 3],
        xs: &[f32],
        shares: &[f32],
        out: &mut [f32],
    ) {
        let (hidden, inter) = (gate.cols, down.cols);
        let count = gate.rows / inter;
        assert!(count >= 1 && gate.rows == count * inter, "gate stacks one [intermediate, hidden] per shared expert");
        assert_eq!((up.rows, up.cols), (gate.rows, gate.cols), "up is shaped like gate");
        assert!(down.rows == count * hidden, "down stacks one [hidden, intermediate] per shared expert");
        let n = xs.len() / hidden;
        assert_eq!(shares.len(), n * count, "a share per row and shared expert");
        let block = |s: usize, width: usize| -> Range<usize> { s * width..(s + 1) * width };
        let (mut g, mut u) = (vec![0.0f32; n * inter], vec![0.0f32; n * inter]);
        let (mut y, mut sum) = (vec![0.0f32; out.len()], vec![0.0f32; out.len()]);
        for s in 0..count {
            self.matmul_rows(threads, *gate, block(s, inter), xs, &mut g);
            self.matmul_rows(threads, *up, block(s, inter), xs, &mut u);
            let row_shares = shares.iter().skip(s).step_by(count);
            for ((g_t, u_t), &share) in g.chunks_exact_mut(inter).zip(u.chunks_exact(inter)).zip(row_shares) {
                // transformers: silu(gate) · up, then times the share.
                ops::silu_mul(g_t, u_t);
                g_t.iter_mut().for_each(|v| *v *= share);
            }
            self.matmul_rows(threads, *down, block(s, hidden), &g, &mut y);
            // The experts' sum in f32, in order, before the residual.
            sum.iter_mut().zip(&y).for_each(|(acc, v)| *acc += v);
        }
        out.iter_mut().zip(&sum).for_each(|(o, v)| *o += v);
    }
}
