//! Tiered storage for routed experts: the memory budget, the expert cache, and
//! the I/O that fills it.
//!
//! **Architecture invariant:** one generic store serves every model family.
//! This crate knows expert *records* (a layer, an expert index, a byte range in
//! a file), never what the bytes mean; interpreting a record is the job of
//! `strata-format`'s `ExpertLayout` in the layers above.
//!
//! **Architecture invariant:** the bytes handed out for an expert are always the
//! complete record as read from disk. A short or failed read is an error, never
//! a partly filled buffer.

mod aligned;
mod error;
mod size;
mod store;

pub use aligned::AlignedBuf;
pub use error::{Error, Result};
pub use size::ByteSize;
pub use store::{ExpertKey, ExpertSource, ExpertStore, StoreStats};
