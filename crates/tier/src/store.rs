//! The expert store: a byte-bounded cache of expert records in RAM, filled
//! from the container's expert files through a bounded pool of I/O workers.
//!
//! A record in use is *leased*: the caller holds an `Arc` to its buffer, and
//! a leased record is never chosen for eviction. Records that cannot be
//! cached (the cache is full of leased records, or smaller than one record)
//! are still served, from a buffer that is freed once the caller drops it, so
//! a tiny cache changes speed, never results.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::io::{IoBackend, IoPool, RecordCheck, RecordFile, RecordSource};
use crate::mirror::{MirrorOptions, Mirrors};
use crate::policy::{Policy, PolicyKind, new_policy};
use crate::usage::Usage;
use crate::{AlignedBuf, Error, Result};

/// One routed expert: `(layer, expert)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    pub layer: usize,
    pub expert: usize,
}

/// Where one layer's expert records live: a file of `num_experts` fixed-size
/// records, record `e` at byte offset `e * record_bytes`.
#[derive(Clone)]
pub struct ExpertSource {
    pub path: PathBuf,
    pub record_bytes: usize,
    pub num_experts: usize,
    /// Run on every record read from disk (`None`: records are handed out
    /// as read).
    pub check: Option<RecordCheck>,
}

impl std::fmt::Debug for ExpertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertSource")
            .field("path", &self.path)
            .field("record_bytes", &self.record_bytes)
            .field("num_experts", &self.num_experts)
            .field("checked", &self.check.is_some())
            .finish()
    }
}

/// How the store caches and reads.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Bytes of records the cache may hold.
    pub capacity_bytes: usize,
    pub policy: PolicyKind,
    pub io: IoBackend,
    /// I/O worker threads.
    pub io_workers: usize,
    /// Loads queued or running at once; each holds one record buffer.
    pub max_in_flight: usize,
    /// Share of the cache (in records) the `pinned` policy may pin.
    pub pinned_percent: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            capacity_bytes: 1 << 30,
            policy: PolicyKind::Lru,
            io: IoBackend::Pread,
            io_workers: 2,
            max_in_flight: 4,
            pinned_percent: 50,
        }
    }
}

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
}

struct Cache {
    entries: HashMap<ExpertKey, Arc<AlignedBuf>>,
    policy: Box<dyn Policy>,
    held_bytes: usize,
    /// Buffers of evicted records, reused for loads: first-touching fresh
    /// memory is several times slower than reading into warm pages.
    free: Vec<AlignedBuf>,
    stats: StoreStats,
}

/// Routed experts, read from disk on demand and kept in RAM within a byte
/// capacity, under a replacement policy.
pub struct ExpertStore {
    files: Vec<Option<Arc<RecordFile>>>,
    /// Where each layer's records are read from: its file, or its file and
    /// the mirrors' copies of it.
    sources: Vec<Option<Arc<dyn RecordSource>>>,
    mirrors: Mirrors,
    options: StoreOptions,
    cache: Mutex<Cache>,
    pool: IoPool,
    /// Held by the one batch of loads in progress: completions are matched
    /// to keys by tag, so two batches must not share the pool at once.
    loading: Mutex<()>,
    usage: Mutex<Usage>,
}

impl ExpertStore {
    /// Opens every layer's expert file. `sources[l]` is `None` for a layer
    /// without routed experts. `usage` is what earlier runs learned.
    pub fn open(sources: Vec<Option<ExpertSource>>, options: StoreOptions, usage: Usage) -> Result<Self> {
        Self::open_mirrored(sources, options, usage, &MirrorOptions::default())
    }

    /// [`open`](Self::open), reading from the mirrors of `mirrors` too
    /// (validated here; see `mirror`).
    pub fn open_mirrored(
        sources: Vec<Option<ExpertSource>>,
        options: StoreOptions,
        usage: Usage,
        mirrors: &MirrorOptions,
    ) -> Result<Self> {
        let files = sources
            .into_iter()
            .enumerate()
            .map(|(layer, source)| {
                source
                    .map(|s| {
                        let file = RecordFile::open(options.io, &s.path, layer, s.record_bytes, s.num_experts)?;
                        Ok(Arc::new(match s.check {
                            Some(check) => file.with_check(check),
                            None => file,
                        }))
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        let mirrors =
            if mirrors.mirrors.is_empty() { Mirrors::none() } else { Mirrors::open(mirrors, options.io, &files)? };
        let sources = files
            .iter()
            .enumerate()
            .map(|(layer, file)| file.as_ref().map(|file| mirrors.source(layer, Arc::clone(file))))
            .collect();
        let record_bytes_max = files.iter().flatten().map(|f| f.record_bytes()).max().unwrap_or(0);
        let capacity_records = options.capacity_bytes.checked_div(record_bytes_max).unwrap_or(0);
        let pinned_max = capacity_records * options.pinned_percent / 100;
        let experts_max = files.iter().flatten().map(|f| f.num_experts()).max().unwrap_or(0);
        let n_layers = files.len();
        let cache = Cache {
            entries: HashMap::new(),
            policy: new_policy(options.policy, &usage, pinned_max, experts_max),
            held_bytes: 0,
            free: Vec::new(),
            stats: StoreStats {
                layer_hits: vec![0; n_layers],
                layer_misses: vec![0; n_layers],
                ..StoreStats::default()
            },
        };
        let pool = IoPool::new(options.io_workers.max(1), options.max_in_flight.max(1))?;
        Ok(Self {
            files,
            sources,
            mirrors,
            options,
            cache: Mutex::new(cache),
            pool,
            loading: Mutex::new(()),
            usage: Mutex::new(usage),
        })
    }

    /// The byte bound on cached records.
    pub fn capacity_bytes(&self) -> usize {
        self.options.capacity_bytes
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        let mut stats = self.lock().stats.clone();
        stats.mirror_bytes_read = self.mirrors.bytes_read();
        stats
    }

    /// The mirrors read besides the container.
    pub fn mirrors(&self) -> &Mirrors {
        &self.mirrors
    }

    /// Warnings since the last call (a mirror copy that failed and is no
    /// longer read), each given once.
    pub fn take_warnings(&self) -> Vec<String> {
        self.mirrors.take_warnings()
    }

    /// Bytes of records currently cached.
    pub fn held_bytes(&self) -> usize {
        self.lock().held_bytes
    }

    /// What the store has learned so far (earlier runs included).
    pub fn usage(&self) -> Usage {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Counts one use of each key (the **learn** step).
    pub fn learn(&self, keys: impl IntoIterator<Item = ExpertKey>) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        for key in keys {
            usage.record(key);
        }
    }

    /// Drops every expert file's pages from the page cache (cold runs).
    pub fn evict_page_cache(&self) -> Result<()> {
        self.files.iter().flatten().try_for_each(|f| f.evict_page_cache())
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        // Cached buffers are immutable, so a panic elsewhere cannot leave
        // them inconsistent; keep serving.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn file(&self, key: ExpertKey) -> Result<&Arc<RecordFile>> {
        let no_such = || Error::NoSuchExpert { layer: key.layer, expert: key.expert };
        let file = self.files.get(key.layer).and_then(Option::as_ref).ok_or_else(no_such)?;
        if key.expert >= file.num_experts() {
            return Err(no_such());
        }
        Ok(file)
    }

    /// The record of `key` if it is resident (a hit, and a lease on it);
    /// `None` counts a miss.
    pub fn lookup(&self, key: ExpertKey) -> Result<Option<Arc<AlignedBuf>>> {
        self.file(key)?;
        let mut guard = self.lock();
        let cache = &mut *guard;
        match cache.entries.get(&key) {
            Some(buf) => {
                let buf = Arc::clone(buf);
                cache.policy.on_hit(key);
                cache.stats.hits += 1;
                cache.stats.layer_hits[key.layer] += 1;
                Ok(Some(buf))
            }
            None => {
                cache.policy.on_miss(key);
                cache.stats.misses += 1;
                cache.stats.layer_misses[key.layer] += 1;
                Ok(None)
            }
        }
    }

    /// Starts loading `keys` (all missing) and yields each as it arrives,
    /// in completion order.
    pub fn fetch(&self, keys: Vec<ExpertKey>) -> Result<Loads<'_>> {
        for &key in &keys {
            self.file(key)?;
        }
        let guard = self.loading.lock().unwrap_or_else(|p| p.into_inner());
        let mut loads = Loads { store: self, _guard: guard, keys, next_submit: 0, in_flight: 0 };
        loads.fill();
        Ok(loads)
    }

    /// The record of `key`, from the cache or from disk.
    pub fn get(&self, key: ExpertKey) -> Result<Arc<AlignedBuf>> {
        if let Some(buf) = self.lookup(key)? {
            return Ok(buf);
        }
        let mut loads = self.fetch(vec![key])?;
        let (_, buf) = loads.next().expect("one load submitted");
        buf
    }

    fn take_buffer(&self, record_bytes: usize) -> AlignedBuf {
        let mut cache = self.lock();
        match cache.free.iter().position(|b| b.len() == record_bytes) {
            Some(i) => cache.free.swap_remove(i),
            None => AlignedBuf::zeroed(record_bytes),
        }
    }

    /// Caches a freshly read record if room can be made without evicting a
    /// leased one, and returns the lease.
    fn admit(&self, key: ExpertKey, buf: AlignedBuf) -> Arc<AlignedBuf> {
        let mut guard = self.lock();
        let cache = &mut *guard;
        let len = buf.len();
        cache.stats.bytes_read += len as u64;
        let buf = Arc::new(buf);
        if cache.entries.contains_key(&key) {
            return buf;
        }
        if len > self.options.capacity_bytes {
            cache.policy.on_bypass(key);
            return buf;
        }
        while cache.held_bytes + len > self.options.capacity_bytes {
            let entries = &cache.entries;
            let leased = |k: ExpertKey| entries.get(&k).is_some_and(|b| Arc::strong_count(b) > 1);
            let Some(victim) = cache.policy.victim(&leased) else {
                // Everything resident is in use: serve this one uncached.
                cache.policy.on_bypass(key);
                return buf;
            };
            if !cache.policy.admits(key, victim) {
                cache.policy.on_bypass(key);
                return buf;
            }
            cache.policy.on_remove(victim);
            let evicted = cache.entries.remove(&victim).expect("the policy names resident keys");
            cache.held_bytes -= evicted.len();
            cache.stats.evictions += 1;
            if let Ok(spare) = Arc::try_unwrap(evicted)
                && cache.free.len() < self.options.max_in_flight
            {
                cache.free.push(spare);
            }
        }
        cache.entries.insert(key, Arc::clone(&buf));
        cache.policy.on_insert(key);
        cache.held_bytes += len;
        assert!(cache.held_bytes <= self.options.capacity_bytes, "cache within capacity");
        buf
    }
}

/// Loads in progress for one batch of missing experts. Dropping it waits for
/// the loads already submitted, so no stale completion reaches a later batch.
pub struct Loads<'s> {
    store: &'s ExpertStore,
    _guard: MutexGuard<'s, ()>,
    keys: Vec<ExpertKey>,
    next_submit: usize,
    in_flight: usize,
}

impl Loads<'_> {
    fn fill(&mut self) {
        while self.in_flight < self.store.options.max_in_flight.max(1) && self.next_submit < self.keys.len() {
            let key = self.keys[self.next_submit];
            let record_bytes = self.store.file(key).expect("keys checked in fetch").record_bytes();
            let source = Arc::clone(self.store.sources[key.layer].as_ref().expect("a layer with a file has a source"));
            let buf = self.store.take_buffer(record_bytes);
            self.store.pool.submit(source, key.expert, buf, self.next_submit as u64);
            self.next_submit += 1;
            self.in_flight += 1;
        }
    }
}

impl Iterator for Loads<'_> {
    type Item = (ExpertKey, Result<Arc<AlignedBuf>>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.in_flight == 0 {
            return None;
        }
        let (tag, result) = self.store.pool.recv();
        self.in_flight -= 1;
        let key = self.keys[tag as usize];
        let result = result.map(|buf| self.store.admit(key, buf));
        self.fill();
        Some((key, result))
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

    const RECORD: usize = 4096;

    fn store_with(records: usize, capacity_bytes: usize, policy: PolicyKind) -> (tempfile::TempDir, ExpertStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_000.bin");
        let bytes: Vec<u8> = (0..records * RECORD).map(|i| (i / RECORD) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let source = ExpertSource { path, record_bytes: RECORD, num_experts: records, check: None };
        let options = StoreOptions { capacity_bytes, policy, ..StoreOptions::default() };
        let store = ExpertStore::open(vec![Some(source)], options, Usage::default()).unwrap();
        (dir, store)
    }

    fn key(expert: usize) -> ExpertKey {
        ExpertKey { layer: 0, expert }
    }

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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_000.bin");
        let bytes: Vec<u8> = (0..2 * RECORD).map(|i| (i / RECORD) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let check: RecordCheck = Arc::new(|expert, record| match record[0] {
            0 => Ok(()),
            _ => Err(format!("expert {expert} is bad")),
        });
        let source = ExpertSource { path, record_bytes: RECORD, num_experts: 2, check: Some(check) };
        let store = ExpertStore::open(vec![Some(source)], StoreOptions::default(), Usage::default()).unwrap();
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
    fn missing_file_fails_at_open() {
        let source =
            ExpertSource { path: "/nonexistent/layer.bin".into(), record_bytes: RECORD, num_experts: 1, check: None };
        let err = ExpertStore::open(vec![Some(source)], StoreOptions::default(), Usage::default());
        assert!(err.err().unwrap().to_string().contains("/nonexistent/layer.bin"));
    }

    #[test]
    fn out_of_range_expert_is_an_error() {
        let (_dir, store) = store_with(2, 0, PolicyKind::Lru);
        assert!(store.get(key(2)).is_err());
        assert!(store.get(ExpertKey { layer: 1, expert: 0 }).is_err());
    }

    #[test]
    fn learning_counts_uses() {
        let (_dir, store) = store_with(2, 0, PolicyKind::Lru);
        store.learn([key(1), key(1), key(0)]);
        assert_eq!(store.usage().count(key(1)), 2);
    }
}
