//! Shared test helpers: tiny random Hugging Face checkpoints written with the
//! safetensors crate, and error-bound checks per storage format.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value, json};
use strata_format::{ModelSpec, names};
use strata_kernels::QuantFormat;

/// splitmix64: deterministic, dependency-free test randomness.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// olmoe, transformers 5.x spelling. Expert down_proj has 48 columns:
/// a partial q4 group of 64.
pub fn olmoe_config() -> Value {
    json!({
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "dtype": "bfloat16",
        "vocab_size": 96, "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
        "num_experts_per_tok": 2, "norm_topk_prob": false, "clip_qkv": null,
        "rms_norm_eps": 1e-05, "max_position_embeddings": 256, "attention_bias": false,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": false, "eos_token_id": 3, "pad_token_id": 1, "bos_token_id": null,
        "hidden_act": "silu", "transformers_version": "5.23.0"
    })
}

/// qwen3_moe, 4.x spelling, with a dense layer, tied embeddings, attention
/// biases and head_dim != hidden/heads.
pub fn qwen_config() -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "torch_dtype": "bfloat16",
        "vocab_size": 80, "hidden_size": 64, "intermediate_size": 40, "moe_intermediate_size": 36,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1,
        "mlp_only_layers": [1], "rms_norm_eps": 1e-06, "max_position_embeddings": 512,
        "attention_bias": true, "rope_theta": 1000000.0, "rope_scaling": null,
        "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": null,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu"
    })
}

/// mixtral, 4.x spelling. Expert width 45: odd q4 rows.
pub fn mixtral_config() -> Value {
    json!({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "torch_dtype": "bfloat16",
        "vocab_size": 64, "hidden_size": 64, "intermediate_size": 45, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-05, "max_position_embeddings": 1024,
        "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"
    })
}

/// How tensors are stored in the test checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Store {
    F32,
    Bf16,
    F16,
    /// 1-D tensors f32, matrices bf16 (as in mixed-precision releases).
    Mixed,
}

impl Store {
    fn dtype(self, shape: &[usize]) -> Dtype {
        match self {
            Store::F32 => Dtype::F32,
            Store::Bf16 => Dtype::BF16,
            Store::F16 => Dtype::F16,
            Store::Mixed if shape.len() == 1 => Dtype::F32,
            Store::Mixed => Dtype::BF16,
        }
    }
}

/// How experts are named in the test checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Layout {
    /// One file, published per-expert names.
    Single,
    /// Split over `n` shards plus `model.safetensors.index.json`.
    Sharded(usize),
    /// transformers 5.x in-memory names: fused `mlp.experts.gate_up_proj`
    /// `[E, 2I, H]` / `down_proj [E, H, I]`, mixtral router under `mlp.`.
    Fused,
}

/// A test model: its spec and every tensor under its published name, with
/// the exact f32 values the checkpoint stores (already rounded to the
/// storage dtype).
pub struct TinyModel {
    pub config: Value,
    pub spec: ModelSpec,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

fn round_to(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::BF16 => f32::from_bits(u32::from(strata_kernels::quant::f32_to_bf16_bits(&[x])[0]) << 16),
        Dtype::F16 => half::f16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn encode(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => strata_kernels::quant::f32_to_bf16_bits(values).iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => values.iter().flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()).collect(),
        other => panic!("test helper cannot encode {other:?}"),
    }
}

impl TinyModel {
    /// Random weights for `config`; norms near 1, matrices in [-s, s].
    pub fn new(config: Value, store: Store, seed: u64) -> TinyModel {
        let spec = ModelSpec::from_config_value(&config).unwrap();
        let mut rng = Rng(seed);
        let mut tensors = BTreeMap::new();
        let mut add = |name: String, shape: Vec<usize>, rng: &mut Rng| {
            let n: usize = shape.iter().product();
            let dtype = store.dtype(&shape);
            let values: Vec<f32> = (0..n)
                .map(|_| {
                    let x = if shape.len() == 1 { 1.0 + 0.1 * rng.uniform() } else { 0.2 * rng.uniform() };
                    round_to(dtype, x)
                })
                .collect();
            tensors.insert(name, (shape, values));
        };
        for d in names::dense_tensors(&spec.arch()) {
            add(d.name, d.shape, &mut rng);
        }
        let shapes = names::expert_shapes(&spec.arch());
        for layer in spec.moe_layers() {
            for e in 0..spec.moe.num_experts {
                for (k, name) in names::expert_names(&spec.arch().core, layer, e).into_iter().enumerate() {
                    add(name, shapes[k].to_vec(), &mut rng);
                }
            }
        }
        TinyModel { config, spec, tensors }
    }

    /// Writes config.json, the weights (per `layout`), and tokenizer files.
    pub fn write(&self, dir: &Path, store: Store, layout: Layout) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&self.config).unwrap()).unwrap();
        std::fs::write(dir.join("tokenizer.json"), b"{\"version\": \"1.0\"}").unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), b"{}").unwrap();

        let mut stored: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
        match layout {
            Layout::Single | Layout::Sharded(_) => {
                for (name, (shape, values)) in &self.tensors {
                    let dtype = store.dtype(shape);
                    stored.push((name.clone(), shape.clone(), dtype, encode(dtype, values)));
                }
            }
            Layout::Fused => {
                let spec = &self.spec;
                let mut expert_names = std::collections::HashSet::new();
                for layer in spec.moe_layers() {
                    let (e, i, h) = (spec.moe.num_experts, spec.moe.intermediate_size, spec.hidden_size);
                    let mut gate_up = Vec::with_capacity(e * 2 * i * h);
                    let mut down = Vec::with_capacity(e * h * i);
                    for expert in 0..e {
                        let n = names::expert_names(&spec.arch().core, layer, expert);
                        gate_up.extend_from_slice(&self.tensors[&n[0]].1);
                        gate_up.extend_from_slice(&self.tensors[&n[1]].1);
                        down.extend_from_slice(&self.tensors[&n[2]].1);
                        expert_names.extend(n);
                    }
                    let dtype = store.dtype(&[0, 0]);
                    let (gu, dn) = names::fused_expert_names(layer);
                    stored.push((gu, vec![e, 2 * i, h], dtype, encode(dtype, &gate_up)));
                    stored.push((dn, vec![e, h, i], dtype, encode(dtype, &down)));
                }
                for (name, (shape, values)) in &self.tensors {
                    if expert_names.contains(name) {
                        continue;
                    }
                    let dtype = store.dtype(shape);
                    let renamed = name.replace(".block_sparse_moe.", ".mlp.");
                    stored.push((renamed, shape.clone(), dtype, encode(dtype, values)));
                }
            }
        }

        let shards = match layout {
            Layout::Sharded(n) => n,
            _ => 1,
        };
        if shards == 1 {
            write_safetensors(&dir.join("model.safetensors"), &stored);
            return;
        }
        let mut weight_map = serde_json::Map::new();
        for s in 0..shards {
            let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
            let part: Vec<_> =
                stored.iter().enumerate().filter(|(i, _)| i % shards == s).map(|(_, t)| t.clone()).collect();
            for t in &part {
                weight_map.insert(t.0.clone(), json!(file));
            }
            write_safetensors(&dir.join(&file), &part);
        }
        let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
}

pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Dtype, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, dtype, bytes)| (name.clone(), TensorView::new(*dtype, shape.clone(), bytes).unwrap()))
        .collect();
    let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

/// Asserts `got` is within `format`'s error bound of `want`, row by row and
/// group by group: f32 exact, bf16 half an ulp (relative 2^-8), q8/q4 half a
/// quantization step of the group's scale.
pub fn assert_within_bound(what: &str, format: QuantFormat, cols: usize, group: usize, want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{what}: length");
    let cols = cols.max(1);
    for (r, (wrow, grow)) in want.chunks(cols).zip(got.chunks(cols)).enumerate() {
        let g = if group == 0 { cols } else { group };
        for (gi, (wg, gg)) in wrow.chunks(g).zip(grow.chunks(g)).enumerate() {
            let amax = wg.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (j, (&w, &x)) in wg.iter().zip(gg).enumerate() {
                let bound = match format {
                    // mxfp4 keeps a checkpoint's bytes: its values are the checkpoint's.
                    QuantFormat::F32 | QuantFormat::Mxfp4 => 0.0,
                    QuantFormat::Bf16 => w.abs() / 256.0,
                    QuantFormat::Q8 => amax / 127.0 / 2.0 * 1.0001 + 1e-7,
                    QuantFormat::Q4 => amax / 7.0 / 2.0 * 1.0001 + 1e-7,
                };
                assert!(
                    (w - x).abs() <= bound,
                    "{what}: {format} row {r} col {}: want {w}, got {x}, bound {bound}",
                    gi * g + j
                );
            }
        }
    }
}

/// Reads expert `expert`'s record of `layout` into an 8-byte aligned buffer.
pub fn read_record(layout: &strata_format::ExpertLayout, expert: usize) -> Vec<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&layout.path).unwrap();
    f.seek(SeekFrom::Start(layout.record_offset(expert).unwrap())).unwrap();
    let mut buf = vec![0u64; layout.record_bytes as usize / 8];
    f.read_exact(bytemuck::cast_slice_mut(&mut buf)).unwrap();
    buf
}

/// Expert `expert`'s gate, up and down as `container` stores them in
/// `layer`'s record: each matrix's format, weight bytes and scale bytes.
pub fn stored_expert(
    container: &strata_format::Container,
    layer: usize,
    expert: usize,
) -> [(QuantFormat, Vec<u8>, Vec<u8>); 3] {
    let layout = container.expert_layout(layer).unwrap();
    let record = read_record(layout, expert);
    let bytes: &[u8] = bytemuck::cast_slice(&record);
    let range = |offset: u64, length: u64| bytes[offset as usize..(offset + length) as usize].to_vec();
    layout
        .components
        .clone()
        .map(|c| (c.format, range(c.offset_bytes, c.length_bytes), range(c.scale_offset_bytes, c.scale_length_bytes)))
}

/// Expert `expert`'s gate, up and down in `container`'s record of `layer`,
/// as f32 values.
pub fn expert_values(container: &strata_format::Container, layer: usize, expert: usize) -> [Vec<f32>; 3] {
    let layout = container.expert_layout(layer).unwrap();
    let record = read_record(layout, expert);
    layout.matrices(bytemuck::cast_slice(&record)).unwrap().map(|m| m.to_f32())
}

/// The SHA-256 of each weight file of `container` (dense.bin and the
/// expert files), by path: equal when the weights are, bit for bit.
pub fn weight_file_hashes(container: &strata_format::Container) -> Vec<(String, String)> {
    let files = container.manifest().files.iter().filter(|f| f.path.ends_with(".bin"));
    files.map(|f| (f.path.clone(), f.sha256.clone())).collect()
}

/// `family_dir`'s f32 checkpoint (`hf/`) and its packed MXFP4 copy
/// (`hf_mxfp4/`) read with `dequantize_mxfp4`, both converted at `preset`
/// under `out`: the two containers, for comparing the dequantized path with
/// the f32 one.
pub fn f32_and_dequantized_mxfp4(
    family_dir: &Path,
    out: &Path,
    preset: strata_format::QuantPreset,
) -> [strata_format::Container; 2] {
    use strata_format::ConvertOptions;
    let dequantize = ConvertOptions { dequantize_mxfp4: true, ..ConvertOptions::new(preset) };
    strata_format::convert(family_dir.join("hf"), out.join("f32"), &ConvertOptions::new(preset)).unwrap();
    strata_format::convert(family_dir.join("hf_mxfp4"), out.join("dequantized"), &dequantize).unwrap();
    ["f32", "dequantized"].map(|c| strata_format::Container::open(out.join(c)).unwrap())
}

/// Every tensor of the single-file checkpoint `dir` as `write_safetensors`
/// takes them, for a copy with some of them changed.
pub fn read_safetensors(dir: &Path) -> Vec<(String, Vec<usize>, Dtype, Vec<u8>)> {
    let file = std::fs::read(dir.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&file).unwrap();
    let mut all: Vec<_> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.shape().to_vec(), view.dtype(), view.data().to_vec()))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}
