//! Key/value caches: GQA keys and values, MLA latents, DSA indexer keys, all
//! as per-layer streams of rows, and the fixed-size recurrent states of
//! linear-attention layers with their snapshots; and their persistence as
//! named, crash-safe session files.
//!
//! **Architecture invariant:** this crate knows nothing about models. It stores
//! per-layer rows of floats at token positions and per-layer states, and
//! enforces a hard bound on how many positions it holds; a session file is
//! bound to a model only through the hashes and dimensions its caller puts in
//! the header.

mod cache;
mod error;
mod persist;

pub use cache::{INDEX_KEYS, KEYS, KvCache, LATENT, LayerLayout, SNAPSHOTS_MAX, STATE_COPIES_MAX, VALUES};
pub use error::{Error, Result};
pub use persist::{
    CutTail, HASH_BYTES, MAX_LAYERS, MAX_STREAMS, Persist, Recovered, SESSION_MAGIC, SESSION_VERSION,
    SESSION_VERSION_OLDEST, SessionFile, SessionHeader, Sink, hex, parse_hash,
};
