//! The error type of the text crate.

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong reading a model's text files, rendering, tokenizing,
/// or holding a conversation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What the engine refused while a conversation ran (its session, its
    /// sampling, a session file).
    #[error(transparent)]
    Engine(#[from] strata_engine::Error),
    /// A model file read through the format crate (tokenizer.json, bounded
    /// in size) that could not be read.
    #[error(transparent)]
    Format(#[from] strata_format::Error),
    /// A file or directory could not be read or written.
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
    /// A conversation the model cannot take (it does not fit the context,
    /// a saved one that is not there or does not match the model).
    #[error("{0}")]
    InvalidRequest(String),
}
