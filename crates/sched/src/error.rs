//! The error type of the scheduler.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while running a layer's experts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Fetching an expert record failed.
    #[error(transparent)]
    Tier(#[from] strata_tier::Error),
    /// An expert record does not match its layout.
    #[error("expert {expert} of layer {layer}: {source}")]
    Record {
        layer: usize,
        expert: usize,
        // Boxed: the format error is large and this is the rare path.
        #[source]
        source: Box<strata_format::Error>,
    },
    /// A worker was asked for an expert the layer lacks, or hidden states
    /// that are not whole rows.
    #[error(
        "layer {layer} has {num_experts} experts of width {hidden}: no call for expert {expert} with {floats} floats"
    )]
    Call { layer: usize, expert: usize, floats: usize, hidden: usize, num_experts: usize },
}
