//! Hugging Face checkpoint -> Strata container conversion.
//!
//! Streaming: dense tensors are converted in blocks of rows (at most
//! [`CHUNK_ELEMS`] f32 at a time, plus the block's scales) and experts one at
//! a time, so peak memory is one expert or one row block, never the model.
//! The output is written into a sibling `OUT.tmp-<pid>` directory, fsynced,
//! and renamed into place only when complete: an interrupted or failed
//! conversion never leaves a directory named OUT that opens as a container,
//! and the next conversion to OUT removes what a killed one left.

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use strata_kernels::{QuantFormat, mxfp4, quant};

use crate::checkpoint::{Checkpoint, Mxfp4Bytes};
use crate::container::{
    AUX_FILES, ComponentEntry, ComponentLayout, DENSE_FILE, EXPERTS_DIR, ExpertLayerEntry, ExpertLayout,
    FORMAT_VERSION, FileEntry, MAGIC, MANIFEST_FILE, Manifest, ModelRecord, QuantInfo, TENSOR_ALIGN_BYTES, TensorEntry,
    expert_file_name, seal_of,
};
use crate::error::{Error, Result};
use crate::names;
use crate::preset::{Q4_DEFAULT_GROUP, Q8_GROUP, QuantPreset, group_for};
use crate::spec::{MAX_TOKENIZER_BYTES, ModelArch, read_at_most};
use crate::temporaries;

/// Largest number of f32 elements decoded at once for a dense tensor
/// (16 MiB), bounding conversion memory for huge embeddings.
pub const CHUNK_ELEMS: usize = 4 << 20;

/// How to convert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertOptions {
    pub preset: QuantPreset,
    /// Group size of q4 experts (preset q4 only).
    pub q4_group: usize,
    /// Draw an indicatif progress bar on stderr.
    pub progress: bool,
    /// Replace a non-empty existing output directory.
    pub overwrite: bool,
    /// config.json keys to accept although the family does not know them
    /// (dotted paths, as the refusal names them): the explicit opt-out of
    /// [`crate::check_config_keys`].
    pub allow_unknown_config: Vec<String>,
    /// Leave out the multi-token-prediction layers (the draft heads of
    /// speculative decoding), which are otherwise kept where the checkpoint
    /// holds them.
    pub drop_mtp: bool,
    /// Dequantize routed experts a checkpoint stores as MXFP4 codes and
    /// scales (Kimi K3's and gpt-oss's hub checkpoints) and store them in
    /// the preset's expert format; otherwise their bytes are kept, unchanged,
    /// as `mxfp4` records.
    pub dequantize_mxfp4: bool,
}

impl ConvertOptions {
    /// `preset` with the default q4 group, no progress bar, no overwrite.
    pub fn new(preset: QuantPreset) -> ConvertOptions {
        ConvertOptions {
            preset,
            q4_group: Q4_DEFAULT_GROUP,
            progress: false,
            overwrite: false,
            allow_unknown_config: Vec::new(),
            drop_mtp: false,
            dequantize_mxfp4: false,
        }
    }
}

/// What a conversion produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertReport {
    pub out_dir: PathBuf,
    pub preset: QuantPreset,
    /// Size of dense.bin.
    pub dense_bytes: u64,
    /// Size of one expert record (all MoE layers share it).
    pub expert_record_bytes: u64,
    /// Total size of all expert files.
    pub expert_bytes: u64,
    /// Every file of the container, manifest included.
    pub total_bytes: u64,
    pub num_dense_tensors: usize,
    pub num_moe_layers: usize,
    /// Checkpoint tensors the model does not use, all of them known to its
    /// family as unused (a tied lm_head, a vision tower).
    pub ignored_tensors: Vec<String>,
    pub elapsed: Duration,
}

/// Converts the Hugging Face checkpoint in `hf_dir` into a container at
/// `out_dir` (see docs/FORMAT.md). A config key or a tensor its family does
/// not know is refused before anything is written.
pub fn convert(hf_dir: impl AsRef<Path>, out_dir: impl AsRef<Path>, opts: &ConvertOptions) -> Result<ConvertReport> {
    let ckpt = match Checkpoint::open(hf_dir.as_ref()) {
        Ok(ckpt) => ckpt,
        Err(err) => {
            // A model this build cannot run says so (naming what is
            // supported) rather than that its weights are missing.
            let config = hf_dir.as_ref().join(crate::checkpoint::CONFIG_FILE);
            if let Ok(text) = std::fs::read_to_string(config) {
                ModelArch::from_config_json(&text)?;
            }
            return Err(err);
        }
    };
    write_container(&ckpt, out_dir.as_ref(), opts)
}

/// Where a container's weights come from: a Hugging Face checkpoint, or a
/// generator of synthetic weights.
pub(crate) trait Source {
    /// For error messages, e.g. "checkpoint /path".
    fn describe(&self) -> String;
    /// The config.json text describing the model.
    fn config_json(&self) -> &str;
    /// The first of `candidates` (a published name and its aliases) present.
    fn resolve(&self, candidates: &[String]) -> Option<String>;
    fn check_shape(&self, name: &str, expected: &[usize]) -> Result<()>;
    /// Rows `row_start..row_start + row_count` of 2-D (or 1-D, as one row)
    /// tensor `name` with `cols` columns, as f32.
    fn rows_f32(&self, name: &str, row_start: usize, row_count: usize, cols: usize) -> Result<Vec<f32>>;
    /// Gate, up and down of one routed expert, as f32.
    fn expert_f32(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]>;
    /// Whether every routed expert of `layer` is stored as MXFP4 codes and
    /// scales, which [`Source::expert_mxfp4`] gives as they are.
    fn stores_mxfp4_experts(&self, _arch: &ModelArch, _layer: usize) -> bool {
        false
    }
    /// Gate, up and down of one routed expert of a layer
    /// [`Source::stores_mxfp4_experts`] says is stored MXFP4, as stored.
    fn expert_mxfp4(&self, _arch: &ModelArch, layer: usize, _expert: usize) -> Result<[Mxfp4Bytes; 3]> {
        Err(Error::InvalidOption {
            option: "mxfp4 experts".into(),
            reason: format!("{} stores no MXFP4 experts (layer {layer})", self.describe()),
        })
    }
    /// The source tensors holding the resolved tensor `name`: itself, the
    /// pair holding it (Inkling's hub `w13`), or the row shards it is
    /// joined from.
    fn stored_as(&self, name: &str) -> Vec<String> {
        vec![name.to_owned()]
    }
    /// Every tensor name in the source, to report the ones left unused.
    fn tensor_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Whether tensor `name` has elements: one without (transformers saves
    /// the shared experts of `n_shared_experts: 0` as `[0, H]`) computes
    /// nothing, read or not.
    fn has_elements(&self, _name: &str) -> bool {
        true
    }
    /// The source tensors holding `layer`'s routed experts.
    fn expert_sources(&self, _arch: &ModelArch, _layer: usize) -> Vec<String> {
        Vec::new()
    }
    /// A directory whose tokenizer and generation files are copied along.
    fn aux_dir(&self) -> Option<&Path> {
        None
    }
}

impl Source for Checkpoint {
    fn describe(&self) -> String {
        format!("checkpoint {}", self.dir().display())
    }

    fn config_json(&self) -> &str {
        Checkpoint::config_json(self)
    }

    fn resolve(&self, candidates: &[String]) -> Option<String> {
        Checkpoint::resolve(self, candidates).map(str::to_owned)
    }

    fn check_shape(&self, name: &str, expected: &[usize]) -> Result<()> {
        Checkpoint::check_shape(self, name, expected)
    }

    fn rows_f32(&self, name: &str, row_start: usize, row_count: usize, _cols: usize) -> Result<Vec<f32>> {
        Checkpoint::rows_f32(self, name, row_start, row_count)
    }

    fn expert_f32(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        Checkpoint::expert_f32(self, arch, layer, expert)
    }

    fn stores_mxfp4_experts(&self, arch: &ModelArch, layer: usize) -> bool {
        self.has_packed_mxfp4_experts(arch, layer)
    }

    fn expert_mxfp4(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Mxfp4Bytes; 3]> {
        Checkpoint::expert_mxfp4(self, arch, layer, expert)
    }

    fn stored_as(&self, name: &str) -> Vec<String> {
        Checkpoint::stored_as(self, name)
    }

    fn tensor_names(&self) -> Vec<String> {
        self.names().map(str::to_owned).collect()
    }

    fn has_elements(&self, name: &str) -> bool {
        self.shape(name).is_ok_and(|shape| !shape.contains(&0))
    }

    fn expert_sources(&self, arch: &ModelArch, layer: usize) -> Vec<String> {
        if let Some(paired) = names::paired_expert_names(&arch.core, layer).filter(|[w13, _]| self.has(w13)) {
            return paired.into();
        }
        // Published per-expert names, or the fused 3-D tensors of transformers 5.x.
        let (fused_gate_up, fused_down) = names::fused_expert_names(layer);
        let interleaved = crate::checkpoint::interleaved_sources(self, fused_gate_up.trim_end_matches("gate_up_proj"));
        if !interleaved.is_empty() {
            return interleaved;
        }
        if self.has(&fused_gate_up) && !self.has(&names::expert_names(&arch.core, layer, 0)[0]) {
            return vec![fused_gate_up, fused_down];
        }
        let mut found = Vec::new();
        for expert in 0..arch.num_experts() {
            for name in names::expert_names(&arch.core, layer, expert) {
                let mut candidates = vec![name.clone()];
                candidates.extend(names::aliases(arch, &name));
                match Checkpoint::resolve(self, &candidates) {
                    Some(stored) => found.push(stored.to_owned()),
                    // Kimi K3's hub experts: packed MXFP4 codes and scales.
                    None => found
                        .extend(crate::checkpoint::packed_names(&name).into_iter().flatten().filter(|n| self.has(n))),
                }
            }
        }
        found
    }

    fn aux_dir(&self) -> Option<&Path> {
        Some(self.dir())
    }
}

/// Writes the container for `source` at `out_dir`, atomically.
pub(crate) fn write_container(source: &dyn Source, out_dir: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    let started = Instant::now();
    if opts.q4_group == 0 {
        return Err(Error::InvalidOption { option: "q4_group".into(), reason: "must be > 0".into() });
    }
    let config: serde_json::Value = serde_json::from_str(source.config_json())
        .map_err(|e| Error::Json { what: format!("config.json of {}", source.describe()), source: e })?;
    // The architecture first: a model of another family is named as such.
    let arch = ModelArch::from_config_value(&config)?;
    crate::check_config_keys(&config, &opts.allow_unknown_config)?;
    // MTP layers are kept where the checkpoint has them: transformers'
    // save_pretrained drops them, so a config may declare layers its
    // checkpoint lacks.
    let arch = match names::mtp_probe(&arch) {
        Some(probe) if !opts.drop_mtp && resolve_dense(source, &arch, &probe).is_ok() => arch,
        _ => arch.without_mtp(),
    };
    let read = tensors_read(source, &arch)?;
    let unread: BTreeSet<String> = source.tensor_names().into_iter().filter(|n| !read.contains(n)).collect();
    let unknown: Vec<String> =
        crate::family::unknown_tensors(&arch, &unread).into_iter().filter(|n| source.has_elements(n)).collect();
    if !unknown.is_empty() {
        return Err(Error::UnknownTensors { family: arch.core.family.to_string(), names: listed(&unknown) });
    }
    let hf_config = RawValue::from_string(source.config_json().trim().to_owned())
        .map_err(|e| Error::Json { what: format!("config.json of {}", source.describe()), source: e })?;

    // Dropping `staging` on any early return removes the temporary tree.
    let staging = Staging::prepare(out_dir, opts.overwrite)?;
    let work = Work {
        source,
        arch: &arch,
        opts,
        tmp: staging.tmp.clone(),
        bar: progress_bar(
            opts.progress,
            (names::dense_tensors(&arch).len() + arch.expert_layers().len() * arch.num_experts()) as u64,
        ),
    };
    let mut used: HashSet<String> = HashSet::new();

    let (tensors, dense_file) = work.write_dense(&mut used)?;
    let dense_bytes = dense_file.size_bytes;
    let (expert_layers, expert_files) = work.write_experts(&mut used)?;
    let expert_bytes = expert_files.iter().map(|f| f.size_bytes).sum();
    let aux_files = match source.aux_dir() {
        Some(dir) => work.copy_aux_files(dir)?,
        None => Vec::new(),
    };

    let manifest = Manifest {
        magic: MAGIC.to_owned(),
        format_version: FORMAT_VERSION,
        created_by: format!("strata-format {}", env!("CARGO_PKG_VERSION")),
        quant: QuantInfo { preset: opts.preset, q8_group: Q8_GROUP, q4_group: opts.q4_group },
        spec: None,
        model: Some(ModelRecord::of(&arch)),
        hf_config,
        tensors,
        expert_layers,
        files: std::iter::once(dense_file).chain(expert_files).chain(aux_files).collect(),
        manifest_sha256: None,
    };
    let json_error = |source| Error::Json { what: MANIFEST_FILE.to_owned(), source };
    let seal = seal_of(&serde_json::to_vec(&manifest).map_err(json_error)?).map_err(json_error)?;
    let manifest = Manifest { manifest_sha256: Some(seal), ..manifest };
    // Written last: a directory without manifest.json is never a container.
    let manifest_bytes = serde_json::to_vec_pretty(&manifest).map_err(json_error)?;
    let mut out = HashingFile::create(work.tmp.join(MANIFEST_FILE))?;
    out.write(&manifest_bytes)?;
    out.finish(MANIFEST_FILE)?;

    let total_bytes = manifest.files.iter().map(|f| f.size_bytes).sum::<u64>() + manifest_bytes.len() as u64;
    let out_dir = staging.publish()?;
    work.bar.finish_and_clear();

    debug_assert!(used == read, "conversion read other tensors than it planned to");
    let ignored_tensors: Vec<String> = unread.into_iter().collect();
    Ok(ConvertReport {
        out_dir,
        preset: opts.preset,
        dense_bytes,
        expert_record_bytes: manifest.expert_layers.first().map_or(0, |l| l.record_bytes),
        expert_bytes,
        total_bytes,
        num_dense_tensors: manifest.tensors.len(),
        num_moe_layers: manifest.expert_layers.len(),
        ignored_tensors,
        elapsed: started.elapsed(),
    })
}

/// The tensors of `source` that converting `arch` reads: each dense
/// tensor's stored name, and every layer's expert tensors.
fn tensors_read(source: &dyn Source, arch: &ModelArch) -> Result<HashSet<String>> {
    let mut read: HashSet<String> = HashSet::new();
    for desc in names::dense_tensors(arch) {
        read.extend(source.stored_as(&resolve_dense(source, arch, &desc.name)?));
    }
    for layer in arch.expert_layers() {
        read.extend(source.expert_sources(arch, layer));
    }
    Ok(read)
}

/// The name `source` stores the dense tensor `name` under (its published
/// name or an alias).
fn resolve_dense(source: &dyn Source, arch: &ModelArch, name: &str) -> Result<String> {
    let mut candidates = vec![name.to_owned()];
    candidates.extend(names::aliases(arch, name));
    source
        .resolve(&candidates)
        .ok_or_else(|| Error::MissingTensor { name: name.to_owned(), hint: format!(" in {}", source.describe()) })
}

/// The first few of `names` and how many more, for a one-line error.
fn listed(names: &[String]) -> String {
    const SHOWN: usize = 8;
    let shown = names.iter().take(SHOWN).map(String::as_str).collect::<Vec<_>>().join(", ");
    match names.len().checked_sub(SHOWN) {
        Some(more) if more > 0 => format!("{shown} and {more} more"),
        _ => shown,
    }
}

fn progress_bar(enabled: bool, total: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// What every conversion step needs.
struct Work<'a> {
    source: &'a dyn Source,
    arch: &'a ModelArch,
    opts: &'a ConvertOptions,
    /// The staging directory.
    tmp: PathBuf,
    bar: ProgressBar,
}

impl Work<'_> {
    /// Writes dense.bin; returns its manifest entries and file entry.
    fn write_dense(&self, used: &mut HashSet<String>) -> Result<(Vec<TensorEntry>, FileEntry)> {
        self.bar.set_message("dense");
        let descs = names::dense_tensors(self.arch);
        let mut out = HashingFile::create(self.tmp.join(DENSE_FILE))?;
        let mut tensors = Vec::with_capacity(descs.len());
        for desc in descs {
            let source = resolve_dense(self.source, self.arch, &desc.name)?;
            self.source.check_shape(&source, &desc.shape)?;
            let format = self.opts.preset.dense_format(desc.kind);
            let group = group_for(format, self.opts.q4_group);
            let Some((rows, cols)) = crate::container::matrix_dims(&desc.shape) else {
                return Err(Error::TensorShape { name: desc.name, expected: vec![], found: desc.shape });
            };
            let placed = write_matrix(&mut out, self.source, &source, rows, cols, format, group)?;
            tensors.push(TensorEntry {
                name: desc.name,
                kind: desc.kind,
                format: format.ordinal(),
                shape: desc.shape,
                file: DENSE_FILE.to_owned(),
                offset_bytes: placed.offset_bytes,
                length_bytes: placed.length_bytes,
                scale_offset_bytes: placed.scale_offset_bytes,
                scale_length_bytes: placed.scale_length_bytes,
                group,
                crc32c: Some(placed.crc32c),
            });
            used.extend(self.source.stored_as(&source));
            self.bar.inc(1);
        }
        Ok((tensors, out.finish(DENSE_FILE)?))
    }

    /// Writes one expert file per MoE layer, MTP layers included.
    fn write_experts(&self, used: &mut HashSet<String>) -> Result<(Vec<ExpertLayerEntry>, Vec<FileEntry>)> {
        let arch = self.arch;
        let mut layers = Vec::new();
        let mut files = Vec::new();
        for layer in arch.expert_layers() {
            // An MXFP4 checkpoint's experts are kept as stored (the MTP
            // layers' too: the bytes are the model, nothing is rounded).
            let format = if !self.opts.dequantize_mxfp4 && self.source.stores_mxfp4_experts(arch, layer) {
                QuantFormat::Mxfp4
            } else if layer < arch.layers.len() {
                self.opts.preset.expert_format()
            } else {
                self.opts.preset.mtp_expert_format()
            };
            let group = group_for(format, self.opts.q4_group);
            self.bar.set_message(format!("layer {layer}"));
            let file_name = expert_file_name(layer);
            let layout = ExpertLayout::compute(
                layer,
                self.tmp.join(&file_name),
                arch.num_experts(),
                names::expert_shapes(arch),
                format,
                group,
            )?;
            let (file, record_crc32c) = write_expert_file(self.source, arch, &layout, &file_name, &self.bar, used)?;
            files.push(file);
            let templates = names::expert_name_templates(&arch.core, layer);
            let [g, u, d] = layout.components.clone();
            let components =
                [(g, &templates[0]), (u, &templates[1]), (d, &templates[2])].map(|(c, name)| ComponentEntry {
                    proj: c.proj,
                    name: name.clone(),
                    format: c.format.ordinal(),
                    shape: [c.rows, c.cols],
                    offset_bytes: c.offset_bytes,
                    length_bytes: c.length_bytes,
                    scale_offset_bytes: c.scale_offset_bytes,
                    scale_length_bytes: c.scale_length_bytes,
                    group: c.group,
                });
            layers.push(ExpertLayerEntry {
                layer,
                file: file_name,
                num_experts: arch.num_experts(),
                record_bytes: layout.record_bytes,
                components,
                record_crc32c: Some(record_crc32c),
            });
        }
        Ok((layers, files))
    }

    /// Copies tokenizer and generation files verbatim (they are small).
    fn copy_aux_files(&self, hf_dir: &Path) -> Result<Vec<FileEntry>> {
        let mut files = Vec::new();
        for name in AUX_FILES {
            let src = hf_dir.join(name);
            if src.is_file() {
                let bytes = read_at_most(&src, MAX_TOKENIZER_BYTES)?;
                let mut out = HashingFile::create(self.tmp.join(name))?;
                out.write(&bytes)?;
                files.push(out.finish(name)?);
            }
        }
        Ok(files)
    }
}

/// Writes every expert record of one layer, one expert in memory at a time;
/// returns the file's entry and each record's CRC32C. An `mxfp4` layout
/// takes the source's MXFP4 bytes as they are; any other format encodes
/// the expert's f32 values.
fn write_expert_file(
    source: &dyn Source,
    arch: &ModelArch,
    layout: &ExpertLayout,
    rel_path: &str,
    bar: &ProgressBar,
    used: &mut HashSet<String>,
) -> Result<(FileEntry, Vec<u32>)> {
    let layer = layout.layer;
    let mut out = HashingFile::create(layout.path.clone())?;
    let record_bytes = usize::try_from(layout.record_bytes).map_err(|_| Error::InvalidOption {
        option: "expert layout".into(),
        reason: format!("layer {layer}: a record of {} bytes does not fit in memory", layout.record_bytes),
    })?;
    let mut record = vec![0u8; record_bytes];
    let mut record_crc32c = Vec::with_capacity(layout.num_experts);
    for expert in 0..layout.num_experts {
        let names = names::expert_names(&arch.core, layer, expert);
        record.fill(0);
        if layout.components.iter().all(|c| c.format == QuantFormat::Mxfp4) {
            let mats = source.expert_mxfp4(arch, layer, expert)?;
            for ((comp, m), name) in layout.components.iter().zip(&mats).zip(&names) {
                check_e8m0_scales(name, &m.scales)?;
                place(&mut record, comp, name, &m.codes, &m.scales)?;
            }
        } else {
            let mats = source.expert_f32(arch, layer, expert)?;
            for ((comp, data), name) in layout.components.iter().zip(&mats).zip(&names) {
                check_finite(name, data, 0)?;
                let enc = encode(comp.format, comp.rows, comp.cols, comp.group, data);
                place(&mut record, comp, name, &enc.weights, bytemuck::cast_slice(&enc.scales))?;
            }
        }
        out.write(&record)?;
        record_crc32c.push(crate::checksum::crc32c(&record));
        bar.inc(1);
    }
    let entry = out.finish(rel_path)?;
    used.extend(source.expert_sources(arch, layer));
    Ok((entry, record_crc32c))
}

/// Copies one matrix's weight and scale bytes to where `comp` puts them in
/// `record`, refusing bytes of another size than the layout's.
fn place(record: &mut [u8], comp: &ComponentLayout, name: &str, weights: &[u8], scales: &[u8]) -> Result<()> {
    if weights.len() as u64 != comp.length_bytes || scales.len() as u64 != comp.scale_length_bytes {
        return Err(Error::InvalidOption {
            option: "expert layout".into(),
            reason: format!("{name}: encoded size disagrees with the layout"),
        });
    }
    // In range: the layout placed both blocks inside the record.
    let w = comp.offset_bytes as usize;
    record[w..w + weights.len()].copy_from_slice(weights);
    let s = comp.scale_offset_bytes as usize;
    record[s..s + scales.len()].copy_from_slice(scales);
    Ok(())
}

/// Where one tensor landed in dense.bin.
struct Placed {
    offset_bytes: u64,
    length_bytes: u64,
    scale_offset_bytes: u64,
    scale_length_bytes: u64,
    /// CRC32C of the weight bytes followed by the scale bytes.
    crc32c: u32,
}

/// Converts one dense tensor in row blocks: weights stream straight to the
/// file, scales (1/8 of the f32 size at most) are collected and written after.
fn write_matrix(
    out: &mut HashingFile,
    ckpt: &dyn Source,
    source: &str,
    rows: usize,
    cols: usize,
    format: QuantFormat,
    group: usize,
) -> Result<Placed> {
    out.pad_to(TENSOR_ALIGN_BYTES)?;
    let offset_bytes = out.pos;
    let mut scales: Vec<f32> = Vec::new();
    let mut crc = crate::checksum::Crc32c::new();
    let chunk_rows = (CHUNK_ELEMS / cols.max(1)).max(1);
    let mut row = 0;
    while row < rows {
        let n = chunk_rows.min(rows - row);
        let data = ckpt.rows_f32(source, row, n, cols)?;
        check_finite(source, &data, row * cols)?;
        // Groups never span rows in q8/q4, so encoding row blocks and
        // concatenating equals encoding the whole matrix.
        let enc = encode(format, n, cols, group, &data);
        out.write(&enc.weights)?;
        crc.update(&enc.weights);
        scales.extend_from_slice(&enc.scales);
        row += n;
    }
    let length_bytes = out.pos - offset_bytes;
    out.pad_to(TENSOR_ALIGN_BYTES)?;
    let scale_offset_bytes = out.pos;
    let scale_bytes: &[u8] = bytemuck::cast_slice(&scales);
    out.write(scale_bytes)?;
    Ok(Placed {
        offset_bytes,
        length_bytes,
        scale_offset_bytes,
        scale_length_bytes: out.pos - scale_offset_bytes,
        crc32c: {
            crc.update(scale_bytes);
            crc.finish()
        },
    })
}

/// Encoded weights (little-endian bytes) and group scales.
pub(crate) struct Encoded {
    pub weights: Vec<u8>,
    pub scales: Vec<f32>,
}

/// Encodes a row-major `[rows, cols]` f32 matrix in `format`.
pub(crate) fn encode(format: QuantFormat, rows: usize, cols: usize, group: usize, data: &[f32]) -> Encoded {
    match format {
        QuantFormat::F32 => Encoded { weights: bytemuck::cast_slice(data).to_vec(), scales: Vec::new() },
        QuantFormat::Bf16 => {
            Encoded { weights: bytemuck::cast_slice(&quant::f32_to_bf16_bits(data)).to_vec(), scales: Vec::new() }
        }
        QuantFormat::Q8 => {
            let (qs, scales) = quant::quantize_q8(data, rows, cols, group);
            Encoded { weights: bytemuck::cast_slice(&qs).to_vec(), scales }
        }
        QuantFormat::Q4 => {
            let (weights, scales) = quant::quantize_q4(data, rows, cols, group);
            Encoded { weights, scales }
        }
        // Formats come from presets, and no preset picks mxfp4: it is kept
        // from an MXFP4 checkpoint's bytes (`write_expert_file`), never
        // re-quantized from f32.
        QuantFormat::Mxfp4 => unreachable!("mxfp4 is never encoded from f32"),
    }
}

/// Rejects the E8M0 scale OCP reserves for NaN ([`mxfp4::E8M0_NAN`]) in
/// kept MXFP4 weights, naming the first value of its block, as
/// [`check_finite`] names that value when the block is dequantized.
fn check_e8m0_scales(name: &str, scales: &[u8]) -> Result<()> {
    match scales.iter().position(|&scale| scale == mxfp4::E8M0_NAN) {
        None => Ok(()),
        Some(block) => {
            Err(Error::NonFinite { name: name.to_owned(), index: block * mxfp4::BLOCK_VALUES, value: f32::NAN })
        }
    }
}

/// Rejects NaN/inf in source weights; `base` is the element index of
/// `data[0]` in the whole tensor, for the message.
fn check_finite(name: &str, data: &[f32], base: usize) -> Result<()> {
    match data.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::NonFinite { name: name.to_owned(), index: base + i, value: data[i] }),
    }
}

/// A buffered file writer that hashes what it writes and tracks its size,
/// so no file is read back to compute its SHA-256.
struct HashingFile {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: Sha256,
    pos: u64,
}

impl HashingFile {
    fn create(path: PathBuf) -> Result<HashingFile> {
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(HashingFile { out: BufWriter::with_capacity(1 << 20, file), path, hasher: Sha256::new(), pos: 0 })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| Error::io(&self.path, e))?;
        self.hasher.update(bytes);
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Writes zeros up to the next multiple of `align`.
    fn pad_to(&mut self, align: u64) -> Result<()> {
        let pad = (align - self.pos % align) % align;
        self.write(&vec![0u8; pad as usize])
    }

    /// Flushes, fsyncs and returns the manifest entry under `rel_path`.
    fn finish(self, rel_path: &str) -> Result<FileEntry> {
        let HashingFile { path, out, hasher, pos } = self;
        let file = out.into_inner().map_err(|e| Error::io(&path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&path, e))?;
        Ok(FileEntry {
            path: rel_path.to_owned(),
            size_bytes: pos,
            sha256: crate::container::hex_digest(&hasher.finalize()),
        })
    }
}

/// The temporary sibling directory a conversion writes into, removed on
/// drop unless published.
struct Staging {
    out: PathBuf,
    parent: PathBuf,
    name: String,
    tmp: PathBuf,
    armed: bool,
}

impl Staging {
    fn prepare(out: &Path, overwrite: bool) -> Result<Staging> {
        let name = out
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::InvalidOption {
                option: "out_dir".into(),
                reason: format!("{} has no final UTF-8 path component", out.display()),
            })?
            .to_owned();
        if let Ok(meta) = std::fs::symlink_metadata(out) {
            let empty_dir = meta.is_dir() && std::fs::read_dir(out).map_err(|e| Error::io(out, e))?.next().is_none();
            if !empty_dir && !overwrite {
                return Err(Error::OutputExists { path: out.to_path_buf() });
            }
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        // Conversions to `out` that were killed left their temporaries.
        temporaries::remove_stale(&parent, |stem| stem == name);
        let tmp = parent.join(temporaries::temporary_name(&name));
        if tmp.exists() {
            // Left by an earlier crashed run that had our pid.
            std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        let experts = tmp.join(EXPERTS_DIR);
        std::fs::create_dir_all(&experts).map_err(|e| Error::io(&experts, e))?;
        Ok(Staging { out: out.to_path_buf(), parent, name, tmp, armed: true })
    }

    /// fsyncs the staged tree and renames it to the output path.
    fn publish(mut self) -> Result<PathBuf> {
        sync_dir(&self.tmp.join(EXPERTS_DIR))?;
        sync_dir(&self.tmp)?;
        if let Ok(meta) = std::fs::symlink_metadata(&self.out) {
            // Move the old output aside first: rename cannot replace a
            // non-empty directory, and deleting first would open a window
            // with no output at all.
            let old = self.parent.join(format!("{}.old-{}", self.name, std::process::id()));
            std::fs::rename(&self.out, &old).map_err(|e| Error::io(&self.out, e))?;
            if let Err(e) = std::fs::rename(&self.tmp, &self.out) {
                let _ = std::fs::rename(&old, &self.out);
                return Err(Error::io(&self.out, e));
            }
            let removed = if meta.is_dir() { std::fs::remove_dir_all(&old) } else { std::fs::remove_file(&old) };
            removed.map_err(|e| Error::io(&old, e))?;
        } else {
            std::fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
        }
        self.armed = false;
        sync_dir(&self.parent)?;
        Ok(self.out.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the conversion already failed with a better error.
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// fsyncs a directory so renames and new entries in it are durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
}
