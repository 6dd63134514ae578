//! Key/value caches for attention: GQA keys and values, MLA latents, DSA
//! indexer keys, all as per-layer streams of rows.
//!
//! **Architecture invariant:** this crate knows nothing about models. It stores
//! per-layer rows of floats at token positions and enforces a hard bound on how
//! many positions it holds.

mod cache;
mod error;

pub use error::{Error, Result};
pub use cache::{INDEX_KEYS, KEYS, KvCache, LATENT, VALUES};
