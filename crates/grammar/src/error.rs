//! The error type of the grammar crate.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Why a grammar or a grammar compiler was not built. A grammar that cannot
/// go on while decoding is the engine's `Error::Grammar`, the error of its
/// `Constraint` seam.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A schema or tool list no grammar is built from: the request's
    /// error, in one line.
    #[error("{0}")]
    InvalidRequest(String),
    /// A model vocabulary no grammar can be built over (no byte-level or
    /// byte-fallback decoder, no end-of-sequence token).
    #[error("grammar: {0}")]
    Vocabulary(String),
}
