//! Validation of a manifest against its own spec and the files on disk.
//!
//! Everything a reader later relies on without checking (ranges inside the
//! mmap, alignment for in-place casts, record sizes, formats) is checked here
//! once, so the accessors can slice without further bounds logic and bad
//! input surfaces as an error naming the file and tensor, never a panic.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use strata_kernels::{QuantFormat, mxfp4};

use super::layout::{ComponentLayout, ExpertLayout, RECORD_ALIGN_BYTES, TENSOR_ALIGN_BYTES, matrix_bytes};
use super::manifest::{
    DENSE_FILE, FORMAT_VERSION, MAGIC, MANIFEST_FILE, Manifest, OLDEST_FORMAT_VERSION, expert_file_name,
};
use crate::error::{Error, Result};
use crate::names::{self, ExpertProj};
use crate::spec::{MAX_MANIFEST_BYTES, ModelArch, read_at_most};

/// What `Container::open` keeps from validation.
pub(super) struct Checked {
    /// The layers, derived from the embedded config.json and checked
    /// against what the manifest stores beside it.
    pub arch: ModelArch,
    pub dense_file_bytes: u64,
    pub dense_index: HashMap<String, usize>,
    pub expert_layouts: Vec<Option<ExpertLayout>>,
}

/// `[rows, cols]` of a stored tensor: 1-D tensors are a single row.
pub(crate) fn matrix_dims(shape: &[usize]) -> Option<(usize, usize)> {
    match *shape {
        [n] => Some((1, n)),
        // A depthwise convolution's `[channels, 1, taps]` kernel is stored
        // as its `[channels, taps]` matrix.
        [rows, cols] | [rows, 1, cols] => Some((rows, cols)),
        // A per-head vector shaped to broadcast over `[batch, tokens,
        // heads, d]` (Kimi-Linear's `A_log`) is stored as its `[heads]`.
        [1, 1, n, 1] => Some((1, n)),
        _ => None,
    }
}

/// Reads manifest.json, checking magic and version before the full parse so
/// a container from a newer build gets a version error, not a field error;
/// with the seal its fields hash to.
pub(super) fn read_manifest(dir: &Path) -> Result<(Manifest, String)> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = read_at_most(&path, MAX_MANIFEST_BYTES)?;
    #[derive(Deserialize)]
    struct Head {
        magic: Option<Value>,
        format_version: Option<Value>,
    }
    let json_err = |source| Error::Json { what: path.display().to_string(), source };
    let head: Head = serde_json::from_slice(&bytes).map_err(json_err)?;
    if head.magic.as_ref().and_then(Value::as_str) != Some(MAGIC) {
        return Err(Error::manifest(&path, format!("not a Strata container (magic must be {MAGIC:?})")));
    }
    match head.format_version.as_ref().and_then(Value::as_u64) {
        Some(v) if (u64::from(OLDEST_FORMAT_VERSION)..=u64::from(FORMAT_VERSION)).contains(&v) => {}
        other => {
            return Err(Error::manifest(
                &path,
                format!(
                    "unsupported format_version {} (this build reads {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})",
                    other.map_or_else(|| "<missing>".to_owned(), |v| v.to_string())
                ),
            ));
        }
    }
    let manifest = serde_json::from_slice(&bytes).map_err(json_err)?;
    Ok((manifest, super::seal_of(&bytes).map_err(json_err)?))
}

/// The model of a manifest: derived from its config, and checked against
/// what the manifest's version stores beside it (version 1 the flat spec,
/// version 2 a record of each layer).
fn model_arch(m: &Manifest) -> Result<ModelArch> {
    match (m.format_version, &m.spec, &m.model) {
        (1, Some(spec), None) => {
            spec.validate()?;
            ModelArch::from_stored(m.hf_config.get(), spec)
        }
        (2, None, Some(record)) => {
            let arch = ModelArch::from_config_json(m.hf_config.get())?;
            record.check(&arch)?;
            Ok(arch)
        }
        (version, ..) => Err(Error::SpecDisagrees {
            what: format!("a version {version} manifest stores `spec` (version 1) or `model` (version 2), one of them"),
        }),
    }
}

/// A relative `/`-separated path that stays inside the container.
fn is_safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

fn format_of(ordinal: u8, what: &str, bad: &dyn Fn(String) -> Error) -> Result<QuantFormat> {
    QuantFormat::from_ordinal(ordinal).map_err(|e| bad(format!("{what}: {e}")))
}

/// Checks the group and both lengths of one stored matrix.
fn check_sizes(
    what: &str,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    group: usize,
    length_bytes: u64,
    scale_length_bytes: u64,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    if format.is_grouped() && group == 0 {
        return Err(bad(format!("{what}: {format} needs a group size > 0")));
    }
    if !format.is_grouped() && group != 0 {
        return Err(bad(format!("{what}: {format} has no groups, but group = {group}")));
    }
    if format == QuantFormat::Mxfp4 && !cols.is_multiple_of(mxfp4::BLOCK_VALUES) {
        return Err(bad(format!("{what}: {format} rows are whole blocks of 32 columns, not {cols}")));
    }
    let (weights, scales) = matrix_bytes(format, rows, cols, group);
    if length_bytes != weights {
        return Err(bad(format!(
            "{what}: {format} [{rows}, {cols}] needs {weights} weight bytes, manifest says {length_bytes}"
        )));
    }
    if scale_length_bytes != scales {
        return Err(bad(format!(
            "{what}: {format} [{rows}, {cols}] group {group} needs {scales} scale bytes, manifest says {scale_length_bytes}"
        )));
    }
    Ok(())
}

/// Checks a block is 64-byte aligned and ends inside `limit` bytes.
fn check_range(what: &str, offset: u64, length: u64, limit: u64, bad: &dyn Fn(String) -> Error) -> Result<()> {
    if !offset.is_multiple_of(TENSOR_ALIGN_BYTES) {
        return Err(bad(format!("{what}: offset {offset} is not {TENSOR_ALIGN_BYTES}-byte aligned")));
    }
    match offset.checked_add(length) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(bad(format!("{what}: bytes {offset}+{length} exceed the {limit} available"))),
    }
}

/// Errors if any two non-empty `(start, end, what)` ranges intersect.
fn check_disjoint(mut ranges: Vec<(u64, u64, String)>, bad: &dyn Fn(String) -> Error) -> Result<()> {
    ranges.retain(|r| r.1 > r.0);
    ranges.sort();
    for pair in ranges.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(bad(format!("{} overlaps {}", pair[0].2, pair[1].2)));
        }
    }
    Ok(())
}

pub(super) fn validate(dir: &Path, m: &Manifest) -> Result<Checked> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let bad = |reason: String| Error::manifest(&manifest_path, reason);
    let arch = model_arch(m).map_err(|e| bad(format!("spec: {e}")))?;
    if m.quant.q8_group == 0 || m.quant.q4_group == 0 {
        return Err(bad("quant: group sizes must be > 0".into()));
    }

    // Files: safe paths, no duplicates, sizes as recorded.
    let mut file_bytes: HashMap<&str, u64> = HashMap::new();
    for f in &m.files {
        if !is_safe_relative(&f.path) {
            return Err(bad(format!("file path {:?} is not a plain relative path", f.path)));
        }
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(format!("file {:?}: sha256 must be 64 hex digits", f.path)));
        }
        if file_bytes.insert(&f.path, f.size_bytes).is_some() {
            return Err(bad(format!("file {:?} listed twice", f.path)));
        }
        let path = dir.join(&f.path);
        let actual = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
        if actual != f.size_bytes {
            return Err(Error::FileSize { path, expected_bytes: f.size_bytes, actual_bytes: actual });
        }
    }
    let listed = |file: &str| -> Result<u64> {
        file_bytes.get(file).copied().ok_or_else(|| bad(format!("data file {file:?} is not listed in `files`")))
    };

    // Dense tensors: exactly the set the spec implies, each well-formed.
    let dense_file_bytes = listed(DENSE_FILE)?;
    let expected: HashMap<String, names::TensorDesc> =
        names::dense_tensors(&arch).into_iter().map(|d| (d.name.clone(), d)).collect();
    let mut dense_index = HashMap::with_capacity(m.tensors.len());
    let mut ranges = Vec::with_capacity(2 * m.tensors.len());
    for (i, t) in m.tensors.iter().enumerate() {
        let what = format!("tensor {:?}", t.name);
        let desc =
            expected.get(&t.name).ok_or_else(|| bad(format!("{what} is not part of a {} model", arch.core.family)))?;
        if dense_index.insert(t.name.clone(), i).is_some() {
            return Err(bad(format!("{what} listed twice")));
        }
        if t.shape != desc.shape || t.kind != desc.kind {
            return Err(bad(format!(
                "{what}: manifest says {:?} {:?}, the spec implies {:?} {:?}",
                t.kind, t.shape, desc.kind, desc.shape
            )));
        }
        if t.file != DENSE_FILE {
            return Err(bad(format!("{what}: must live in {DENSE_FILE}, not {:?}", t.file)));
        }
        let format = format_of(t.format, &what, &bad)?;
        if !t.kind.is_matrix() && format != QuantFormat::F32 {
            return Err(bad(format!("{what}: {:?} tensors must be f32, not {format}", t.kind)));
        }
        let (rows, cols) =
            matrix_dims(&t.shape).ok_or_else(|| bad(format!("{what}: shape {:?} is not 1-D or 2-D", t.shape)))?;
        check_sizes(&what, format, rows, cols, t.group, t.length_bytes, t.scale_length_bytes, &bad)?;
        check_range(&what, t.offset_bytes, t.length_bytes, dense_file_bytes, &bad)?;
        check_range(&format!("{what} scales"), t.scale_offset_bytes, t.scale_length_bytes, dense_file_bytes, &bad)?;
        ranges.push((t.offset_bytes, t.offset_bytes + t.length_bytes, what.clone()));
        ranges.push((t.scale_offset_bytes, t.scale_offset_bytes + t.scale_length_bytes, format!("{what} scales")));
    }
    if let Some(missing) = names::dense_tensors(&arch).into_iter().find(|d| !dense_index.contains_key(&d.name)) {
        return Err(bad(format!("tensor {:?} is missing", missing.name)));
    }
    check_disjoint(ranges, &bad)?;

    // Expert layers: one per MoE layer, in order.
    let moe_layers = arch.moe_layers();
    if m.expert_layers.len() != moe_layers.len() {
        return Err(bad(format!(
            "{} expert layers listed, the spec has {} MoE layers",
            m.expert_layers.len(),
            moe_layers.len()
        )));
    }
    let shapes = names::expert_shapes(&arch);
    let mut expert_layouts: Vec<Option<ExpertLayout>> = vec![None; arch.layers.len()];
    let mut seen_files = HashSet::new();
    for (entry, &layer) in m.expert_layers.iter().zip(&moe_layers) {
        let what = format!("expert layer {}", entry.layer);
        if entry.layer != layer {
            return Err(bad(format!("{what}: expected MoE layer {layer} at this position")));
        }
        if entry.file != expert_file_name(layer) || !seen_files.insert(&entry.file) {
            return Err(bad(format!("{what}: file must be {:?}, not {:?}", expert_file_name(layer), entry.file)));
        }
        if entry.num_experts != arch.num_experts() {
            return Err(bad(format!("{what}: {} experts, the spec says {}", entry.num_experts, arch.num_experts())));
        }
        if entry.record_bytes == 0 || !entry.record_bytes.is_multiple_of(RECORD_ALIGN_BYTES) {
            return Err(bad(format!(
                "{what}: record_bytes {} is not a positive multiple of {RECORD_ALIGN_BYTES}",
                entry.record_bytes
            )));
        }
        let templates = names::expert_name_templates(&arch.core, layer);
        let mut components = Vec::with_capacity(3);
        let mut ranges = Vec::with_capacity(6);
        for (k, c) in entry.components.iter().enumerate() {
            let proj = ExpertProj::ALL[k];
            let cwhat = format!("{what} {} component", proj.name());
            if c.proj != proj || c.name != templates[k] {
                return Err(bad(format!(
                    "{cwhat}: expected {:?} named {:?}, found {:?} named {:?}",
                    proj, templates[k], c.proj, c.name
                )));
            }
            if c.shape != shapes[k] {
                return Err(bad(format!("{cwhat}: shape {:?}, the spec implies {:?}", c.shape, shapes[k])));
            }
            let format = format_of(c.format, &cwhat, &bad)?;
            let [rows, cols] = c.shape;
            check_sizes(&cwhat, format, rows, cols, c.group, c.length_bytes, c.scale_length_bytes, &bad)?;
            check_range(&cwhat, c.offset_bytes, c.length_bytes, entry.record_bytes, &bad)?;
            check_range(
                &format!("{cwhat} scales"),
                c.scale_offset_bytes,
                c.scale_length_bytes,
                entry.record_bytes,
                &bad,
            )?;
            ranges.push((c.offset_bytes, c.offset_bytes + c.length_bytes, cwhat.clone()));
            ranges.push((c.scale_offset_bytes, c.scale_offset_bytes + c.scale_length_bytes, format!("{cwhat} scales")));
            components.push(ComponentLayout {
                proj,
                format,
                rows,
                cols,
                group: c.group,
                offset_bytes: c.offset_bytes,
                length_bytes: c.length_bytes,
                scale_offset_bytes: c.scale_offset_bytes,
                scale_length_bytes: c.scale_length_bytes,
            });
        }
        check_disjoint(ranges, &bad)?;
        let expected_file_bytes = (entry.num_experts as u64)
            .checked_mul(entry.record_bytes)
            .ok_or_else(|| bad(format!("{what}: file size overflows")))?;
        let actual = listed(&entry.file)?;
        if actual != expected_file_bytes {
            return Err(Error::FileSize {
                path: dir.join(&entry.file),
                expected_bytes: expected_file_bytes,
                actual_bytes: actual,
            });
        }
        let components: [ComponentLayout; 3] =
            components.try_into().map_err(|_| bad(format!("{what}: needs exactly 3 components")))?;
        if let Some(crcs) = &entry.record_crc32c
            && crcs.len() != entry.num_experts
        {
            return Err(bad(format!("{what}: {} record_crc32c for {} experts", crcs.len(), entry.num_experts)));
        }
        expert_layouts[layer] = Some(ExpertLayout {
            layer,
            path: dir.join(&entry.file),
            num_experts: entry.num_experts,
            record_bytes: entry.record_bytes,
            components,
            record_crc32c: entry.record_crc32c.clone(),
        });
    }

    Ok(Checked { arch, dense_file_bytes, dense_index, expert_layouts })
}
