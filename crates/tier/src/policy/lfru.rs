//! LFRU: a recency window (LRU) in front of a frequency partition (LFU by
//! frequency class, LRU within a class), with ageing and a window size that
//! adapts to the trace.
//!
//! # Algorithm
//!
//! - **Counts.** Every use of a key (a hit, or the miss that inserts it) adds
//!   one to its count. Counts outlive residency: an evicted key that comes
//!   back resumes its count. Every `16 × max(resident keys, 64)` uses all
//!   counts are halved (ageing), and keys whose count reaches zero while not
//!   resident are forgotten, so the history stays bounded by the model's
//!   routed experts and follows changes of topic.
//! - **Window** (privileged partition). A key enters at the most recent end
//!   of the window; a hit in the window moves it back there. When the window
//!   holds more than its share of the resident keys, its least recent keys
//!   move to the frequency partition.
//! - **Frequency partition** (unprivileged). Keys sit in the list of their
//!   class, `class(count) = bit length of count` (1 → 1, 2–3 → 2, 4–7 → 3,
//!   …); a hit moves the key to the most recent end of its (new) class list.
//!   Halving lowers every class by exactly one, so ageing relabels the lists
//!   (classes 0 and 1 merge in recency order) in O(resident keys).
//! - **Victim.** The least recent key of the lowest non-empty class, skipping
//!   leased keys; only if every key of the frequency partition is leased, the
//!   least recent unleased key of the window.
//! - **Window size.** Hill climbing on the hit rate: every `4 × max(resident
//!   keys, 64)` uses, the window's share moves 5 points (between 0% and 80%)
//!   in the same direction as last time if the period's hit rate did not
//!   drop, else in the other direction. It starts at 0% (pure frequency
//!   classes), growing first.
//!
//! Every operation is O(1) amortised: 66 lists in one slab (`RecencyLists`),
//! a count map, at most 65 list heads scanned per victim, and ageing and
//! window moves bounded by the uses between them.
//!
//! # Why this shape for MoE routing
//!
//! Every token walks the layers in order and touches each layer's top-k
//! experts once, so two uses of an expert are at least a token's worth of
//! other experts apart. A cache smaller than a few tokens' working set sees
//! that cycle as a scan: LRU gets almost nothing (0% on synthetic OLMoE- and
//! Mixtral-shaped traces at 10% capacity), and so does segmented LRU, whose
//! promotion needs a second hit while still on probation. Routing is also
//! skewed, so counting uses across evictions and evicting the lowest class
//! first keeps the experts most tokens route to, and the scan evicts itself.
//! But neighbouring tokens also share experts, which rewards recency when
//! the cache holds more than a token's working set; the window captures that,
//! and since the best window share depends on the cache size relative to
//! that working set, it is learned rather than fixed. Log-sized classes keep
//! recency in charge between experts of similar popularity.
//!
//! On synthetic traces (Zipf-skewed routing, token-to-token repeats, topic
//! drift; OLMoE, Qwen3-MoE and Mixtral shapes; 10–50% capacity), this beats
//! or matches LRU almost everywhere and is far ahead of it at small caches;
//! see `policy_comparison_on_synthetic_moe_traces` in `replay.rs` (run with
//! `--ignored --nocapture`) and `strata trace replay` for real traces.

use std::collections::HashMap;

use super::Policy;
use super::lru::RecencyLists;
use crate::ExpertKey;

/// Classes 0..=64 (the bit lengths of a `u64` count) are lists 0..=64.
const NUM_CLASSES: usize = 65;

/// The list holding the window (privileged partition).
const WINDOW: usize = NUM_CLASSES;

/// Counts halve after this many uses per resident key: long enough for a
/// class to reflect many tokens of routing, short enough that a change of
/// topic reshapes the frequency partition within a few hundred tokens.
const AGEING_PERIOD_PER_RESIDENT: u64 = 16;

/// The window share is reconsidered after this many uses per resident key:
/// enough uses for the hit rate to be more signal than noise.
const ADAPT_PERIOD_PER_RESIDENT: u64 = 4;

/// A floor on the resident count used for the periods above, so a nearly
/// empty cache does not age or adapt every few uses.
const MIN_RESIDENT: u64 = 64;

/// How far one adaptation moves the window share, in percentage points.
const WINDOW_STEP_PERCENT: isize = 5;

/// The largest window share. The rest stays frequency-ordered, so a cyclic
/// scan can never flush the whole cache.
const MAX_WINDOW_PERCENT: usize = 80;

fn class(count: u64) -> usize {
    (u64::BITS - count.leading_zeros()) as usize
}

#[derive(Debug, Clone)]
pub struct Lfru {
    /// Decayed use counts of every key seen recently, resident or not.
    counts: HashMap<ExpertKey, u64>,
    /// Resident keys: lists 0..=64 are the frequency classes, `WINDOW` the
    /// window, each in recency order.
    lists: RecencyLists,
    uses_since_ageing: u64,
    /// The most keys ever resident at once; sets the periods.
    max_resident: u64,
    /// The window's share of resident keys, in percent.
    window_percent: usize,
    /// `None`: the window share is fixed. Otherwise the signed step of the
    /// next adaptation.
    window_step_percent: Option<isize>,
    period_hits: u64,
    period_uses: u64,
    /// The hit rate of the previous adaptation period.
    last_hit_rate: f64,
}

impl Lfru {
    /// The adaptive policy, starting with no window.
    pub fn new() -> Self {
        Self::build(0, Some(WINDOW_STEP_PERCENT))
    }

    /// A policy whose window always holds `window_percent`% of the resident
    /// keys (clamped to 100). `fixed_window(0)` is pure frequency classes;
    /// `fixed_window(100)` is LRU.
    pub fn fixed_window(window_percent: usize) -> Self {
        Self::build(window_percent.min(100), None)
    }

    fn build(window_percent: usize, window_step_percent: Option<isize>) -> Self {
        Self {
            counts: HashMap::new(),
            lists: RecencyLists::new(NUM_CLASSES + 1),
            uses_since_ageing: 0,
            max_resident: 0,
            window_percent,
            window_step_percent,
            period_hits: 0,
            period_uses: 0,
            last_hit_rate: 0.0,
        }
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.lists.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lists.len() == 0
    }

    /// The decayed use count of `key` (0 if unseen or aged out).
    pub fn count(&self, key: ExpertKey) -> u64 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// The window's current share of resident keys, in percent.
    pub fn window_percent(&self) -> usize {
        self.window_percent
    }

    /// Counts one use of `key` and returns its class after it.
    fn count_use(&mut self, key: ExpertKey) -> usize {
        let count = self.counts.entry(key).or_insert(0);
        *count = count.saturating_add(1);
        class(*count)
    }

    /// Moves the window's least recent keys to the frequency partition
    /// until the window is within its share.
    fn shrink_window(&mut self) {
        let max_window = self.lists.len() * self.window_percent / 100;
        while self.lists.list_len(WINDOW) > max_window {
            let key = self.lists.back(WINDOW).expect("a window over its share is not empty");
            self.lists.move_to_front(class(self.count(key)), key);
        }
    }

    fn after_use(&mut self, hit: bool) {
        self.shrink_window();
        self.max_resident = self.max_resident.max(self.lists.len() as u64);
        let resident_floor = self.max_resident.max(MIN_RESIDENT);
        self.uses_since_ageing += 1;
        if self.uses_since_ageing >= AGEING_PERIOD_PER_RESIDENT * resident_floor {
            self.age();
        }
        if let Some(step) = self.window_step_percent {
            self.period_hits += u64::from(hit);
            self.period_uses += 1;
            if self.period_uses >= ADAPT_PERIOD_PER_RESIDENT * resident_floor {
                self.adapt_window(step);
            }
        }
    }

    /// One hill-climbing step: keep going while the hit rate does not drop.
    fn adapt_window(&mut self, step: isize) {
        let hit_rate = self.period_hits as f64 / self.period_uses as f64;
        let step = if hit_rate < self.last_hit_rate { -step } else { step };
        self.window_step_percent = Some(step);
        self.last_hit_rate = hit_rate;
        self.period_hits = 0;
        self.period_uses = 0;
        self.window_percent = self.window_percent.saturating_add_signed(step).min(MAX_WINDOW_PERCENT);
        // A smaller window takes effect now; a larger one fills as keys come in.
        self.shrink_window();
    }

    /// Halves every count. Halving lowers the class of every nonzero count
    /// by exactly one, so the class lists shift down one (0 and 1 merge).
    fn age(&mut self) {
        self.uses_since_ageing = 0;
        let lists = &self.lists;
        self.counts.retain(|&key, count| {
            *count /= 2;
            *count > 0 || lists.list_of(key).is_some()
        });
        self.lists.relabel(|list| if list == WINDOW { WINDOW } else { list.saturating_sub(1) });
        debug_assert!(self.counts.iter().all(|(&key, &count)| {
            self.lists.list_of(key).is_none_or(|list| list == WINDOW || list == class(count))
        }));
    }
}

impl Default for Lfru {
    fn default() -> Self {
        Self::new()
    }
}

impl Policy for Lfru {
    fn on_hit(&mut self, key: ExpertKey) {
        let class = self.count_use(key);
        let list = if self.lists.list_of(key) == Some(WINDOW) { WINDOW } else { class };
        let resident = self.lists.move_to_front(list, key);
        debug_assert!(resident, "hit on {key:?}, which is not resident");
        self.after_use(true);
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.count_use(key);
        self.lists.push_front(WINDOW, key);
        self.after_use(false);
    }

    fn on_remove(&mut self, key: ExpertKey) {
        // The count stays: it is history, not residency.
        self.lists.remove(key);
    }

    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        (0..NUM_CLASSES)
            .filter(|&class| self.lists.list_len(class) > 0)
            .find_map(|class| self.lists.back_unleased(class, leased))
            .or_else(|| self.lists.back_unleased(WINDOW, leased))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{key, no_lease};

    /// Uses between two ageings while at most 64 keys are resident.
    const AGEING_USES: u64 = AGEING_PERIOD_PER_RESIDENT * MIN_RESIDENT;

    #[test]
    fn classes_are_bit_lengths() {
        assert_eq!([0, 1, 2, 3, 4, 7, 8, u64::MAX].map(class), [0, 1, 2, 2, 3, 3, 4, 64]);
    }

    #[test]
    fn evicts_the_least_recent_of_the_lowest_class() {
        let mut lfru = Lfru::fixed_window(0);
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
        assert_eq!(lfru.len(), 3);
    }

    #[test]
    fn counts_survive_eviction() {
        let mut lfru = Lfru::fixed_window(0);
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
        let mut lfru = Lfru::fixed_window(0);
        lfru.on_insert(key(0, 0));
        lfru.on_insert(key(0, 1));
        lfru.on_hit(key(0, 1));
        assert_eq!(lfru.victim(&|k| k.expert == 0), Some(key(0, 1)));
        assert_eq!(lfru.victim(&|_| true), None);
        assert_eq!(Lfru::new().victim(&no_lease), None);
    }

    #[test]
    fn the_window_keeps_new_keys_until_they_overflow_its_share() {
        let mut lfru = Lfru::fixed_window(50);
        let [a, b, c, d] = [key(0, 0), key(0, 1), key(0, 2), key(0, 3)];
        for k in [a, b, c, d] {
            lfru.on_insert(k);
        }
        // Half of 4: the window holds c and d; a and b went to class 1.
        assert_eq!(lfru.victim(&no_lease), Some(a));
        lfru.on_hit(c);
        lfru.on_hit(a);
        // a climbed to class 2, so b is the lowest class.
        assert_eq!(lfru.victim(&no_lease), Some(b));
        assert_eq!(lfru.victim(&|k| k == b), Some(a));
        // With the whole frequency partition leased, the window's least
        // recent key goes: c was hit after d arrived.
        assert_eq!(lfru.victim(&|k| k == a || k == b), Some(d));
        assert_eq!(lfru.victim(&|k| k != c), Some(c));
    }

    #[test]
    fn a_full_window_is_lru() {
        let mut lfru = Lfru::fixed_window(100);
        for e in 0..3 {
            lfru.on_insert(key(0, e));
        }
        for _ in 0..5 {
            lfru.on_hit(key(0, 1));
        }
        lfru.on_hit(key(0, 0));
        assert_eq!(lfru.victim(&no_lease), Some(key(0, 2)));
        assert_eq!(lfru.window_percent(), 100);
    }

    #[test]
    fn ageing_halves_counts_and_lets_a_new_hot_set_in() {
        let mut lfru = Lfru::fixed_window(0);
        let (old, new) = (key(0, 0), key(0, 1));
        lfru.on_insert(old);
        for _ in 1..640 {
            lfru.on_hit(old);
        }
        lfru.on_insert(new);
        for _ in 1..AGEING_USES - 640 {
            lfru.on_hit(new);
        }
        // One ageing period: 640 → 320 and 384 → 192.
        assert_eq!((lfru.count(old), lfru.count(new)), (320, 192));
        assert_eq!(lfru.victim(&no_lease), Some(new));
        // The new key stays hot while the old one goes quiet; three periods
        // later the old one has decayed below it and is the victim.
        for _ in 0..3 * AGEING_USES {
            lfru.on_hit(new);
        }
        assert_eq!(lfru.count(old), 40);
        assert!(lfru.count(new) > 40);
        assert_eq!(lfru.victim(&no_lease), Some(old));
    }

    #[test]
    fn ageing_forgets_cold_non_resident_keys() {
        let mut lfru = Lfru::fixed_window(0);
        lfru.on_insert(key(0, 0));
        lfru.on_remove(key(0, 0));
        lfru.on_insert(key(0, 1));
        for _ in 2..AGEING_USES {
            lfru.on_hit(key(0, 1));
        }
        assert_eq!(lfru.count(key(0, 0)), 0);
        assert!(!lfru.counts.contains_key(&key(0, 0)));
        assert_eq!(lfru.len(), 1);
    }

    #[test]
    fn the_window_share_climbs_while_the_hit_rate_does_not_drop() {
        let mut lfru = Lfru::new();
        assert_eq!(lfru.window_percent(), 0);
        let adapt_uses = ADAPT_PERIOD_PER_RESIDENT * MIN_RESIDENT;
        // Every use a hit: the rate never drops, so each period adds a step.
        lfru.on_insert(key(0, 0));
        for _ in 1..3 * adapt_uses {
            lfru.on_hit(key(0, 0));
        }
        assert_eq!(lfru.window_percent(), 3 * WINDOW_STEP_PERCENT as usize);
        // A period with misses in it reverses the direction (63 new keys
        // keep the resident count, and so the period, where it was).
        for e in 0..63 {
            lfru.on_insert(key(1, e));
        }
        for _ in 63..adapt_uses {
            lfru.on_hit(key(0, 0));
        }
        assert_eq!(lfru.window_percent(), 2 * WINDOW_STEP_PERCENT as usize);
    }
}
