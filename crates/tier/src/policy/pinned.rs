//! A hot set pinned from learned usage, LRU for everything else.
//!
//! Pinned keys are not loaded ahead of use: a pinned key becomes resident the
//! first time it is used, like any other, and from then on is never a victim.
//! This keeps the policy a pure ordering (the store still decides what to
//! read) while giving the hot set a guaranteed place, so a burst of cold
//! experts cannot flush the experts that most tokens route to.

use std::collections::HashSet;

use super::Policy;
use super::lru::RecencyLists;
use crate::ExpertKey;

/// The resident keys that may be evicted, in LRU order.
const UNPINNED: usize = 0;

#[derive(Debug, Clone)]
pub struct Pinned {
    pinned: HashSet<ExpertKey>,
    resident_pinned: HashSet<ExpertKey>,
    unpinned: RecencyLists,
}

impl Pinned {
    /// A policy that never evicts a resident key of `pinned`. The caller
    /// bounds its size (`new_policy` takes the top keys of the usage).
    pub fn new(pinned: impl IntoIterator<Item = ExpertKey>) -> Self {
        Self { pinned: pinned.into_iter().collect(), resident_pinned: HashSet::new(), unpinned: RecencyLists::new(1) }
    }

    /// Whether `key` is in the hot set (resident or not).
    pub fn is_pinned(&self, key: ExpertKey) -> bool {
        self.pinned.contains(&key)
    }

    /// Resident keys, pinned or not.
    pub fn len(&self) -> usize {
        self.resident_pinned.len() + self.unpinned.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Policy for Pinned {
    fn on_hit(&mut self, key: ExpertKey) {
        if !self.pinned.contains(&key) {
            let resident = self.unpinned.move_to_front(UNPINNED, key);
            debug_assert!(resident, "hit on {key:?}, which is not resident");
        }
    }

    fn on_insert(&mut self, key: ExpertKey) {
        if self.pinned.contains(&key) {
            self.resident_pinned.insert(key);
        } else {
            self.unpinned.push_front(UNPINNED, key);
        }
    }

    fn on_remove(&mut self, key: ExpertKey) {
        // The store may still drop a pinned key (e.g. when it is cleared).
        if !self.resident_pinned.remove(&key) {
            self.unpinned.remove(key);
        }
    }

    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        self.unpinned.back_unleased(UNPINNED, leased)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{key, no_lease};

    #[test]
    fn pinned_keys_are_never_victims() {
        let mut policy = Pinned::new([key(0, 0), key(1, 3)]);
        policy.on_insert(key(0, 0));
        policy.on_insert(key(1, 3));
        assert_eq!(policy.victim(&no_lease), None, "only pinned keys are resident");
        policy.on_insert(key(0, 1));
        policy.on_insert(key(0, 2));
        // The pinned keys are the oldest, yet the victims are the unpinned.
        assert_eq!(policy.victim(&no_lease), Some(key(0, 1)));
        policy.on_hit(key(0, 1));
        policy.on_hit(key(0, 0));
        assert_eq!(policy.victim(&no_lease), Some(key(0, 2)));
        policy.on_remove(key(0, 2));
        policy.on_remove(key(0, 1));
        assert_eq!(policy.victim(&no_lease), None);
        assert_eq!(policy.len(), 2);
        assert!(policy.is_pinned(key(1, 3)) && !policy.is_pinned(key(0, 1)));
    }

    #[test]
    fn unpinned_rest_is_lru_and_skips_leases() {
        let mut policy = Pinned::new([key(0, 9)]);
        for e in 0..3 {
            policy.on_insert(key(0, e));
        }
        policy.on_hit(key(0, 0));
        assert_eq!(policy.victim(&no_lease), Some(key(0, 1)));
        assert_eq!(policy.victim(&|k| k.expert == 1), Some(key(0, 2)));
        assert_eq!(policy.victim(&|k| k.expert != 9), None);
    }

    #[test]
    fn a_removed_pinned_key_can_return() {
        let mut policy = Pinned::new([key(0, 0)]);
        policy.on_insert(key(0, 0));
        policy.on_remove(key(0, 0));
        assert!(policy.is_empty());
        policy.on_insert(key(0, 0));
        policy.on_insert(key(0, 1));
        assert_eq!(policy.victim(&no_lease), Some(key(0, 1)));
    }
}
