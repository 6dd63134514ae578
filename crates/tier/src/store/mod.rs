//! The expert store: a byte-bounded cache of expert records in RAM, filled
//! from the container's expert files through a bounded pool of I/O workers.
//!
//! A record in use is *leased*: the caller holds an `Arc` to its buffer, and
//! a leased record is never chosen for eviction. Records that cannot be
//! cached (the cache is full of leased records, or smaller than one record)
//! are still served, from a buffer that is freed once the caller drops it, so
//! a tiny cache changes speed, never results.
//!
//! Records may also be *prefetched*: read ahead of demand on a guess (the
//! next layer's predicted experts), through a second pool of their own that
//! defers to the demand reads: while a batch of demand loads is being read
//! it holds a [`Gate`], and no guess starts reading until the batch's last
//! record is in, so guesses fill the drive's idle time (the rest of the
//! layer's compute, the next layer's attention and router) instead of
//! competing with demand. When the next batch of demand is placed, guesses
//! no read has started for are cancelled: the route is known, and a right
//! guess not yet read is read as demand; wrong ones being read are stopped
//! at their next request (`IoPool::stop_running`). A prefetched record waits in its
//! prefetch buffer, unchecked and outside the cache, until that placement:
//! a demanded one is checked, cached as a demand load would be and counted
//! used; the others are dropped and their bytes counted wasted, having cost
//! neither a check nor a cached record. A demand for a record whose prefetch
//! is being read waits for that read instead of reading it twice. A guess
//! only moves bytes: what a computation receives is always the record it
//! asked for, checked.
//!
//! When the cache can hold every record and records come through the page
//! cache (`--io auto`, `mmap`), nothing is read into buffers at all: a miss
//! maps the record in place from the file ([`Record`]), checks it, and
//! caches the view. A fresh process on a model already in the page cache
//! then pays no copy for its first use of each expert, and the expert bytes
//! are in RAM once (the page cache), not twice. There is nothing to read
//! ahead then, so prefetching is off.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::aligned::ALIGN_BYTES;
use crate::io::{Gate, GateHold, IoBackend, IoPool, RecordCheck, RecordFile, RecordSource};
use crate::mirror::{MirrorOptions, Mirrors};
use crate::policy::{Policy, PolicyKind, new_policy};
use crate::usage::Usage;
use crate::{AlignedBuf, Error, Record, Result};

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
    /// Run on every record read from disk, on the thread that takes it from
    /// the I/O pool (`None`: records are handed out as read).
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
    /// `Auto` is resolved at open ([`IoBackend::resolve`]).
    pub io: IoBackend,
    /// I/O worker threads.
    pub io_workers: usize,
    /// Loads queued or running at once; each holds one record buffer.
    pub max_in_flight: usize,
    /// Share of the cache (in records) the `pinned` policy may pin.
    pub pinned_percent: usize,
    /// Prefetch loads queued or running at once, each holding one record
    /// buffer beside the cache (0: no prefetching).
    pub prefetch_in_flight: usize,
}

/// Prefetch loads in flight at once when prefetching is on: enough to cover
/// one decode step's predicted experts of one layer (top-k is 8 in most
/// families) without letting guesses crowd the drive.
pub const PREFETCH_IN_FLIGHT: usize = 8;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            capacity_bytes: 1 << 30,
            policy: PolicyKind::Lru,
            io: IoBackend::Auto,
            io_workers: 2,
            max_in_flight: 4,
            pinned_percent: 50,
            prefetch_in_flight: 0,
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

struct Cache {
    entries: HashMap<ExpertKey, Arc<Record>>,
    policy: Box<dyn Policy>,
    held_bytes: usize,
    /// Buffers of evicted records, reused for loads: first-touching fresh
    /// memory is several times slower than reading into warm pages.
    free: Vec<AlignedBuf>,
    /// Per layer: the experts its latest prediction named.
    predicted: Vec<Option<HashSet<usize>>>,
    stats: StoreStats,
}

/// The prefetch reads in flight: received only under this lock, so each
/// completion is matched to its key by exactly one receiver.
struct Prefetches {
    pool: IoPool,
    /// Tag → key of each read submitted and not yet received.
    in_flight: HashMap<u64, ExpertKey>,
    /// Records read and not yet asked for, unchecked; dropped (wasted) when
    /// the next demand is placed. With `in_flight`, at most the pool's
    /// `max_in_flight` buffers.
    landed: HashMap<ExpertKey, AlignedBuf>,
    /// Buffers of guesses cancelled or dropped, reused for the next ones
    /// (fresh pages cost a fault each). With `in_flight` and `landed`, at
    /// most the pool's `max_in_flight`.
    spare: Vec<AlignedBuf>,
    next_tag: u64,
}

/// What waiting for a demanded record's prefetch gave.
enum Awaited {
    /// It landed (or had landed): the record, or the read's error.
    Landed(ExpertKey, Result<Arc<Record>>),
    /// Its read failed and was forgotten: read it again as demand.
    Lost(ExpertKey),
    /// Still in flight (only when not blocking).
    Pending,
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
    /// With `io` resolved and prefetching off when `in_place`.
    options: StoreOptions,
    /// Whether misses map records in place instead of reading them (the
    /// module docs).
    in_place: bool,
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
        let mut options = options;
        let all_records_bytes = sources
            .iter()
            .flatten()
            .try_fold(0usize, |sum, s| s.record_bytes.checked_mul(s.num_experts).and_then(|b| sum.checked_add(b)));
        let resident = all_records_bytes.is_some_and(|bytes| bytes <= options.capacity_bytes);
        let mirrored = !mirrors.mirrors.is_empty();
        options.io = options.io.resolve(resident, mirrored);
        // Records must start on page boundaries to be viewed in place (every
        // container's do).
        let aligned = sources.iter().flatten().all(|s| s.record_bytes.is_multiple_of(ALIGN_BYTES));
        let in_place = options.io == IoBackend::Mmap && resident && !mirrored && aligned;
        if in_place {
            options.prefetch_in_flight = 0;
        }
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
            entries: HashMap::new(),
            policy: new_policy(options.policy, &usage, pinned_max, experts_max),
            held_bytes: 0,
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
            in_place,
            cache: Mutex::new(cache),
            pool,
            loading: Mutex::new(()),
            demand,
            prefetches,
            usage: Mutex::new(usage),
        })
    }

    /// The byte bound on cached records.
    pub fn capacity_bytes(&self) -> usize {
        self.options.capacity_bytes
    }

    /// The backend records are read with (`auto` resolved).
    pub fn io(&self) -> IoBackend {
        self.options.io
    }

    /// Whether records are served in place from the page cache (module docs).
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        let mut stats = self.lock().stats.clone();
        stats.mirror_bytes_read = self.mirrors.bytes_read();
        stats.mirror_rates_bytes_per_s = self.mirrors.rates_bytes_per_s().to_vec();
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

    /// A completed read of `key` once the layer's check passed it: a record
    /// the check refuses is [`Error::RecordRejected`], never handed out.
    fn checked(&self, key: ExpertKey, read: Result<Record>) -> Result<Record> {
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

    fn lock_prefetches(&self) -> Option<MutexGuard<'_, Prefetches>> {
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
            if cache.entries.contains_key(&key)
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
    fn cancel_prefetches(&self, prefetches: &mut Prefetches) {
        for (tag, buf) in prefetches.pool.cancel_pending() {
            prefetches.in_flight.remove(&tag).expect("every prefetch tag is in flight");
            prefetches.spare.push(buf);
        }
    }

    /// Moves every prefetch read that has completed to `landed`, without
    /// blocking. A failed prefetch is forgotten: a demand for the record
    /// reads it again and meets the error itself.
    fn drain_prefetches(&self, prefetches: &mut Prefetches) {
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
    fn drop_landed(&self, prefetches: &mut Prefetches) {
        let mut cache = self.lock();
        for (_, buf) in prefetches.landed.drain() {
            cache.stats.prefetch_wasted_bytes += buf.len() as u64;
            prefetches.spare.push(buf);
        }
    }

    /// Checks and caches a prefetched record a demand asked for.
    fn use_prefetched(&self, key: ExpertKey, buf: AlignedBuf) -> Result<Arc<Record>> {
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
    fn await_prefetch(&self, awaited: &mut Vec<ExpertKey>, block: bool) -> Awaited {
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

    /// The record of `key`, from the cache or from disk.
    pub fn get(&self, key: ExpertKey) -> Result<Arc<Record>> {
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

    /// Caches a record a demand asked for if room can be made without
    /// evicting a leased one, and returns the lease. `count_read`: its
    /// bytes were read for this demand (a prefetch counted them on landing).
    fn admit(&self, key: ExpertKey, buf: Record, count_read: bool) -> Arc<Record> {
        let mut guard = self.lock();
        let cache = &mut *guard;
        let len = buf.len();
        if count_read {
            cache.stats.bytes_read += len as u64;
        }
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
            if let Some(spare) = Arc::try_unwrap(evicted).ok().and_then(Record::into_buffer)
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
        if self.store.in_place {
            // Every record of the batch is asked for at once, so that the
            // disk reads them side by side while the first are checked and
            // computed (they are only mapped, one by one, in `next`).
            if self.next_submit == 0 {
                for key in &self.keys {
                    self.store.file(*key).expect("keys checked in fetch").will_need(key.expert);
                }
            }
            return;
        }
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
        if self.store.in_place {
            let key = *self.keys.get(self.next_submit)?;
            self.next_submit += 1;
            let file = self.store.file(key).expect("keys checked in fetch");
            let mapped = file.mapped_record(key.expert).expect("in place: every file is mapped");
            let result = self.store.checked(key, mapped).map(|record| self.store.admit(key, record, true));
            return Some((key, result));
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

    const RECORD: usize = 4096;

    fn open_store(records: usize, options: StoreOptions) -> (tempfile::TempDir, ExpertStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_000.bin");
        let bytes: Vec<u8> = (0..records * RECORD).map(|i| (i / RECORD) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let source = ExpertSource { path, record_bytes: RECORD, num_experts: records, check: None };
        let store = ExpertStore::open(vec![Some(source)], options, Usage::default()).unwrap();
        (dir, store)
    }

    fn store_with(records: usize, capacity_bytes: usize, policy: PolicyKind) -> (tempfile::TempDir, ExpertStore) {
        open_store(records, StoreOptions { capacity_bytes, policy, ..StoreOptions::default() })
    }

    fn key(expert: usize) -> ExpertKey {
        ExpertKey { layer: 0, expert }
    }

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

    /// A store of two records whose check refuses expert 1 (every record
    /// but expert 0's starts with a nonzero byte).
    fn store_refusing_expert_1(options: StoreOptions) -> (tempfile::TempDir, ExpertStore) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_000.bin");
        let bytes: Vec<u8> = (0..2 * RECORD).map(|i| (i / RECORD) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let check: RecordCheck = Arc::new(|expert, record| match record[0] {
            0 => Ok(()),
            _ => Err(format!("expert {expert} is bad")),
        });
        let source = ExpertSource { path, record_bytes: RECORD, num_experts: 2, check: Some(check) };
        (dir, ExpertStore::open(vec![Some(source)], options, Usage::default()).unwrap())
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

    #[test]
    fn a_cache_holding_every_record_serves_them_in_place_under_auto_and_mmap() {
        for io in [IoBackend::Auto, IoBackend::Mmap] {
            let (_dir, store) =
                open_store(4, StoreOptions { capacity_bytes: 4 * RECORD, io, ..StoreOptions::default() });
            assert!(store.in_place() && store.io() == IoBackend::Mmap, "{io}");
            for expert in [2, 0, 2, 3] {
                let record = store.get(key(expert)).unwrap();
                assert!(record.is_mapped(), "{io}: served in place");
                assert!(record.as_slice().iter().all(|&b| b == expert as u8), "{io}: expert {expert}");
                assert_eq!(record.as_slice().as_ptr() as usize % ALIGN_BYTES, 0);
            }
            let stats = store.stats();
            assert_eq!((stats.hits, stats.misses, stats.bytes_read), (1, 3, 3 * RECORD as u64), "{io}");
            assert_eq!(store.held_bytes(), 3 * RECORD);
        }
    }

    #[test]
    fn a_cache_short_of_every_record_reads_them_and_auto_means_pread() {
        for (io, resolved) in [(IoBackend::Auto, IoBackend::Pread), (IoBackend::Mmap, IoBackend::Mmap)] {
            let (_dir, store) =
                open_store(4, StoreOptions { capacity_bytes: 4 * RECORD - 1, io, ..StoreOptions::default() });
            assert!(!store.in_place() && store.io() == resolved, "{io}");
            let record = store.get(key(1)).unwrap();
            assert!(!record.is_mapped() && record.as_slice().iter().all(|&b| b == 1), "{io}");
        }
        // Explicit pread reads even when everything fits.
        let (_dir, store) =
            open_store(4, StoreOptions { capacity_bytes: 1 << 20, io: IoBackend::Pread, ..StoreOptions::default() });
        assert!(!store.in_place() && !store.get(key(0)).unwrap().is_mapped());
    }

    #[test]
    fn a_record_in_place_its_check_refuses_is_never_cached_or_handed_out() {
        let (_dir, store) =
            store_refusing_expert_1(StoreOptions { capacity_bytes: 1 << 20, ..StoreOptions::default() });
        assert!(store.in_place());
        assert!(store.get(key(0)).unwrap().is_mapped());
        for _ in 0..2 {
            assert!(matches!(store.get(key(1)), Err(Error::RecordRejected { layer: 0, expert: 1, .. })));
        }
        assert!(store.lookup(key(1)).unwrap().is_none());
    }

    #[test]
    fn a_truncated_file_served_in_place_is_a_short_read_not_a_fault() {
        let (dir, store) = store_with(2, 1 << 20, PolicyKind::Lru);
        assert!(store.in_place());
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("layer_000.bin"))
            .unwrap()
            .set_len(RECORD as u64 + 10)
            .unwrap();
        assert!(matches!(store.get(key(1)), Err(Error::ShortRead { layer: 0, expert: 1, .. })));
        assert_eq!(store.get(key(0)).unwrap().as_slice()[0], 0);
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
        // One batch: once per distinct expert, each token an event.
        store.learn(0, [&[1, 0][..], &[1]]);
        store.learn(0, [&[1][..]]);
        let usage = store.usage();
        assert_eq!((usage.count(key(1)), usage.count(key(0))), (2, 1));
        assert_eq!(usage.routing().collect::<Vec<_>>(), [(0, &[1, 0][..]), (0, &[1]), (0, &[1])]);
    }
}
