//! Belady's optimal policy (MIN), for judging the online policies on a trace.
//!
//! It knows the whole trace in advance. Classical MIN evicts the resident key
//! whose next use is farthest in the future (never used again counts as
//! farthest of all); that is optimal for demand paging one access at a time.
//! Replay has two more rules (see `replay.rs`): the experts of one event are
//! leased while it runs, and a miss may be served without being cached (the
//! store must, when everything resident is leased or pinned). With leases,
//! deciding access by access is not optimal: caching a key never used again
//! into free room leases that slot for the rest of the event, and can force
//! a key needed soon after to be dropped. So MIN decides per event instead:
//!
//! At the first miss of an event, of the resident keys the event does not use
//! and the event's missing keys, it keeps the `capacity − (event keys already
//! resident)` that are needed soonest after this event. A missing key outside
//! that set is not cached; to cache one inside it, the victim is the
//! non-leased resident needed farthest ahead, which is always outside it.
//!
//! "Sooner" compares the event of each key's next use, and between two keys
//! next used in the same event, the use after that (and so on): the key kept
//! until then is leased through that event while the other stays a free
//! choice there, so the one needed again sooner is the better one to keep.
//!
//! Classical MIN is provably optimal for demand paging; for this setting we
//! know of no proof, so the tests compare it with an exhaustive search: on
//! every trace of up to four events over three experts at every capacity,
//! and on random small skewed traces. Every online policy here is one of the
//! policies that search covers, so Belady's hits bound theirs from above.
//!
//! It plugs into the simulation loop through [`Policy`]: each `on_hit`,
//! `on_insert` or `on_bypass` consumes the next access of the trace, so the
//! loop must report every access, in order, and ask [`Belady::admits`] before
//! caching a miss.

use std::collections::{BTreeSet, HashMap};

use super::Policy;
use crate::ExpertKey;

/// The next use of a key that is never used again.
const NEVER: usize = usize::MAX;

#[derive(Debug, Clone)]
pub struct Belady {
    capacity_records: usize,
    accesses: Vec<ExpertKey>,
    /// `next_use[i]`: when the key of access `i` is next used, as a rank that
    /// orders accesses by event and then by their own future (see `new`),
    /// or `NEVER`.
    next_use: Vec<usize>,
    /// `event_starts[e]`: the position of event `e`'s first access; one more
    /// entry holds the number of accesses.
    event_starts: Vec<usize>,
    /// Position of the access the next callback reports.
    cursor: usize,
    /// The event holding the access at `cursor`.
    event: usize,
    /// The event `rejected` was planned for.
    planned_event: Option<usize>,
    /// Missing keys of the planned event that are not to be cached.
    rejected: Vec<ExpertKey>,
    /// Resident keys ordered by their next use rank; the last is needed
    /// farthest ahead.
    by_next_use: BTreeSet<(usize, ExpertKey)>,
    resident_next_use: HashMap<ExpertKey, usize>,
}

impl Belady {
    /// The policy for exactly this trace: `events[e]` lists the keys event
    /// `e` accesses, in order (distinct within an event), for a cache of
    /// `capacity_records` records. Events larger than the cache are left out
    /// by the replay, which never shows them to a policy.
    pub fn new(events: impl IntoIterator<Item = Vec<ExpertKey>>, capacity_records: usize) -> Self {
        let mut accesses = Vec::new();
        let mut event_starts = vec![0];
        for event in events {
            accesses.extend(event);
            event_starts.push(accesses.len());
        }
        let mut next_position = vec![NEVER; accesses.len()];
        let mut seen_at: HashMap<ExpertKey, usize> = HashMap::new();
        for (position, &key) in accesses.iter().enumerate().rev() {
            if let Some(later) = seen_at.insert(key, position) {
                next_position[position] = later;
            }
        }
        // Two keys next used in the same event are not interchangeable: the
        // one kept until then is leased through that event, the other stays
        // a free choice, so keeping the one whose *following* use is sooner
        // is better. So accesses are ranked by event, and within an event by
        // the rank of the key's next access, which orders keys by their
        // whole future, event by event. Ranking runs from the last event to
        // the first, so each next access is ranked before it is needed.
        let mut rank = vec![NEVER; accesses.len()];
        let rank_of = |rank: &[usize], position: usize| if position == NEVER { NEVER } else { rank[position] };
        for window in event_starts.windows(2).rev() {
            let (start, end) = (window[0], window[1]);
            let mut positions: Vec<usize> = (start..end).collect();
            positions.sort_by_key(|&position| rank_of(&rank, next_position[position]));
            for (offset, position) in positions.into_iter().enumerate() {
                rank[position] = start + offset;
            }
        }
        let next_use = next_position.iter().map(|&position| rank_of(&rank, position)).collect();
        Self {
            capacity_records,
            accesses,
            next_use,
            event_starts,
            cursor: 0,
            event: 0,
            planned_event: None,
            rejected: Vec::new(),
            by_next_use: BTreeSet::new(),
            resident_next_use: HashMap::new(),
        }
    }

    /// Whether the miss at the current access should be cached (evicting
    /// [`Policy::victim`] if the cache is full).
    pub fn admits(&mut self) -> bool {
        if self.planned_event != Some(self.event) {
            self.plan_event();
        }
        self.accesses.get(self.cursor).is_some_and(|key| !self.rejected.contains(key))
    }

    /// Accesses consumed so far.
    pub fn position(&self) -> usize {
        self.cursor
    }

    /// Decides which of the current event's missing keys not to cache: of
    /// the resident keys outside the event and the missing keys, the ones
    /// beyond room for the soonest needed. Only the `overflow` farthest are
    /// looked at, so this costs O(event size × log resident keys).
    fn plan_event(&mut self) {
        self.planned_event = Some(self.event);
        self.rejected.clear();
        let event = &self.accesses[self.event_starts[self.event]..self.event_starts[self.event + 1]];
        // Misses before the cursor were already admitted (now resident);
        // the plan is made at the event's first miss, so none was dropped.
        let first = self.cursor - self.event_starts[self.event];
        let mut missing: Vec<(usize, ExpertKey)> = (first..event.len())
            .map(|offset| (self.next_use[self.event_starts[self.event] + offset], event[offset]))
            .filter(|(_, key)| !self.resident_next_use.contains_key(key))
            .collect();
        let overflow = (self.resident_next_use.len() + missing.len()).saturating_sub(self.capacity_records);
        // Farthest first; a missing key loses ties (only "never" ties), which
        // saves an eviction that would gain nothing.
        missing.sort_unstable_by(|a, b| b.cmp(a));
        let mut residents =
            self.by_next_use.iter().rev().filter(|(_, key)| !event.contains(key)).map(|&(next, _)| next).peekable();
        let mut missing = missing.into_iter().peekable();
        for _ in 0..overflow {
            let reject = match (missing.peek(), residents.peek()) {
                (Some(&(miss_next, _)), Some(&resident_next)) => miss_next >= resident_next,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if reject {
                self.rejected.extend(missing.next().map(|(_, key)| key));
            } else {
                residents.next();
            }
        }
    }

    /// Consumes the access at the cursor, which must be `key`, and returns
    /// the key's next use after it.
    fn advance(&mut self, key: ExpertKey) -> usize {
        assert_eq!(
            self.accesses.get(self.cursor),
            Some(&key),
            "Belady was told about access {} out of the order it was built with",
            self.cursor
        );
        let next = self.next_use[self.cursor];
        self.cursor += 1;
        while self.event + 1 < self.event_starts.len() && self.cursor >= self.event_starts[self.event + 1] {
            self.event += 1;
        }
        next
    }

    fn set_next_use(&mut self, key: ExpertKey, next: usize) {
        if let Some(old) = self.resident_next_use.insert(key, next) {
            self.by_next_use.remove(&(old, key));
        }
        self.by_next_use.insert((next, key));
    }
}

impl Policy for Belady {
    fn on_hit(&mut self, key: ExpertKey) {
        let next = self.advance(key);
        debug_assert!(self.resident_next_use.contains_key(&key), "hit on {key:?}, which is not resident");
        self.set_next_use(key, next);
    }

    fn on_insert(&mut self, key: ExpertKey) {
        let next = self.advance(key);
        self.set_next_use(key, next);
    }

    fn on_remove(&mut self, key: ExpertKey) {
        if let Some(next) = self.resident_next_use.remove(&key) {
            self.by_next_use.remove(&(next, key));
        }
    }

    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        self.by_next_use.iter().rev().map(|&(_, key)| key).find(|&key| !leased(key))
    }

    fn on_bypass(&mut self, key: ExpertKey) {
        self.advance(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{key, no_lease};

    fn singles(keys: &[ExpertKey]) -> Vec<Vec<ExpertKey>> {
        keys.iter().map(|&key| vec![key]).collect()
    }

    #[test]
    fn evicts_the_key_used_farthest_ahead() {
        let a = key(0, 0);
        let b = key(0, 1);
        let c = key(0, 2);
        // a b c | a b a c ...: with a, b, c resident after the first three,
        // b's next use (4) is farther than a's (3) but sooner than c's (6).
        let mut belady = Belady::new(singles(&[a, b, c, a, b, a, c]), 3);
        belady.on_insert(a);
        belady.on_insert(b);
        belady.on_insert(c);
        assert_eq!(belady.victim(&no_lease), Some(c));
        assert_eq!(belady.victim(&|k| k == c), Some(b));
        belady.on_hit(a);
        // a's next use is now 5, still sooner than c's.
        assert_eq!(belady.victim(&no_lease), Some(c));
        belady.on_remove(c);
        belady.on_hit(b);
        // b is never used again.
        assert_eq!(belady.victim(&no_lease), Some(b));
        assert_eq!(belady.position(), 5);
    }

    #[test]
    fn declines_to_cache_a_key_needed_later_than_the_victim() {
        let a = key(0, 0);
        let b = key(0, 1);
        // A one-record cache: caching b would evict a, needed sooner.
        let mut belady = Belady::new(singles(&[a, b, a]), 1);
        belady.on_insert(a);
        assert!(!belady.admits());
        belady.on_bypass(b);
        belady.on_hit(a);
    }

    #[test]
    fn plans_a_whole_event_so_a_dead_key_does_not_take_a_leased_slot() {
        let [a, b, c, d] = [key(0, 0), key(0, 1), key(1, 0), key(1, 1)];
        // Room for 3; a and b are resident when event {c, d} arrives. There
        // is room for c, but c is never used again while d is, and once c
        // is cached it is leased until the event ends, so d could only be
        // cached by evicting a or b, both needed sooner.
        let mut belady = Belady::new(vec![vec![a, b], vec![c, d], vec![a, b, d]], 3);
        belady.on_insert(a);
        belady.on_insert(b);
        assert!(!belady.admits());
        belady.on_bypass(c);
        assert!(belady.admits());
        belady.on_insert(d);
    }

    #[test]
    #[should_panic(expected = "out of the order")]
    fn rejects_accesses_out_of_order() {
        let mut belady = Belady::new(singles(&[key(0, 0)]), 1);
        belady.on_insert(key(0, 1));
    }
}
