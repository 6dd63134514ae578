//! OLMoE (`olmoe`, `OlmoeConfig`): GQA with q/k norms over the whole
//! projection and an optional `clip_qkv`; softmax top-k routing, every
//! layer MoE.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, HF_NAMING, Naming, gqa};
use crate::error::{Error, Result};
use crate::spec::{FfnKind, MixerSpec, ModelArch, QkNorm, f32_to_json};

pub(super) struct Olmoe;

/// What an olmoe checkpoint may hold (`OlmoeConfig`).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[
            CORE_READ,
            gqa::READ,
            &["num_experts", "num_local_experts", "norm_topk_prob", "clip_qkv", "attention_bias"],
        ],
        inert: &[HF_INERT],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &[],
    extra_layers_unused: false,
};

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

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let mut parsed = gqa::parse(root, Family::Olmoe, &DEFAULTS)?;
        let cfg = &parsed.cfg;
        let renormalize = cfg.bool("norm_topk_prob")?.unwrap_or(false);
        parsed.attention.clip_qkv = cfg.f64("clip_qkv")?.map(|c| c as f32);
        parsed.attention.bias = cfg.bool("attention_bias")?.unwrap_or(false);
        parsed.attention.qk_norm = QkNorm::Full;
        parsed.softmax_router(renormalize);
        let kinds = vec![FfnKind::Moe; parsed.num_layers];
        parsed.build_alike(&kinds)
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        // OlmoeAttention sizes q_norm by hidden_size and k_norm by
        // (hidden_size / heads) * kv_heads: only consistent when
        // head_dim == hidden_size / num_heads.
        let hidden = arch.core.hidden_size;
        let narrow = arch.layers.iter().find_map(|l| match &l.mixer {
            MixerSpec::Gqa(gqa) if gqa.q_dim() != hidden => Some(gqa),
            _ => None,
        });
        if let Some(gqa) = narrow {
            return Err(Error::invalid(
                "head_dim",
                format!(
                    "olmoe requires num_attention_heads * head_dim == hidden_size ({} * {} != {hidden})",
                    gqa.num_heads, gqa.head_dim
                ),
            ));
        }
        gqa::every_gqa(arch, |g| g.qk_norm == QkNorm::Full, "model_type", "uses full q/k norms")?;
        gqa::validate(arch, false)
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let (attention, moe) = gqa::blocks(arch);
        let mut c = gqa::config_json(arch, &attention, &moe);
        c.insert("intermediate_size".into(), json!(moe.intermediate_size));
        c.insert("num_experts".into(), json!(moe.num_experts));
        c.insert("norm_topk_prob".into(), json!(moe.router.renormalizes()));
        c.insert("attention_bias".into(), json!(attention.bias));
        c.insert("clip_qkv".into(), json!(attention.clip_qkv.map(f32_to_json)));
        Value::Object(c)
    }
}
