//! Qwen3-MoE (`qwen3_moe`, `Qwen3MoeConfig`): GQA with per-head q/k norms
//! and an optional sliding window; softmax top-k routing; dense layers
//! where `mlp_only_layers` or `decoder_sparse_step` put them.

use serde_json::{Map, Value, json};

use super::{Family, FamilyDef, HF_NAMING, Naming, gqa};
use crate::error::{Error, Result};
use crate::spec::{AttentionKind, LayerKind, ModelSpec, QkNorm};

pub(super) struct Qwen3Moe;

const DEFAULTS: gqa::Defaults = gqa::Defaults {
    num_kv_heads: Some(4),
    rms_norm_eps: 1e-6,
    max_position_embeddings: 32768,
    rope_theta: 10_000.0,
    bos_token_id: None,
    eos_token_ids: &[],
    expert_width: "moe_intermediate_size",
    expert_count: ("num_experts", "num_local_experts"),
};

impl FamilyDef for Qwen3Moe {
    fn model_type(&self) -> &'static str {
        "qwen3_moe"
    }

    fn architecture(&self) -> &'static str {
        "Qwen3MoeForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelSpec> {
        let (mut spec, cfg) = gqa::parse(root, Family::Qwen3Moe, &DEFAULTS)?;
        let num_layers = spec.num_layers;
        spec.moe.norm_topk_prob = cfg.bool("norm_topk_prob")?.unwrap_or(false);
        let step = cfg.usize("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(Error::invalid("decoder_sparse_step", "must be >= 1"));
        }
        let mlp_only = cfg.usize_list("mlp_only_layers")?.unwrap_or_default();
        if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
            return Err(Error::invalid("mlp_only_layers", format!("layer {bad} >= num_hidden_layers {num_layers}")));
        }
        // Qwen3MoeDecoderLayer.__init__: sparse iff not listed in
        // mlp_only_layers, experts exist, and (i+1) % step == 0.
        let num_experts = spec.moe.num_experts;
        spec.layers = (0..num_layers)
            .map(|i| {
                if !mlp_only.contains(&i) && num_experts > 0 && (i + 1).is_multiple_of(step) {
                    LayerKind::Moe
                } else {
                    LayerKind::Dense
                }
            })
            .collect();
        // __post_init__ drops the window unless use_sliding_window.
        spec.sliding_window = if cfg.bool("use_sliding_window")?.unwrap_or(false) {
            match root.get("sliding_window") {
                None => Some(4096),
                Some(_) => cfg.usize("sliding_window")?,
            }
        } else {
            None
        };
        spec.attention_bias = cfg.bool("attention_bias")?.unwrap_or(false);
        spec.qk_norm = QkNorm::PerHead;
        Ok(spec)
    }

    fn validate(&self, spec: &ModelSpec) -> Result<()> {
        if spec.qk_norm != QkNorm::PerHead {
            return Err(Error::invalid("model_type", "qwen3_moe uses per-head q/k norms"));
        }
        gqa::validate(spec, true)
    }

    fn attention(&self, spec: &ModelSpec, _layer: usize) -> AttentionKind {
        gqa::attention(spec)
    }

    fn to_config_json(&self, spec: &ModelSpec, _source: Option<&Value>) -> Value {
        let mut c = gqa::config_json(spec);
        // decoder_sparse_step = 1 plus an explicit list reproduces any
        // layer pattern exactly.
        let dense: Vec<usize> = (0..spec.num_layers).filter(|&l| !spec.is_moe(l)).collect();
        c.insert("intermediate_size".into(), json!(spec.dense_intermediate_size));
        c.insert("moe_intermediate_size".into(), json!(spec.moe.intermediate_size));
        c.insert("num_experts".into(), json!(spec.moe.num_experts));
        c.insert("norm_topk_prob".into(), json!(spec.moe.norm_topk_prob));
        c.insert("decoder_sparse_step".into(), json!(1));
        c.insert("mlp_only_layers".into(), json!(dense));
        c.insert("attention_bias".into(), json!(spec.attention_bias));
        c.insert("use_sliding_window".into(), json!(spec.sliding_window.is_some()));
        c.insert("sliding_window".into(), json!(spec.sliding_window));
        Value::Object(c)
    }
}
