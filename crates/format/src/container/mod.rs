//! The Strata container (normative description: docs/FORMAT.md).
//!
//! [`Container::open`] reads and validates `manifest.json` against the model
//! spec and the sizes of the files on disk, then reads `dense.bin` into
//! memory and refuses a tensor whose CRC32C differs from the manifest's or
//! that holds a non-finite float. It never reads expert files
//! (another crate streams them; [`ExpertLayout::check_record`] checks each
//! record read); opened with [`Embedding::ReadByRow`] it keeps the embedding
//! table on disk too and reads the rows tokens ask for (`rows.rs`). It
//! never hashes whole files: hashing a 60 GB container on
//! every start would dominate start-up time, so that is the explicit
//! [`Container::verify`].

mod dense;
mod finite;
mod layout;
mod manifest;
mod record;
mod rows;
mod seal;
mod validate;
mod verify;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use strata_kernels::{Matrix, QuantFormat};

use crate::error::{Error, Result};
use crate::preset::QuantPreset;
use crate::spec::{ModelArch, ModelSpec};
use dense::DenseBytes;
use rows::RowTable;

pub use layout::{ComponentLayout, ExpertLayout, RECORD_ALIGN_BYTES, TENSOR_ALIGN_BYTES, align_up, matrix_bytes};
pub use manifest::{
    AUX_FILES, ComponentEntry, DENSE_FILE, EXPERTS_DIR, ExpertLayerEntry, FORMAT_VERSION, FileEntry, MAGIC,
    MANIFEST_FILE, Manifest, OLDEST_FORMAT_VERSION, QuantInfo, TensorEntry, expert_file_name,
};
pub use record::{FfnRecord, LayerRecord, MixerRecord, ModelRecord};
pub use rows::RowReads;
pub use seal::SEAL_FIELD;
pub(crate) use seal::seal_of;
pub(crate) use validate::matrix_dims;
pub(crate) use verify::hex as hex_digest;
pub use verify::sha256_file;

/// An opened, validated container.
pub struct Container {
    dir: PathBuf,
    manifest: Manifest,
    /// The layers the manifest's config derives (checked against what the
    /// manifest stores beside it).
    arch: ModelArch,
    /// dense.bin in this process's memory (see `dense`), but for `by_row`.
    dense: DenseBytes,
    /// The tables read by row, when opened with `Embedding::ReadByRow`:
    /// the embedding table (untied) and every PLE table.
    by_row: Vec<RowTable>,
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
            .field("family", &self.arch.core.family)
            .field("preset", &self.manifest.quant.preset)
            .finish()
    }
}

/// A dense tensor resolved once by name ([`Container::dense_id`]): a hot
/// path reads it through [`Container::dense_at`] without a name lookup.
/// Meaningful only for the container that resolved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseId(usize);

/// Where [`Container::open_with`] keeps the embedding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// In memory with the rest of dense.bin.
    Resident,
    /// On disk, each row read when a token asks for it
    /// ([`Container::dense_rows`]): a token reads one row of it, so in
    /// memory it would only take room from the expert cache. A tied table is
    /// the lm head as well, which reads all of it every token, and stays
    /// resident. The PLE tables (Qwen3.8-Flash-Next's n-gram rows, 51 B
    /// parameters, a few rows a token) are read by row too.
    ReadByRow,
}

impl Container {
    /// Opens the container in `dir`, validating the manifest (magic, version,
    /// spec, every tensor's format/shape/length/alignment, expert record
    /// layouts, file sizes), then reading dense.bin and checking every
    /// tensor's CRC32C (where recorded) and that every float in it is
    /// finite. Expert data is not read.
    pub fn open(dir: impl AsRef<Path>) -> Result<Container> {
        Self::open_with(dir, Embedding::Resident)
    }

    /// [`Container::open`], keeping the embedding table where `embedding`
    /// says. Its bytes are checked at open either way.
    pub fn open_with(dir: impl AsRef<Path>, embedding: Embedding) -> Result<Container> {
        let dir = dir.as_ref().to_path_buf();
        let (manifest, seal) = validate::read_manifest(&dir)?;
        let checked = validate::validate(&dir, &manifest)?;
        // After validation, whose errors say more about a damaged manifest:
        // what is left is an edit that still makes a model, another one.
        if let Some(recorded) = &manifest.manifest_sha256
            && *recorded != seal
        {
            return Err(Error::manifest(
                dir.join(MANIFEST_FILE),
                format!(
                    "edited after it was written: its fields hash to {seal}, not the {SEAL_FIELD} {recorded} it \
                     records (an edit of the model's settings changes the model: convert it again instead)"
                ),
            ));
        }
        let dense_path = dir.join(DENSE_FILE);
        let file = std::fs::File::open(&dense_path).map_err(|e| Error::io(&dense_path, e))?;
        let table_name = crate::names::embedding_name(&checked.arch.core);
        let tied = checked.arch.core.tie_word_embeddings;
        let by_row_entries: Vec<&TensorEntry> = match embedding {
            Embedding::ReadByRow => manifest
                .tensors
                .iter()
                .filter(|entry| (entry.name == table_name && !tied) || crate::names::is_ple_table(&entry.name))
                .collect(),
            Embedding::Resident => Vec::new(),
        };
        let unread: Vec<_> = by_row_entries.iter().flat_map(|entry| RowTable::byte_ranges(entry)).collect();
        let dense = DenseBytes::read(&dense_path, &file, checked.dense_file_bytes, &unread)?;
        let by_row = by_row_entries
            .into_iter()
            .map(|entry| {
                let file = file.try_clone().map_err(|e| Error::io(&dense_path, e))?;
                RowTable::open(&dense_path, file, entry)
            })
            .collect::<Result<Vec<_>>>()?;
        let (content_hash, _) = sha256_file(&dir.join(MANIFEST_FILE))?;
        let container = Container {
            content_hash,
            dir,
            arch: checked.arch,
            manifest,
            dense,
            by_row,
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
        // The table read by rows was checked when it was opened.
        for entry in self.manifest.tensors.iter().filter(|entry| !self.is_read_by_row(&entry.name)) {
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

    /// What this container cannot check, written before the checksums
    /// existed, as one line for the user; `None` when it checks everything.
    pub fn missing_checksums_notice(&self) -> Option<String> {
        let manifest = &self.manifest;
        let missing: Vec<&str> = [
            (manifest.manifest_sha256.is_none(), "its model settings (manifest.json)"),
            (manifest.tensors.iter().any(|t| t.crc32c.is_none()), "dense tensors (dense.bin)"),
            (manifest.expert_layers.iter().any(|l| l.record_crc32c.is_none()), "expert records"),
        ]
        .into_iter()
        .filter_map(|(is_missing, what)| is_missing.then_some(what))
        .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "{} was written without checksums of {}: damage or edits there go undetected (convert it again to \
                 add them)",
                self.dir.display(),
                missing.join(", ")
            )
        })
    }

    /// A hash that changes whenever any byte of the model does: the SHA-256
    /// of manifest.json, which records every data file's SHA-256. Files
    /// derived from a model (usage, traces, KV sessions) are bound to it.
    pub fn content_hash(&self) -> &str {
        &self.content_hash
    }

    /// Memory dense.bin takes while the model runs: all of it, less the
    /// tables read by rows (plus their row checksums).
    pub fn dense_resident_bytes(&self) -> u64 {
        self.dense.resident_bytes() + self.by_row.iter().map(RowTable::resident_bytes).sum::<u64>()
    }

    /// Rows read and bytes read so far from the PLE tables kept on disk
    /// (every PLE layer's together).
    pub fn ple_row_reads(&self) -> RowReads {
        let tables = self.by_row.iter().filter(|table| crate::names::is_ple_table(table.name()));
        tables.map(RowTable::reads).fold(RowReads::default(), |sum, reads| sum + reads)
    }

    fn is_read_by_row(&self, name: &str) -> bool {
        self.by_row.iter().any(|table| table.name() == name)
    }

    /// The container directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The flat spec a version-1 manifest stores (frozen; `None` in later
    /// versions). The model is [`Container::arch`].
    pub fn legacy_spec(&self) -> Option<&ModelSpec> {
        self.manifest.spec.as_ref()
    }

    /// The model architecture: the common part and every layer's spec.
    pub fn arch(&self) -> &ModelArch {
        &self.arch
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
        Ok(&self.manifest.tensors[self.dense_id(name)?.0])
    }

    /// Non-expert tensor `name`, resolved for [`Container::dense_at`] and
    /// the other `_at` readers.
    pub fn dense_id(&self, name: &str) -> Result<DenseId> {
        self.dense_index.get(name).map(|&i| DenseId(i)).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
            hint: format!(" in container {}", self.dir.display()),
        })
    }

    /// The entry of a tensor whose bytes are in memory.
    fn resident_entry(&self, id: DenseId) -> Result<&TensorEntry> {
        let entry = &self.manifest.tensors[id.0];
        if self.is_read_by_row(&entry.name) {
            return Err(Error::ReadByRow { name: entry.name.clone() });
        }
        Ok(entry)
    }

    /// Rows `rows` of the non-expert matrix `name` as f32, one after another
    /// in `out` (`rows.len() × cols`), from memory or, for a table read by
    /// rows, from dense.bin (each row checked against its CRC32C kept at
    /// open).
    pub fn dense_rows(&self, name: &str, rows: &[usize], out: &mut [f32]) -> Result<()> {
        self.dense_rows_at(self.dense_id(name)?, rows, out)
    }

    /// [`Container::dense_rows`] of a resolved tensor.
    pub fn dense_rows_at(&self, id: DenseId, rows: &[usize], out: &mut [f32]) -> Result<()> {
        let name = &self.manifest.tensors[id.0].name;
        if let Some(table) = self.by_row.iter().find(|table| table.name() == name) {
            return table.rows_to_f32(rows, out);
        }
        let matrix = self.dense_at(id)?;
        assert_eq!(out.len(), rows.len() * matrix.cols, "one output row per row asked for");
        for (&row, out) in rows.iter().zip(out.chunks_exact_mut(matrix.cols.max(1))) {
            if row >= matrix.rows {
                return Err(Error::RowOutOfRange { name: name.to_owned(), row, rows: matrix.rows });
            }
            matrix.row_to_f32(row, out);
        }
        Ok(())
    }

    /// A non-expert tensor as a matrix over the dense bytes (1-D tensors are
    /// one row). Zero-copy.
    pub fn dense(&self, name: &str) -> Result<Matrix<'_>> {
        self.dense_at(self.dense_id(name)?)
    }

    /// [`Container::dense`] of a resolved tensor.
    pub fn dense_at(&self, id: DenseId) -> Result<Matrix<'_>> {
        let entry = self.resident_entry(id)?;
        let name = &entry.name;
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
        self.dense_vec_at(self.dense_id(name)?)
    }

    /// [`Container::dense_vec`] of a resolved tensor.
    pub fn dense_vec_at(&self, id: DenseId) -> Result<&[f32]> {
        let entry = self.resident_entry(id)?;
        let name = &entry.name;
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
