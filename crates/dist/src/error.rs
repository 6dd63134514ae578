//! The error type of the distributed layer.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong between a coordinator and its workers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket or file could not be opened, bound, read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The shared key is missing or unusable.
    #[error("worker key: {0}")]
    Key(String),
    /// A `--shard` that is not `I/N`.
    #[error("--shard: {0}")]
    Shard(String),
    /// Zenoh refused a setting, or a session could not open.
    #[error("zenoh: {0}")]
    Zenoh(String),
    /// A peer's message that does not parse or does not fit.
    #[error("worker message: {0}")]
    Wire(String),
    /// The workers named are not a usable set.
    #[error("--workers: {0}")]
    Workers(String),
    /// Workers were asked of a build without them.
    #[error(
        "this build has no expert workers: build with `--features workers` \
         (e.g. `cargo build --release -p strata --features workers`)"
    )]
    NotBuilt,
    /// The worker's engine failed to compute a call.
    #[error(transparent)]
    Engine(#[from] strata_engine::Error),
}
