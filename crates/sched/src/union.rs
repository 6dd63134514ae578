//! Union: the distinct experts a batch of tokens needs, each with the tokens
//! routed to it.

use std::collections::BTreeMap;

/// One routing decision: token `token` sends its hidden state to `expert`
/// with weight `weight`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// Groups a batch's routes by expert, in ascending expert order.
///
/// `routes` is `[n_tokens][top_k]` flattened. The result maps each distinct
/// expert to the `(token, slot)` pairs routed to it, where `slot` is the
/// index into `routes`, so every distinct expert is read at most once per
/// layer per batch.
pub fn union(routes: &[Route], top_k: usize) -> BTreeMap<usize, Vec<(usize, usize)>> {
    assert!(top_k > 0 && routes.len().is_multiple_of(top_k), "routes are [n_tokens][top_k]");
    let mut by_expert: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
    for (slot, route) in routes.iter().enumerate() {
        by_expert.entry(route.expert).or_default().push((slot / top_k, slot));
    }
    by_expert
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_distinct_expert_appears_once_with_all_its_tokens() {
        let r = |expert| Route { expert, weight: 0.5 };
        let routes = [r(3), r(1), r(1), r(0), r(3), r(2)];
        let groups = union(&routes, 2);
        assert_eq!(groups.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(groups[&1], vec![(0, 1), (1, 2)]);
        assert_eq!(groups[&3], vec![(0, 0), (2, 4)]);
    }
}
