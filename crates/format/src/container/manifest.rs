//! `manifest.json`: the serde model of a container's table of contents.
//!
//! docs/FORMAT.md is the normative description; this file mirrors it field
//! by field. Formats are stored as ordinals (`QuantFormat::ordinal`) and never
//! inferred from byte counts: q8 and a hypothetical 8-bit float would have
//! identical sizes.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::record::ModelRecord;
use crate::names::{ExpertProj, TensorKind};
use crate::preset::QuantPreset;
use crate::spec::{Family, ModelSpec};

/// Value of the `magic` field.
pub const MAGIC: &str = "strata-container";
/// The format version this build writes.
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads: version 1 stores the flat
/// [`ModelSpec`] where version 2 stores a [`ModelRecord`].
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The file holding every non-expert tensor.
pub const DENSE_FILE: &str = "dense.bin";
/// The directory of per-layer expert files.
pub const EXPERTS_DIR: &str = "experts";
/// Files copied verbatim from the Hugging Face directory when present.
pub const AUX_FILES: [&str; 4] =
    ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"];

/// Relative path of the expert file of `layer`: `experts/layer_LLL.bin`.
pub fn expert_file_name(layer: usize) -> String {
    format!("{EXPERTS_DIR}/layer_{layer:03}.bin")
}

/// The whole manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`MAGIC`].
    pub magic: String,
    /// Bumped on any incompatible change; readers reject versions they do
    /// not know.
    pub format_version: u32,
    /// Free-form producer string, e.g. `"strata-format 0.1.0"`.
    pub created_by: String,
    pub quant: QuantInfo,
    /// Version 1 only: the flat spec, frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ModelSpec>,
    /// Version 2: the family and each layer as `hf_config` derived them
    /// when the container was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRecord>,
    /// The source config.json, embedded verbatim (modulo surrounding
    /// whitespace): the model's layers are derived from it.
    pub hf_config: Box<RawValue>,
    /// Every non-expert tensor, in file order.
    pub tensors: Vec<TensorEntry>,
    /// One entry per MoE layer, ascending by layer.
    pub expert_layers: Vec<ExpertLayerEntry>,
    /// Every data file with its size and SHA-256.
    pub files: Vec<FileEntry>,
    /// The SHA-256 of every other field (`container::seal`), checked at
    /// open: a hand edit of the model's settings is refused. Absent in
    /// containers written before it existed (nothing is checked then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
}

impl Manifest {
    /// The model's family, as either version stores it (`None`: neither
    /// `spec` nor `model` is there, a manifest no reader opens).
    pub fn family(&self) -> Option<Family> {
        self.model.as_ref().map(|m| m.family).or(self.spec.as_ref().map(|s| s.family))
    }
}

/// The quantization policy the container was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantInfo {
    pub preset: QuantPreset,
    /// Group size used for q8 tensors.
    pub q8_group: usize,
    /// Group size used for q4 tensors.
    pub q4_group: usize,
}

/// One non-expert tensor inside `dense.bin`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorEntry {
    /// The published Hugging Face name.
    pub name: String,
    pub kind: TensorKind,
    /// `QuantFormat` ordinal: 0 f32, 1 bf16, 2 q8, 3 q4.
    pub format: u8,
    /// Logical shape; 1-D tensors are viewed as one row.
    pub shape: Vec<usize>,
    /// Relative path of the file holding the bytes (always `dense.bin`).
    pub file: String,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// Where the f32 group scales live (length 0 for f32/bf16).
    pub scale_offset_bytes: u64,
    pub scale_length_bytes: u64,
    /// Columns per scale group (0 for f32/bf16).
    pub group: usize,
    /// CRC32C of the weight bytes followed by the scale bytes, checked when
    /// the container is opened. Absent in containers written before it
    /// existed (nothing is checked then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<u32>,
}

/// One MoE layer's expert file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertLayerEntry {
    pub layer: usize,
    /// Relative path, `experts/layer_LLL.bin`.
    pub file: String,
    pub num_experts: usize,
    /// Size of one record; a multiple of 4096. Expert `e` lives at
    /// `e * record_bytes`.
    pub record_bytes: u64,
    /// Gate, up, down, in that order.
    pub components: [ComponentEntry; 3],
    /// CRC32C of each whole record (padding included), by expert, checked
    /// whenever a record is read from disk. Absent in containers written
    /// before it existed (nothing is checked then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_crc32c: Option<Vec<u32>>,
}

/// One matrix of every expert record of a layer. Offsets are relative to
/// the start of the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentEntry {
    pub proj: ExpertProj,
    /// Published tensor name with `{expert}` in place of the expert index.
    pub name: String,
    /// `QuantFormat` ordinal.
    pub format: u8,
    /// `[rows, cols]`.
    pub shape: [usize; 2],
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub scale_offset_bytes: u64,
    pub scale_length_bytes: u64,
    pub group: usize,
}

/// A data file and its integrity data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative path with `/` separators.
    pub path: String,
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: String,
}
