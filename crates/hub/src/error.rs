//! The error type of the hub crate.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong finding a model: pulling it from the hub, converting
/// a checkpoint into the cache, or naming one the cache lacks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A checkpoint that does not convert, or a container that does not open.
    #[error(transparent)]
    Format(#[from] strata_format::Error),
    /// A checkpoint's tokenizer.json or chat template that cannot be used.
    #[error(transparent)]
    Text(#[from] strata_text::Error),
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file of the checkpoint or the cache (index, record, manifest)
    /// that is not what it should be.
    #[error("{}: {reason}", path.display())]
    ModelFile { path: std::path::PathBuf, reason: String },
    /// The hub could not be reached, or broke off a transfer (a dropped
    /// connection, a 5xx), while pulling `name` (`what`: the step, e.g.
    /// "fetching config.json"): a later pull may succeed, and resumes.
    #[error("pulling {name}: {what}: {reason}")]
    HubTransfer { name: String, what: String, reason: String },
    /// The hub refused a request of a pull of `name` (not found, gated,
    /// private: its 4xx and `X-Error-Code`), with what to do about it.
    #[error("pulling {name}: {reason}")]
    HubRefused { name: String, reason: String },
    /// What the hub said of `name` is not what a pull can or may use: no
    /// config.json, an architecture Strata cannot run, no safetensors, no
    /// digest for a file, a name that is not a plain one (a commit id, a
    /// file name, an ETag), a size past the declared one, over a limit.
    #[error("pulling {name}: {reason}")]
    HubMetadata { name: String, reason: String },
    /// A downloaded file whose bytes are not the ones the hub's metadata
    /// names: it is removed and the pull refused.
    #[error("{file}: {algorithm} is {actual} but the hub says {expected}; the download was refused and removed")]
    Digest { file: String, algorithm: &'static str, expected: String, actual: String },
    /// `--model ORG/NAME` of a model not in the cache.
    #[error("{name} is not pulled; run `strata pull {name}`")]
    NotPulled { name: String },
    /// A `--model` that names no model Strata reads (a GGUF file, a file, a
    /// directory that is neither a container nor a checkpoint).
    #[error("{0}")]
    InvalidRequest(String),
}
