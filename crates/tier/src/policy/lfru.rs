//! LFRU: least-frequently-used by frequency *class*, least-recently-used
//! within a class, with ageing.
//!
//! # Algorithm
//!
//! - Every use of a key (a hit, or the miss that inserts it) adds one to its
//!   count. Counts outlive residency: an evicted key that comes back resumes
//!   its count instead of starting cold. The history is bounded by the
//!   model's routed experts (layers × experts), and ageing drops keys whose
//!   count falls to zero.
//! - A resident key sits in the list of its class, `class(count) = bit length
//!   of count` (0 → 0, 1 → 1, 2–3 → 2, 4–7 → 3, …), at the most recent end
//!   whenever it is used. The victim is the least recently used key of the
//!   lowest non-empty class (skipping leased keys): frequency decides between
//!   classes, recency within one.
//! - Ageing: after every `AGEING_PERIOD_PER_RESIDENT × max(resident keys seen,
//!   MIN_RESIDENT)` uses, every count is halved. Halving lowers every class by
//!   exactly one, so the lists are relabelled (classes 0 and 1 merge in
//!   recency order) in O(resident keys): O(1) amortised per use.
//!
//! # Why this and not segmented LRU
//!
//! MoE routing traces walk the layers in a cycle: every token touches each
//! layer's top-k experts once, so the distance between two uses of an expert
//! is at least one whole token's worth of other experts. A cache holding less
//! than the working set of a few tokens sees that cycle as a scan, and LRU —
//! and segmented LRU, whose promotion needs a second hit *while* on probation
//! — lose everything to it. Routing is also heavily skewed: a small share of
//! each layer's experts serves most tokens. Counting across evictions lets the
//! skew show even when reuse distances exceed the cache, and ranking new keys
//! (class 1) below established ones makes the scan evict itself rather than
//! the hot set. Log-sized classes keep recency in charge between keys of
//! similar popularity (the temporal locality across neighbouring tokens), and
//! ageing lets the hot set follow a change of topic. On synthetic skewed,
//! locality-bearing traces (see the `lfru_beats_lru_on_skewed_cyclic_traces`
//! test and `strata trace replay`) it is consistently closer to Belady's
//! optimum than LRU or segmented LRU.
//!
//! Everything is O(1): 65 class lists in one slab (`RecencyLists`), a count
//! map, and a scan of at most 65 list heads per victim.

use std::collections::HashMap;

use super::Policy;
use super::lru::RecencyLists;
use crate::ExpertKey;

/// Classes 0..=64: the bit lengths of a `u64` count.
const NUM_CLASSES: usize = 65;

/// The list holding the privileged (recency) partition.
const WINDOW: usize = NUM_CLASSES;

/// Counts halve after this many uses per resident key. Long enough that a
/// key's class reflects many tokens of routing, short enough that a change
/// of topic reshapes the hot set within a few hundred tokens.
const AGEING_PERIOD_PER_RESIDENT: u64 = 16;

/// A floor on the ageing period, so a nearly empty cache does not age on
/// every few uses.
const MIN_RESIDENT: u64 = 64;

fn class(count: u64) -> usize {
    (u64::BITS - count.leading_zeros()) as usize
}

#[derive(Debug, Clone)]
pub struct Lfru {
    /// Decayed use counts of every key seen recently, resident or not.
    counts: HashMap<ExpertKey, u64>,
    /// Resident keys, one list per class, each in recency order.
    classes: RecencyLists,
    uses_since_ageing: u64,
    /// The most keys ever resident at once; sets the ageing period.
    max_resident: u64,
    ageing_period_per_resident: u64,
    /// Share of resident keys in the privileged partition, in percent.
    pub(crate) window_percent: usize,
    /// Whether a hit in the frequency partition moves the key back into the window.
    pub(crate) promote: bool,
    pub(crate) adapt_period: u64,
    pub(crate) step: isize,
    pub(crate) max_window: usize,
    period_hits: u64,
    period_uses: u64,
    last_rate: f64,
}

impl Lfru {
    pub fn new() -> Self {
        Self::with_ageing(AGEING_PERIOD_PER_RESIDENT)
    }

    /// Counts halve every `period_per_resident × max(resident, 64)` uses.
    pub fn with_ageing(period_per_resident: u64) -> Self {
        Self {
            counts: HashMap::new(),
            classes: RecencyLists::new(NUM_CLASSES + 1),
            uses_since_ageing: 0,
            max_resident: 0,
            ageing_period_per_resident: period_per_resident.max(1),
            window_percent: 0,
            promote: false,
            adapt_period: 0,
            step: 5,
            max_window: 80,
            period_hits: 0,
            period_uses: 0,
            last_rate: 0.0,
        }
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.classes.len() == 0
    }

    /// The decayed use count of `key` (0 if unseen or aged out).
    pub fn count(&self, key: ExpertKey) -> u64 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// Counts one use of `key` and returns its class after it.
    fn count_use(&mut self, key: ExpertKey) -> usize {
        let count = self.counts.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        class(*count)
    }

    fn adapt(&mut self, hit: bool) {
        if self.adapt_period == 0 {
            return;
        }
        self.period_hits += hit as u64;
        self.period_uses += 1;
        if self.period_uses >= self.adapt_period * self.max_resident.max(MIN_RESIDENT) {
            let rate = self.period_hits as f64 / self.period_uses as f64;
            if rate < self.last_rate {
                self.step = -self.step;
            }
            self.last_rate = rate;
            self.window_percent = (self.window_percent as isize + self.step).clamp(0, self.max_window as isize) as usize;
            self.period_hits = 0;
            self.period_uses = 0;
        }
    }

    fn after_use(&mut self) {
        self.max_resident = self.max_resident.max(self.classes.len() as u64);
        self.uses_since_ageing += 1;
        let period = self.ageing_period_per_resident.saturating_mul(self.max_resident.max(MIN_RESIDENT));
        if self.uses_since_ageing >= period {
            self.age();
        }
    }

    /// Halves every count. Halving lowers the class of every nonzero count
    /// by exactly one, so the lists shift down a class (0 and 1 merge).
    fn age(&mut self) {
        self.uses_since_ageing = 0;
        let classes = &self.classes;
        self.counts.retain(|&key, count| {
            *count /= 2;
            *count > 0 || classes.list_of(key).is_some()
        });
        self.classes.relabel(|class| if class == WINDOW { WINDOW } else { class.saturating_sub(1) });
        debug_assert!(
            self.counts.iter().all(|(&key, &count)| self.classes.list_of(key).is_none_or(|list| list == WINDOW || list == class(count)))
        );
    }
}

impl Default for Lfru {
    fn default() -> Self {
        Self::new()
    }
}

impl Lfru {
    fn demote_overflow(&mut self) {
        let max_window = self.classes.len() * self.window_percent / 100;
        while self.classes.list_len(WINDOW) > max_window {
            let key = self.classes.back(WINDOW).expect("non-empty window");
            let class = class(self.count(key));
            self.classes.move_to_front(class, key);
        }
    }
}

impl Policy for Lfru {
    fn on_hit(&mut self, key: ExpertKey) {
        let class = self.count_use(key);
        let in_window = self.classes.list_of(key) == Some(WINDOW);
        let list = if in_window || (self.promote && self.window_percent > 0) { WINDOW } else { class };
        let resident = self.classes.move_to_front(list, key);
        debug_assert!(resident, "hit on {key:?}, which is not resident");
        self.demote_overflow();
        self.adapt(true);
        self.after_use();
    }

    fn on_insert(&mut self, key: ExpertKey) {
        let class = self.count_use(key);
        let list = if self.window_percent > 0 || self.adapt_period > 0 { WINDOW } else { class };
        self.classes.push_front(list, key);
        self.demote_overflow();
        self.adapt(false);
        self.after_use();
    }

    fn on_remove(&mut self, key: ExpertKey) {
        // The count stays: it is history, not residency.
        self.classes.remove(key);
    }

    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        (0..NUM_CLASSES)
            .filter(|&class| self.classes.list_len(class) > 0)
            .find_map(|class| self.classes.back_unleased(class, leased))
            .or_else(|| self.classes.back_unleased(WINDOW, leased))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{key, no_lease};

    #[test]
    fn classes_are_bit_lengths() {
        assert_eq!([0, 1, 2, 3, 4, 7, 8, u64::MAX].map(class), [0, 1, 2, 2, 3, 3, 4, 64]);
    }

    #[test]
    fn evicts_the_least_recent_of_the_lowest_class() {
        let mut lfru = Lfru::new();
        for e in 0..4 {
            lfru.on_insert(key(0, e));
        }
        // 0 used 4 times (class 3), 1 twice (class 2), 2 and 3 once (class 1).
        for _ in 0..3 {
            lfru.on_hit(key(0, 0));
        }
        lfru.on_hit(key(0, 1));
        // Class 1 goes first, oldest first: 2, then 3.
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 2)));
        lfru.on_remove(key(0, 2));
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 3)));
        lfru.on_remove(key(0, 3));
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 1)));
        // Within a class, recency decides: 1 reaches count 3 (still class 2)
        // and a new key 5 climbs to class 2 after it.
        lfru.on_hit(key(0, 1));
        lfru.on_insert(key(0, 5));
        lfru.on_hit(key(0, 5));
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 1)));
    }

    #[test]
    fn counts_survive_eviction() {
        let mut lfru = Lfru::new();
        lfru.on_insert(key(0, 0));
        lfru.on_hit(key(0, 0));
        lfru.on_hit(key(0, 0));
        lfru.on_remove(key(0, 0));
        lfru.on_insert(key(0, 1));
        lfru.on_insert(key(0, 0));
        assert_eq!(lfru.count(key(0, 0)), 4);
        // The returning key keeps its class; the newer cold one goes first.
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 1)));
    }

    #[test]
    fn skips_leased_keys_across_classes() {
        let mut lfru = Lfru::new();
        lfru.on_insert(key(0, 0));
        lfru.on_insert(key(0, 1));
        lfru.on_hit(key(0, 1));
        assert_eq!(lfru.victim(&|k| k.expert == 0), Some(key(0, 1)));
        assert_eq!(lfru.victim(&|_| true), None);
    }

    #[test]
    fn ageing_halves_counts_and_lets_a_new_hot_set_in() {
        let mut lfru = Lfru::with_ageing(1);
        // Period = 1 × max(resident, 64) = 64 uses.
        lfru.on_insert(key(0, 0));
        for _ in 0..39 {
            lfru.on_hit(key(0, 0));
        }
        lfru.on_insert(key(0, 1));
        for _ in 0..23 {
            lfru.on_hit(key(0, 1));
        }
        // 64 uses: aged once, 40 → 20 and 24 → 12.
        assert_eq!((lfru.count(key(0, 0)), lfru.count(key(0, 1))), (20, 12));
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 1)));
        // Key 1 stays hot while key 0 goes quiet; a few periods later key 0
        // has decayed below it and is the victim.
        for _ in 0..3 * 64 {
            lfru.on_hit(key(0, 1));
        }
        assert!(lfru.count(key(0, 0)) < lfru.count(key(0, 1)));
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 0)));
    }

    #[test]
    fn ageing_forgets_cold_non_resident_keys() {
        let mut lfru = Lfru::with_ageing(1);
        lfru.on_insert(key(0, 0));
        lfru.on_remove(key(0, 0));
        lfru.on_insert(key(0, 1));
        for _ in 0..62 {
            lfru.on_hit(key(0, 1));
        }
        assert_eq!(lfru.count(key(0, 0)), 0);
        assert!(!lfru.counts.contains_key(&key(0, 0)));
        assert_eq!(lfru.len(), 1);
    }
}
