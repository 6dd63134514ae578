//! Prefetching: records read ahead of demand on a guess (the next layer's
//! predicted experts), and the bookkeeping of those reads.
//!
//! Guesses go through a second pool of their own that defers to the demand
//! reads: while a batch of demand loads is being read it holds a [`Gate`],
//! and no guess starts reading until the batch's last record is in, so
//! guesses fill the drive's idle time (the rest of the layer's compute, the
//! next layer's attention and router) instead of competing with demand.
//! When the next batch of demand is placed, guesses no read has started for
//! are cancelled: the route is known, and a right guess not yet read is read
//! as demand; wrong ones being read are stopped at their next request
//! (`IoPool::stop_running`). A prefetched record waits in its prefetch
//! buffer, unchecked and outside the cache, until that placement: a demanded
//! one is checked, cached as a demand load would be and counted used; the
//! others are dropped and their bytes counted wasted, having cost neither a
//! check nor a cached record. A demand for a record whose prefetch is being
//! read waits for that read instead of reading it twice. A guess only moves
//! bytes: what a computation receives is always the record it asked for,
//! checked.
//!
//! Invariants: the buffers in flight, landed and spare are together at most
//! the prefetch pool's `max_in_flight` (asserted on every guess); every tag
//! in flight maps to one key, and each completion is received under the
//! `Prefetches` lock by exactly one thread.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};

use super::{ExpertKey, ExpertStore};
use crate::io::IoPool;
use crate::{AlignedBuf, Error, Record, Result};

/// The prefetch reads in flight: received only under this lock, so each
/// completion is matched to its key by exactly one receiver.
pub(super) struct Prefetches {
    pub(super) pool: IoPool,
    /// Tag → key of each read submitted and not yet received.
    pub(super) in_flight: HashMap<u64, ExpertKey>,
    /// Records read and not yet asked for, unchecked; dropped (wasted) when
    /// the next demand is placed. With `in_flight`, at most the pool's
    /// `max_in_flight` buffers.
    pub(super) landed: HashMap<ExpertKey, AlignedBuf>,
    /// Buffers of guesses cancelled or dropped, reused for the next ones
    /// (fresh pages cost a fault each). With `in_flight` and `landed`, at
    /// most the pool's `max_in_flight`.
    pub(super) spare: Vec<AlignedBuf>,
    pub(super) next_tag: u64,
}

/// What waiting for a demanded record's prefetch gave.
pub(super) enum Awaited {
    /// It landed (or had landed): the record, or the read's error.
    Landed(ExpertKey, Result<Arc<Record>>),
    /// Its read failed and was forgotten: read it again as demand.
    Lost(ExpertKey),
    /// Still in flight (only when not blocking).
    Pending,
}

impl ExpertStore {
    pub(super) fn lock_prefetches(&self) -> Option<MutexGuard<'_, Prefetches>> {
        // The map is updated only after a completion is taken, in code that
        // does not panic; a poisoned lock still guards consistent state.
        self.prefetches.as_ref().map(|p| p.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// Whether prefetching is on ([`StoreOptions::prefetch_in_flight`] > 0).
    pub fn prefetching(&self) -> bool {
        self.prefetches.is_some()
    }

    /// Queues reads of the records of `experts` of `layer` that are neither
    /// resident nor already prefetched, without blocking, and notes the
    /// guess for the layer's recall. They start once no demand is being read
    /// (the module docs). Reads beyond the prefetch buffers (in flight and
    /// landed), or that with them would exceed the cache capacity, are not
    /// queued. Returns the reads queued (0 when prefetching is off).
    pub fn prefetch(&self, layer: usize, experts: &[usize]) -> Result<usize> {
        for &expert in experts {
            self.file(ExpertKey { layer, expert })?;
        }
        let Some(mut prefetches) = self.lock_prefetches() else { return Ok(0) };
        self.drain_prefetches(&mut prefetches);
        let mut cache = self.lock();
        cache.predicted[layer] = Some(experts.iter().copied().collect());
        let mut started = 0;
        for &expert in experts {
            let key = ExpertKey { layer, expert };
            let record_bytes = self.file(key)?.record_bytes();
            let held = prefetches.in_flight.len() + prefetches.landed.len();
            // Submit never blocks: with every prefetch buffer taken the guess
            // is dropped.
            if held >= prefetches.pool.max_in_flight() || (held + 1) * record_bytes > self.options.capacity_bytes {
                break;
            }
            if cache.records.contains(key)
                || prefetches.landed.contains_key(&key)
                || prefetches.in_flight.values().any(|&k| k == key)
            {
                continue;
            }
            let buf = match prefetches.spare.iter().position(|b| b.len() == record_bytes) {
                Some(i) => prefetches.spare.swap_remove(i),
                None => AlignedBuf::zeroed(record_bytes),
            };
            let source = Arc::clone(self.sources[layer].as_ref().expect("a layer with a file has a source"));
            let tag = prefetches.next_tag;
            prefetches.next_tag += 1;
            prefetches.pool.submit(source, expert, buf, tag);
            prefetches.in_flight.insert(tag, key);
            started += 1;
        }
        assert!(
            prefetches.in_flight.len() + prefetches.landed.len() + prefetches.spare.len()
                <= prefetches.pool.max_in_flight(),
            "prefetch buffers within their bound"
        );
        Ok(started)
    }

    /// Takes back the guesses whose read has not started: the demand they
    /// guessed is being placed, so a right one is read as demand and a wrong
    /// one costs nothing.
    pub(super) fn cancel_prefetches(&self, prefetches: &mut Prefetches) {
        for (tag, buf) in prefetches.pool.cancel_pending() {
            prefetches.in_flight.remove(&tag).expect("every prefetch tag is in flight");
            prefetches.spare.push(buf);
        }
    }

    /// Moves every prefetch read that has completed to `landed`, without
    /// blocking. A failed prefetch is forgotten: a demand for the record
    /// reads it again and meets the error itself.
    pub(super) fn drain_prefetches(&self, prefetches: &mut Prefetches) {
        while let Some((tag, result)) = prefetches.pool.try_recv() {
            self.land(prefetches, tag, result);
        }
    }

    fn land(&self, prefetches: &mut Prefetches, tag: u64, result: Result<AlignedBuf>) {
        let key = prefetches.in_flight.remove(&tag).expect("every prefetch tag is in flight");
        let mut cache = self.lock();
        cache.stats.prefetch_issued += 1;
        match result {
            Ok(buf) => {
                cache.stats.bytes_read += buf.len() as u64;
                prefetches.landed.insert(key, buf);
            }
            // A wrong guess stopped part-way: what it read was wasted.
            Err(Error::ReadStopped { done_bytes, .. }) => {
                cache.stats.bytes_read += done_bytes as u64;
                cache.stats.prefetch_wasted_bytes += done_bytes as u64;
            }
            Err(_) => {}
        }
    }

    /// Drops the prefetched records no demand took; their bytes were wasted.
    pub(super) fn drop_landed(&self, prefetches: &mut Prefetches) {
        let mut cache = self.lock();
        for (_, buf) in prefetches.landed.drain() {
            cache.stats.prefetch_wasted_bytes += buf.len() as u64;
            prefetches.spare.push(buf);
        }
    }

    /// Checks and caches a prefetched record a demand asked for.
    pub(super) fn use_prefetched(&self, key: ExpertKey, buf: AlignedBuf) -> Result<Arc<Record>> {
        self.lock().stats.prefetch_used += 1;
        self.checked(key, Ok(Record::read(buf))).map(|record| self.admit(key, record, false))
    }

    /// Waits until every prefetch in flight has landed: tests that count
    /// what a prefetch became must not race its read.
    #[cfg(test)]
    fn settle_prefetches(&self) {
        let Some(mut prefetches) = self.lock_prefetches() else { return };
        while !prefetches.in_flight.is_empty() {
            let (tag, result) = prefetches.pool.recv();
            self.land(&mut prefetches, tag, result);
        }
    }

    /// Waits (if `block`, else only checks) for the prefetch of one of the
    /// demanded `awaited` keys, keeping others that land meanwhile; the key
    /// it returns is removed from `awaited`.
    pub(super) fn await_prefetch(&self, awaited: &mut Vec<ExpertKey>, block: bool) -> Awaited {
        let mut prefetches = self.lock_prefetches().expect("only prefetches are awaited");
        loop {
            // One that landed (here or by another thread's drain), or whose
            // read failed and was forgotten.
            if let Some(i) = awaited.iter().position(|key| !prefetches.in_flight.values().any(|k| k == key)) {
                let key = awaited.swap_remove(i);
                return match prefetches.landed.remove(&key) {
                    Some(buf) => Awaited::Landed(key, self.use_prefetched(key, buf)),
                    None => Awaited::Lost(key),
                };
            }
            let completion = if block { Some(prefetches.pool.recv()) } else { prefetches.pool.try_recv() };
            let Some((tag, result)) = completion else { return Awaited::Pending };
            self.land(&mut prefetches, tag, result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBackend;
    use crate::store::StoreOptions;
    use crate::store::testing::{RECORD, key, open_store, store_refusing_expert_1};

    fn prefetching_store(records: usize, capacity_bytes: usize, in_flight: usize) -> (tempfile::TempDir, ExpertStore) {
        // pread: a cache holding every record would otherwise serve them in
        // place, with nothing to prefetch.
        let io = IoBackend::Pread;
        open_store(
            records,
            StoreOptions { capacity_bytes, prefetch_in_flight: in_flight, io, ..StoreOptions::default() },
        )
    }

    /// Demands `expert` the way the MoE pipeline does: lookup, then fetch.
    fn demand(store: &ExpertStore, expert: usize) -> Arc<Record> {
        if let Some(buf) = store.lookup(key(expert)).unwrap() {
            return buf;
        }
        let mut loads = store.fetch(vec![key(expert)]).unwrap();
        let (got, buf) = loads.next().unwrap();
        assert_eq!(got, key(expert));
        assert!(loads.next().is_none());
        buf.unwrap()
    }

    #[test]
    fn a_prefetched_record_is_counted_used_once_or_wasted_when_its_demand_is_placed_without_it() {
        let (_dir, store) = prefetching_store(8, 2 * RECORD, 4);
        assert_eq!(store.prefetch(0, &[1, 2]).unwrap(), 2);
        // Both land before any demand (one not yet started would be
        // cancelled by the demand: the next test).
        store.settle_prefetches();
        // Read, but neither checked nor cached before a demand asks.
        assert_eq!(store.stats().bytes_read, 2 * RECORD as u64);
        assert_eq!(store.held_bytes(), 0);
        // Demanded twice: one read, counted used once; expert 2, guessed for
        // the same placement and not asked for, is dropped as wasted.
        for _ in 0..2 {
            assert!(demand(&store, 1).as_slice().iter().all(|&b| b == 1));
        }
        let stats = store.stats();
        assert_eq!((stats.prefetch_issued, stats.prefetch_used), (2, 1));
        assert_eq!((stats.prefetch_wasted_bytes, store.held_bytes()), (RECORD as u64, RECORD));
        demand(&store, 3);
        demand(&store, 4);
        let stats = store.stats();
        assert_eq!((stats.prefetch_used, stats.prefetch_wasted_bytes), (1, RECORD as u64));
        assert_eq!(stats.bytes_read, 4 * RECORD as u64, "no record was read twice");
        // The guess named 1 and 2: of the demands 1, 1, 3, 4, two were named.
        assert_eq!((stats.layer_predicted_lookups[0], stats.layer_predicted_hits[0]), (4, 2));
        assert!(store.held_bytes() <= store.capacity_bytes());
    }

    #[test]
    fn guesses_wait_while_demand_reads_and_those_not_started_are_cancelled_by_the_next_demand() {
        let (_dir, store) = prefetching_store(8, 8 * RECORD, 4);
        // Demand reads in progress (held here for as long as the test needs).
        let demand_reading = store.demand.hold();
        assert_eq!(store.prefetch(0, &[1, 2, 3]).unwrap(), 3);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(store.prefetches.as_ref().unwrap().lock().unwrap().pool.in_flight(), 3);
        assert_eq!(store.stats().bytes_read, 0, "no guess is read while demand reads");
        // The route is known: 1 was guessed right and is read as demand, 2
        // and 3 were wrong and are never read.
        assert!(demand(&store, 1).as_slice().iter().all(|&b| b == 1));
        let stats = store.stats();
        assert_eq!(stats.bytes_read, RECORD as u64);
        assert_eq!((stats.prefetch_issued, stats.prefetch_used, stats.prefetch_wasted_bytes), (0, 0, 0));
        assert_eq!(store.prefetches.as_ref().unwrap().lock().unwrap().pool.in_flight(), 0);
        drop(demand_reading);
        // With the gate open a guess is read at once.
        assert_eq!(store.prefetch(0, &[4]).unwrap(), 1);
        store.settle_prefetches();
        assert_eq!(store.stats().bytes_read, 2 * RECORD as u64);
        assert!(demand(&store, 4).as_slice().iter().all(|&b| b == 4));
        assert_eq!(store.stats().prefetch_used, 1);
    }

    #[test]
    fn prefetches_in_flight_are_bounded_in_records_and_by_the_cache() {
        let (_dir, store) = prefetching_store(32, 1 << 20, 3);
        let started = store.prefetch(0, &(0..32).collect::<Vec<_>>()).unwrap();
        assert!(started <= 3, "{started} prefetches in flight");
        // Already resident or in flight: not read again.
        let again = store.prefetch(0, &(0..started).collect::<Vec<_>>()).unwrap();
        assert_eq!(again, 0);
        // A cache of two records holds at most two prefetches in flight.
        let (_dir, store) = prefetching_store(32, 2 * RECORD, 8);
        assert!(store.prefetch(0, &(0..32).collect::<Vec<_>>()).unwrap() <= 2);
        // Prefetching off: nothing starts, nothing is noted.
        let (_dir, store) = prefetching_store(4, 1 << 20, 0);
        assert_eq!(store.prefetch(0, &[0, 1]).unwrap(), 0);
        demand(&store, 0);
        assert_eq!(store.stats().layer_predicted_lookups[0], 0);
        assert!(store.prefetch(0, &[4]).is_err(), "an expert out of range is an error");
    }

    #[test]
    fn a_demand_waits_for_an_in_flight_prefetch_instead_of_reading_twice() {
        for _ in 0..20 {
            let (_dir, store) = prefetching_store(8, 8 * RECORD, 8);
            let experts: Vec<usize> = (0..8).collect();
            store.prefetch(0, &experts).unwrap();
            let keys: Vec<ExpertKey> =
                experts.iter().map(|&e| key(e)).filter(|&k| store.lookup(k).unwrap().is_none()).collect();
            for (k, buf) in store.fetch(keys).unwrap() {
                assert!(buf.unwrap().as_slice().iter().all(|&b| b == k.expert as u8));
            }
            // Each record read once: by its guess, or (a guess not started
            // when the demand came is cancelled) by the demand.
            let stats = store.stats();
            assert_eq!(stats.bytes_read, 8 * RECORD as u64);
            assert_eq!((stats.prefetch_used, stats.prefetch_wasted_bytes), (stats.prefetch_issued, 0));
        }
    }

    #[test]
    fn a_prefetched_record_its_check_refuses_is_never_cached_or_handed_out() {
        let (_dir, store) = store_refusing_expert_1(StoreOptions {
            prefetch_in_flight: 2,
            io: IoBackend::Pread,
            ..StoreOptions::default()
        });
        // Demanded while in flight, and after landing: both meet the check.
        assert_eq!(store.prefetch(0, &[0, 1]).unwrap(), 2);
        let err = store.fetch(vec![key(1)]).unwrap().next().unwrap().1.unwrap_err();
        assert!(matches!(err, Error::RecordRejected { layer: 0, expert: 1, .. }), "{err}");
        store.prefetch(0, &[1]).unwrap();
        store.settle_prefetches();
        assert!(store.lookup(key(1)).unwrap().is_none(), "a refused prefetch is not cached");
        assert!(matches!(store.get(key(1)), Err(Error::RecordRejected { .. })));
        assert_eq!(store.get(key(0)).unwrap().as_slice()[0], 0);
    }
}
