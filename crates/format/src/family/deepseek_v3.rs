//! DeepSeek-V3 (`deepseek_v3`, `DeepseekV3Config`, and V2-style configs
//! without `q_lora_rank`): Multi-head Latent Attention, the sigmoid
//! group-limited router, shared experts, `first_k_dense_replace` dense
//! layers first.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, HF_NAMING, Naming, mla};
use crate::error::Result;
use crate::spec::ModelArch;
use crate::spec::fields::Fields;

pub(super) struct DeepseekV3;

/// What a deepseek_v3 checkpoint may hold (`DeepseekV3Config`; its
/// multi-token-prediction layers follow the last decoder layer, each one's
/// copies of the embedding and lm head left unread).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[CORE_READ, mla::READ, mla::MTP_KEYS, &["rope_interleave"]],
        inert: &[HF_INERT, mla::INERT],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &[],
    extra_layers_unused: true,
};

impl FamilyDef for DeepseekV3 {
    fn model_type(&self) -> &'static str {
        "deepseek_v3"
    }

    fn architecture(&self) -> &'static str {
        "DeepseekV3ForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let cfg = Fields { map: root, prefix: "" };
        mla::parse(&cfg, Family::DeepseekV3, &mla::DEEPSEEK_DEFAULTS)?.with_mtp(&cfg)?.build(|_| None)
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        mla::validate_dense_first_without_dsa(arch)
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let Some(attention) = arch.first_mla() else {
            // validate() guarantees latent attention for this family.
            return Value::Null;
        };
        let mut c = mla::config_json(arch, attention);
        c.insert("rope_interleave".into(), json!(attention.dims.rope_interleave));
        Value::Object(c)
    }
}
