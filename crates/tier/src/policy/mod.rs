//! Cache placement policies: which resident expert to evict next.
//!
//! A policy only orders keys; the store owns the records, the byte budget and
//! the leases, and tells the policy what happened through [`Policy`]. Every
//! policy is chosen by `--cache-policy`:
//!
//! - `lru` ([`Lru`], `PolicyKind::default()`): evict the key used longest ago.
//! - `lfru` ([`Lfru`]): frequency classes with recency inside each class and
//!   periodic ageing; see `lfru.rs` for the exact algorithm and why.
//! - `pinned` ([`Pinned`]): the hottest keys of the learned usage never leave
//!   once resident; LRU for the rest.
//! - `predict` ([`Predict`]): evicts the key whose next use, predicted from
//!   learned routing transitions, is farthest ahead, and declines to cache a
//!   miss predicted to return later than its victim; see `predict.rs`. The
//!   command-line default (`strata_engine::args`), as it measures best on
//!   the demo model's real decode trace (docs/BENCHMARKS.md).
//!
//! [`Belady`] is not selectable: it needs the future, and exists so that trace
//! replay can show how far each online policy is from the optimum.

mod belady;
mod lfru;
mod lru;
mod pinned;
mod predict;

use std::fmt;
use std::str::FromStr;

pub use belady::Belady;
pub use lfru::Lfru;
pub use lru::Lru;
pub use pinned::Pinned;
pub use predict::Predict;

use crate::{Error, ExpertKey, Result, Usage};

/// The policies `--cache-policy` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PolicyKind {
    #[default]
    Lru,
    Lfru,
    Pinned,
    Predict,
}

impl PolicyKind {
    /// Every kind, in the order help text lists them.
    pub const ALL: [PolicyKind; 4] = [PolicyKind::Lru, PolicyKind::Lfru, PolicyKind::Pinned, PolicyKind::Predict];

    /// The name `--cache-policy` takes.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Lfru => "lfru",
            PolicyKind::Pinned => "pinned",
            PolicyKind::Predict => "predict",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let wanted = text.trim().to_ascii_lowercase();
        PolicyKind::ALL.into_iter().find(|kind| kind.name() == wanted).ok_or_else(|| Error::UnknownPolicy {
            name: text.to_owned(),
            expected: PolicyKind::ALL.map(PolicyKind::name).join(", "),
        })
    }
}

/// Eviction order over resident keys.
///
/// All operations are O(1) (amortised), except [`Policy::victim`], which also
/// costs one step per leased (or pinned) key it skips (`predict` also pays
/// per layer and per event; `predict.rs` gives its costs). The caller keeps the
/// residency: it calls `on_insert` only for a key that is not resident,
/// `on_hit` only for one that is, and `on_remove` when it evicts (or drops) a
/// key. `victim` proposes; it changes nothing until `on_remove` follows.
pub trait Policy: Send {
    /// A resident key was used.
    fn on_hit(&mut self, key: ExpertKey);
    /// `key` became resident (it was used and missed). The caller guarantees
    /// it was not resident already.
    fn on_insert(&mut self, key: ExpertKey);
    /// `key` left the cache.
    fn on_remove(&mut self, key: ExpertKey);
    /// The key to evict next among resident ones for which `leased(key)` is
    /// false; `None` if every resident key is leased (or pinned).
    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey>;
    /// `key` missed and was served without being cached (no victim could be
    /// evicted, or the policy chose not to cache it). Most policies ignore
    /// it; the offline [`Belady`] uses it to keep its place in the trace.
    fn on_bypass(&mut self, key: ExpertKey) {
        let _ = key;
    }
    /// `key` was looked up and is not resident; `on_insert` or `on_bypass`
    /// follows once it is read. Lets a policy see a whole layer's routing
    /// before its first eviction; most ignore it.
    fn on_miss(&mut self, key: ExpertKey) {
        let _ = key;
    }
    /// Whether the missing `key` should be cached at the cost of evicting
    /// `victim` (just proposed by [`Policy::victim`]). Declining serves the
    /// key uncached. Most policies always admit.
    fn admits(&mut self, key: ExpertKey, victim: ExpertKey) -> bool {
        let _ = (key, victim);
        true
    }
}

/// The online policy `kind`.
///
/// `usage` is what earlier runs learned: `pinned` takes the top
/// `pinned_max` keys by count (ties: lower layer, then lower expert) as its
/// hot set, and `predict` learns the transitions of its routing events.
/// `pinned_max` is how many records the hot set may hold; the caller
/// gives e.g. half the cache capacity in records. `experts` is the most
/// routed experts any layer has; `predict` sizes its tables by it (and
/// skips events naming an expert past it).
pub fn new_policy(kind: PolicyKind, usage: &Usage, pinned_max: usize, experts: usize) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Lru => Box::new(Lru::new()),
        PolicyKind::Lfru => Box::new(Lfru::new()),
        PolicyKind::Pinned => Box::new(Pinned::new(usage.top(pinned_max))),
        PolicyKind::Predict => {
            let mut predict = Predict::new(experts);
            predict.learn(usage.routing().filter(|(_, event)| event.iter().all(|&expert| expert < experts)));
            Box::new(predict)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn key(layer: usize, expert: usize) -> ExpertKey {
        ExpertKey { layer, expert }
    }

    pub(crate) fn no_lease(_: ExpertKey) -> bool {
        false
    }

    #[test]
    fn kinds_parse_print_and_default_to_lru() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.to_string().parse::<PolicyKind>().unwrap(), kind);
        }
        assert_eq!(" LFRU ".parse::<PolicyKind>().unwrap(), PolicyKind::Lfru);
        assert_eq!(PolicyKind::default(), PolicyKind::Lru);
        let err = "mru".parse::<PolicyKind>().unwrap_err().to_string();
        assert!(err.contains("\"mru\"") && err.contains("lru, lfru, pinned, predict"), "{err}");
    }

    #[test]
    fn predict_starts_from_the_routing_a_usage_kept() {
        // Earlier runs: at layer 0, expert 1 always followed expert 0.
        let mut usage = Usage::default();
        for token in 0..40 {
            usage.record_routing(0, &[token % 2]);
        }
        let mut policy = new_policy(PolicyKind::Predict, &usage, 0, 4);
        for expert in [1, 3, 0] {
            policy.on_miss(key(0, expert));
            policy.on_insert(key(0, expert));
        }
        // The event in progress used 0, so 1 comes next: 3 goes first.
        assert_eq!(policy.victim(&|k| k.expert == 0), Some(key(0, 3)));
        // An event naming an expert past the policy's tables is skipped.
        usage.record_routing(0, &[9]);
        new_policy(PolicyKind::Predict, &usage, 0, 4);
    }

    #[test]
    fn new_policy_builds_each_kind() {
        let mut usage = Usage::default();
        for _ in 0..3 {
            usage.record(key(0, 7));
        }
        usage.record(key(0, 1));
        for kind in PolicyKind::ALL {
            let mut policy = new_policy(kind, &usage, 1, 8);
            policy.on_insert(key(0, 7));
            policy.on_insert(key(0, 1));
            policy.on_hit(key(0, 7));
            let victim = policy.victim(&no_lease);
            assert!(victim.is_some(), "{kind}");
            if kind == PolicyKind::Pinned {
                // The hottest learned key is pinned, whatever its recency.
                assert_eq!(victim, Some(key(0, 1)));
            }
        }
    }
}
