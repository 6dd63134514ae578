//! Mixtral (`mixtral`, `MixtralConfig`): plain GQA with an optional sliding
//! window; a softmax router that always renormalises its top-k; experts
//! published as `block_sparse_moe.experts.{e}.w1/w3/w2`.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, Naming, gqa};
use crate::error::Result;
use crate::spec::{FfnKind, GqaSpec, ModelArch, QkNorm};

pub(super) struct Mixtral;

/// What a mixtral checkpoint may hold (`MixtralConfig`).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[CORE_READ, gqa::READ, &["num_local_experts", "num_experts", "sliding_window"]],
        inert: &[HF_INERT, &["router_jitter_noise"]],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &[],
    extra_layers_unused: false,
};

pub(super) const DEFAULTS: gqa::Defaults = gqa::Defaults {
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
    saved_as: &[],
};

impl FamilyDef for Mixtral {
    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn architecture(&self) -> &'static str {
        "MixtralForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let mut parsed = gqa::parse(root, Family::Mixtral, &DEFAULTS)?;
        // MixtralTopKRouter always renormalizes the top-k weights.
        parsed.softmax_router(true);
        parsed.attention.sliding_window = parsed.cfg.usize("sliding_window")?;
        let kinds = vec![FfnKind::Moe; parsed.num_layers];
        parsed.build_alike(&kinds)
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        let plain = |g: &GqaSpec| g.qk_norm == QkNorm::None && !g.bias;
        gqa::every_gqa(arch, plain, "model_type", "has neither q/k norms nor attention biases")?;
        gqa::validate(arch, false)
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let (attention, moe) = gqa::blocks(arch);
        let mut c = gqa::config_json(arch, &attention, &moe);
        c.insert("intermediate_size".into(), json!(moe.intermediate_size));
        c.insert("num_local_experts".into(), json!(moe.num_experts));
        c.insert("sliding_window".into(), json!(attention.sliding_window));
        Value::Object(c)
    }
}
