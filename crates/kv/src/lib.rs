//! Key/value caches for attention: GQA keys and values, MLA latents, DSA
//! indexer keys, all as per-layer streams of rows, and their persistence as
//! named, crash-safe session files.
//!
//! **Architecture invariant:** this crate knows nothing about models. It stores
//! per-layer rows of floats at token positions and enforces a hard bound on how
//! many positions it holds; a session file is bound to a model only through
//! the hashes and dimensions its caller puts in the header.

mod cache;
mod error;
mod persist;

pub use cache::{INDEX_KEYS, KEYS, KvCache, LATENT, LayerLayout, VALUES};
pub use error::{Error, Result};
pub use persist::{
    CutTail, HASH_BYTES, MAX_STREAMS, Persist, Recovered, SESSION_MAGIC, SESSION_VERSION, SessionFile, SessionHeader,
    Sink, hex, parse_hash,
};
