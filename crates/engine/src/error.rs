//! The error type of the engine.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while opening or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Format(#[from] strata_format::Error),
    #[error(transparent)]
    Kernels(#[from] strata_kernels::Error),
    #[error(transparent)]
    Tier(#[from] strata_tier::Error),
    #[error(transparent)]
    Model(#[from] strata_models::Error),
    /// A KV session file that cannot be opened, read or used.
    #[error(transparent)]
    Kv(#[from] strata_kv::Error),
    /// A file or directory the engine needed could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The model computed a NaN or infinite logit. Sampling from such a row
    /// picks garbage (NaN compares false with everything), so the step is an
    /// error instead; finite but damaged weights can overflow this way.
    #[error(
        "the model computed a non-finite logit ({value}) for token id {token} at position {position}; its weights may be damaged (`strata info --verify` checks the files)"
    )]
    NonFiniteLogits { position: usize, token: usize, value: f32 },
    /// An option outside what the engine accepts.
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    /// A sequence's [`Constraint`](crate::Constraint) that cannot go on: a
    /// structured-output grammar that allows nothing the model's vocabulary
    /// spells next, a thinking budget's forced marker outside it.
    #[error("grammar: {0}")]
    Grammar(String),
    /// A request the engine cannot serve (e.g. an empty prompt).
    #[error("{0}")]
    InvalidRequest(String),
    /// A batcher's queue holds `jobs` jobs already; retry shortly.
    #[error("busy: {jobs} jobs are waiting already")]
    QueueFull { jobs: usize },
    /// The batcher's thread has ended (shut down, or killed by a bug).
    #[error("the batcher has stopped")]
    BatcherStopped,
}
