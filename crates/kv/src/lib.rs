//! Key/value caches for attention.
//!
//! **Architecture invariant:** this crate knows nothing about models. It stores
//! per-layer rows of floats at token positions and enforces a hard bound on how
//! many positions it holds.

mod error;
mod gqa;

pub use error::{Error, Result};
pub use gqa::KvCache;
