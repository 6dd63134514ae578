//! Read-only access to a Hugging Face safetensors checkpoint directory: one
//! `model.safetensors`, or shards listed by `model.safetensors.index.json`.
//!
//! Files are memory-mapped and only their headers are parsed on open; tensor
//! data is decoded to f32 on request, one tensor (or one row block, or one
//! expert slice of a fused tensor) at a time, so converting a checkpoint never
//! needs more than one tensor's worth of f32 in memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use serde_json::Value;

mod interleaved;
mod packed;
mod paired;

pub use interleaved::InterleavedExperts;
pub(crate) use interleaved::{fused_down, fused_gate_up, interleave, interleaved_sources};
pub use packed::Mxfp4Bytes;
pub(crate) use packed::packed_names;

use crate::error::{Error, Result};
use crate::fp8::{self, ScaleGrid};
use crate::names;
use crate::spec::ModelArch;

/// Single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Sharded checkpoint index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The architecture description.
pub const CONFIG_FILE: &str = "config.json";

/// Element types we decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceDtype {
    F32,
    Bf16,
    F16,
    /// An integer table (DeepSeek V4's `tid2eid`, int64 as transformers saves
    /// it), read as f32: exact below 2^24; the graph checks each id at load.
    I64,
}

impl SourceDtype {
    fn bytes(self) -> usize {
        match self {
            SourceDtype::I64 => 8,
            SourceDtype::F32 => 4,
            SourceDtype::Bf16 | SourceDtype::F16 => 2,
        }
    }
}

/// One tensor's location inside a shard.
#[derive(Debug, Clone)]
struct TensorLoc {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the shard's mmap (header already skipped).
    start_bytes: usize,
    end_bytes: usize,
}

/// One tensor as a safetensors header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range inside the whole file (the header is before it).
    pub start_bytes: usize,
    pub end_bytes: usize,
}

/// Parses the header of the safetensors file `bytes` (the whole file, as
/// mapped) named `path` for errors: every tensor's dtype, shape and byte
/// range. `read_metadata` checks that the ranges tile the data after the
/// header exactly, so each lies inside `bytes`. Its own function so that it
/// is fuzzed on bytes (fuzz/), without a file.
pub fn read_safetensors_header(bytes: &[u8], path: &Path) -> Result<Vec<HeaderTensor>> {
    let (header_bytes, metadata) = SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::Safetensors { path: path.to_owned(), reason: e.to_string() })?;
    let data_start = 8 + header_bytes;
    let tensors = metadata.tensors().into_iter().map(|(name, info)| {
        let (start, end) = info.data_offsets;
        HeaderTensor {
            name,
            dtype: info.dtype,
            shape: info.shape.clone(),
            start_bytes: data_start + start,
            end_bytes: data_start + end,
        }
    });
    Ok(tensors.collect())
}

struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// An opened checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    config_json: String,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorLoc>,
    /// FP8 (or FP4) tensor -> the tensor holding its block scales.
    fp8_scales: HashMap<String, String>,
    /// Those scale tensors: read with their weight, never on their own.
    scale_tensors: HashSet<String>,
    /// `quantization_config.weight_block_size`, else 128 x 128.
    fp8_block: [usize; 2],
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl Checkpoint {
    /// Opens `dir`: reads config.json, maps every shard, parses headers.
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join(CONFIG_FILE);
        let config_json = std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;

        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        // file name -> tensor names the index assigns to it (None: single file).
        let files: Vec<(String, Option<Vec<String>>)> = if index_path.is_file() {
            read_index(&index_path)?.into_iter().map(|(file, names)| (file, Some(names))).collect()
        } else if single_path.is_file() {
            vec![(SINGLE_FILE.to_owned(), None)]
        } else {
            return Err(Error::Checkpoint {
                path: dir,
                reason: format!("neither {SINGLE_FILE} nor {INDEX_FILE} found"),
            });
        };

        let mut shards = Vec::with_capacity(files.len());
        let mut tensors = BTreeMap::new();
        for (file, expected) in files {
            let path = dir.join(&file);
            let handle = File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the mapping is read-only and private to this process;
            // a checkpoint modified while we convert it is outside the
            // contract (as for any reader of safetensors files).
            let map = unsafe { Mmap::map(&handle) }.map_err(|e| Error::io(&path, e))?;
            // Conversion reads each shard front to back once: ask for
            // aggressive readahead and early reclaim of pages behind us. A
            // hint only, so failure is ignored.
            #[cfg(unix)]
            let _ = map.advise(memmap2::Advice::Sequential);
            let shard = shards.len();
            for header in read_safetensors_header(&map, &path)? {
                let HeaderTensor { name, dtype, shape, start_bytes, end_bytes } = header;
                let loc = TensorLoc { shard, dtype, shape, start_bytes, end_bytes };
                if tensors.insert(name.clone(), loc).is_some() {
                    return Err(Error::Checkpoint {
                        path: path.clone(),
                        reason: format!("tensor {name:?} is stored in more than one shard"),
                    });
                }
            }
            if let Some(expected) = expected {
                for name in expected {
                    match tensors.get(&name) {
                        Some(loc) if loc.shard == shard => {}
                        _ => {
                            return Err(Error::Checkpoint {
                                path: index_path.clone(),
                                reason: format!("tensor {name:?} is listed for {file} but not stored there"),
                            });
                        }
                    }
                }
            }
            shards.push(Shard { path, map });
        }
        // A config that does not parse fails later, with a better error.
        let config = serde_json::from_str::<Value>(&config_json).ok();
        let fp8_block = config.as_ref().and_then(fp8::block_size).unwrap_or(fp8::DEFAULT_BLOCK);
        let fp4 = config.as_ref().is_some_and(fp8::fp4_experts);
        // FP8 (and, where the config says so, FP4-packed I8) weights carry
        // their block scales in a companion tensor.
        let mut fp8_scales = HashMap::new();
        for (name, loc) in &tensors {
            if (loc.dtype == Dtype::F8_E4M3 || (fp4 && loc.dtype == Dtype::I8))
                && let Some(scale) = fp8::scale_candidates(name).into_iter().find(|c| tensors.contains_key(c))
            {
                fp8_scales.insert(name.clone(), scale);
            }
        }
        // An FP4 tensor holds two values a byte: every reader sees the
        // matrix's own shape.
        for (name, loc) in
            tensors.iter_mut().filter(|(name, loc)| loc.dtype == Dtype::I8 && fp8_scales.contains_key(*name))
        {
            let last = loc.shape.last_mut().and_then(|cols| cols.checked_mul(2).map(|doubled| (cols, doubled)));
            let Some((cols, doubled)) = last else {
                return Err(Error::Checkpoint {
                    path: dir,
                    reason: format!("FP4 tensor {name:?} has no columns to unpack"),
                });
            };
            *cols = doubled;
        }
        let scale_tensors = fp8_scales.values().cloned().collect();
        Ok(Checkpoint { dir, config_json, shards, tensors, fp8_scales, scale_tensors, fp8_block })
    }

    /// The directory this checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The verbatim text of config.json.
    pub fn config_json(&self) -> &str {
        &self.config_json
    }

    /// Every tensor name in the checkpoint, sorted, except the block scales
    /// of FP8 tensors (they are read as part of their weight).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().filter(|name| !self.scale_tensors.contains(*name)).map(String::as_str)
    }

    /// Whether the checkpoint stores `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The stored shape of `name`.
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        Ok(&self.loc(name)?.shape)
    }

    /// The first of `candidates` that the checkpoint stores, or derives
    /// from what it stores (a split expert bias, see
    /// [`InterleavedExperts`]; half of a paired gate and up, `paired.rs`).
    pub fn resolve<'n>(&self, candidates: &'n [String]) -> Option<&'n str> {
        candidates.iter().map(String::as_str).find(|name| {
            self.has(name)
                || self.split_bias(name).is_some()
                || self.paired_half(name).is_some()
                || !self.row_shards(name).is_empty()
        })
    }

    /// The stored tensors `name` is read from: itself, the pair it is half
    /// of, or the row shards it is joined from (see [`Checkpoint::row_shards`]).
    pub fn stored_as(&self, name: &str) -> Vec<String> {
        if let Some((source, _)) = self.paired_half(name) {
            return vec![source];
        }
        match self.row_shards(name) {
            shards if shards.is_empty() => vec![name.to_owned()],
            shards => shards,
        }
    }

    /// The shards `X.shard_{k}.weight` (k = 0, 1, … while stored) a matrix
    /// `X.weight` that is not stored itself is split into by rows: the
    /// PLE tables (`ngram_embedding`, `split_ngram_parts` shards, as
    /// transformers' `Concatenate(dim=0)` joins them). Empty otherwise.
    pub fn row_shards(&self, name: &str) -> Vec<String> {
        let Some(base) = name.strip_suffix(".weight").filter(|_| !self.has(name)) else { return Vec::new() };
        (0..).map(|k| format!("{base}.shard_{k}.weight")).take_while(|shard| self.has(shard)).collect()
    }

    /// Rows of a matrix stored as row shards, from each shard in turn.
    fn shard_rows_f32(&self, shards: &[String], mut row_start: usize, mut row_count: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for shard in shards {
            let (rows, _) = as_matrix(shard, &self.loc(shard)?.shape)?;
            if row_start >= rows {
                row_start -= rows;
                continue;
            }
            let take = row_count.min(rows - row_start);
            out.extend(self.rows_f32(shard, row_start, take)?);
            (row_start, row_count) = (0, row_count - take);
            if row_count == 0 {
                return Ok(out);
            }
        }
        Err(Error::Checkpoint {
            path: self.dir.clone(),
            reason: format!("tensor {:?}: {row_count} rows past its shards' end", shards.first()),
        })
    }

    /// A whole tensor decoded to f32, with its shape.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let loc = self.loc(name)?;
        let numel = numel(name, &loc.shape)?;
        let data = self.elements_f32(name, 0, numel)?;
        Ok((loc.shape.clone(), data))
    }

    /// Rows `[row_start, row_start + row_count)` of `name` viewed as a 2-D
    /// matrix `[shape[0], product(shape[1..])]` (a 1-D tensor is one row; a
    /// 3-D one `[shape[0] · shape[1], shape[2]]`), decoded to f32. Lets large matrices be converted in bounded memory.
    pub fn rows_f32(&self, name: &str, row_start: usize, row_count: usize) -> Result<Vec<f32>> {
        if let Some((source, parity)) = self.split_bias(name) {
            return self.split_bias_rows(&source, parity, row_start, row_count);
        }
        if let Some((source, parity)) = self.paired_half(name) {
            return self.paired_rows(&source, parity, row_start, row_count);
        }
        let shards = self.row_shards(name);
        if !shards.is_empty() {
            return self.shard_rows_f32(&shards, row_start, row_count);
        }
        let loc = self.loc(name)?;
        let (rows, cols) = as_matrix(name, &loc.shape)?;
        let end = row_start.checked_add(row_count);
        if end.is_none_or(|end| end > rows) {
            return Err(Error::Checkpoint {
                path: self.shards[loc.shard].path.clone(),
                reason: format!("tensor {name:?}: rows {row_start}+{row_count} out of range ({rows} rows)"),
            });
        }
        self.elements_f32(name, row_start * cols, row_count * cols)
    }

    /// The gate, up and down matrices (f32, `[rows, cols]`) of one expert.
    ///
    /// Reads the published per-expert tensors when present, else the fused
    /// 3-D tensors of a transformers 5.x save (`gate_up_proj [E, 2I, H]`,
    /// gate in rows `0..I` and up in rows `I..2I` of each expert's slab, as
    /// `Concatenate(dim=1)` in `conversion_mapping.py` builds it;
    /// `down_proj [E, H, I]`). Only that expert's slice is decoded.
    pub fn expert_f32(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let names = names::expert_names(&arch.core, layer, expert);
        let shapes = names::expert_shapes(arch);
        let (e, i, h) = (arch.num_experts(), arch.expert_intermediate_size(), arch.core.hidden_size);
        if expert >= e {
            return Err(Error::ExpertOutOfRange { layer, expert, num_experts: e });
        }

        if self.has_paired_experts(arch, layer) {
            return self.paired_expert_f32(arch, layer, expert);
        }
        let (fused_gate_up, fused_down) = names::fused_expert_names(layer);
        let prefix = fused_gate_up.trim_end_matches("gate_up_proj");
        if interleaved::is_interleaved(self, prefix) {
            return self.interleaved_expert_f32(&self.interleaved_experts(arch, prefix), expert);
        }
        if !self.has(&names[0]) && self.has(&fused_gate_up) {
            self.check_shape(&fused_gate_up, &[e, 2 * i, h])?;
            self.check_shape(&fused_down, &[e, h, i])?;
            let slab = 2 * i * h;
            let gate = self.elements_f32(&fused_gate_up, expert * slab, i * h)?;
            let up = self.elements_f32(&fused_gate_up, expert * slab + i * h, i * h)?;
            let down = self.elements_f32(&fused_down, expert * h * i, h * i)?;
            return Ok([gate, up, down]);
        }

        let mut out: [Vec<f32>; 3] = Default::default();
        for ((slot, name), shape) in out.iter_mut().zip(&names).zip(shapes) {
            let mut candidates = vec![name.clone()];
            candidates.extend(names::aliases(arch, name));
            let Some(found) = self.resolve(&candidates) else {
                let packed = self.packed_mxfp4(name, shape)?.ok_or_else(|| Error::MissingTensor {
                    name: name.clone(),
                    hint: format!(" (nor fused {fused_gate_up}, nor packed MXFP4)"),
                })?;
                *slot = packed.to_f32();
                continue;
            };
            self.check_shape(found, &shape)?;
            *slot = self.tensor_f32(found)?.1;
        }
        Ok(out)
    }

    /// Whether every matrix of every routed expert of `layer` is stored as
    /// MXFP4 codes and scales: Kimi K3's `weight_packed`/`weight_scale`, or
    /// gpt-oss's `*_blocks`/`*_scales`. Their bytes are then what
    /// [`Checkpoint::expert_mxfp4`] gives.
    pub fn has_packed_mxfp4_experts(&self, arch: &ModelArch, layer: usize) -> bool {
        let (fused_gate_up, _) = names::fused_expert_names(layer);
        let prefix = fused_gate_up.trim_end_matches("gate_up_proj");
        if interleaved::is_interleaved(self, prefix) {
            let experts = self.interleaved_experts(arch, prefix);
            return self.has_mxfp4_experts(&experts);
        }
        // Per-expert matrices (paired and fused experts have no such names).
        let packed = |name: &String| {
            let aliases = names::aliases(arch, name);
            self.is_packed_mxfp4(name) && !aliases.iter().any(|alias| self.has(alias))
        };
        !self.has_paired_experts(arch, layer)
            && (0..arch.num_experts()).all(|e| names::expert_names(&arch.core, layer, e).iter().all(packed))
    }

    /// Gate, up and down of one routed expert of a layer stored MXFP4
    /// ([`Checkpoint::has_packed_mxfp4_experts`]) as their codes and scales,
    /// shapes checked: the bytes a container's `mxfp4` components keep.
    pub fn expert_mxfp4(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Mxfp4Bytes; 3]> {
        let e = arch.num_experts();
        if expert >= e {
            return Err(Error::ExpertOutOfRange { layer, expert, num_experts: e });
        }
        let (fused_gate_up, _) = names::fused_expert_names(layer);
        let prefix = fused_gate_up.trim_end_matches("gate_up_proj");
        if interleaved::is_interleaved(self, prefix) {
            return self.interleaved_expert_mxfp4(&self.interleaved_experts(arch, prefix), expert);
        }
        let (names, shapes) = (names::expert_names(&arch.core, layer, expert), names::expert_shapes(arch));
        let [gate, up, down] = std::array::from_fn(|k| {
            self.packed_mxfp4(&names[k], shapes[k])?.ok_or_else(|| Error::MissingTensor {
                name: names[k].clone(),
                hint: " as packed MXFP4 (weight_packed and weight_scale)".to_owned(),
            })
        });
        Ok([gate?, up?, down?])
    }

    /// The widths of the interleaved experts under `prefix`.
    fn interleaved_experts<'p>(&self, arch: &ModelArch, prefix: &'p str) -> InterleavedExperts<'p> {
        InterleavedExperts {
            prefix,
            num_experts: arch.num_experts(),
            hidden: arch.core.hidden_size,
            inter: arch.expert_intermediate_size(),
        }
    }

    /// Errors unless `name` exists with exactly `expected` shape.
    pub fn check_shape(&self, name: &str, expected: &[usize]) -> Result<()> {
        if let (Some((source, _)), [experts, width]) = (self.split_bias(name), expected) {
            // Its source interleaves two such biases.
            return self.check_shape(&source, &[*experts, 2 * width]);
        }
        if let Some((source, _)) = self.paired_half(name) {
            return self.check_paired_shape(name, &source, expected);
        }
        let shards = self.row_shards(name);
        if let [rows, cols] = expected
            && !shards.is_empty()
        {
            // Every shard `[r_k, cols]`, the r_k summing to `rows`.
            let mut total: usize = 0;
            for shard in &shards {
                let shape = &self.loc(shard)?.shape;
                match shape[..] {
                    [r, c] if c == *cols => total = total.saturating_add(r),
                    _ => {
                        return Err(Error::TensorShape {
                            name: shard.clone(),
                            expected: vec![0, *cols],
                            found: shape.clone(),
                        });
                    }
                }
            }
            if total != *rows {
                return Err(Error::TensorShape {
                    name: name.to_owned(),
                    expected: expected.to_vec(),
                    found: vec![total, *cols],
                });
            }
            return Ok(());
        }
        let loc = self.loc(name)?;
        if loc.shape != expected {
            return Err(Error::TensorShape {
                name: name.to_owned(),
                expected: expected.to_vec(),
                found: loc.shape.clone(),
            });
        }
        Ok(())
    }

    fn loc(&self, name: &str) -> Result<&TensorLoc> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
            hint: format!(" in checkpoint {}", self.dir.display()),
        })
    }

    /// Decodes elements `[first, first + count)` of the flattened tensor.
    fn elements_f32(&self, name: &str, first: usize, count: usize) -> Result<Vec<f32>> {
        let loc = self.loc(name)?;
        let dtype = match loc.dtype {
            Dtype::F32 => SourceDtype::F32,
            Dtype::BF16 => SourceDtype::Bf16,
            Dtype::F16 => SourceDtype::F16,
            Dtype::I64 => SourceDtype::I64,
            Dtype::F8_E4M3 => return self.fp8_elements_f32(name, first, count),
            Dtype::I8 if self.fp8_scales.contains_key(name) => return self.fp4_elements_f32(name, first, count),
            other => {
                return Err(Error::UnsupportedDtype { name: name.to_owned(), dtype: format!("{other:?}") });
            }
        };
        let width = dtype.bytes();
        let shard = &self.shards[loc.shard];
        // The header was validated by safetensors (offsets consistent with
        // shape, dtype and file size), but recheck arithmetically so a bad
        // request can never index out of the map.
        let start = first.checked_mul(width).and_then(|b| b.checked_add(loc.start_bytes));
        let end = count.checked_mul(width).and_then(|b| start.and_then(|s| s.checked_add(b)));
        let bytes = match (start, end) {
            (Some(s), Some(e)) if e <= loc.end_bytes && e <= shard.map.len() => &shard.map[s..e],
            _ => {
                return Err(Error::Checkpoint {
                    path: shard.path.clone(),
                    reason: format!("tensor {name:?}: elements {first}+{count} out of range"),
                });
            }
        };
        Ok(decode(dtype, bytes))
    }

    /// Elements of an FP8 e4m3 tensor, dequantized with its block scales.
    fn fp8_elements_f32(&self, name: &str, first: usize, count: usize) -> Result<Vec<f32>> {
        let loc = self.loc(name)?;
        let shard = &self.shards[loc.shard];
        let bad = |reason: String| Error::Checkpoint {
            path: shard.path.clone(),
            reason: format!("tensor {name:?}: {reason}"),
        };
        let scale_name = self.fp8_scales.get(name).ok_or_else(|| {
            bad(format!("float8 weights without block scales (none of {:?})", fp8::scale_candidates(name)))
        })?;
        let scale_loc = self.loc(scale_name)?;
        let grid = ScaleGrid::new(&loc.shape, &scale_loc.shape, self.fp8_block).map_err(bad)?;
        let scales = self.scale_values(scale_name)?;
        let bytes = first
            .checked_add(count)
            .and_then(|end| {
                let (s, e) = (loc.start_bytes + first, loc.start_bytes + end);
                (e <= loc.end_bytes && e <= shard.map.len()).then(|| &shard.map[s..e])
            })
            .ok_or_else(|| bad(format!("elements {first}+{count} out of range")))?;
        Ok(fp8::dequantize(bytes, first, &grid, &scales))
    }

    /// Elements of an FP4 tensor ([`fp8::fp4_experts`]), dequantized with
    /// its scales; `first` and `count` count values, two a byte.
    fn fp4_elements_f32(&self, name: &str, first: usize, count: usize) -> Result<Vec<f32>> {
        let loc = self.loc(name)?;
        let shard = &self.shards[loc.shard];
        let bad = |reason: String| Error::Checkpoint {
            path: shard.path.clone(),
            reason: format!("tensor {name:?}: {reason}"),
        };
        let scale_name = &self.fp8_scales[name];
        let grid = ScaleGrid::new(&loc.shape, &self.loc(scale_name)?.shape, fp8::FP4_BLOCK).map_err(bad)?;
        let scales = self.scale_values(scale_name)?;
        let bytes = first
            .checked_add(count)
            .and_then(|end| {
                let (s, e) = (loc.start_bytes + first / 2, loc.start_bytes + end.div_ceil(2));
                (e <= loc.end_bytes && e <= shard.map.len()).then(|| &shard.map[s..e])
            })
            .ok_or_else(|| bad(format!("values {first}+{count} out of range")))?;
        Ok(fp8::dequantize_fp4(bytes, first, count, &grid, &scales))
    }

    /// Every value of a scale tensor (f32, bf16, f16 or UE8M0) as f32.
    fn scale_values(&self, name: &str) -> Result<Vec<f32>> {
        let loc = self.loc(name)?;
        if loc.dtype == Dtype::F8_E8M0 {
            let shard = &self.shards[loc.shard];
            let bytes = shard.map.get(loc.start_bytes..loc.end_bytes).ok_or_else(|| Error::Checkpoint {
                path: shard.path.clone(),
                reason: format!("tensor {name:?}: data out of range"),
            })?;
            return Ok(bytes.iter().map(|&b| fp8::e8m0_to_f32(b)).collect());
        }
        Ok(self.tensor_f32(name)?.1)
    }
}

/// Decodes little-endian elements. Safetensors data is not necessarily
/// aligned inside the file, so this goes through byte arrays, not casts.
fn decode(dtype: SourceDtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        SourceDtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        SourceDtype::Bf16 => {
            bytes.chunks_exact(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)).collect()
        }
        SourceDtype::F16 => {
            bytes.chunks_exact(2).map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect()
        }
        SourceDtype::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect(),
    }
}

fn numel(name: &str, shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| Error::TensorShape {
        name: name.to_owned(),
        expected: vec![],
        found: shape.to_vec(),
    })
}

/// `[rows, cols]` of a tensor seen as a matrix over its first dimension,
/// except a stack of matrices `[count, rows, cols]`, seen as their rows one
/// after another (as the container stores it: Inkling's shared experts;
/// a `[channels, 1, taps]` kernel is `[channels, taps]` either way).
fn as_matrix(name: &str, shape: &[usize]) -> Result<(usize, usize)> {
    match shape {
        [] => Ok((1, 1)),
        [n] => Ok((1, *n)),
        [count, rows, cols] => Ok((numel(name, &[*count, *rows])?, *cols)),
        [rows, rest @ ..] => Ok((*rows, numel(name, rest)?)),
    }
}

/// Parses `model.safetensors.index.json` into file -> tensor names.
fn read_index(path: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let value: Value =
        serde_json::from_str(&text).map_err(|source| Error::Json { what: path.display().to_string(), source })?;
    let bad = |reason: String| Error::Checkpoint { path: path.to_path_buf(), reason };
    let map =
        value.get("weight_map").and_then(Value::as_object).ok_or_else(|| bad("missing object `weight_map`".into()))?;
    let mut files: HashMap<String, Vec<String>> = HashMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| bad(format!("weight_map[{tensor:?}] is not a string")))?;
        // Shards must be plain files next to the index: never follow a path
        // out of the checkpoint directory.
        if file.is_empty() || file.contains(['/', '\\']) || file == "." || file == ".." {
            return Err(bad(format!("weight_map[{tensor:?}]: shard name {file:?} is not a plain file name")));
        }
        files.entry(file.to_owned()).or_default().push(tensor.clone());
    }
    if files.is_empty() {
        return Err(bad("`weight_map` is empty".into()));
    }
    Ok(files.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inkling's shared experts, `[count, rows, cols]`, are read as the
    /// container stores them: each matrix's rows after the one before's.
    #[test]
    fn a_stack_of_matrices_reads_as_its_rows_one_after_another() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling/hf");
        let ckpt = Checkpoint::open(dir).unwrap();
        let name = "model.layers.1.mlp.shared_experts.down_proj";
        let (shape, all) = ckpt.tensor_f32(name).unwrap();
        let [count, rows, cols] = shape[..] else { panic!("{name}: {shape:?}") };
        assert!(count > 1, "{name}: a stack of one");
        // The second matrix's first two rows.
        assert_eq!(ckpt.rows_f32(name, rows, 2).unwrap(), all[rows * cols..(rows + 2) * cols]);
    }
}
