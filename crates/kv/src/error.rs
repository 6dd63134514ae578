//! The error type of the KV caches and their session files.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in a KV cache or a persisted session.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sequence outgrew the context the cache was sized for.
    #[error("context is full: {needed_tokens} tokens needed, the cache holds at most {capacity_tokens}")]
    ContextFull { needed_tokens: usize, capacity_tokens: usize },

    /// An operating-system error opening, reading or creating a session file.
    #[error("{action} KV session {path}: {source}")]
    Io {
        path: PathBuf,
        /// What was being done, e.g. `"opening"`.
        action: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// An operating-system error appending to a session file (a full disk
    /// among them, see [`Error::is_storage_full`]).
    #[error("{action} KV session {path} at byte {offset_bytes}: {source}")]
    Append {
        path: PathBuf,
        action: &'static str,
        offset_bytes: u64,
        #[source]
        source: std::io::Error,
    },

    /// The file does not start with the session magic.
    #[error("{path} is not a Strata KV session file (it starts with {found:?}, not \"STRATAKV\")")]
    NotASession { path: PathBuf, found: String },

    /// A session file of a version this build does not read.
    #[error(
        "KV session {path}: unsupported version {version} (this build reads versions {} to {})",
        crate::SESSION_VERSION_OLDEST,
        crate::SESSION_VERSION
    )]
    UnsupportedVersion { path: PathBuf, version: u32 },

    /// A header that fails its checksum or holds impossible values. Headers
    /// are published whole (written, fsynced, then linked into place), so
    /// this is damage, not a crash, and the file is left alone.
    #[error("KV session {path}: corrupt header: {reason}")]
    CorruptHeader { path: PathBuf, reason: String },

    /// A session written for another model (or tokenizer, or cache shape).
    #[error("KV session {path} was written for another model and is not used: {mismatches}")]
    ModelMismatch {
        path: PathBuf,
        /// Each differing field with the file's value and the model's.
        mismatches: String,
    },

    /// A session longer than the cache it is loaded into.
    #[error("KV session {path} holds at least {tokens} tokens, more than the context of {capacity_tokens}")]
    SessionTooLong { path: PathBuf, tokens: usize, capacity_tokens: usize },

    /// A copy read without recovery ([`crate::SessionFile::read_copy`])
    /// whose records stop being valid before its end. The file is left as
    /// it is.
    #[error("KV file {path} is damaged at byte {offset_bytes} (record {record_index}: {reason}); it was left as it is")]
    DamagedCopy { path: PathBuf, offset_bytes: u64, record_index: usize, reason: String },

    /// Another process holds the session open.
    #[error("KV session {path} is in use by another process")]
    SessionInUse { path: PathBuf },

    /// An append that does not continue the file's sequence (a caller bug,
    /// or a file whose earlier append failed and could not be undone).
    #[error("KV session {path}: {reason}")]
    OutOfSequence { path: PathBuf, reason: String },
}
