//! What resolving a model's name gives, shared by the demo and
//! [`crate::resolve_model`].

use std::path::PathBuf;

use strata_format::QuantPreset;

/// The preset a checkpoint is converted with when the user did not convert it
/// first, and the default of `strata convert` and `strata pull`: lossless in
/// perplexity on the demo (docs/BENCHMARKS.md), half the size of f32.
/// q4 is a flag away for a model that does not fit.
pub const AUTO_CONVERT_PRESET: QuantPreset = QuantPreset::Q8;

/// Where a model comes from, after [`resolve_model`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// The container to open.
    pub container_dir: PathBuf,
    /// Whether this call converted a checkpoint into the cache.
    pub converted: bool,
}
