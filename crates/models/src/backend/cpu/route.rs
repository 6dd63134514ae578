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

/// The `top_k` largest logits, then a softmax over those alone (gpt-oss's
/// `GptOssTopKRouter`, its bias already in the logits).
///
/// `logits` is `[n_tokens, n_experts]`; the result is `[n_tokens][top_k]`
/// in descending weight order. Ties go to the lower expert index.
pub fn top_k_then_softmax(logits: &[f32], n_experts: usize, top_k: usize) -> Vec<Route> {
    assert!(top_k >= 1 && top_k <= n_experts, "top-k within the expert count");
    let mut routes = Vec::with_capacity(logits.len() / n_experts * top_k);
    let mut order: Vec<usize> = Vec::with_capacity(n_experts);
    let mut weights = vec![0.0f32; top_k];
    for row in logits.chunks_exact(n_experts) {
        order.clear();
        order.extend(0..n_experts);
        order.sort_by(by_score(row));
        for (w, &expert) in weights.iter_mut().zip(&order) {
            *w = row[expert];
        }
        ops::softmax_inplace(&mut weights);
        routes.extend(order.iter().zip(&weights).map(|(&expert, &weight)| Route { expert, weight }));
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

/// DeepSeek V4's router (`DeepseekV4TopKRouter`): scores
/// `s = sqrt(softplus(logit))` (softplus as torch's: the logit itself above
/// 20), the `top_k` best by `s + bias` taken with weights `s` renormalised
/// (plus 1e-20) and times `scaling`.
///
/// `logits` is `[n_tokens, n_experts]`; the result is `[n_tokens][top_k]` in
/// descending choice-score order. Ties go to the lower index.
pub fn sqrt_softplus_top_k(logits: &[f32], n_experts: usize, top_k: usize, scaling: f32, bias: &[f32]) -> Vec<Route> {
    assert!(top_k >= 1 && top_k <= n_experts, "top-k within the expert count");
    assert_eq!(bias.len(), n_experts, "one correction bias per expert");
    let mut routes = Vec::with_capacity(logits.len() / n_experts * top_k);
    let mut scores = vec![0.0f32; n_experts];
    let mut choice = vec![0.0f32; n_experts];
    let mut order: Vec<usize> = Vec::with_capacity(n_experts);
    for row in logits.chunks_exact(n_experts) {
        for ((s, c), (&logit, &b)) in scores.iter_mut().zip(choice.iter_mut()).zip(row.iter().zip(bias)) {
            *s = softplus(logit).sqrt();
            *c = *s + b;
        }
        order.clear();
        order.extend(0..n_experts);
        order.sort_by(by_score(&choice));
        weigh_sqrt_softplus(&scores, &order[..top_k], scaling, &mut routes);
    }
    routes
}

/// DeepSeek V4's hash router (`DeepseekV4HashRouter`): token `t`'s experts
/// are row `t` of `table` (`[vocab, top_k]`, ids checked at load), weighted
/// by their scores `sqrt(softplus(logit))` renormalised (plus 1e-20) and
/// times `scaling`, in the table's order.
///
/// `logits` is `[n_tokens, n_experts]`, one row per id of `tokens`.
pub fn hash_routes(
    logits: &[f32],
    n_experts: usize,
    top_k: usize,
    scaling: f32,
    table: &[f32],
    tokens: &[u32],
) -> Vec<Route> {
    assert_eq!(logits.len(), tokens.len() * n_experts, "a row of logits per token");
    let mut chosen = vec![0usize; top_k];
    let mut routes = Vec::with_capacity(tokens.len() * top_k);
    let mut scores = vec![0.0f32; n_experts];
    for (row, &token) in logits.chunks_exact(n_experts).zip(tokens) {
        scores.iter_mut().zip(row).for_each(|(s, &logit)| *s = softplus(logit).sqrt());
        // Ids checked at load: whole numbers below the expert count.
        let ids = &table[token as usize * top_k..][..top_k];
        chosen.iter_mut().zip(ids).for_each(|(e, &id)| *e = id as usize);
        weigh_sqrt_softplus(&scores, &chosen, scaling, &mut routes);
    }
    routes
}

/// Routes to the `chosen` experts, weighted by their `scores` renormalised
/// (plus 1e-20, as transformers) and times `scaling`.
fn weigh_sqrt_softplus(scores: &[f32], chosen: &[usize], scaling: f32, routes: &mut Vec<Route>) {
    let denominator = chosen.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20;
    routes.extend(chosen.iter().map(|&expert| Route { expert, weight: scores[expert] / denominator * scaling }));
}

/// torch's `softplus` (beta 1, threshold 20): `ln(1 + e^x)`, or `x` where
/// that is `x` to f32 precision.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_then_softmax_weighs_only_the_chosen_logits() {
        // Softmax over all four would give expert 3 about 0.6; over the two
        // chosen it is sigmoid(1), and the other two take no share.
        let routes = top_k_then_softmax(&[0.5, 1.0, -2.0, 2.0, 0.0, 3.0, 3.0, 1.0], 4, 2);
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert_eq!(routes.iter().map(|r| r.expert).collect::<Vec<_>>(), vec![3, 1, 1, 2]);
        assert!((routes[0].weight - s(1.0)).abs() < 1e-6 && (routes[1].weight - s(-1.0)).abs() < 1e-6);
        assert_eq!((routes[2].weight, routes[3].weight), (0.5, 0.5), "a tie: both chosen, equal weights");
    }

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

    /// transformers' `DeepseekV4TopKRouter` on the fixture's logits
    /// (xtask/fixtures/deepseek_v4_blocks.py: 4 experts, top 2, scaling 1.5,
    /// two rows past softplus's threshold): the same experts, the same
    /// weights.
    #[test]
    fn sqrt_softplus_routes_match_transformers() {
        let load = |name: &str| crate::backend::cpu::fixture("deepseek_v4/blocks", name);
        let (logits_shape, logits) = load("router_logits");
        let (bias, want_weights) = (load("router_bias").1, load("router_weights").1);
        let want_experts = load("router_indices").1;
        let (n_experts, top_k) = (logits_shape[1], 2);
        let routes = sqrt_softplus_top_k(&logits, n_experts, top_k, 1.5, &bias);
        let by_expert = |pairs: Vec<(usize, f32)>| {
            let mut pairs = pairs;
            pairs.sort_by_key(|&(expert, _)| expert);
            pairs
        };
        for (t, (got, (experts, weights))) in routes
            .chunks_exact(top_k)
            .zip(want_experts.chunks_exact(top_k).zip(want_weights.chunks_exact(top_k)))
            .enumerate()
        {
            let got = by_expert(got.iter().map(|r| (r.expert, r.weight)).collect());
            let want = by_expert(experts.iter().map(|&e| e as usize).zip(weights.iter().copied()).collect());
            for ((e, w), (want_e, want_w)) in got.into_iter().zip(want) {
                assert_eq!(e, want_e, "token {t}");
                assert!((w - want_w).abs() <= 1e-6 * want_w.abs().max(1.0), "token {t}: {w} vs torch's {want_w}");
            }
        }
    }

    /// transformers' `DeepseekV4HashRouter` on the fixture's logits and
    /// tokens: each token's experts are its row of the table, weighted as
    /// the learned router weighs them.
    #[test]
    fn hash_routes_take_each_tokens_row_of_the_table_as_transformers() {
        let load = |name: &str| crate::backend::cpu::fixture("deepseek_v4/blocks", name).1;
        let (logits, table, tokens) = (load("hash_logits"), load("hash_table"), load("hash_tokens"));
        let (want_experts, want_weights) = (load("hash_indices"), load("hash_weights"));
        let tokens: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let (n_experts, top_k) = (logits.len() / tokens.len(), 2);
        let routes = hash_routes(&logits, n_experts, top_k, 1.5, &table, &tokens);
        assert_eq!(routes.len(), want_experts.len());
        for (i, (route, (&expert, &weight))) in routes.iter().zip(want_experts.iter().zip(&want_weights)).enumerate() {
            assert_eq!(route.expert, expert as usize, "route {i}");
            assert!(
                (route.weight - weight).abs() <= 1e-6 * weight.abs().max(1.0),
                "route {i}: {} vs {weight}",
                route.weight
            );
        }
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
