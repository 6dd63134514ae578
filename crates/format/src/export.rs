//! Strata container -> Hugging Face checkpoint (f32), the inverse of
//! [`crate::convert`] up to quantization error.
//!
//! Used to check a container against the reference implementation:
//! `transformers.AutoModelForCausalLM.from_pretrained(out)` loads the result.
//! Tensors are produced lazily while `safetensors::serialize_to_file` writes
//! them, so only one dequantized tensor (plus one expert record) is in memory
//! at a time: for fused experts that is a whole layer's
//! (`E · hidden · 2·intermediate` floats: 8.5 GB for gpt-oss-120b).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use safetensors::tensor::{Dtype, View};
use serde_json::Value;

use crate::checkpoint::{CONFIG_FILE, SINGLE_FILE, fused_down, fused_gate_up, interleave};
use crate::container::{AUX_FILES, Container};
use crate::error::{Error, Result};
use crate::names;
use crate::spec::{ExpertKind, FfnSpec, ModelArch};

/// Writes `container_dir` as an f32 Hugging Face checkpoint into
/// `out_hf_dir` (created; must not exist or be empty): `model.safetensors`
/// with the published tensor names as `save_pretrained` spells them
/// (per-expert, not fused, except gpt-oss's biased experts, which
/// transformers only reads fused and interleaved), `config.json` from the
/// family's `to_config_json`, and the tokenizer files the container
/// carries.
pub fn export(container_dir: impl AsRef<Path>, out_hf_dir: impl AsRef<Path>) -> Result<()> {
    let container = Container::open(container_dir)?;
    let out = out_hf_dir.as_ref();
    if std::fs::symlink_metadata(out).is_ok() {
        let empty = out.is_dir() && std::fs::read_dir(out).map_err(|e| Error::io(out, e))?.next().is_none();
        if !empty {
            return Err(Error::OutputExists { path: out.to_path_buf() });
        }
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;

    let reader = Reader {
        container: &container,
        files: RefCell::new(HashMap::new()),
        record: RefCell::new(None),
        error: RefCell::new(None),
    };
    let arch = container.arch();
    let core = &arch.core;
    let lazy = |shape: Vec<usize>, source: Source| Lazy { reader: &reader, shape, source };
    let interleaved_layers: Vec<usize> =
        arch.moe_layers().into_iter().filter(|&l| has_interleaved_experts(arch, l)).collect();
    // Their gate and up biases are written interleaved, as one tensor.
    let fused_biases: HashSet<String> = interleaved_layers
        .iter()
        .flat_map(|&layer| {
            let [gate, up, _] = names::expert_bias_names(core, layer);
            [gate, up]
        })
        .collect();
    let mut tensors: Vec<(String, Lazy<'_>)> = Vec::new();
    for entry in container.manifest().tensors.iter().filter(|e| !fused_biases.contains(&e.name)) {
        tensors
            .push((names::saved_name(core, &entry.name), lazy(entry.shape.clone(), Source::Dense(entry.name.clone()))));
    }
    let shapes = names::expert_shapes(arch);
    let ([inter, hidden], experts) = (shapes[0], arch.num_experts());
    for layer in arch.moe_layers() {
        if interleaved_layers.contains(&layer) {
            let [gate_up, gate_up_bias, down] = names::interleaved_expert_names(core, layer);
            let two_inter = 2 * inter;
            tensors.push((
                gate_up,
                lazy(vec![experts, hidden, two_inter], Source::Interleaved { layer, part: Fused::GateUp }),
            ));
            tensors.push((gate_up_bias, lazy(vec![experts, two_inter], Source::InterleavedBiases { layer })));
            tensors.push((down, lazy(vec![experts, inter, hidden], Source::Interleaved { layer, part: Fused::Down })));
            continue;
        }
        for expert in 0..experts {
            for (k, name) in names::expert_names(core, layer, expert).into_iter().enumerate() {
                let source = Source::Expert { layer, expert, component: k };
                tensors.push((names::saved_name(core, &name), lazy(shapes[k].to_vec(), source)));
            }
        }
    }

    let st_path = out.join(SINGLE_FILE);
    // transformers refuses safetensors archives whose metadata lacks a known
    // "format"; "pt" is what torch's save_file writes.
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(tensors, Some(metadata), &st_path)
        .map_err(|e| Error::Safetensors { path: st_path.clone(), reason: e.to_string() })?;
    if let Some(err) = reader.error.take() {
        // A tensor could not be produced: its zeros must not be mistaken
        // for a valid export.
        let _ = std::fs::remove_file(&st_path);
        return Err(err);
    }

    let config_path = out.join(CONFIG_FILE);
    let source: Value = serde_json::from_str(container.manifest().hf_config.get())
        .map_err(|source| Error::Json { what: "manifest hf_config".into(), source })?;
    let config = arch.to_config_json_from(&source);
    let config = serde_json::to_string_pretty(&config)
        .map_err(|source| Error::Json { what: config_path.display().to_string(), source })?;
    std::fs::write(&config_path, config + "\n").map_err(|e| Error::io(&config_path, e))?;
    for name in AUX_FILES {
        if let Some(src) = container.aux_file(name) {
            let dst = out.join(name);
            std::fs::copy(&src, &dst).map_err(|e| Error::io(&dst, e))?;
        }
    }
    Ok(())
}

/// Whether `layer`'s experts are biased and clamped: transformers keeps
/// those (gpt-oss's) fused, with gate and up interleaved.
fn has_interleaved_experts(arch: &ModelArch, layer: usize) -> bool {
    matches!(&arch.layers[layer].ffn, FfnSpec::Moe(moe) if matches!(moe.experts, ExpertKind::ClampedSwiGlu { .. }))
}

/// Where a lazily produced tensor comes from.
enum Source {
    Dense(String),
    Expert { layer: usize, expert: usize, component: usize },
    Interleaved { layer: usize, part: Fused },
    InterleavedBiases { layer: usize },
}

/// A fused matrix of a layer's interleaved experts
/// ([`names::interleaved_expert_names`]).
#[derive(Clone, Copy)]
enum Fused {
    /// `[E, hidden, 2·intermediate]`, from each record's gate and up.
    GateUp,
    /// `[E, intermediate, hidden]`, from each record's down.
    Down,
}

/// 64-byte aligned storage, so f32/bf16 views of a record are valid casts.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Align64([u8; 64]);
// SAFETY: a plain byte array with alignment 64 and size 64: no padding, every
// bit pattern valid.
unsafe impl bytemuck::Zeroable for Align64 {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Align64 {}

/// Shared state of one export: open expert files, the last record read
/// (gate/up/down of an expert are adjacent in the sorted write order, and a
/// fused `gate_up_proj` takes each expert's gate and up in turn, so one read
/// serves them), and the first error (View::data cannot fail).
struct Reader<'c> {
    container: &'c Container,
    files: RefCell<HashMap<usize, File>>,
    record: RefCell<Option<(usize, usize, Vec<Align64>)>>,
    error: RefCell<Option<Error>>,
}

impl Reader<'_> {
    fn tensor_f32(&self, source: &Source) -> Result<Vec<f32>> {
        match *source {
            Source::Dense(ref name) => Ok(self.container.dense(name)?.to_f32()),
            Source::Expert { layer, expert, component } => self.expert_f32(layer, expert, component),
            Source::Interleaved { layer, part } => self.interleaved_f32(layer, part),
            Source::InterleavedBiases { layer } => self.interleaved_biases_f32(layer),
        }
    }

    /// A fused tensor of `layer`'s interleaved experts, expert by expert.
    fn interleaved_f32(&self, layer: usize, part: Fused) -> Result<Vec<f32>> {
        let hidden = self.container.arch().core.hidden_size;
        let mut out = Vec::new();
        for expert in 0..self.container.arch().num_experts() {
            out.extend(match part {
                Fused::GateUp => {
                    fused_gate_up(&self.expert_f32(layer, expert, 0)?, &self.expert_f32(layer, expert, 1)?, hidden)
                }
                Fused::Down => fused_down(&self.expert_f32(layer, expert, 2)?, hidden),
            });
        }
        Ok(out)
    }

    /// `gate_up_proj_bias` of `layer`'s interleaved experts, from the
    /// resident gate and up biases.
    fn interleaved_biases_f32(&self, layer: usize) -> Result<Vec<f32>> {
        let [gate, up, _] = names::expert_bias_names(&self.container.arch().core, layer);
        Ok(interleave(self.container.dense_vec(&gate)?, self.container.dense_vec(&up)?, 1))
    }

    /// Component `component` (gate, up, down) of one expert's record.
    fn expert_f32(&self, layer: usize, expert: usize, component: usize) -> Result<Vec<f32>> {
        let layout = self.container.expert_layout(layer)?;
        let mut cached = self.record.borrow_mut();
        let hit = matches!(&*cached, Some((l, e, _)) if *l == layer && *e == expert);
        if !hit {
            let mut buf = vec![Align64([0; 64]); (layout.record_bytes as usize).div_ceil(64)];
            let bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut buf)[..layout.record_bytes as usize];
            let mut files = self.files.borrow_mut();
            let file = match files.entry(layer) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(File::open(&layout.path).map_err(|e| Error::io(&layout.path, e))?)
                }
            };
            let offset = layout.record_offset(expert)?;
            file.seek(SeekFrom::Start(offset))
                .and_then(|_| file.read_exact(bytes))
                .map_err(|e| Error::io(&layout.path, e))?;
            *cached = Some((layer, expert, buf));
        }
        let Some((_, _, buf)) = cached.as_ref() else {
            return Err(Error::NotMoeLayer { layer });
        };
        let bytes: &[u8] = &bytemuck::cast_slice(buf)[..layout.record_bytes as usize];
        let mats = layout.matrices(bytes)?;
        Ok(mats[component].to_f32())
    }
}

/// A tensor dequantized only when the serializer asks for its bytes.
struct Lazy<'r> {
    reader: &'r Reader<'r>,
    shape: Vec<usize>,
    source: Source,
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self.reader.tensor_f32(&self.source) {
            Ok(values) if values.len() * 4 == self.data_len() => Cow::Owned(bytemuck::cast_slice(&values).to_vec()),
            outcome => {
                let err = outcome.err().unwrap_or_else(|| Error::MissingTensor {
                    name: format!("{:?}", self.shape),
                    hint: " (dequantized to the wrong length)".into(),
                });
                self.reader.error.borrow_mut().get_or_insert(err);
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}
