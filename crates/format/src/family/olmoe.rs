//! OLMoE (`olmoe`, `OlmoeConfig`): GQA with q/k norms over the whole
//! projection and an optional `clip_qkv`; softmax top-k routing, every
//! layer MoE.

use serde_json::{Map, Value, json};

use super::{Family, FamilyDef, HF_NAMING, Naming, gqa};
use crate::error::{Error, Result};
use crate::spec::{AttentionKind, ModelSpec, QkNorm, f32_to_json};

pub(super) struct Olmoe;

const DEFAULTS: gqa::Defaults = gqa::Defaults {
    num_kv_heads: None,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 4096,
    rope_theta: 10_000.0,
    bos_token_id: None,
    eos_token_ids: &[50279],
    expert_width: "intermediate_size",
    expert_count: ("num_experts", "num_local_experts"),
};

impl FamilyDef for Olmoe {
    fn model_type(&self) -> &'static str {
        "olmoe"
    }

    fn architecture(&self) -> &'static str {
        "OlmoeForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelSpec> {
        let (mut spec, cfg) = gqa::parse(root, Family::Olmoe, &DEFAULTS)?;
        spec.moe.norm_topk_prob = cfg.bool("norm_topk_prob")?.unwrap_or(false);
        spec.clip_qkv = cfg.f64("clip_qkv")?.map(|c| c as f32);
        spec.attention_bias = cfg.bool("attention_bias")?.unwrap_or(false);
        spec.qk_norm = QkNorm::Full;
        Ok(spec)
    }

    fn validate(&self, spec: &ModelSpec) -> Result<()> {
        // OlmoeAttention sizes q_norm by hidden_size and k_norm by
        // (hidden_size / heads) * kv_heads: only consistent when
        // head_dim == hidden_size / num_heads.
        if spec.q_dim() != spec.hidden_size {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "olmoe requires num_attention_heads * head_dim == hidden_size ({} * {} != {})",
                    spec.num_heads, spec.head_dim, spec.hidden_size
                ),
            ));
        }
        if spec.qk_norm != QkNorm::Full {
            return Err(Error::invalid("model_type", "olmoe uses full q/k norms"));
        }
        gqa::validate(spec, false)
    }

    fn attention(&self, spec: &ModelSpec, _layer: usize) -> AttentionKind {
        gqa::attention(spec)
    }

    fn to_config_json(&self, spec: &ModelSpec, _source: Option<&Value>) -> Value {
        let mut c = gqa::config_json(spec);
        c.insert("intermediate_size".into(), json!(spec.moe.intermediate_size));
        c.insert("num_experts".into(), json!(spec.moe.num_experts));
        c.insert("norm_topk_prob".into(), json!(spec.moe.norm_topk_prob));
        c.insert("attention_bias".into(), json!(spec.attention_bias));
        c.insert("clip_qkv".into(), json!(spec.clip_qkv.map(f32_to_json)));
        Value::Object(c)
    }
}
