//! Least-recently-used eviction, and the O(1) recency lists every online
//! policy here is built on.
//!
//! [`RecencyLists`] keeps several doubly linked lists in one slab (a `Vec` of
//! nodes with a free list) and one `HashMap` from key to slot, so moving a key
//! to the front of any list, or between lists, is O(1) with no ordered map and
//! no allocation once the slab has grown to the resident set.

use std::collections::HashMap;

use super::Policy;
use crate::ExpertKey;

/// "No node": the end of a list, or an empty list.
const NIL: usize = usize::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: ExpertKey,
    /// Toward the most recently used end.
    prev: usize,
    /// Toward the least recently used end.
    next: usize,
    list: usize,
    /// When the key was last put at the front of a list; lets two lists be
    /// merged in recency order (the LFRU policy's ageing).
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct Ends {
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
    len: usize,
}

const EMPTY: Ends = Ends { head: NIL, tail: NIL, len: 0 };

/// A fixed number of recency-ordered lists over distinct keys: each key is in
/// at most one list, at one position.
#[derive(Debug, Clone)]
pub(crate) struct RecencyLists {
    nodes: Vec<Node>,
    free_slots: Vec<usize>,
    slots: HashMap<ExpertKey, usize>,
    lists: Vec<Ends>,
    next_tick: u64,
}

impl RecencyLists {
    pub(crate) fn new(num_lists: usize) -> Self {
        Self {
            nodes: Vec::new(),
            free_slots: Vec::new(),
            slots: HashMap::new(),
            lists: vec![EMPTY; num_lists],
            next_tick: 0,
        }
    }

    /// Keys in all lists together.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Keys in `list`.
    pub(crate) fn list_len(&self, list: usize) -> usize {
        self.lists[list].len
    }

    /// Which list holds `key`, if any.
    pub(crate) fn list_of(&self, key: ExpertKey) -> Option<usize> {
        self.slots.get(&key).map(|&slot| self.nodes[slot].list)
    }

    /// Puts a key that is in no list at the most recent end of `list`.
    pub(crate) fn push_front(&mut self, list: usize, key: ExpertKey) {
        debug_assert!(!self.slots.contains_key(&key), "{key:?} is already in a list");
        let node = Node { key, prev: NIL, next: NIL, list, tick: 0 };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.nodes[slot] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.slots.insert(key, slot);
        self.link_front(list, slot);
    }

    /// Moves `key` to the most recent end of `list` (its own or another).
    /// Returns false, changing nothing, if the key is in no list.
    pub(crate) fn move_to_front(&mut self, list: usize, key: ExpertKey) -> bool {
        let Some(&slot) = self.slots.get(&key) else { return false };
        self.unlink(slot);
        self.link_front(list, slot);
        true
    }

    /// Takes `key` out of its list. Returns false if it was in none.
    pub(crate) fn remove(&mut self, key: ExpertKey) -> bool {
        let Some(slot) = self.slots.remove(&key) else { return false };
        self.unlink(slot);
        self.free_slots.push(slot);
        true
    }

    /// The least recently used key of `list`.
    pub(crate) fn back(&self, list: usize) -> Option<ExpertKey> {
        let tail = self.lists[list].tail;
        (tail != NIL).then(|| self.nodes[tail].key)
    }

    /// The keys of `list` from least to most recently used.
    pub(crate) fn iter_from_back(&self, list: usize) -> impl Iterator<Item = ExpertKey> + '_ {
        let mut slot = self.lists[list].tail;
        std::iter::from_fn(move || {
            if slot == NIL {
                return None;
            }
            let node = &self.nodes[slot];
            slot = node.prev;
            Some(node.key)
        })
    }

    /// The least recently used key of `list` that is not leased. Costs one
    /// step per leased key skipped.
    pub(crate) fn back_unleased(&self, list: usize, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        self.iter_from_back(list).find(|&key| !leased(key))
    }

    /// Relabels every list `l` as `relabel(l)`, merging lists that land on the
    /// same label in recency order. O(keys + lists); used for ageing, which
    /// happens rarely enough to be O(1) amortised per access.
    pub(crate) fn relabel(&mut self, relabel: impl Fn(usize) -> usize) {
        // Gather each old list from least to most recent, then push them into
        // their new lists oldest first. Two old lists merging into one are
        // interleaved by tick so the merged list stays in recency order.
        let mut by_new_list: Vec<Vec<(u64, ExpertKey)>> = vec![Vec::new(); self.lists.len()];
        for old in 0..self.lists.len() {
            let target = relabel(old);
            let mut slot = self.lists[old].tail;
            while slot != NIL {
                let node = self.nodes[slot];
                by_new_list[target].push((node.tick, node.key));
                slot = node.prev;
            }
        }
        let next_tick = self.next_tick;
        *self = Self::new(self.lists.len());
        // Keep the tick counter monotone so later pushes stay "more recent".
        self.next_tick = next_tick;
        for (list, mut keys) in by_new_list.into_iter().enumerate() {
            // Each source list is already sorted by tick, so this stable sort
            // sees at most a few sorted runs and merges them in linear time.
            keys.sort_by_key(|&(tick, _)| tick);
            for (tick, key) in keys {
                self.push_front(list, key);
                let slot = self.slots[&key];
                self.nodes[slot].tick = tick;
            }
        }
    }

    fn link_front(&mut self, list: usize, slot: usize) {
        let ends = &mut self.lists[list];
        let old_head = ends.head;
        let node = &mut self.nodes[slot];
        node.list = list;
        node.prev = NIL;
        node.next = old_head;
        node.tick = self.next_tick;
        self.next_tick += 1;
        if old_head == NIL {
            ends.tail = slot;
        } else {
            self.nodes[old_head].prev = slot;
        }
        ends.head = slot;
        ends.len += 1;
    }

    fn unlink(&mut self, slot: usize) {
        let Node { prev, next, list, .. } = self.nodes[slot];
        let ends = &mut self.lists[list];
        if prev == NIL {
            ends.head = next;
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            ends.tail = prev;
        } else {
            self.nodes[next].prev = prev;
        }
        ends.len -= 1;
    }
}

/// Evicts the resident key used longest ago.
#[derive(Debug, Clone)]
pub struct Lru {
    recency: RecencyLists,
}

impl Lru {
    pub fn new() -> Self {
        Self { recency: RecencyLists::new(1) }
    }

    /// Resident keys.
    pub fn len(&self) -> usize {
        self.recency.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recency.len() == 0
    }
}

impl Default for Lru {
    fn default() -> Self {
        Self::new()
    }
}

impl Policy for Lru {
    fn on_hit(&mut self, key: ExpertKey) {
        let resident = self.recency.move_to_front(0, key);
        debug_assert!(resident, "hit on {key:?}, which is not resident");
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.recency.push_front(0, key);
    }

    fn on_remove(&mut self, key: ExpertKey) {
        self.recency.remove(key);
    }

    fn victim(&mut self, leased: &dyn Fn(ExpertKey) -> bool) -> Option<ExpertKey> {
        self.recency.back_unleased(0, leased)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::{key, no_lease};

    #[test]
    fn lists_keep_recency_order_and_move_between_lists() {
        let mut lists = RecencyLists::new(2);
        for e in 0..4 {
            lists.push_front(0, key(0, e));
        }
        assert!(lists.move_to_front(0, key(0, 1)));
        assert!(lists.move_to_front(1, key(0, 2)));
        assert!(lists.remove(key(0, 0)));
        assert!(!lists.remove(key(0, 0)));
        assert!(!lists.move_to_front(0, key(9, 9)));
        assert_eq!(lists.iter_from_back(0).collect::<Vec<_>>(), [key(0, 3), key(0, 1)]);
        assert_eq!(lists.iter_from_back(1).collect::<Vec<_>>(), [key(0, 2)]);
        assert_eq!((lists.len(), lists.list_len(0), lists.list_len(1)), (3, 2, 1));
        assert_eq!(lists.list_of(key(0, 2)), Some(1));
        // A freed slot is reused.
        lists.push_front(0, key(1, 0));
        assert_eq!(lists.nodes.len(), 4);
        assert_eq!(lists.back(0), Some(key(0, 3)));
    }

    #[test]
    fn relabel_merges_lists_in_recency_order() {
        let mut lists = RecencyLists::new(3);
        // Interleave pushes into lists 0 and 1 so the merge must interleave.
        lists.push_front(0, key(0, 0));
        lists.push_front(1, key(0, 1));
        lists.push_front(0, key(0, 2));
        lists.push_front(2, key(0, 3));
        lists.push_front(1, key(0, 4));
        lists.relabel(|l| l.saturating_sub(1));
        assert_eq!(lists.iter_from_back(0).collect::<Vec<_>>(), [key(0, 0), key(0, 1), key(0, 2), key(0, 4)]);
        assert_eq!(lists.iter_from_back(1).collect::<Vec<_>>(), [key(0, 3)]);
        assert_eq!(lists.list_len(2), 0);
        // Later pushes are still more recent than everything relabelled.
        lists.push_front(0, key(0, 5));
        lists.relabel(|l| l);
        assert_eq!(lists.iter_from_back(0).last(), Some(key(0, 5)));
    }

    #[test]
    fn evicts_least_recently_used_first() {
        let mut lru = Lru::new();
        for e in 0..3 {
            lru.on_insert(key(0, e));
        }
        lru.on_hit(key(0, 0));
        // Order now, oldest first: 1, 2, 0.
        assert_eq!(lru.victim(&no_lease), Some(key(0, 1)));
        lru.on_remove(key(0, 1));
        assert_eq!(lru.victim(&no_lease), Some(key(0, 2)));
        lru.on_hit(key(0, 2));
        assert_eq!(lru.victim(&no_lease), Some(key(0, 0)));
        assert_eq!(lru.len(), 2);
    }

    #[test]
    fn skips_leased_keys() {
        let mut lru = Lru::new();
        for e in 0..3 {
            lru.on_insert(key(0, e));
        }
        assert_eq!(lru.victim(&|k| k.expert == 0), Some(key(0, 1)));
        assert_eq!(lru.victim(&|k| k.expert < 2), Some(key(0, 2)));
        assert_eq!(lru.victim(&|_| true), None);
        assert_eq!(Lru::new().victim(&no_lease), None);
    }
}
