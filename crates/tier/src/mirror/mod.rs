//! Multi-disk mirrors: byte-identical copies of some or all expert files on
//! other drives, read side by side with the container (`--mirror DIR`).
//!
//! A mirror is a directory with the container's layout (`experts/…`) and a
//! receipt (`receipt.rs`) listing what it holds. At open every copy the
//! receipt lists is checked against the container's manifest (path, size,
//! SHA-256, record size) and against the file on disk (its size); any
//! mismatch refuses the mirror. Each drive's read rate is given
//! (`DIR=RATE`) or measured with a short cold read.
//!
//! Each expert is read from one drive, chosen deterministically from the
//! (layer, expert) pair, with probability proportional to each drive's
//! rate among the drives holding its layer (the container's drive
//! included), so a fast and a slow drive together serve at close to the sum
//! of their rates. Every record read from a mirror is checked against its
//! digest in the receipt; a read error or a differing record makes that copy
//! unused from then on, with one warning, and the record is read from the
//! container instead: a mirror changes where bytes come from, never which.
//! Nothing is ever written to a mirror at run time.

mod receipt;
mod stage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

pub use receipt::{RECEIPT_FILE_NAME, Receipt, ReceiptFile, hash_file};
pub use stage::{PlannedFile, StageReport, VerifyReport, plan, stage, verify};

use crate::io::{RecordFile, RecordSource};
use crate::{AlignedBuf, ByteSize, Error, IoBackend, Result};
use receipt::{RecordDigest, record_digest};

/// Bytes read, at most, to measure a drive's rate at open.
const RATE_SAMPLE_BYTES: usize = 64 << 20;

/// Time spent, at most, measuring a drive's rate at open (a slow drive
/// stops here before [`RATE_SAMPLE_BYTES`]).
const RATE_SAMPLE_SECONDS: f64 = 0.5;

/// One `--mirror` argument: `DIR` or `DIR=RATE` (a size per second, e.g.
/// `/mnt/nvme1/model=3GB`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorSpec {
    pub dir: PathBuf,
    /// `None`: measured at open.
    pub rate_bytes_per_s: Option<u64>,
}

impl FromStr for MirrorSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let invalid = |reason: String| Error::MirrorSpec { text: text.to_owned(), reason };
        let (dir, rate_bytes_per_s) = match text.rsplit_once('=') {
            Some((dir, rate)) => {
                let rate = rate.parse::<ByteSize>().map_err(|err| invalid(format!("rate: {err}")))?;
                if rate.bytes() == 0 {
                    return Err(invalid("a rate must be more than 0 bytes per second".into()));
                }
                (dir, Some(rate.bytes()))
            }
            None => (text, None),
        };
        if dir.is_empty() {
            return Err(invalid("no directory".into()));
        }
        Ok(MirrorSpec { dir: PathBuf::from(dir), rate_bytes_per_s })
    }
}

/// An expert file of the container, as its manifest records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerFile {
    pub layer: usize,
    /// Relative, `/`-separated (`experts/layer_003.bin`).
    pub path: String,
    pub size_bytes: u64,
    /// Lower-case hex SHA-256.
    pub sha256: String,
    pub record_bytes: usize,
    pub num_experts: usize,
}

/// What the store needs to open mirrors.
#[derive(Debug, Clone, Default)]
pub struct MirrorOptions {
    pub mirrors: Vec<MirrorSpec>,
    /// The container's content hash, which a receipt must name.
    pub container_hash: String,
    /// Every expert file of the container.
    pub files: Vec<LayerFile>,
    /// The container's drive's rate (`None`: measured at open).
    pub primary_rate_bytes_per_s: Option<u64>,
}

/// A copy of one layer's file on one mirror.
#[derive(Debug)]
struct Copy {
    /// Index of the mirror in `--mirror` order.
    mirror: usize,
    file: RecordFile,
    record_digests: Vec<RecordDigest>,
    /// Set at the first failed or differing read: the copy is not used again.
    failed: AtomicBool,
}

impl Copy {
    /// Reads record `expert` (stopped when `stop` says so, if given) and
    /// checks it against the receipt's digest.
    fn read_verified(&self, expert: usize, buf: &mut AlignedBuf, stop: Option<&dyn Fn() -> bool>) -> Result<()> {
        match stop {
            Some(stop) => self.file.read_into_until(expert, buf, stop)?,
            None => self.file.read_into(expert, buf)?,
        }
        if record_digest(buf.as_slice()) != self.record_digests[expert] {
            return Err(Error::MirrorInvalid {
                dir: self.file.path().to_owned(),
                reason: format!(
                    "expert {expert} of layer {} differs from the container's (record digest)",
                    self.file.layer()
                ),
            });
        }
        Ok(())
    }
}

/// What every mirrored layer reports into.
#[derive(Debug)]
struct Counters {
    /// Per mirror: bytes of records it served.
    bytes_read: Vec<AtomicU64>,
    /// Copies that failed and are read no more.
    failed_copies: AtomicU64,
}

/// The mirrors of a store, validated.
#[derive(Debug)]
pub struct Mirrors {
    dirs: Vec<PathBuf>,
    /// Per mirror, then the container's drive last.
    rates_bytes_per_s: Vec<u64>,
    copies: HashMap<usize, Vec<Arc<Copy>>>,
    counters: Arc<Counters>,
}

impl Mirrors {
    /// No mirrors.
    pub fn none() -> Self {
        Self::with(Vec::new(), Vec::new(), HashMap::new())
    }

    fn with(dirs: Vec<PathBuf>, rates_bytes_per_s: Vec<u64>, copies: HashMap<usize, Vec<Arc<Copy>>>) -> Self {
        let counters = Arc::new(Counters {
            bytes_read: dirs.iter().map(|_| AtomicU64::new(0)).collect(),
            failed_copies: AtomicU64::new(0),
        });
        Self { dirs, rates_bytes_per_s, copies, counters }
    }

    /// Validates each mirror of `options` against the container and opens
    /// its copies with `io`. `primary[layer]` is the container's file of
    /// each layer (its rate is measured when a mirror holds that layer).
    pub fn open(options: &MirrorOptions, io: IoBackend, primary: &[Option<Arc<RecordFile>>]) -> Result<Self> {
        let by_path: HashMap<&str, &LayerFile> = options.files.iter().map(|f| (f.path.as_str(), f)).collect();
        let mut copies: HashMap<usize, Vec<Arc<Copy>>> = HashMap::new();
        let mut rates_bytes_per_s = Vec::new();
        for (mirror, spec) in options.mirrors.iter().enumerate() {
            let held = open_copies(spec, mirror, &options.container_hash, &by_path, io)?;
            let rate = match (spec.rate_bytes_per_s, held.first()) {
                (Some(rate), _) => rate,
                (None, Some(copy)) => measure_rate_bytes_per_s(&copy.file)?,
                (None, None) => 1,
            };
            rates_bytes_per_s.push(rate);
            for copy in held {
                copies.entry(copy.file.layer()).or_default().push(Arc::new(copy));
            }
        }
        let measured_on = copies.keys().min().and_then(|&layer| primary.get(layer)?.as_ref());
        let primary_rate = match (options.primary_rate_bytes_per_s, measured_on) {
            (Some(rate), _) => rate.max(1),
            (None, Some(file)) => measure_rate_bytes_per_s(file)?,
            (None, None) => 1,
        };
        rates_bytes_per_s.push(primary_rate);
        let dirs = options.mirrors.iter().map(|spec| spec.dir.clone()).collect();
        Ok(Self::with(dirs, rates_bytes_per_s, copies))
    }

    /// The mirror directories, in `--mirror` order.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The rate each mirror was weighted by, then the container's drive's.
    pub fn rates_bytes_per_s(&self) -> &[u64] {
        &self.rates_bytes_per_s
    }

    /// Bytes each mirror served so far.
    pub fn bytes_read(&self) -> Vec<u64> {
        self.counters.bytes_read.iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }

    /// Copies that failed (a read error, a record unlike the container's)
    /// and are read no more; each was logged as a warning.
    pub fn failed_copies(&self) -> u64 {
        self.counters.failed_copies.load(Ordering::Relaxed)
    }

    /// Where records of `layer` are read from: `primary` alone, or `primary`
    /// with the copies of it.
    pub fn source(&self, layer: usize, primary: Arc<RecordFile>) -> Arc<dyn RecordSource> {
        let Some(copies) = self.copies.get(&layer) else { return primary };
        let primary_rate = *self.rates_bytes_per_s.last().expect("the primary's rate is last");
        // Cumulative weights: each copy's mirror rate, then the primary.
        let mut total = 0u64;
        let mut bounds = Vec::with_capacity(copies.len() + 1);
        for rate in copies.iter().map(|copy| self.rates_bytes_per_s[copy.mirror]).chain([primary_rate]) {
            total = total.saturating_add(rate.max(1));
            bounds.push(total);
        }
        Arc::new(MirroredLayer { layer, primary, copies: copies.clone(), bounds, counters: Arc::clone(&self.counters) })
    }
}

/// Opens the copies a mirror's receipt lists, checking each.
fn open_copies(
    spec: &MirrorSpec,
    mirror: usize,
    container_hash: &str,
    by_path: &HashMap<&str, &LayerFile>,
    io: IoBackend,
) -> Result<Vec<Copy>> {
    let dir = &spec.dir;
    let invalid = |reason: String| Error::MirrorInvalid { dir: dir.clone(), reason };
    let receipt = Receipt::read(dir)?.ok_or_else(|| {
        invalid(format!(
            "no {RECEIPT_FILE_NAME}: stage it with `strata mirror stage`, or check copies made by hand with `strata mirror verify`"
        ))
    })?;
    if receipt.container_hash != container_hash {
        return Err(invalid(format!(
            "it mirrors container {}, this container is {container_hash}; stage it again",
            receipt.container_hash
        )));
    }
    let mut copies = Vec::new();
    for held in &receipt.files {
        let expected = by_path
            .get(held.path.as_str())
            .ok_or_else(|| invalid(format!("it holds {}, which is not an expert file of the container", held.path)))?;
        if held.sha256 != expected.sha256
            || held.size_bytes != expected.size_bytes
            || held.record_bytes != expected.record_bytes as u64
            || held.record_digests.len() != expected.num_experts
        {
            return Err(invalid(format!("its receipt for {} does not match the container's manifest", held.path)));
        }
        let path = receipt::join(dir, &held.path);
        let on_disk = std::fs::metadata(&path)
            .map_err(|err| invalid(format!("{} is listed in its receipt but cannot be read: {err}", held.path)))?;
        if on_disk.len() != held.size_bytes {
            return Err(invalid(format!(
                "{} has {} bytes, the container's copy {}",
                held.path,
                on_disk.len(),
                held.size_bytes
            )));
        }
        let file = RecordFile::open(io, &path, expected.layer, expected.record_bytes, expected.num_experts)?;
        let record_digests = Receipt::record_digests(dir, held)?;
        copies.push(Copy { mirror, file, record_digests, failed: AtomicBool::new(false) });
    }
    Ok(copies)
}

/// Reads records from the start of `file`, cold (its pages dropped first),
/// until [`RATE_SAMPLE_BYTES`] or [`RATE_SAMPLE_SECONDS`], and returns the
/// rate of the second half of the reads. Drives (and throttles) serve a
/// burst faster after idling (an SLC cache, a controller's, blk-throttle's
/// first slice read 16 MiB at 1 GB/s from a drive capped at 160 MB/s):
/// weighing by the burst would send a slow drive more than its share.
fn measure_rate_bytes_per_s(file: &RecordFile) -> Result<u64> {
    file.evict_page_cache()?;
    let most = (RATE_SAMPLE_BYTES / file.record_bytes()).clamp(2, file.num_experts().max(2)).min(file.num_experts());
    let mut buf = AlignedBuf::zeroed(file.record_bytes());
    let start = Instant::now();
    // When each read ended, seconds after the start.
    let mut ended_s = Vec::with_capacity(most);
    for expert in 0..most {
        file.read_into(expert, &mut buf)?;
        ended_s.push(start.elapsed().as_secs_f64());
        if ended_s.len() >= 2 && start.elapsed().as_secs_f64() >= RATE_SAMPLE_SECONDS {
            break;
        }
    }
    let reads = ended_s.len();
    let (bytes, seconds) = match reads {
        // A single record (a one-expert file): its whole read.
        0 | 1 => (reads * file.record_bytes(), ended_s.last().copied().unwrap_or(0.0)),
        _ => {
            let half = reads / 2;
            ((reads - half) * file.record_bytes(), ended_s[reads - 1] - ended_s[half - 1])
        }
    };
    Ok((bytes as f64 / seconds.max(1e-6)).max(1.0) as u64)
}

/// A well-mixed 64-bit hash (splitmix64's finaliser): spreads (layer,
/// expert) pairs evenly over the drives' shares.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// One layer's records, readable from the container or a mirror.
struct MirroredLayer {
    layer: usize,
    primary: Arc<RecordFile>,
    copies: Vec<Arc<Copy>>,
    /// Cumulative rates: copy `i` serves hashes below `bounds[i]`, the
    /// primary the rest up to the last bound.
    bounds: Vec<u64>,
    counters: Arc<Counters>,
}

impl MirroredLayer {
    /// The copy record `expert` is read from, or `None` for the container.
    fn chosen(&self, expert: usize) -> Option<&Copy> {
        let total = *self.bounds.last().expect("at least the primary");
        let hash = mix(((self.layer as u64) << 32) ^ expert as u64);
        // Scale the hash into [0, total) without modulo bias worth noting.
        let point = ((u128::from(hash) * u128::from(total)) >> 64) as u64;
        let at = self.bounds.partition_point(|&bound| bound <= point);
        self.copies.get(at).map(Arc::as_ref)
    }
}

impl RecordSource for MirroredLayer {
    fn read_record(&self, expert: usize, buf: &mut AlignedBuf) -> Result<()> {
        self.read(expert, buf, None)
    }

    fn read_record_until(&self, expert: usize, buf: &mut AlignedBuf, stop: &dyn Fn() -> bool) -> Result<()> {
        self.read(expert, buf, Some(stop))
    }
}

impl MirroredLayer {
    /// Reads from the chosen copy, falling back to the container (for good,
    /// with one warning) on any failure but a stop, which is the caller's.
    fn read(&self, expert: usize, buf: &mut AlignedBuf, stop: Option<&dyn Fn() -> bool>) -> Result<()> {
        if let Some(copy) = self.chosen(expert)
            && !copy.failed.load(Ordering::Relaxed)
        {
            match copy.read_verified(expert, buf, stop) {
                Ok(()) => {
                    self.counters.bytes_read[copy.mirror].fetch_add(buf.len() as u64, Ordering::Relaxed);
                    return Ok(());
                }
                Err(err @ Error::ReadStopped { .. }) => return Err(err),
                Err(err) => {
                    if !copy.failed.swap(true, Ordering::Relaxed) {
                        self.counters.failed_copies.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            mirror = copy.mirror,
                            path = %copy.file.path().display(),
                            "{err}; reading layer {} from the container from now on",
                            self.layer
                        );
                    }
                }
            }
        }
        match stop {
            Some(stop) => self.primary.read_into_until(expert, buf, stop),
            None => self.primary.read_into(expert, buf),
        }
    }
}

#[cfg(test)]
mod tests;
