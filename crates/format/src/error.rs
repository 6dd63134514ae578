//! The one error type of the crate.
//!
//! Everything this crate reads comes from files written by someone else (a
//! Hugging Face checkpoint, a container from an older build, a user's .npy),
//! so every failure is an [`Error`] carrying the path, tensor, field, layer or
//! expert it concerns: the message alone must tell the user what to fix.

use std::path::PathBuf;

/// Everything that can go wrong reading configs, checkpoints and containers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error on a specific path.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON document (config.json, index, manifest) that does not parse.
    #[error("{what}: invalid JSON: {source}")]
    Json {
        /// The file or document, e.g. `"/m/config.json"`.
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// `model_type` names an architecture this build cannot run.
    #[error("unsupported model_type {model_type:?} (supported: {supported})")]
    UnsupportedModelType { model_type: String, supported: String },

    /// A required config field is absent or null.
    #[error("config.json: missing required field `{field}`")]
    MissingField { field: String },

    /// A config field is present but has the wrong type, an impossible value
    /// or contradicts another field.
    #[error("config field `{field}`: {reason}")]
    InvalidField { field: String, reason: String },

    /// A stored model whose embedded config.json derives other layers than
    /// its frozen spec describes.
    #[error(
        "the stored spec disagrees with the embedded config.json: {what} (written by another build: convert the model again)"
    )]
    SpecDisagrees { what: String },

    /// config.json has keys the family's file neither reads nor knows to be
    /// inert: converting would run a model other than the one described.
    #[error(
        "config.json: {family} does not know {keys}: Strata would run another model than the one described \
         (--allow-unknown-config KEY, once for each, converts anyway)"
    )]
    UnknownConfigKeys { family: String, keys: String },

    /// The checkpoint has tensors no block reads that the family does not
    /// know to be unused.
    #[error("{family} checkpoint: no block reads {names}: Strata would run another model than the one stored")]
    UnknownTensors { family: String, names: String },

    /// A RoPE scaling scheme we do not implement (yet).
    #[error("unsupported rope_type {rope_type:?} (supported: default, linear; yarn for the MLA families)")]
    UnsupportedRope { rope_type: String },

    /// The safetensors library rejected a file (bad header, truncated data).
    #[error("{path}: invalid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },

    /// A checkpoint directory that is not laid out as expected.
    #[error("{path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },

    /// A tensor the model needs is not in the checkpoint or container.
    #[error("tensor {name:?} not found{hint}")]
    MissingTensor { name: String, hint: String },

    /// A tensor whose shape differs from what the ModelSpec implies.
    #[error("tensor {name:?}: expected shape {expected:?}, found {found:?}")]
    TensorShape { name: String, expected: Vec<usize>, found: Vec<usize> },

    /// A checkpoint tensor stored in a dtype we do not convert.
    #[error("tensor {name:?}: unsupported dtype {dtype} (supported: F32, BF16, F16, F8_E4M3 with block scales)")]
    UnsupportedDtype { name: String, dtype: String },

    /// A NaN or infinity in a source weight: quantizing it would silently
    /// produce garbage, so conversion stops.
    #[error("tensor {name:?}: non-finite value {value} at element {index}")]
    NonFinite { name: String, index: usize, value: f32 },

    /// A NaN or infinity stored in a container (a quantization scale or a
    /// float weight): every answer that touched it would be garbage, so the
    /// tensor is refused when it is loaded.
    #[error(
        "{path}: {what}: non-finite {kind} {value} at index {index} (the file is damaged: convert the model again)"
    )]
    NonFiniteStored { path: PathBuf, what: String, kind: &'static str, index: usize, value: f32 },

    /// Bytes that differ from what was written: a dense tensor or an
    /// expert record whose CRC32C is not the manifest's (a flipped bit on
    /// disk, a file edited or replaced in part).
    #[error(
        "{path}: {what}: CRC32C mismatch: the manifest says {expected:08x}, the bytes read give {actual:08x} (the file is damaged: convert the model again)"
    )]
    Crc32c { path: PathBuf, what: String, expected: u32, actual: u32 },

    /// A dense tensor kept on disk and read by rows
    /// (`Embedding::ReadByRow`) was asked for whole.
    #[error("tensor {name:?} is read a row at a time (the container was opened with the embedding on disk)")]
    ReadByRow { name: String },

    /// A row past the end of a tensor read by rows.
    #[error("tensor {name:?}: row {row} out of range ({rows} rows)")]
    RowOutOfRange { name: String, row: usize, rows: usize },

    /// The kernels crate rejected a buffer (length/alignment/format).
    #[error("{context}: {source}")]
    Kernels {
        /// Which tensor or record, e.g. `"tensor \"model.norm.weight\""`.
        context: String,
        #[source]
        source: strata_kernels::Error,
    },

    /// manifest.json is structurally valid JSON but inconsistent.
    #[error("{path}: invalid manifest: {reason}")]
    Manifest { path: PathBuf, reason: String },

    /// A container file whose size differs from what the manifest says.
    #[error("{path}: expected {expected_bytes} bytes, found {actual_bytes} (truncated or corrupt)")]
    FileSize { path: PathBuf, expected_bytes: u64, actual_bytes: u64 },

    /// A container file whose SHA-256 differs from the manifest.
    #[error("{path}: SHA-256 mismatch: manifest says {expected}, file has {actual}")]
    Checksum { path: PathBuf, expected: String, actual: String },

    /// The conversion/export target exists and is not empty.
    #[error("{path}: output exists and is not empty (pass --overwrite to replace it)")]
    OutputExists { path: PathBuf },

    /// A layer index that is not a MoE layer (or does not exist).
    #[error("layer {layer} is not a MoE layer of this model")]
    NotMoeLayer { layer: usize },

    /// An expert index beyond the layer's expert count.
    #[error("layer {layer}: expert {expert} out of range (num_experts = {num_experts})")]
    ExpertOutOfRange { layer: usize, expert: usize, num_experts: usize },

    /// A record buffer handed to `ExpertLayout::matrices` of the wrong size.
    #[error("layer {layer}: expert record must be {expected_bytes} bytes, got {actual_bytes}")]
    RecordSize { layer: usize, expected_bytes: u64, actual_bytes: u64 },

    /// A tensor whose stored format is not the one an accessor needs.
    #[error("tensor {name:?}: stored as {format}, but {needed} was requested")]
    WrongFormat { name: String, format: &'static str, needed: &'static str },

    /// Bad conversion options (unknown preset, zero group size, ...).
    #[error("invalid option `{option}`: {reason}")]
    InvalidOption { option: String, reason: String },

    /// A malformed or unsupported .npy file.
    #[error("{path}: .npy: {reason}")]
    Npy { path: PathBuf, reason: String },

    /// A file read whole that is larger than its limit
    /// (`spec::MAX_*_BYTES`).
    #[error("{path}: larger than the {max_bytes} bytes this build reads for such a file")]
    FileTooLarge { path: PathBuf, max_bytes: u64 },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidField { field: field.into(), reason: reason.into() }
    }

    pub(crate) fn manifest(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Manifest { path: path.into(), reason: reason.into() }
    }

    pub(crate) fn kernels(context: impl Into<String>, source: strata_kernels::Error) -> Self {
        Error::Kernels { context: context.into(), source }
    }
}
