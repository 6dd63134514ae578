//! The error type of the tiered store.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while sizing, reading or caching experts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A size string such as `512MiB` could not be parsed.
    #[error("invalid size {text:?}: {reason}")]
    InvalidSize { text: String, reason: &'static str },
    /// Opening an expert file failed.
    #[error("cannot open expert file {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading one expert record failed.
    #[error("reading expert {expert} of layer {layer} from {} failed: {source}", path.display())]
    Read {
        path: PathBuf,
        layer: usize,
        expert: usize,
        #[source]
        source: std::io::Error,
    },
    /// The file ended before the record did.
    #[error(
        "expert {expert} of layer {layer} is truncated in {}: wanted {wanted_bytes} bytes at offset {offset_bytes}, the file ended after {got_bytes}",
        path.display()
    )]
    ShortRead {
        path: PathBuf,
        layer: usize,
        expert: usize,
        offset_bytes: u64,
        wanted_bytes: usize,
        got_bytes: usize,
    },
    /// A layer or expert index outside the model.
    #[error("no expert {expert} in layer {layer}")]
    NoSuchExpert { layer: usize, expert: usize },
}
