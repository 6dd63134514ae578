//! What one tier holds: values by expert within a byte capacity, under a
//! replacement policy, each leased by holding its `Arc`. The RAM cache
//! (records) and the VRAM tier ([`DeviceTier`]: an expert's matrices on a
//! device) are both one of these, so both evict by the same policies and
//! never evict a value in use.
//!
//! Invariants: `held_bytes` is the sum of the held values' charged bytes
//! and never exceeds the capacity (asserted on every admission); a leased
//! value (its `Arc` held outside) is never chosen for eviction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::ExpertKey;
use crate::policy::Policy;

pub(crate) struct Resident<V> {
    /// Each value and the bytes it is charged.
    entries: HashMap<ExpertKey, (Arc<V>, usize)>,
    pub(crate) policy: Box<dyn Policy>,
    held_bytes: usize,
    capacity_bytes: usize,
}

impl<V> Resident<V> {
    pub(crate) fn new(policy: Box<dyn Policy>, capacity_bytes: usize) -> Self {
        Self { entries: HashMap::new(), policy, held_bytes: 0, capacity_bytes }
    }

    pub(crate) fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    pub(crate) fn contains(&self, key: ExpertKey) -> bool {
        self.entries.contains_key(&key)
    }

    /// A lease on `key`'s value if it is held (the policy told of the hit),
    /// else `None` (the policy told of the miss).
    pub(crate) fn lookup(&mut self, key: ExpertKey) -> Option<Arc<V>> {
        match self.entries.get(&key) {
            Some((value, _)) => {
                self.policy.on_hit(key);
                Some(Arc::clone(value))
            }
            None => {
                self.policy.on_miss(key);
                None
            }
        }
    }

    /// Holds `value`, charged `bytes`, if room can be made without
    /// evicting a leased value and the policy admits it over its victims;
    /// the caller serves it uncached otherwise. What left to make room.
    pub(crate) fn admit(&mut self, key: ExpertKey, value: &Arc<V>, bytes: usize) -> Vec<Arc<V>> {
        let mut evicted = Vec::new();
        if self.entries.contains_key(&key) {
            return evicted;
        }
        if bytes > self.capacity_bytes {
            self.policy.on_bypass(key);
            return evicted;
        }
        while self.held_bytes + bytes > self.capacity_bytes {
            let entries = &self.entries;
            let leased = |k: ExpertKey| entries.get(&k).is_some_and(|(v, _)| Arc::strong_count(v) > 1);
            let admitted = self.policy.victim(&leased).filter(|&victim| self.policy.admits(key, victim));
            let Some(victim) = admitted else {
                // Everything held is in use, or the policy prefers what is.
                self.policy.on_bypass(key);
                return evicted;
            };
            self.policy.on_remove(victim);
            let (value, charged) = self.entries.remove(&victim).expect("the policy names held keys");
            self.held_bytes -= charged;
            evicted.push(value);
        }
        self.entries.insert(key, (Arc::clone(value), bytes));
        self.policy.on_insert(key);
        self.held_bytes += bytes;
        assert!(self.held_bytes <= self.capacity_bytes, "a tier within its capacity");
        evicted
    }
}

/// Counters of a [`DeviceTier`], for the run stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceTierStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes copied to the device (admitted or served once uncached).
    pub bytes_uploaded: u64,
    pub evictions: u64,
    /// Time spent uploading: compute on the device waited for it.
    pub upload_stall_ns: u64,
    /// Uploads the device refused (out of memory): those experts ran on
    /// the CPU from their records.
    pub refused_uploads: u64,
    /// Bytes of experts held now, and the most the tier may hold.
    pub held_bytes: usize,
    pub capacity_bytes: usize,
}

/// Experts on a device (VRAM): values `V` (an expert's matrices there) by
/// expert within a byte capacity, under the RAM cache's policy and leases
/// (made by [`crate::ExpertStore::device_tier`]).
pub struct DeviceTier<V> {
    resident: Mutex<Resident<V>>,
    capacity_bytes: usize,
    stats: Mutex<DeviceTierStats>,
}

impl<V> DeviceTier<V> {
    pub(crate) fn new(resident: Resident<V>) -> Self {
        let capacity_bytes = resident.capacity_bytes;
        Self { resident: Mutex::new(resident), capacity_bytes, stats: Mutex::new(DeviceTierStats::default()) }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// Bytes of experts held on the device.
    pub fn held_bytes(&self) -> usize {
        self.lock().held_bytes()
    }

    pub fn stats(&self) -> DeviceTierStats {
        let counted = *self.stats.lock().unwrap_or_else(|p| p.into_inner());
        DeviceTierStats { held_bytes: self.held_bytes(), capacity_bytes: self.capacity_bytes, ..counted }
    }

    fn lock(&self) -> MutexGuard<'_, Resident<V>> {
        // A held value is immutable: a panic elsewhere leaves nothing half done.
        self.resident.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, update: impl FnOnce(&mut DeviceTierStats)) {
        update(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// A lease on `key`'s copy on the device (a hit), or `None` (a miss).
    pub fn lookup(&self, key: ExpertKey) -> Option<Arc<V>> {
        let found = self.lock().lookup(key);
        self.count(|s| if found.is_some() { s.hits += 1 } else { s.misses += 1 });
        found
    }

    /// Whether a value charged `bytes` could ever be held: uploading one
    /// that could not is wasted.
    pub fn could_hold(&self, bytes: usize) -> bool {
        bytes <= self.capacity_bytes
    }

    /// Counts an upload the device refused; whether it is the first, which
    /// the run reports (once: later ones are only counted).
    pub fn refuse(&self) -> bool {
        let mut first = false;
        self.count(|s| {
            first = s.refused_uploads == 0;
            s.refused_uploads += 1;
        });
        first
    }

    /// The copy `upload` made of `key`, `bytes` long and taking `took`,
    /// held if the policy and the leases make room (else served once, then
    /// freed); its lease.
    pub fn admit(&self, key: ExpertKey, value: V, bytes: usize, took: Duration) -> Arc<V> {
        let value = Arc::new(value);
        let evictions = self.lock().admit(key, &value, bytes).len() as u64;
        self.count(|s| {
            s.bytes_uploaded += bytes as u64;
            s.evictions += evictions;
            s.upload_stall_ns += took.as_nanos() as u64;
        });
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Lru;

    fn key(expert: usize) -> ExpertKey {
        ExpertKey { layer: 0, expert }
    }

    fn tier(capacity_bytes: usize) -> DeviceTier<usize> {
        DeviceTier::new(Resident::new(Box::new(Lru::default()), capacity_bytes))
    }

    #[test]
    fn a_device_tier_counts_uploads_and_evicts_by_its_policy() {
        let tier = tier(2 * 10);
        for expert in [0, 1, 0, 2, 0] {
            if tier.lookup(key(expert)).is_none() {
                tier.admit(key(expert), expert, 10, Duration::from_millis(1));
            }
        }
        // 0, 1 uploaded; 0 hit; 2 evicts 1 (least recent); 0 hit.
        let stats = tier.stats();
        assert_eq!((stats.hits, stats.misses, stats.evictions), (2, 3, 1));
        assert_eq!((stats.bytes_uploaded, stats.upload_stall_ns), (30, 3_000_000));
        assert!(tier.lookup(key(1)).is_none() && tier.lookup(key(2)).is_some());
        assert_eq!(tier.held_bytes(), 20);
    }

    #[test]
    fn a_leased_device_copy_is_never_evicted() {
        let tier = tier(10);
        let lease = tier.admit(key(0), 0, 10, Duration::ZERO);
        // The one slot is leased: the next copy is served, not held.
        let served = tier.admit(key(1), 1, 10, Duration::ZERO);
        assert_eq!(*served, 1);
        assert!(tier.lookup(key(0)).is_some() && tier.lookup(key(1)).is_none());
        drop(lease);
    }

    #[test]
    fn a_zero_capacity_tier_holds_nothing() {
        let tier = tier(0);
        assert!(!tier.could_hold(1));
        tier.admit(key(0), 0, 1, Duration::ZERO);
        assert_eq!((tier.held_bytes(), tier.stats().evictions), (0, 0));
    }
}
