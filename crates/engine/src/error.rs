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
    /// An option outside what the engine accepts.
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    /// A request the engine cannot serve (e.g. an empty prompt).
    #[error("{0}")]
    InvalidRequest(String),
}
