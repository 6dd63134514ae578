//! How the store is opened: where each layer's records live
//! ([`ExpertSource`]) and how they are cached and read ([`StoreOptions`]).
//!
//! Plain data: [`ExpertStore::open`](super::ExpertStore::open) opens the
//! files the sources name and resolves the options (`Auto`).

use std::path::PathBuf;

use crate::io::{IoBackend, RecordCheck};
use crate::policy::PolicyKind;

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
