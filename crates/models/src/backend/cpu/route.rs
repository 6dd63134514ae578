//! The router kinds: logits over experts → each token's top-k experts and
//! weights.

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

/// The DeepSeek-V3 router's parameters (`noaux_tc`).
#[derive(Debug, Clone, Copy)]
pub struct GroupedSigmoid<'a> {
    pub n_group: usize,
    pub topk_group: usize,
    pub top_k: usize,
    /// Divide the chosen weights by their sum (plus 1e-20).
    pub normalize: bool,
    /// Multiplies the final weights (`routed_scaling_factor`).
    pub scaling: f32,
    /// Added to the scores for choosing, not for weighting
    /// (`e_score_correction_bias`).
    pub bias: &'a [f32],
}

/// Orders indices by descending `v`, ties to the lower index.
fn by_score(v: &[f32]) -> impl Fn(&usize, &usize) -> std::cmp::Ordering + '_ {
    move |&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b))
}

/// Sigmoid scores, group-limited top-k (DeepseekV3TopkRouter):
/// `s = sigmoid(logit)`, choice scores `s + bias`; groups of consecutive
/// experts are ranked by the sum of their two best choice scores and only
/// the `topk_group` best stay eligible; the `top_k` best eligible experts
/// are taken with weights `s` (not `s + bias`), optionally renormalised,
/// times `scaling`.
///
/// `logits` is `[n_tokens, n_experts]`; the result is `[n_tokens][top_k]` in
/// descending choice-score order. Ties go to the lower index.
pub fn grouped_sigmoid_top_k(logits: &[f32], n_experts: usize, cfg: &GroupedSigmoid<'_>) -> Vec<Route> {
    let per_group = n_experts / cfg.n_group;
    assert!(per_group >= 2 && per_group * cfg.n_group == n_experts, "groups of at least two experts");
    assert!(cfg.topk_group <= cfg.n_group && cfg.top_k <= cfg.topk_group * per_group, "enough eligible experts");
    assert_eq!(cfg.bias.len(), n_experts, "one correction bias per expert");
    let mut routes = Vec::with_capacity(logits.len() / n_experts * cfg.top_k);
    let mut scores = vec![0.0f32; n_experts];
    let mut choice = vec![0.0f32; n_experts];
    let mut group_scores = vec![0.0f32; cfg.n_group];
    for row in logits.chunks_exact(n_experts) {
        for ((s, c), (&logit, &b)) in scores.iter_mut().zip(choice.iter_mut()).zip(row.iter().zip(cfg.bias)) {
            *s = ops::sigmoid(logit);
            *c = *s + b;
        }
        for (g, group) in group_scores.iter_mut().zip(choice.chunks_exact(per_group)) {
            let mut order: Vec<usize> = (0..per_group).collect();
            order.sort_by(by_score(group));
            *g = group[order[0]] + group[order[1]];
        }
        let mut groups: Vec<usize> = (0..cfg.n_group).collect();
        groups.sort_by(by_score(&group_scores));
        let mut eligible: Vec<usize> =
            groups[..cfg.topk_group].iter().flat_map(|&g| g * per_group..(g + 1) * per_group).collect();
        eligible.sort_by(by_score(&choice));
        let chosen = &eligible[..cfg.top_k];
        let denominator = if cfg.normalize { chosen.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20 } else { 1.0 };
        for &expert in chosen {
            let weight = if cfg.normalize { scores[expert] / denominator } else { scores[expert] };
            routes.push(Route { expert, weight: weight * cfg.scaling });
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_sigmoid_limits_groups_and_weights_by_raw_scores() {
        // Four experts in two groups. The bias makes expert 3 (group 1)
        // look best, but group 0's two best sum higher, so only group 0 is
        // eligible with topk_group 1.
        let logits = [2.0, 1.0, -3.0, 0.0];
        let bias = [0.0, 0.0, 0.0, 0.9];
        let cfg = GroupedSigmoid { n_group: 2, topk_group: 1, top_k: 2, normalize: true, scaling: 2.0, bias: &bias };
        let routes = grouped_sigmoid_top_k(&logits, 4, &cfg);
        assert_eq!(routes.iter().map(|r| r.expert).collect::<Vec<_>>(), vec![0, 1]);
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        let sum = s(2.0) + s(1.0);
        assert!((routes[0].weight - 2.0 * s(2.0) / sum).abs() < 1e-6);
        // With both groups eligible the biased expert 3 wins first place;
        // its weight is its raw sigmoid score.
        let cfg = GroupedSigmoid { topk_group: 2, normalize: false, scaling: 1.0, ..cfg };
        let routes = grouped_sigmoid_top_k(&logits, 4, &cfg);
        assert_eq!((routes[0].expert, routes[0].weight), (3, 0.5));
    }

    #[test]
    fn picks_the_largest_and_renormalises() {
        let routes = softmax_top_k(&[0.0, 2.0, 1.0, 2.0f32.ln() + 2.0], 4, 2, true);
        assert_eq!(routes.iter().map(|r| r.expert).collect::<Vec<_>>(), vec![3, 1]);
        assert!((routes[0].weight - 2.0 / 3.0).abs() < 1e-6);
        let raw = softmax_top_k(&[0.0, 0.0], 2, 1, false);
        assert_eq!((raw[0].expert, raw[0].weight), (0, 0.5));
    }
}
