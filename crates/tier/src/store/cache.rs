//! The cache and its leases: records kept in RAM within a byte capacity,
//! under a replacement policy, and the counters of what the store did.
//!
//! A record in use is *leased*: the caller holds an `Arc` to its buffer, and
//! a leased record is never chosen for eviction. Records that cannot be
//! cached (the cache is full of leased records, or smaller than one record)
//! are still served, from a buffer that is freed once the caller drops it, so
//! a tiny cache changes speed, never results.
//!
//! Invariants: the records are a [`Resident`] (cached bytes within the
//! capacity, leased records never evicted); a record is cached only after
//! its check passed (callers admit checked records only); the buffers kept
//! from evictions for reuse are at most `max_in_flight`.

use std::collections::HashSet;
use std::sync::{Arc, MutexGuard};

use super::{ExpertKey, ExpertStore};
use crate::resident::Resident;
use crate::{AlignedBuf, Record, Result};

/// Counters of what the store did, for `--json` stats and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub evictions: u64,
    /// Hits per decoder layer.
    pub layer_hits: Vec<u64>,
    /// Misses per decoder layer.
    pub layer_misses: Vec<u64>,
    /// Bytes each mirror served, in `--mirror` order (the container's drive
    /// served the rest of `bytes_read`).
    pub mirror_bytes_read: Vec<u64>,
    /// The read rate each mirror's share was weighed by, then the
    /// container's drive's (empty without mirrors).
    pub mirror_rates_bytes_per_s: Vec<u64>,
    /// Prefetch reads done (counted as each completes; a guess cancelled
    /// before its read started is not counted).
    pub prefetch_issued: u64,
    /// Prefetched records a demand then asked for (each counted once).
    pub prefetch_used: u64,
    /// Bytes of prefetched records dropped before any demand asked for them
    /// (evicted, refused by the cache, or already there).
    pub prefetch_wasted_bytes: u64,
    /// Per decoder layer: demand lookups made while a prediction for the
    /// layer stood, and how many of them the prediction named (recall =
    /// hits / lookups).
    pub layer_predicted_lookups: Vec<u64>,
    pub layer_predicted_hits: Vec<u64>,
}

pub(super) struct Cache {
    /// The cached records, each charged its length.
    pub(super) records: Resident<Record>,
    /// Buffers of evicted records, reused for loads: first-touching fresh
    /// memory is several times slower than reading into warm pages.
    pub(super) free: Vec<AlignedBuf>,
    /// Per layer: the experts its latest prediction named.
    pub(super) predicted: Vec<Option<HashSet<usize>>>,
    pub(super) stats: StoreStats,
}

impl ExpertStore {
    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        let mut stats = self.lock().stats.clone();
        stats.mirror_bytes_read = self.mirrors.bytes_read();
        stats.mirror_rates_bytes_per_s = self.mirrors.rates_bytes_per_s().to_vec();
        stats
    }

    /// Bytes of records currently cached.
    pub fn held_bytes(&self) -> usize {
        self.lock().records.held_bytes()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Cache> {
        // Cached buffers are immutable, so a panic elsewhere cannot leave
        // them inconsistent; keep serving.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The record of `key` if it is resident (a hit, and a lease on it);
    /// `None` counts a miss.
    pub fn lookup(&self, key: ExpertKey) -> Result<Option<Arc<Record>>> {
        self.file(key)?;
        if let Some(mut prefetches) = self.lock_prefetches() {
            self.drain_prefetches(&mut prefetches);
        }
        let mut guard = self.lock();
        let cache = &mut *guard;
        if let Some(predicted) = &cache.predicted[key.layer] {
            cache.stats.layer_predicted_lookups[key.layer] += 1;
            cache.stats.layer_predicted_hits[key.layer] += u64::from(predicted.contains(&key.expert));
        }
        match cache.records.lookup(key) {
            Some(buf) => {
                cache.stats.hits += 1;
                cache.stats.layer_hits[key.layer] += 1;
                Ok(Some(buf))
            }
            None => {
                cache.stats.misses += 1;
                cache.stats.layer_misses[key.layer] += 1;
                Ok(None)
            }
        }
    }

    /// Whether `key`'s record is cached (no lookup counted, no lease).
    pub(super) fn is_cached(&self, key: ExpertKey) -> bool {
        self.lock().records.contains(key)
    }

    pub(super) fn take_buffer(&self, record_bytes: usize) -> AlignedBuf {
        let mut cache = self.lock();
        match cache.free.iter().position(|b| b.len() == record_bytes) {
            Some(i) => cache.free.swap_remove(i),
            None => AlignedBuf::zeroed(record_bytes),
        }
    }

    /// Caches a record a demand asked for if room can be made without
    /// evicting a leased one, and returns the lease. `count_read`: its
    /// bytes were read for this demand (a prefetch counted them on landing).
    pub(super) fn admit(&self, key: ExpertKey, buf: Record, count_read: bool) -> Arc<Record> {
        let mut guard = self.lock();
        let cache = &mut *guard;
        let len = buf.len();
        if count_read {
            cache.stats.bytes_read += len as u64;
        }
        let buf = Arc::new(buf);
        let evicted = cache.records.admit(key, &buf, len);
        cache.stats.evictions += evicted.len() as u64;
        for evicted in evicted {
            if let Some(spare) = Arc::try_unwrap(evicted).ok().map(Record::into_buffer)
                && cache.free.len() < self.options.max_in_flight
            {
                cache.free.push(spare);
            }
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::PolicyKind;
    use crate::store::testing::{RECORD, key, store_with};

    #[test]
    fn serves_whole_records_and_evicts_least_recent() {
        let (_dir, store) = store_with(4, 2 * RECORD, PolicyKind::Lru);
        for expert in [0, 1, 0, 2, 0, 1] {
            let buf = store.get(key(expert)).unwrap();
            assert!(buf.as_slice().iter().all(|&b| b == expert as u8));
        }
        let stats = store.stats();
        // 0 miss, 1 miss, 0 hit, 2 miss (evicts 1), 0 hit, 1 miss (evicts 2).
        assert_eq!((stats.hits, stats.misses, stats.evictions), (2, 4, 2));
        assert_eq!(stats.bytes_read, 4 * RECORD as u64);
        assert_eq!(stats.layer_misses, vec![4]);
        assert!(store.held_bytes() <= store.capacity_bytes());
    }

    #[test]
    fn leased_records_are_never_evicted() {
        let (_dir, store) = store_with(4, 2 * RECORD, PolicyKind::Lru);
        let lease0 = store.get(key(0)).unwrap();
        let lease1 = store.get(key(1)).unwrap();
        // Both resident records are leased: a third is served uncached.
        let third = store.get(key(2)).unwrap();
        assert_eq!(third.as_slice()[0], 2);
        assert!(store.lookup(key(0)).unwrap().is_some() && store.lookup(key(1)).unwrap().is_some());
        assert!(store.lookup(key(2)).unwrap().is_none());
        drop((lease0, lease1));
    }

    #[test]
    fn capacity_below_one_record_still_serves_without_caching() {
        let (_dir, store) = store_with(2, 100, PolicyKind::Lfru);
        for _ in 0..3 {
            let buf = store.get(key(1)).unwrap();
            assert_eq!(buf.as_slice()[RECORD - 1], 1);
        }
        assert_eq!(store.held_bytes(), 0);
        assert_eq!(store.stats().misses, 3);
    }
}
