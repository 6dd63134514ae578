//! Routers: scores over experts → each token's top-k experts and weights.

use strata_kernels::ops;
use strata_sched::Route;

/// Softmax over all experts, then the `top_k` largest, optionally renormalised
/// to sum to one (OLMoE, Qwen3-MoE, Mixtral).
///
/// `logits` is `[n_tokens, n_experts]`; the result is `[n_tokens][top_k]`
/// in descending weight order. Ties go to the lower expert index.
pub fn softmax_top_k(logits: &[f32], n_experts: usize, top_k: usize, renormalize: bool) -> Vec<Route> {
    assert!(top_k >= 1 && top_k <= n_experts, "top-k within the expert count");
    let mut routes = Vec::with_capacity(logits.len() / n_experts * top_k);
    let mut probs = vec![0.0f32; n_experts];
    let mut order: Vec<usize> = Vec::with_capacity(n_experts);
    for row in logits.chunks_exact(n_experts) {
        probs.copy_from_slice(row);
        ops::softmax_inplace(&mut probs);
        order.clear();
        order.extend(0..n_experts);
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..top_k];
        let sum: f32 = chosen.iter().map(|&e| probs[e]).sum();
        for &expert in chosen {
            let weight = if renormalize { probs[expert] / sum } else { probs[expert] };
            routes.push(Route { expert, weight });
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_and_renormalises() {
        let routes = softmax_top_k(&[0.0, 2.0, 1.0, 2.0f32.ln() + 2.0], 4, 2, true);
        assert_eq!(routes.iter().map(|r| r.expert).collect::<Vec<_>>(), vec![3, 1]);
        assert!((routes[0].weight - 2.0 / 3.0).abs() < 1e-6);
        let raw = softmax_top_k(&[0.0, 0.0], 2, 1, false);
        assert_eq!((raw[0].expert, raw[0].weight), (0, 0.5));
    }
}
