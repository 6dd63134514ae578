//! Qwen3-MoE (`qwen3_moe`, `Qwen3MoeConfig`): GQA with per-head q/k norms
//! and an optional sliding window; softmax top-k routing; dense layers
//! where `mlp_only_layers` or `decoder_sparse_step` put them.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, HF_NAMING, Naming, gqa};
use crate::error::Result;
use crate::spec::{ModelArch, QkNorm};

pub(super) struct Qwen3Moe;

/// What a qwen3_moe checkpoint may hold (`Qwen3MoeConfig`; the Hub's
/// `max_window_layers` is a Qwen2 field 5.23 does not read).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[
            CORE_READ,
            gqa::READ,
            gqa::SPARSE_STEP_READ,
            &["num_experts", "num_local_experts", "moe_intermediate_size", "norm_topk_prob"],
            &["use_sliding_window", "sliding_window", "attention_bias"],
        ],
        inert: &[HF_INERT, &["max_window_layers"]],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &[],
    extra_layers_unused: false,
};

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

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let mut parsed = gqa::parse(root, Family::Qwen3Moe, &DEFAULTS)?;
        let cfg = &parsed.cfg;
        let renormalize = cfg.bool("norm_topk_prob")?.unwrap_or(false);
        let kinds = gqa::sparse_step_layer_kinds(cfg, parsed.num_layers)?;
        // __post_init__ drops the window unless use_sliding_window.
        parsed.attention.sliding_window = if cfg.bool("use_sliding_window")?.unwrap_or(false) {
            match cfg.raw("sliding_window") {
                None => Some(4096),
                Some(_) => cfg.usize("sliding_window")?,
            }
        } else {
            None
        };
        parsed.attention.bias = cfg.bool("attention_bias")?.unwrap_or(false);
        parsed.attention.qk_norm = QkNorm::PerHead;
        parsed.softmax_router(renormalize);
        parsed.build_alike(&kinds)
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        gqa::every_gqa(arch, |g| g.qk_norm == QkNorm::PerHead, "model_type", "uses per-head q/k norms")?;
        gqa::validate(arch, true)
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let (attention, moe) = gqa::blocks(arch);
        let mut c = gqa::config_json(arch, &attention, &moe);
        c.insert("intermediate_size".into(), json!(arch.dense_intermediate_size().unwrap_or(0)));
        c.insert("moe_intermediate_size".into(), json!(moe.intermediate_size));
        c.insert("num_experts".into(), json!(moe.num_experts));
        c.insert("norm_topk_prob".into(), json!(moe.router.renormalizes()));
        gqa::sparse_step_config(arch, &mut c);
        c.insert("attention_bias".into(), json!(attention.bias));
        c.insert("use_sliding_window".into(), json!(attention.sliding_window.is_some()));
        c.insert("sliding_window".into(), json!(attention.sliding_window));
        Value::Object(c)
    }
}
