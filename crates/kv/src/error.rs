//! The error type of the KV caches.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in a KV cache.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sequence outgrew the context the cache was sized for.
    #[error("context is full: {needed_tokens} tokens needed, the cache holds at most {capacity_tokens}")]
    ContextFull { needed_tokens: usize, capacity_tokens: usize },
}
