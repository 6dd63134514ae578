//! The expert store: a byte-bounded cache of expert records in RAM, filled
//! from the container's expert files through a bounded pool of I/O workers.
//!
//! This file holds the store itself (what it owns, and opening it: the I/O
//! backend resolved, the files and mirrors opened) and the learned usage. The rest is in submodules:
//! - `options`: how a store is opened ([`ExpertSource`], [`StoreOptions`]);
//! - `cache`: the cache and its leases, and the counters ([`StoreStats`]);
//! - `loads`: demand reads ([`Loads`]), the record check, and mirrors;
//! - `prefetch`: reads ahead of demand on a guess, and their bookkeeping.
//!
//! Invariants they share: a record handed out is complete and passed
//! its layer's check; a leased record is never evicted and cached bytes
//! never exceed the capacity; every queue (loads in flight, spare buffers,
//! prefetches) has a fixed bound; a guess only moves bytes.

mod cache;
mod loads;
mod options;
mod prefetch;
#[cfg(test)]
mod testing;

pub use cache::StoreStats;
pub use loads::Loads;
pub use options::{ExpertSource, PREFETCH_IN_FLIGHT, StoreOptions};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use self::cache::Cache;
use self::prefetch::Prefetches;
use crate::io::{Gate, IoBackend, IoPool, RecordCheck, RecordFile, RecordSource};
use crate::mirror::{MirrorOptions, Mirrors};
use crate::policy::new_policy;
use crate::resident::{DeviceTier, Resident};
use crate::usage::Usage;
use crate::{Error, Result};

/// One routed expert: `(layer, expert)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    pub layer: usize,
    pub expert: usize,
}

/// Routed experts, read from disk on demand and kept in RAM within a byte
/// capacity, under a replacement policy.
pub struct ExpertStore {
    files: Vec<Option<Arc<RecordFile>>>,
    /// Per layer: what every record read from disk must pass before it is
    /// cached or handed out. Run by the thread that takes the completed
    /// read, never by an I/O worker, so that a worker goes straight on to
    /// its next read (docs/BENCHMARKS.md, "The record check on reads").
    checks: Vec<Option<RecordCheck>>,
    /// Whether `checks` run (off only to measure them: `set_checking`).
    checking: AtomicBool,
    /// Where each layer's records are read from: its file, or its file and
    /// the mirrors' copies of it.
    sources: Vec<Option<Arc<dyn RecordSource>>>,
    mirrors: Mirrors,
    /// With `io` resolved.
    options: StoreOptions,
    cache: Mutex<Cache>,
    pool: IoPool,
    /// Held by the one batch of demand loads in progress: completions are
    /// matched to keys by tag, so two batches must not share the pool at
    /// once. Prefetches have their own pool and never take it.
    loading: Mutex<()>,
    /// Held while a batch's demand reads are in progress; the prefetch
    /// pool starts no read meanwhile.
    demand: Arc<Gate>,
    /// `None` when prefetching is off.
    prefetches: Option<Mutex<Prefetches>>,
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
        let options = StoreOptions { io: options.io.resolve(), ..options };
        let checks = sources.iter().map(|s| s.as_ref().and_then(|s| s.check.clone())).collect();
        let files = sources
            .into_iter()
            .enumerate()
            .map(|(layer, source)| {
                source
                    .map(|s| RecordFile::open(options.io, &s.path, layer, s.record_bytes, s.num_experts).map(Arc::new))
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
            records: Resident::new(new_policy(options.policy, &usage, pinned_max, experts_max), options.capacity_bytes),
            free: Vec::new(),
            predicted: vec![None; n_layers],
            stats: StoreStats {
                layer_hits: vec![0; n_layers],
                layer_misses: vec![0; n_layers],
                layer_predicted_lookups: vec![0; n_layers],
                layer_predicted_hits: vec![0; n_layers],
                ..StoreStats::default()
            },
        };
        let pool = IoPool::new(options.io_workers.max(1), options.max_in_flight.max(1))?;
        let demand = Gate::new();
        let prefetches = match options.prefetch_in_flight {
            0 => None,
            max_in_flight => Some(Mutex::new(Prefetches {
                pool: IoPool::deferring(options.io_workers.max(1), max_in_flight, Arc::clone(&demand))?,
                in_flight: HashMap::new(),
                landed: HashMap::new(),
                spare: Vec::new(),
                next_tag: 0,
            })),
        };
        Ok(Self {
            files,
            checks,
            checking: AtomicBool::new(true),
            sources,
            mirrors,
            options,
            cache: Mutex::new(cache),
            pool,
            loading: Mutex::new(()),
            demand,
            prefetches,
            usage: Mutex::new(usage),
        })
    }

    /// A tier of experts on a device (VRAM) holding `capacity_bytes`,
    /// under this store's policy (its learned usage, and its share pinned
    /// of as many of the largest records as fit).
    pub fn device_tier<V>(&self, capacity_bytes: usize) -> DeviceTier<V> {
        let record_bytes_max = self.files.iter().flatten().map(|f| f.record_bytes()).max().unwrap_or(0);
        let experts_max = self.files.iter().flatten().map(|f| f.num_experts()).max().unwrap_or(0);
        // `auto` is a capacity of usize::MAX: the share saturates.
        let pinned_max =
            capacity_bytes.checked_div(record_bytes_max).unwrap_or(0).saturating_mul(self.options.pinned_percent) / 100;
        let policy = new_policy(self.options.policy, &self.usage(), pinned_max, experts_max);
        DeviceTier::new(Resident::new(policy, capacity_bytes))
    }

    /// The byte bound on cached records.
    pub fn capacity_bytes(&self) -> usize {
        self.options.capacity_bytes
    }

    /// The backend records are read with (`auto` resolved).
    pub fn io(&self) -> IoBackend {
        self.options.io
    }

    /// What the store has learned so far (earlier runs included).
    pub fn usage(&self) -> Usage {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The **learn** step for one batch at `layer`: counts one use of each
    /// distinct expert its tokens routed to, and keeps each token's experts
    /// as a routing event (what `predict` learns from in later runs).
    pub fn learn<'t>(&self, layer: usize, tokens: impl IntoIterator<Item = &'t [usize]>) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let mut used = HashSet::new();
        for experts in tokens {
            usage.record_routing(layer, experts);
            used.extend(experts.iter().copied());
        }
        for expert in used {
            usage.record(ExpertKey { layer, expert });
        }
    }

    /// Drops every expert file's pages from the page cache (cold runs).
    pub fn evict_page_cache(&self) -> Result<()> {
        self.files.iter().flatten().try_for_each(|f| f.evict_page_cache())
    }

    fn file(&self, key: ExpertKey) -> Result<&Arc<RecordFile>> {
        let no_such = || Error::NoSuchExpert { layer: key.layer, expert: key.expert };
        let file = self.files.get(key.layer).and_then(Option::as_ref).ok_or_else(no_such)?;
        if key.expert >= file.num_experts() {
            return Err(no_such());
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{RECORD, key, store_with};
    use super::*;
    use crate::policy::PolicyKind;

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
        // One batch: once per distinct expert, each token an event.
        store.learn(0, [&[1, 0][..], &[1]]);
        store.learn(0, [&[1][..]]);
        let usage = store.usage();
        assert_eq!((usage.count(key(1)), usage.count(key(0))), (2, 1));
        assert_eq!(usage.routing().collect::<Vec<_>>(), [(0, &[1, 0][..]), (0, &[1]), (0, &[1])]);
    }
}
