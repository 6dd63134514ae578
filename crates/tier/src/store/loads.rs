//! Demand reads: one batch of missing records at a time ([`Loads`]), each
//! read from its layer's file or a mirror's copy of it, checked on the
//! thread that takes it from the I/O pool, and admitted to the cache.
//!
//! Every record is read into a buffer of the process's own, even when the
//! cache could hold every record and serve views of a mapping instead:
//! such a view faults (SIGBUS) when the file is truncated under the running
//! model (`cp` over it truncates first), and shows bytes rewritten in place
//! after the check passed them. A cached record is the one that was
//! checked; a file changed since is noticed when a record is next read (a
//! short read, or the check refusing it), as dense.bin's rows are.
//!
//! Invariants: one batch holds the demand pool at a time (its completions
//! are matched to keys by tag), and dropping a batch waits for the reads it
//! submitted; at most `max_in_flight` demand reads are queued or running; a
//! record is handed out only complete and passed by its layer's check (a
//! short, failed or refused read is an error, never cached).

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::prefetch::{Awaited, Prefetches};
use super::{ExpertKey, ExpertStore};
use crate::io::GateHold;
use crate::mirror::Mirrors;
use crate::{Error, Record, Result};

impl ExpertStore {
    /// The mirrors read besides the container.
    pub fn mirrors(&self) -> &Mirrors {
        &self.mirrors
    }

    /// A completed read of `key` once the layer's check passed it: a record
    /// the check refuses is [`Error::RecordRejected`], never handed out.
    pub(super) fn checked(&self, key: ExpertKey, read: Result<Record>) -> Result<Record> {
        let buf = read?;
        let Some(check) = self.checks[key.layer].as_ref().filter(|_| self.checking.load(Ordering::Relaxed)) else {
            return Ok(buf);
        };
        check(key.expert, buf.as_slice()).map_err(|reason| Error::RecordRejected {
            path: self.files[key.layer].as_ref().map(|f| f.path().to_owned()).unwrap_or_default(),
            layer: key.layer,
            expert: key.expert,
            reason,
        })?;
        Ok(buf)
    }

    /// Stops (or resumes) running the sources' checks on records read from
    /// now on: only for measuring what the checks cost.
    pub fn set_checking(&self, on: bool) {
        self.checking.store(on, Ordering::Relaxed);
    }

    /// Starts loading `keys` (all missing at their lookup) and yields each
    /// as it arrives, in completion order. A key whose prefetch is in flight
    /// waits for that read; one whose prefetch landed since is served from
    /// the cache.
    pub fn fetch(&self, keys: Vec<ExpertKey>) -> Result<Loads<'_>> {
        for &key in &keys {
            self.file(key)?;
        }
        let guard = self.loading.lock().unwrap_or_else(|p| p.into_inner());
        let (mut demand, mut awaited, mut ready) = (Vec::new(), Vec::new(), Vec::new());
        match self.lock_prefetches() {
            None => demand = keys,
            Some(mut prefetches) => {
                self.cancel_prefetches(&mut prefetches);
                self.drain_prefetches(&mut prefetches);
                for key in keys {
                    if let Some(buf) = prefetches.landed.remove(&key) {
                        ready.push((key, self.use_prefetched(key, buf)));
                    } else if prefetches.in_flight.values().any(|&k| k == key) {
                        awaited.push(key);
                    } else {
                        demand.push(key);
                    }
                }
                // The guesses for this placement that were wrong: those read
                // are dropped, those being read stopped.
                self.drop_landed(&mut prefetches);
                let Prefetches { pool, in_flight, .. } = &*prefetches;
                pool.stop_running(|tag| in_flight.get(&tag).is_some_and(|key| awaited.contains(key)));
            }
        }
        let mut loads = Loads {
            store: self,
            _guard: guard,
            keys: demand,
            next_submit: 0,
            in_flight: 0,
            awaited,
            ready,
            demand_hold: None,
        };
        loads.fill();
        Ok(loads)
    }

    /// Reads every record not yet cached when the cache can hold them all,
    /// and returns the bytes read (0 when they do not all fit).
    ///
    /// A model whose experts fit its budget is then resident from its first
    /// token, as llama.cpp's load (which repacks its weights into memory of
    /// its own) makes it: otherwise the first use of each expert copies it
    /// while a token waits, which cost resident decode a fifth of its speed
    /// on the bench's OLMoE shape (53.9 against 68.1 tok/s on warm steps,
    /// docs/BENCHMARKS.md). Records go through the same checked reads as
    /// demand ones.
    pub fn load_all(&self) -> Result<u64> {
        let files = || self.files.iter().enumerate().filter_map(|(layer, f)| f.as_ref().map(|f| (layer, f)));
        let total_bytes =
            files().try_fold(0usize, |sum, (_, f)| f.record_bytes().checked_mul(f.num_experts())?.checked_add(sum));
        if total_bytes.is_none_or(|total| total > self.options.capacity_bytes) {
            return Ok(0);
        }
        let bytes_before = self.stats().bytes_read;
        for (layer, file) in files() {
            let missing: Vec<ExpertKey> = (0..file.num_experts())
                .map(|expert| ExpertKey { layer, expert })
                .filter(|&key| !self.is_cached(key))
                .collect();
            for (_, record) in self.fetch(missing)? {
                record?;
            }
        }
        Ok(self.stats().bytes_read - bytes_before)
    }

    /// The record of `key`, from the cache or from disk.
    pub fn get(&self, key: ExpertKey) -> Result<Arc<Record>> {
        if let Some(buf) = self.lookup(key)? {
            return Ok(buf);
        }
        let mut loads = self.fetch(vec![key])?;
        let (_, buf) = loads.next().expect("one load submitted");
        buf
    }
}

/// Loads in progress for one batch of missing experts. Dropping it waits for
/// the loads already submitted, so no stale completion reaches a later batch.
pub struct Loads<'s> {
    store: &'s ExpertStore,
    _guard: MutexGuard<'s, ()>,
    /// Demand reads: submitted up to `next_submit`.
    keys: Vec<ExpertKey>,
    next_submit: usize,
    in_flight: usize,
    /// Keys whose prefetch is in flight, not read again.
    awaited: Vec<ExpertKey>,
    /// Keys whose prefetch had landed when the batch was placed.
    ready: Vec<(ExpertKey, Result<Arc<Record>>)>,
    /// Closes the store's demand gate from the first demand read submitted
    /// until the last one is received.
    demand_hold: Option<GateHold>,
}

impl Loads<'_> {
    fn fill(&mut self) {
        while self.in_flight < self.store.options.max_in_flight.max(1) && self.next_submit < self.keys.len() {
            let key = self.keys[self.next_submit];
            let record_bytes = self.store.file(key).expect("keys checked in fetch").record_bytes();
            let source = Arc::clone(self.store.sources[key.layer].as_ref().expect("a layer with a file has a source"));
            let buf = self.store.take_buffer(record_bytes);
            self.demand_hold.get_or_insert_with(|| self.store.demand.hold());
            self.store.pool.submit(source, key.expert, buf, self.next_submit as u64);
            self.next_submit += 1;
            self.in_flight += 1;
        }
    }
}

impl Iterator for Loads<'_> {
    type Item = (ExpertKey, Result<Arc<Record>>);

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(ready) = self.ready.pop() {
            return Some(ready);
        }
        loop {
            if !self.awaited.is_empty() {
                // Block on the prefetch pool only when no demand read could
                // come first.
                let block = self.in_flight == 0;
                match self.store.await_prefetch(&mut self.awaited, block) {
                    Awaited::Landed(key, result) => return Some((key, result)),
                    Awaited::Lost(key) => {
                        self.keys.push(key);
                        self.fill();
                        continue;
                    }
                    Awaited::Pending => assert!(!block, "a blocking wait returns a prefetch"),
                }
            }
            if self.in_flight == 0 {
                assert!(self.awaited.is_empty(), "awaited prefetches are waited for first");
                return None;
            }
            let (tag, result) = self.store.pool.recv();
            self.in_flight -= 1;
            let key = self.keys[tag as usize];
            // The next read starts before this one is checked.
            self.fill();
            if self.in_flight == 0 {
                // The batch's last demand read is in: the drive is free for
                // guesses while it is checked and computed.
                self.demand_hold = None;
            }
            let result = self.store.checked(key, result.map(Record::read)).map(|buf| self.store.admit(key, buf, true));
            return Some((key, result));
        }
    }
}

impl Drop for Loads<'_> {
    fn drop(&mut self) {
        while self.in_flight > 0 {
            let _ = self.store.pool.recv();
            self.in_flight -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBackend;
    use crate::aligned::ALIGN_BYTES;
    use crate::policy::PolicyKind;
    use crate::store::StoreOptions;
    use crate::store::testing::{RECORD, key, open_store, store_refusing_expert_1, store_with};

    #[test]
    fn a_batch_of_loads_arrives_complete_and_in_the_cache() {
        let (_dir, store) = store_with(8, 8 * RECORD, PolicyKind::Pinned);
        let keys: Vec<ExpertKey> = (0..8).map(key).collect();
        let mut seen: Vec<usize> = store
            .fetch(keys)
            .unwrap()
            .map(|(k, buf)| {
                assert!(buf.unwrap().as_slice().iter().all(|&b| b == k.expert as u8));
                k.expert
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        assert_eq!(store.held_bytes(), 8 * RECORD);
    }

    #[test]
    fn truncated_file_is_a_short_read_naming_the_expert() {
        let (dir, store) = store_with(2, 1 << 20, PolicyKind::Lru);
        let path = dir.path().join("layer_000.bin");
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(RECORD as u64 + 10).unwrap();
        let err = store.get(key(1)).unwrap_err().to_string();
        assert!(err.contains("expert 1") && err.contains("layer 0"), "{err}");
        // The failed load left nothing behind.
        assert!(store.lookup(key(1)).unwrap().is_none());
    }

    #[test]
    fn a_record_its_check_refuses_is_an_error_read_again_each_time() {
        let (_dir, store) = store_refusing_expert_1(StoreOptions { io: IoBackend::Pread, ..StoreOptions::default() });
        assert_eq!(store.get(key(0)).unwrap().as_slice()[0], 0);
        for _ in 0..2 {
            let err = store.get(key(1)).unwrap_err();
            assert!(matches!(err, Error::RecordRejected { layer: 0, expert: 1, .. }), "{err}");
            assert_eq!(err.to_string(), "expert 1 is bad");
        }
        // A refused record is never cached.
        assert!(store.lookup(key(1)).unwrap().is_none());
        assert_eq!(store.stats().bytes_read, RECORD as u64);
    }

    #[test]
    fn auto_means_pread_whether_or_not_the_cache_holds_every_record() {
        for capacity_bytes in [4 * RECORD - 1, 4 * RECORD, 1 << 20] {
            let (_dir, store) = open_store(4, StoreOptions { capacity_bytes, ..StoreOptions::default() });
            assert_eq!(store.io(), IoBackend::Pread, "{capacity_bytes}");
            let record = store.get(key(1)).unwrap();
            assert!(record.as_slice().iter().all(|&b| b == 1));
            assert_eq!(record.as_slice().as_ptr() as usize % ALIGN_BYTES, 0);
        }
    }

    /// A cache holding every record used to serve views of the file's
    /// mapping: `cp` or `truncate` over the file then killed the process
    /// with SIGBUS at the next use, and bytes rewritten in place changed a
    /// record its check had passed. Under every backend a cached record now
    /// stays as it was read, and an uncached one is a short read naming
    /// the file.
    #[test]
    fn a_file_truncated_or_rewritten_in_place_never_changes_or_faults_a_cached_record() {
        for io in [IoBackend::Auto, IoBackend::Mmap, IoBackend::Pread] {
            let (dir, store) = open_store(2, StoreOptions { capacity_bytes: 1 << 20, io, ..StoreOptions::default() });
            let path = dir.path().join("layer_000.bin");
            assert_eq!(store.get(key(0)).unwrap().as_slice()[0], 0);
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(0).unwrap();
            assert!(store.get(key(0)).unwrap().as_slice().iter().all(|&b| b == 0), "{io}: truncated");
            let err = store.get(key(1)).unwrap_err();
            assert!(matches!(err, Error::ShortRead { layer: 0, expert: 1, .. }), "{io}: {err}");
            assert!(err.to_string().contains(&path.display().to_string()), "{io}: {err}");
            std::fs::write(&path, vec![7u8; 2 * RECORD]).unwrap();
            assert!(store.get(key(0)).unwrap().as_slice().iter().all(|&b| b == 0), "{io}: rewritten");
            assert_eq!(store.stats().misses, 2, "{io}: the cached record was not read again");
        }
    }

    /// A model that fits its budget is read whole at open, so its first
    /// tokens find every expert cached; one that does not fit is left to
    /// demand (reading it all would only evict it again). A record its
    /// check refuses fails the load, naming it.
    #[test]
    fn load_all_reads_every_record_only_when_the_cache_holds_them_all() {
        use crate::policy::PolicyKind;
        use crate::store::testing::{store_refusing_expert_1, store_with};

        let (_dir, store) = store_with(4, 3 * RECORD, PolicyKind::Lru);
        assert_eq!(store.load_all().unwrap(), 0);
        assert_eq!(store.held_bytes(), 0);

        let (_dir, store) = store_with(4, 4 * RECORD, PolicyKind::Lru);
        store.get(key(2)).unwrap();
        assert_eq!(store.load_all().unwrap(), 3 * RECORD as u64, "the cached record is not read again");
        for expert in 0..4 {
            assert_eq!(store.lookup(key(expert)).unwrap().unwrap().as_slice()[0], expert as u8);
        }
        assert_eq!(store.stats().misses, 1, "only get's own lookup missed");

        let (_dir, store) =
            store_refusing_expert_1(StoreOptions { capacity_bytes: 2 * RECORD, ..StoreOptions::default() });
        let err = store.load_all().unwrap_err();
        assert!(matches!(err, Error::RecordRejected { expert: 1, .. }), "{err}");
    }
}
