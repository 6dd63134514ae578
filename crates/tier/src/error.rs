//! The error type of the tiered store.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while sizing, reading or caching experts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A size string such as `512MiB` could not be parsed.
    #[error("invalid size {text:?}: {reason}")]
    InvalidSize { text: String, reason: &'static str },
    /// Opening an expert file failed.
    #[error("cannot open expert file {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading one expert record failed.
    #[error("reading expert {expert} of layer {layer} from {} failed: {source}", path.display())]
    Read {
        path: PathBuf,
        layer: usize,
        expert: usize,
        #[source]
        source: std::io::Error,
    },
    /// The file ended before the record did.
    #[error(
        "expert {expert} of layer {layer} is truncated in {}: wanted {wanted_bytes} bytes at offset {offset_bytes}, the file ended after {got_bytes}",
        path.display()
    )]
    ShortRead { path: PathBuf, layer: usize, expert: usize, offset_bytes: u64, wanted_bytes: usize, got_bytes: usize },
    /// A read stopped part-way because its caller no longer wanted it (a
    /// prefetch its demand overtook); never reported to a user.
    #[error("reading expert {expert} of layer {layer} from {} was stopped after {done_bytes} bytes", path.display())]
    ReadStopped { path: PathBuf, layer: usize, expert: usize, done_bytes: usize },
    /// A complete record that its [`RecordCheck`](crate::io::RecordCheck)
    /// refused (a non-finite scale, a checksum mismatch); `reason` comes from
    /// the check and names the file, layer and expert.
    #[error("{reason}")]
    RecordRejected { path: PathBuf, layer: usize, expert: usize, reason: String },
    /// A layer or expert index outside the model.
    #[error("no expert {expert} in layer {layer}")]
    NoSuchExpert { layer: usize, expert: usize },
    // Disk I/O backends (`io`).
    /// `--io` named no known backend.
    #[error("unknown I/O backend {text:?}: expected one of auto, pread, direct, uring, mmap")]
    UnknownIoBackend { text: String },
    /// The expert file path names a directory, device or pipe, not a file.
    #[error("expert file {} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    /// O_DIRECT needs every read's offset and length to be a multiple of the
    /// alignment unit, and one read covers one record.
    #[error(
        "--io {backend} reads with O_DIRECT, which needs records that are a multiple of {align_bytes} bytes; {} has {record_bytes}-byte records",
        path.display()
    )]
    UnalignedRecords { path: PathBuf, backend: &'static str, record_bytes: usize, align_bytes: usize },
    /// The filesystem refused O_DIRECT (EINVAL at open).
    #[error(
        "--io {backend} needs O_DIRECT, which the filesystem holding {} does not support ({source}); use --io pread or --io mmap",
        path.display()
    )]
    DirectUnsupported {
        path: PathBuf,
        backend: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// io_uring could not be set up (kernel without it, `kernel.io_uring_disabled`, seccomp).
    #[error(
        "--io uring: cannot set up an io_uring for {} ({source}); io_uring may be disabled (sysctl kernel.io_uring_disabled) or blocked by seccomp; use --io direct or --io pread",
        path.display()
    )]
    UringSetup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The buffer handed to a read is not exactly one record long.
    #[error(
        "buffer for expert {expert} of layer {layer} from {} holds {got_bytes} bytes, the record {wanted_bytes}",
        path.display()
    )]
    BufferSize { path: PathBuf, layer: usize, expert: usize, wanted_bytes: usize, got_bytes: usize },
    /// Dropping a file's pages from the page cache failed.
    #[error("cannot drop {} from the page cache: {source}", path.display())]
    EvictPageCache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An I/O pool was asked for zero workers or zero loads in flight.
    #[error("invalid I/O pool: {workers} workers, at most {max_in_flight} loads in flight (both must be at least 1)")]
    IoPoolSize { workers: usize, max_in_flight: usize },
    /// The operating system refused to start an I/O worker thread.
    #[error("cannot start an I/O worker thread: {source}")]
    SpawnWorker {
        #[source]
        source: std::io::Error,
    },
    /// The memory budget cannot hold even the minimum.
    #[error(
        "--ram-budget {have} is too small: this model needs at least {needed} (dense weights {dense}, KV {kv}, fixed KV state {kv_state}, I/O buffers {io}, one layer's experts {experts})"
    )]
    BudgetTooSmall {
        needed: crate::ByteSize,
        have: crate::ByteSize,
        dense: crate::ByteSize,
        kv: crate::ByteSize,
        kv_state: crate::ByteSize,
        io: crate::ByteSize,
        experts: crate::ByteSize,
    },
    /// `/proc/meminfo` could not be read for `--ram-budget auto`.
    #[error("--ram-budget auto: {reason}")]
    MemInfo { reason: String },
    /// `--cache-policy` named no known policy.
    #[error("unknown cache policy {name:?} (expected one of: {expected})")]
    UnknownPolicy { name: String, expected: String },
    /// Saving the learned-usage file failed (loading never fails: a bad
    /// usage file is ignored with a warning).
    #[error("cannot write usage file {}: {source}", path.display())]
    UsageWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Creating, writing or reading a routing trace failed.
    #[error("cannot {action} trace file {}: {source}", path.display())]
    TraceIo {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A line of a routing trace is malformed; `line` counts from 1.
    #[error("{}:{line}: {reason}", path.display())]
    TraceLine { path: PathBuf, line: usize, reason: String },
    // Multi-disk mirrors (`mirror`).
    /// `--mirror` was not `DIR` or `DIR=RATE`.
    #[error("invalid --mirror {text:?}: {reason}")]
    MirrorSpec { text: String, reason: String },
    /// A mirror cannot be used as it is: no or a stale receipt, a copy whose
    /// size or hash differs from the container's.
    #[error("mirror {}: {reason}", dir.display())]
    MirrorInvalid { dir: PathBuf, reason: String },
    /// Reading, hashing, copying or publishing a mirror file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    MirrorIo {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Staging would leave less free space than `--reserve`.
    #[error(
        "staging {} needs {needed} but {} has {free} free and {reserve} must stay free",
        path.display(), dir.display()
    )]
    MirrorNoSpace {
        path: PathBuf,
        dir: PathBuf,
        needed: crate::ByteSize,
        free: crate::ByteSize,
        reserve: crate::ByteSize,
    },
}
