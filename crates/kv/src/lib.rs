//! Per-sequence state of a model's layers (the KV cache): each layer keeps a
//! list of typed parts (rows per token, a ring of the last rows, rows per
//! group of tokens, a fixed-size state, token ids) with snapshots of those
//! that cannot be cut back; and their persistence as named, crash-safe
//! session files.
//!
//! **Architecture invariant:** the cache knows nothing about models. It stores
//! the parts a layer declares at token positions, and enforces a hard bound
//! on how many positions it holds; a session file is bound to a model only
//! through the hashes and layouts its caller puts in the header. What each
//! kind of layer keeps is derived from its spec in one place, [`layout_of`].

mod cache;
mod error;
mod part;
mod persist;
mod spec;

pub use cache::{SNAPSHOTS_MAX, STATE_COPIES_MAX, SequenceState};
pub use error::{Error, Result};
pub use part::{LayerLayout, StatePart};
pub use persist::{
    CutTail, HASH_BYTES, MAX_LAYERS, MAX_PARTS, Persist, Recovered, SESSION_MAGIC, SESSION_VERSION,
    SESSION_VERSION_OLDEST, SessionFile, SessionHeader, Sink, hex, parse_hash,
};
pub use spec::{layout_of, layouts_of};
