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
    /// `tokenizer.json` that cannot be parsed, or text/ids it fails to
    /// encode or decode.
    #[error("tokenizer {}: {reason}", path.display())]
    Tokenizer { path: std::path::PathBuf, reason: String },
    /// A chat template (in `tokenizer_config.json` or `chat_template.jinja`)
    /// that cannot be read, compiled or rendered, including the template's
    /// own `raise_exception(...)`.
    #[error("chat template {}: {reason}", path.display())]
    Template { path: std::path::PathBuf, reason: String },
    /// `generation_config.json` (or another JSON file of the model) that is
    /// not what it should be.
    #[error("{}: {reason}", path.display())]
    ModelFile { path: std::path::PathBuf, reason: String },
    /// The model computed a NaN or infinite logit. Sampling from such a row
    /// picks garbage (NaN compares false with everything), so the step is an
    /// error instead; finite but damaged weights can overflow this way.
    #[error(
        "the model computed a non-finite logit ({value}) for token id {token} at position {position}; its weights may be damaged (`strata info --verify` checks the files)"
    )]
    NonFiniteLogits { position: usize, token: usize, value: f32 },
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
    /// An option outside what the engine accepts.
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },
    /// A structured-output grammar that cannot go on (nothing the model's
    /// vocabulary spells is allowed next), or that could not be built over
    /// the model's tokenizer.
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
