//! The Strata container (normative description: docs/FORMAT.md).
//!
//! [`Container::open`] reads and validates `manifest.json` against the model
//! spec and the sizes of the files on disk, then reads `dense.bin` into
//! memory and refuses a tensor whose CRC32C differs from the manifest's or
//! that holds a non-finite float. It never reads expert files
//! (another crate streams them; [`ExpertLayout::check_record`] checks each
//! record read) and never hashes whole files: hashing a 60 GB container on
//! every start would dominate start-up time, so that is the explicit
//! [`Container::verify`].

mod dense;
mod finite;
mod layout;
mod manifest;
mod validate;
mod verify;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use strata_kernels::{Matrix, QuantFormat};

use crate::error::{Error, Result};
use crate::preset::QuantPreset;
use crate::spec::ModelSpec;
use dense::DenseBytes;

pub use layout::{ComponentLayout, ExpertLayout, RECORD_ALIGN_BYTES, TENSOR_ALIGN_BYTES, align_up, matrix_bytes};
pub use manifest::{
    AUX_FILES, ComponentEntry, DENSE_FILE, EXPERTS_DIR, ExpertLayerEntry, FORMAT_VERSION, FileEntry, MAGIC,
    MANIFEST_FILE, Manifest, QuantInfo, TensorEntry, expert_file_name,
};
pub(crate) use validate::matrix_dims;
pub(crate) use verify::hex as hex_digest;
pub use verify::sha256_file;

/// An opened, validated container.
pub struct Container {
    dir: PathBuf,
    manifest: Manifest,
    /// All of dense.bin, in this process's memory (see `dense`).
    dense: DenseBytes,
    /// Tensor name -> index into `manifest.tensors`.
    dense_index: HashMap<String, usize>,
    /// Indexed by layer; `None` for dense layers.
    expert_layouts: Vec<Option<ExpertLayout>>,
    /// SHA-256 of manifest.json, which holds every data file's SHA-256.
    content_hash: String,
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container")
            .field("dir", &self.dir)
            .field("family", &self.manifest.spec.family)
            .field("preset", &self.manifest.quant.preset)
            .finish()
    }
}

impl Container {
    /// Opens the container in `dir`, validating the manifest (magic, version,
    /// spec, every tensor's format/shape/length/alignment, expert record
    /// layouts, file sizes), then reading dense.bin and checking every
    /// tensor's CRC32C (where recorded) and that every float in it is
    /// finite. Expert data is not read.
    pub fn open(dir: impl AsRef<Path>) -> Result<Container> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = validate::read_manifest(&dir)?;
        let checked = validate::validate(&dir, &manifest)?;
        let dense_path = dir.join(DENSE_FILE);
        let dense = DenseBytes::read(&dense_path, checked.dense_file_bytes)?;
        let (content_hash, _) = sha256_file(&dir.join(MANIFEST_FILE))?;
        let container = Container {
            content_hash,
            dir,
            manifest,
            dense,
            dense_index: checked.dense_index,
            expert_layouts: checked.expert_layouts,
        };
        container.check_dense(&dense_path)?;
        Ok(container)
    }

    /// Refuses a dense tensor whose CRC32C is not the manifest's, and a
    /// NaN or infinity anywhere in the dense tensors (weights of f32/bf16
    /// tensors, scales of q8/q4 ones), naming the tensor.
    fn check_dense(&self, dense_path: &Path) -> Result<()> {
        for entry in &self.manifest.tensors {
            // Formats were validated by `validate`.
            let format = QuantFormat::from_ordinal(entry.format)
                .map_err(|e| Error::kernels(format!("tensor {:?}", entry.name), e))?;
            let weights = self.bytes(entry.offset_bytes, entry.length_bytes);
            let scales = self.bytes(entry.scale_offset_bytes, entry.scale_length_bytes);
            if let Some(expected) = entry.crc32c {
                let mut crc = crate::checksum::Crc32c::new();
                crc.update(weights);
                crc.update(scales);
                let actual = crc.finish();
                if actual != expected {
                    return Err(Error::Crc32c {
                        path: dense_path.to_path_buf(),
                        what: format!("tensor {:?}", entry.name),
                        expected,
                        actual,
                    });
                }
            }
            if let Some((kind, index, value)) = finite::first_non_finite(format, weights, scales) {
                return Err(Error::NonFiniteStored {
                    path: dense_path.to_path_buf(),
                    what: format!("tensor {:?}", entry.name),
                    kind,
                    index,
                    value,
                });
            }
        }
        Ok(())
    }

    /// A hash that changes whenever any byte of the model does: the SHA-256
    /// of manifest.json, which records every data file's SHA-256. Files
    /// derived from a model (usage, traces, KV sessions) are bound to it.
    pub fn content_hash(&self) -> &str {
        &self.content_hash
    }

    /// Size of dense.bin, all of which stays resident while the model runs.
    pub fn dense_file_bytes(&self) -> u64 {
        self.dense.len() as u64
    }

    /// The container directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model architecture.
    pub fn spec(&self) -> &ModelSpec {
        &self.manifest.spec
    }

    /// The parsed manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The quantization preset the container was written with.
    pub fn preset(&self) -> QuantPreset {
        self.manifest.quant.preset
    }

    /// Whether a non-expert tensor `name` is stored.
    pub fn has_dense(&self, name: &str) -> bool {
        self.dense_index.contains_key(name)
    }

    /// The manifest entry of non-expert tensor `name`.
    pub fn dense_entry(&self, name: &str) -> Result<&TensorEntry> {
        self.dense_index.get(name).map(|&i| &self.manifest.tensors[i]).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
            hint: format!(" in container {}", self.dir.display()),
        })
    }

    /// A non-expert tensor as a matrix over the dense bytes (1-D tensors are
    /// one row). Zero-copy.
    pub fn dense(&self, name: &str) -> Result<Matrix<'_>> {
        let entry = self.dense_entry(name)?;
        let (rows, cols) = validate::matrix_dims(&entry.shape).unwrap_or((0, 0));
        // Ranges and format were validated on open.
        let format =
            QuantFormat::from_ordinal(entry.format).map_err(|e| Error::kernels(format!("tensor {name:?}"), e))?;
        Matrix::from_bytes(
            format,
            rows,
            cols,
            entry.group,
            self.bytes(entry.offset_bytes, entry.length_bytes),
            self.bytes(entry.scale_offset_bytes, entry.scale_length_bytes),
        )
        .map_err(|e| Error::kernels(format!("tensor {name:?}"), e))
    }

    /// An f32 tensor (norms, biases, routers: never quantized by any preset)
    /// as a slice of the dense bytes.
    pub fn dense_vec(&self, name: &str) -> Result<&[f32]> {
        let entry = self.dense_entry(name)?;
        if entry.format != QuantFormat::F32.ordinal() {
            let format = QuantFormat::from_ordinal(entry.format).map(QuantFormat::name).unwrap_or("an unknown format");
            return Err(Error::WrongFormat { name: name.to_owned(), format, needed: "f32" });
        }
        let bytes = self.bytes(entry.offset_bytes, entry.length_bytes);
        // Cannot fail: offsets are 64-byte aligned in a page-aligned copy and
        // lengths are multiples of 4 (validated on open).
        bytemuck::try_cast_slice(bytes).map_err(|e| {
            Error::manifest(self.dir.join(MANIFEST_FILE), format!("tensor {name:?}: cannot view as f32: {e}"))
        })
    }

    /// Names of all non-expert tensors, in file order.
    pub fn dense_names(&self) -> impl Iterator<Item = &str> {
        self.manifest.tensors.iter().map(|t| t.name.as_str())
    }

    /// The expert layout of MoE layer `layer`.
    pub fn expert_layout(&self, layer: usize) -> Result<&ExpertLayout> {
        self.expert_layouts.get(layer).and_then(Option::as_ref).ok_or(Error::NotMoeLayer { layer })
    }

    /// Path of MoE layer `layer`'s expert file.
    pub fn expert_file(&self, layer: usize) -> Result<PathBuf> {
        Ok(self.expert_layout(layer)?.path.clone())
    }

    /// Path of an auxiliary file (`tokenizer.json`, ...) if the container
    /// has it.
    pub fn aux_file(&self, name: &str) -> Option<PathBuf> {
        (AUX_FILES.contains(&name) && self.manifest.files.iter().any(|f| f.path == name)).then(|| self.dir.join(name))
    }

    /// Recomputes the SHA-256 of every file listed in the manifest and
    /// compares it (and the size) with the recorded values. Reads every
    /// byte of the container: run it explicitly, not on every start.
    pub fn verify(&self) -> Result<()> {
        verify::verify_files(&self.dir, &self.manifest.files)
    }

    fn bytes(&self, offset_bytes: u64, length_bytes: u64) -> &[u8] {
        let start = offset_bytes as usize;
        &self.dense[start..start + length_bytes as usize]
    }
}
