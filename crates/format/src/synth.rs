//! Synthetic containers: random weights in a real model's shapes, so that I/O
//! can be measured on multi-GB models without downloading one.
//!
//! The shapes come from the public config.json of each model (embedded
//! below, trimmed to the fields Strata reads). Weights are uniform random
//! with the spread of a trained model's (std 0.02), norms are ones, so
//! activations stay finite through any number of layers. A synthetic
//! container is an ordinary container: every command runs on it.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::convert::{ConvertOptions, ConvertReport, Source, write_container};
use crate::names;
use crate::preset::{Q4_DEFAULT_GROUP, QuantPreset};
use crate::spec::ModelArch;
use crate::{Error, Result};

/// Models whose shapes `synth --like` can copy, with their config.json as
/// published on the Hugging Face hub (allenai/OLMoE-1B-7B-0924,
/// Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1), and for the hybrid
/// Qwen models the shapes transformers 5.23's config classes default to,
/// which describe Qwen3.5/3.6-35B-A3B (in the hub's multimodal wrapper) and
/// Qwen3-Next-80B-A3B; and DeepSeek V4 Flash's shapes in the hub's spelling
/// (testdata/deepseek_v4/flash_shape, its FP8 and FP4 storage left out);
/// Inkling's (975B) in the hub's wrapper, `InklingTextConfig`'s defaults
/// (testdata/inkling_hub, its vision and audio towers, MTP layer and NVFP4
/// storage left out); and Qwen3.8-Flash-Next's as public ports give them
/// (hidden 2560, 48 layers, 512 experts x 640 top-10, four gated streams,
/// QSA, the n-gram PLE on layer 2 with its 51 B-parameter table;
/// docs/qwen4_exp.md), as the text model `Qwen4ExpForCausalLM` saves it.
pub const LIKE: [(&str, &str); 8] = [
    (
        "olmoe-1b-7b",
        r#"{"model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
            "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": false, "clip_qkv": null,
            "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 50279, "torch_dtype": "bfloat16"}"#,
    ),
    (
        "qwen3-30b-a3b",
        r#"{"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
            "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "rope_scaling": null, "num_experts": 128, "num_experts_per_tok": 8,
            "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": false,
            "tie_word_embeddings": false, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"}"#,
    ),
    (
        "mixtral-8x7b",
        r#"{"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": null,
            "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}"#,
    ),
    (
        "qwen3.6-35b-a3b",
        r#"{"model_type": "qwen3_5_moe", "tie_word_embeddings": false, "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            "dtype": "bfloat16"}}"#,
    ),
    (
        "qwen3-next-80b-a3b",
        r#"{"model_type": "qwen3_next", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
            "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
            "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts": 512,
            "num_experts_per_tok": 10, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "max_position_embeddings": 262144, "rms_norm_eps": 1e-06, "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#,
    ),
    (
        "deepseek-v4-flash",
        r#"{"model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
            "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
            "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
            "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
            "scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
            "num_hash_layers": 3, "swiglu_limit": 10.0,
            "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                                4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
            "compress_rope_theta": 160000, "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-06, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-06,
            "num_nextn_predict_layers": 1, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 1,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#,
    ),
    (
        "inkling",
        r#"{"model_type": "inkling_mm_model", "text_config": {
            "model_type": "inkling_text", "vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 6144,
            "num_hidden_layers": 66, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
            "swa_num_attention_heads": 64, "swa_num_key_value_heads": 16, "swa_head_dim": 128,
            "sliding_window_size": 512, "d_rel": 16, "rel_extent": 1024, "sconv_kernel_size": 4, "dense_mlp_idx": 0,
            "intermediate_size": 3072, "dense_intermediate_size": 24576, "n_routed_experts": 256,
            "num_experts_per_tok": 6, "n_shared_experts": 2, "route_scale": 8.0, "logits_mup_width_multiplier": 24.0,
            "rms_norm_eps": 1e-06, "model_max_length": 131072, "hidden_act": "silu", "bos_token_id": 1,
            "eos_token_id": 2}}"#,
    ),
    (
        "qwen3.8-flash-next",
        r#"{"model_type": "qwen4_exp_text", "vocab_size": 151936, "hidden_size": 2560, "num_hidden_layers": 48,
            "num_attention_heads": 24, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "moe_intermediate_size": 640,
            "shared_expert_intermediate_size": 640, "num_experts": 512, "num_experts_per_tok": 10,
            "norm_topk_prob": true, "hc_count": 4, "hc_lowrank": 320, "output_gate_type": "sigmoid",
            "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128, "indexer_budget": 2048,
            "indexer_compress_ratio": 4, "ple_layer_ids": [2], "ple_embed_dim": 2560, "ple_conv_kernel_size": 4,
            "ngram_size": 3, "heads_per_ngram": 8, "ngram_vocab_size_base": 20000000,
            "make_ngram_vocab_size_divisible_by": 128, "seed": 1234, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            "eos_token_id": 151645, "tie_word_embeddings": false, "dtype": "bfloat16"}"#,
    ),
];

/// Standard deviation of the synthetic weights.
const WEIGHT_STD: f32 = 0.02;

/// How to synthesize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthOptions {
    /// A name from [`LIKE`].
    pub like: String,
    /// Keep only the first this-many decoder layers.
    pub layers: Option<usize>,
    pub preset: QuantPreset,
    pub q4_group: usize,
    pub seed: u64,
    pub progress: bool,
    pub overwrite: bool,
    /// Replaces the hashed n-gram table's `ngram_vocab_size_base`, so that
    /// its rows fit a disk (Qwen3.8-Flash-Next's 20 M gives 51 B
    /// parameters); only for a model with that table.
    pub ngram_vocab_size_base: Option<u64>,
}

impl SynthOptions {
    pub fn new(like: &str, preset: QuantPreset) -> Self {
        Self {
            like: like.to_owned(),
            layers: None,
            preset,
            q4_group: Q4_DEFAULT_GROUP,
            seed: 0,
            progress: false,
            overwrite: false,
            ngram_vocab_size_base: None,
        }
    }
}

/// The config.json text of `like` with `layers` decoder layers.
pub fn like_config(like: &str, layers: Option<usize>) -> Result<String> {
    let (_, text) = LIKE.iter().find(|(name, _)| *name == like).ok_or_else(|| Error::InvalidOption {
        option: "like".into(),
        reason: format!(
            "unknown model {like:?}; known: {}",
            LIKE.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        ),
    })?;
    let mut config: serde_json::Value =
        serde_json::from_str(text).map_err(|source| Error::Json { what: format!("synth config {like}"), source })?;
    if let Some(n) = layers {
        if n == 0 {
            return Err(Error::InvalidOption { option: "layers".into(), reason: "must be at least 1".into() });
        }
        // A multimodal wrapper keeps the layer count in its text config.
        match config.get_mut("text_config") {
            Some(text) => text["num_hidden_layers"] = n.into(),
            None => config["num_hidden_layers"] = n.into(),
        }
    }
    Ok(config.to_string())
}

/// Writes a synthetic container to `out_dir`.
pub fn synth(out_dir: impl AsRef<Path>, options: &SynthOptions) -> Result<ConvertReport> {
    let mut config_json = like_config(&options.like, options.layers)?;
    if let Some(base) = options.ngram_vocab_size_base {
        config_json = with_ngram_vocab_size_base(&config_json, base)?;
    }
    synth_config(out_dir, config_json, options)
}

/// `config_json` with its hashed n-gram table's `ngram_vocab_size_base`
/// replaced by `base` (the family then checks it as any config's); an error
/// for a model without that table.
pub fn with_ngram_vocab_size_base(config_json: &str, base: u64) -> Result<String> {
    const KEY: &str = "ngram_vocab_size_base";
    let invalid = |reason: String| Error::InvalidOption { option: KEY.replace('_', "-"), reason };
    let mut config: serde_json::Value =
        serde_json::from_str(config_json).map_err(|source| Error::Json { what: "synth config".into(), source })?;
    let text = match config.get_mut("text_config") {
        Some(text) => text,
        None => &mut config,
    };
    match text.get_mut(KEY) {
        Some(value) => *value = base.into(),
        None => return Err(invalid("this model has no hashed n-gram table".into())),
    }
    Ok(config.to_string())
}

/// Writes a synthetic container of the model `config_json` describes to
/// `out_dir` (`options.like` and `options.layers` unread): for a test's
/// own shapes.
pub fn synth_config(out_dir: impl AsRef<Path>, config_json: String, options: &SynthOptions) -> Result<ConvertReport> {
    // Parsed here too so a bad --layers fails before anything is written.
    let arch = ModelArch::from_config_json(&config_json)?;
    let source = RandomSource { config_json, seed: options.seed, num_experts: arch.num_experts() };
    let convert_options = ConvertOptions {
        q4_group: options.q4_group,
        progress: options.progress,
        overwrite: options.overwrite,
        ..ConvertOptions::new(options.preset)
    };
    write_container(&source, out_dir.as_ref(), &convert_options)
}

/// Weights drawn from a seeded generator, each tensor (and each row block)
/// from its own stream, so any part can be produced independently.
struct RandomSource {
    config_json: String,
    seed: u64,
    /// The ids a hash layer's table may hold.
    num_experts: usize,
}

impl RandomSource {
    fn fill(&self, stream: u64, out: &mut [f32]) {
        // Uniform on [-a, a] has std a/sqrt(3).
        let a = WEIGHT_STD * 3f32.sqrt();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // Bulk random bits, then a cheap affine map: this runs for billions
        // of weights when synthesizing a multi-GB model.
        let bits: &mut [u32] = bytemuck::cast_slice_mut(out);
        rng.fill(bits);
        let scale = 2.0 * a / (1u64 << 24) as f32;
        for x in out.iter_mut() {
            *x = (x.to_bits() >> 8) as f32 * scale - a;
        }
    }
}

fn name_stream(name: &str) -> u64 {
    // FNV-1a: a stable per-name stream id (std's hasher is randomised per process).
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Source for RandomSource {
    fn describe(&self) -> String {
        "synthetic weights".to_owned()
    }

    fn config_json(&self) -> &str {
        &self.config_json
    }

    fn resolve(&self, candidates: &[String]) -> Option<String> {
        candidates.first().cloned()
    }

    fn check_shape(&self, _name: &str, _expected: &[usize]) -> Result<()> {
        Ok(())
    }

    fn rows_f32(&self, name: &str, row_start: usize, row_count: usize, cols: usize) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; row_count * cols];
        if name.ends_with("norm.weight") {
            out.fill(1.0);
        } else if name.ends_with(".gate.tid2eid") {
            // Expert ids, not weights: each token's top-k distinct (k is at
            // most the expert count), the tokens spread over every expert.
            assert!(cols <= self.num_experts, "{name}: {cols} experts per token of {}", self.num_experts);
            for (row, ids) in out.chunks_exact_mut(cols).enumerate() {
                for (slot, id) in ids.iter_mut().enumerate() {
                    *id = (((row_start + row) * cols + slot) % self.num_experts) as f32;
                }
            }
        } else {
            self.fill(name_stream(name) ^ (row_start as u64) << 32, &mut out);
        }
        Ok(out)
    }

    fn expert_f32(&self, arch: &ModelArch, layer: usize, expert: usize) -> Result<[Vec<f32>; 3]> {
        let shapes = names::expert_shapes(arch);
        let names = names::expert_names(&arch.core, layer, expert);
        Ok([0, 1, 2].map(|i| {
            let [rows, cols] = shapes[i];
            let mut out = vec![0.0f32; rows * cols];
            self.fill(name_stream(&names[i]), &mut out);
            out
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's Qwen3.8-Flash-Next row shrinks only the n-gram table: the
    /// published 20 M base gives 51 B parameters, more than a disk spares.
    #[test]
    fn the_ngram_base_option_shrinks_only_the_ple_table_and_only_where_there_is_one() {
        let published = like_config("qwen3.8-flash-next", Some(4)).unwrap();
        let smaller = with_ngram_vocab_size_base(&published, 2_000_000).unwrap();
        let (a, b) = (ModelArch::from_config_json(&published).unwrap(), ModelArch::from_config_json(&smaller).unwrap());
        let bases = |arch: &ModelArch| {
            arch.layers.iter().filter_map(|l| l.ple.as_ref().map(|p| p.vocab_base)).collect::<Vec<_>>()
        };
        assert_eq!((bases(&a), bases(&b)), (vec![20_000_000], vec![2_000_000]));
        assert_eq!(ModelArch { layers: Vec::new(), ..a }, ModelArch { layers: Vec::new(), ..b }, "the rest unchanged");
        let err = with_ngram_vocab_size_base(&like_config("inkling", Some(2)).unwrap(), 1000).unwrap_err();
        assert!(err.to_string().contains("no hashed n-gram table"), "{err}");
        let too_large = with_ngram_vocab_size_base(&published, u64::MAX).unwrap();
        assert!(ModelArch::from_config_json(&too_large).is_err(), "the family's limit still holds");
    }

    #[test]
    fn a_synthetic_hash_table_holds_distinct_valid_expert_ids_per_token() {
        let config_json = like_config("deepseek-v4-flash", Some(1)).unwrap();
        let arch = ModelArch::from_config_json(&config_json).unwrap();
        let source = RandomSource { config_json, seed: 7, num_experts: arch.num_experts() };
        let table = names::hash_table_name(&arch.core, 0);
        let (rows, top_k) = (1000, 6);
        let ids = source.rows_f32(&table, 129_000, rows, top_k).unwrap();
        let mut used = std::collections::BTreeSet::new();
        for token in ids.chunks_exact(top_k) {
            let distinct: std::collections::BTreeSet<u32> = token.iter().map(|&id| id as u32).collect();
            assert_eq!(distinct.len(), top_k, "{token:?}");
            assert!(token.iter().all(|&id| id.fract() == 0.0 && (id as usize) < 256), "{token:?}");
            used.extend(distinct);
        }
        assert_eq!(used.len(), 256, "every expert serves some token");
    }
}
