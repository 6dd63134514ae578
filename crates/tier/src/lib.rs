//! Tiered storage for routed experts: the memory budget, the expert cache, and
//! the I/O that fills it.
//!
//! **Architecture invariant:** one generic store serves every model family.
//! This crate knows expert *records* (a layer, an expert index, a byte range in
//! a file), never what the bytes mean; interpreting a record is the job of
//! `strata-format`'s `ExpertLayout` in the layers above.
//!
//! **Architecture invariant:** the bytes handed out for an expert are always the
//! complete record as read from disk into the process's own memory (never a view
//! of the file's pages, which change or fault when the file does), and passed the record check the layers
//! above gave (finite scales, checksum). A short, failed or refused read is an
//! error, never a partly filled or damaged buffer.

mod aligned;
mod budget;
mod error;
pub mod io;
pub mod mirror;
pub mod policy;
mod record;
mod replay;
mod resident;
mod size;
mod store;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
mod trace;
mod usage;

pub use aligned::AlignedBuf;
pub use budget::{
    AUTO_SHARE_PERCENT, BudgetNeeds, BudgetPlan, RamBudget, SLACK_BYTES, batch_capacity, mem_available_bytes,
    peak_rss_bytes, resident_bytes,
};
pub use error::{Error, Result};
pub use io::{Gate, GateHold, IoBackend, IoPool, RecordCheck, RecordFile, RecordSource};
pub use mirror::{LayerFile, MirrorOptions, MirrorSpec, Mirrors};
pub use policy::{Policy, PolicyKind, new_policy};
pub use record::Record;
pub use replay::{HitRate, ReplayReport, replay, replay_learned, simulate};
pub use resident::{DeviceTier, DeviceTierStats};
pub use size::ByteSize;
pub use store::{ExpertKey, ExpertSource, ExpertStore, Loads, PREFETCH_IN_FLIGHT, StoreOptions, StoreStats};
pub use trace::{TRACE_FORMAT, TRACE_VERSION, TraceEvent, TraceHeader, TraceWriter, read_trace};
pub use usage::{USAGE_FORMAT, USAGE_VERSION, Usage};
