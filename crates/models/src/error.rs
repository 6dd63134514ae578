//! The error type of the model graphs.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor is missing from the container or has the wrong shape.
    #[error(transparent)]
    Format(#[from] strata_format::Error),
    /// A tensor has a shape the graph cannot use.
    #[error("tensor {name}: expected shape {expected:?}, found {found:?}")]
    Shape { name: String, expected: Vec<usize>, found: Vec<usize> },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    /// The KV cache is full.
    #[error(transparent)]
    Kv(#[from] strata_kv::Error),
    /// Running the routed experts failed (I/O, corrupt record). Boxed: the
    /// I/O errors are large and every forward-pass `Result` carries them.
    #[error(transparent)]
    Sched(Box<strata_sched::Error>),
    /// Recording the routing trace failed.
    #[error(transparent)]
    Tier(Box<strata_tier::Error>),
    /// The GPU could not be had (no adapter, or a build without it).
    #[error(transparent)]
    Device(#[from] crate::backend::DeviceError),
    /// Configuration the graph cannot honour (e.g. an unsupported rope type).
    #[error("{0}")]
    Unsupported(String),
}

impl From<strata_sched::Error> for Error {
    fn from(e: strata_sched::Error) -> Self {
        Error::Sched(Box::new(e))
    }
}

impl From<strata_tier::Error> for Error {
    fn from(e: strata_tier::Error) -> Self {
        Error::Tier(Box::new(e))
    }
}
