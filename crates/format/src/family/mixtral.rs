//! Mixtral (`mixtral`, `MixtralConfig`): plain GQA with an optional sliding
//! window; a softmax router that always renormalises its top-k; experts
//! published as `block_sparse_moe.experts.{e}.w1/w3/w2`.

use serde_json::{Map, Value, json};

use super::{Family, FamilyDef, Naming, gqa};
use crate::error::{Error, Result};
use crate::spec::{AttentionKind, LayerKind, ModelSpec, QkNorm};

pub(super) struct Mixtral;

const DEFAULTS: gqa::Defaults = gqa::Defaults {
    num_kv_heads: Some(8),
    rms_norm_eps: 1e-5,
    max_position_embeddings: 4096 * 32,
    rope_theta: 1_000_000.0,
    bos_token_id: Some(1),
    eos_token_ids: &[2],
    expert_width: "intermediate_size",
    expert_count: ("num_local_experts", "num_experts"),
};

const NAMING: Naming = Naming {
    model_prefix: "model.",
    lm_head: "lm_head.weight",
    moe_module: "block_sparse_moe",
    expert_projections: ["w1", "w3", "w2"],
    // transformers 5.x renames `.block_sparse_moe.` to `.mlp.` when loading
    // and only reverts it when saving in the original format.
    aliases: &[(".block_sparse_moe.", ".mlp.")],
};

impl FamilyDef for Mixtral {
    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn architecture(&self) -> &'static str {
        "MixtralForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelSpec> {
        let (mut spec, cfg) = gqa::parse(root, Family::Mixtral, &DEFAULTS)?;
        // MixtralTopKRouter always renormalizes the top-k weights.
        spec.moe.norm_topk_prob = true;
        spec.sliding_window = cfg.usize("sliding_window")?;
        Ok(spec)
    }

    fn validate(&self, spec: &ModelSpec) -> Result<()> {
        if spec.layers.contains(&LayerKind::Dense) {
            return Err(Error::invalid("model_type", "mixtral has no dense layers"));
        }
        if spec.qk_norm != QkNorm::None || spec.attention_bias {
            return Err(Error::invalid("model_type", "mixtral has neither q/k norms nor attention biases"));
        }
        gqa::validate(spec, false)
    }

    fn attention(&self, spec: &ModelSpec, _layer: usize) -> AttentionKind {
        gqa::attention(spec)
    }

    fn to_config_json(&self, spec: &ModelSpec, _source: Option<&Value>) -> Value {
        let mut c = gqa::config_json(spec);
        c.insert("intermediate_size".into(), json!(spec.moe.intermediate_size));
        c.insert("num_local_experts".into(), json!(spec.moe.num_experts));
        c.insert("sliding_window".into(), json!(spec.sliding_window));
        Value::Object(c)
    }
}
