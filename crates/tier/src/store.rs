//! The expert store: a byte-bounded cache of expert records in RAM, filled from
//! the container's expert files on demand.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{AlignedBuf, Error, Result};

/// One routed expert: `(layer, expert)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    pub layer: usize,
    pub expert: usize,
}

/// Where one layer's expert records live: a file of `num_experts` fixed-size
/// records, record `e` at byte offset `e * record_bytes`.
#[derive(Debug, Clone)]
pub struct ExpertSource {
    pub path: PathBuf,
    pub record_bytes: usize,
    pub num_experts: usize,
}

/// Counters of what the store did, for `--json` stats and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub evictions: u64,
}

struct Layer {
    source: ExpertSource,
    file: File,
}

/// Least-recently-used bookkeeping: `tick` orders uses; the smallest is oldest.
#[derive(Default)]
struct Cache {
    entries: HashMap<ExpertKey, (Arc<AlignedBuf>, u64)>,
    by_tick: BTreeMap<u64, ExpertKey>,
    next_tick: u64,
    held_bytes: usize,
    stats: StoreStats,
}

/// Routed experts, read from disk on demand and kept in RAM within
/// `capacity_bytes`.
///
/// A record larger than the whole capacity is still served (read into a
/// buffer the caller drops after use) but never cached, so a tiny
/// `--expert-cache` changes speed, never results.
pub struct ExpertStore {
    layers: Vec<Option<Layer>>,
    capacity_bytes: usize,
    cache: Mutex<Cache>,
}

impl ExpertStore {
    /// Opens every layer's expert file. `sources[l]` is `None` for a layer
    /// without routed experts.
    pub fn open(sources: Vec<Option<ExpertSource>>, capacity_bytes: usize) -> Result<Self> {
        let layers = sources
            .into_iter()
            .map(|source| source.map(open_layer).transpose())
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, capacity_bytes, cache: Mutex::new(Cache::default()) })
    }

    /// The byte bound on cached records.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        self.lock().stats
    }

    /// Bytes of records currently cached.
    pub fn held_bytes(&self) -> usize {
        self.lock().held_bytes
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        // A panic while holding the lock leaves only counters half-updated;
        // the cached buffers themselves are immutable, so keep going.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The complete record of `key`, from the cache or from disk.
    pub fn get(&self, key: ExpertKey) -> Result<Arc<AlignedBuf>> {
        let layer = self.layer(key)?;
        if let Some(buf) = self.lookup(key) {
            return Ok(buf);
        }
        let buf = Arc::new(read_record(layer, key)?);
        self.insert(key, &buf);
        Ok(buf)
    }

    fn layer(&self, key: ExpertKey) -> Result<&Layer> {
        let no_such = || Error::NoSuchExpert { layer: key.layer, expert: key.expert };
        let layer = self.layers.get(key.layer).and_then(Option::as_ref).ok_or_else(no_such)?;
        if key.expert >= layer.source.num_experts {
            return Err(no_such());
        }
        Ok(layer)
    }

    fn lookup(&self, key: ExpertKey) -> Option<Arc<AlignedBuf>> {
        let mut guard = self.lock();
        let cache = &mut *guard;
        let tick = cache.next_tick;
        match cache.entries.get_mut(&key) {
            Some((buf, last_tick)) => {
                cache.by_tick.remove(last_tick);
                *last_tick = tick;
                cache.by_tick.insert(tick, key);
                cache.next_tick += 1;
                cache.stats.hits += 1;
                Some(Arc::clone(buf))
            }
            None => {
                cache.stats.misses += 1;
                None
            }
        }
    }

    fn insert(&self, key: ExpertKey, buf: &Arc<AlignedBuf>) {
        let mut guard = self.lock();
        let cache = &mut *guard;
        cache.stats.bytes_read += buf.len() as u64;
        if buf.len() > self.capacity_bytes || cache.entries.contains_key(&key) {
            return;
        }
        while cache.held_bytes + buf.len() > self.capacity_bytes {
            let (_, oldest) = cache.by_tick.pop_first().expect("held bytes imply an entry");
            let (evicted, _) = cache.entries.remove(&oldest).expect("tick index matches entries");
            cache.held_bytes -= evicted.len();
            cache.stats.evictions += 1;
        }
        let tick = cache.next_tick;
        cache.next_tick += 1;
        cache.by_tick.insert(tick, key);
        cache.entries.insert(key, (Arc::clone(buf), tick));
        cache.held_bytes += buf.len();
        debug_assert!(cache.held_bytes <= self.capacity_bytes);
    }
}

fn open_layer(source: ExpertSource) -> Result<Layer> {
    let file = File::open(&source.path)
        .map_err(|source_err| Error::Open { path: source.path.clone(), source: source_err })?;
    Ok(Layer { source, file })
}

/// Reads one whole record with positioned reads, retrying short reads until
/// the record is complete; the end of the file before that is an error.
fn read_record(layer: &Layer, key: ExpertKey) -> Result<AlignedBuf> {
    let record_bytes = layer.source.record_bytes;
    let offset_bytes = (key.expert as u64) * record_bytes as u64;
    let mut buf = AlignedBuf::zeroed(record_bytes);
    let mut done_bytes = 0;
    while done_bytes < record_bytes {
        let at = offset_bytes + done_bytes as u64;
        match layer.file.read_at(&mut buf.as_mut_slice()[done_bytes..], at) {
            Ok(0) => {
                return Err(Error::ShortRead {
                    path: layer.source.path.clone(),
                    layer: key.layer,
                    expert: key.expert,
                    offset_bytes,
                    wanted_bytes: record_bytes,
                    got_bytes: done_bytes,
                });
            }
            Ok(n) => done_bytes += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(Error::Read {
                    path: layer.source.path.clone(),
                    layer: key.layer,
                    expert: key.expert,
                    source,
                });
            }
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(records: usize, record_bytes: usize, capacity_bytes: usize) -> (tempfile::TempDir, ExpertStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_000.bin");
        let bytes: Vec<u8> = (0..records * record_bytes).map(|i| (i / record_bytes) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let source = ExpertSource { path, record_bytes, num_experts: records };
        let store = ExpertStore::open(vec![Some(source)], capacity_bytes).unwrap();
        (dir, store)
    }

    #[test]
    fn serves_whole_records_and_evicts_least_recent() {
        let (_dir, store) = store_with(4, 4096, 2 * 4096);
        for expert in [0, 1, 0, 2, 0, 1] {
            let buf = store.get(ExpertKey { layer: 0, expert }).unwrap();
            assert!(buf.as_slice().iter().all(|&b| b == expert as u8));
        }
        let stats = store.stats();
        // 0 miss, 1 miss, 0 hit, 2 miss (evicts 1), 0 hit, 1 miss (evicts 2).
        assert_eq!((stats.hits, stats.misses, stats.evictions), (2, 4, 2));
        assert_eq!(stats.bytes_read, 4 * 4096);
        assert!(store.held_bytes() <= store.capacity_bytes());
    }

    #[test]
    fn capacity_below_one_record_still_serves_without_caching() {
        let (_dir, store) = store_with(2, 4096, 100);
        for _ in 0..3 {
            let buf = store.get(ExpertKey { layer: 0, expert: 1 }).unwrap();
            assert_eq!(buf.as_slice()[4095], 1);
        }
        assert_eq!(store.held_bytes(), 0);
        assert_eq!(store.stats().misses, 3);
    }

    #[test]
    fn truncated_file_is_a_short_read_naming_the_expert() {
        let (dir, store) = store_with(2, 4096, 1 << 20);
        let path = dir.path().join("layer_000.bin");
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096 + 10).unwrap();
        let err = store.get(ExpertKey { layer: 0, expert: 1 }).unwrap_err().to_string();
        assert!(err.contains("expert 1 of layer 0") && err.contains("truncated"), "{err}");
    }

    #[test]
    fn missing_file_fails_at_open() {
        let source = ExpertSource { path: "/nonexistent/layer.bin".into(), record_bytes: 4096, num_experts: 1 };
        let err = ExpertStore::open(vec![Some(source)], 0).err().unwrap().to_string();
        assert!(err.contains("/nonexistent/layer.bin"), "{err}");
    }

    #[test]
    fn out_of_range_expert_is_an_error() {
        let (_dir, store) = store_with(2, 4096, 0);
        assert!(store.get(ExpertKey { layer: 0, expert: 2 }).is_err());
        assert!(store.get(ExpertKey { layer: 1, expert: 0 }).is_err());
    }
}
