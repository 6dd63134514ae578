//! DeepSeek-V3 (`deepseek_v3`, `DeepseekV3Config`, and V2-style configs
//! without `q_lora_rank`): Multi-head Latent Attention, the sigmoid
//! group-limited router, shared experts, `first_k_dense_replace` dense
//! layers first.

use serde_json::{Map, Value, json};

use super::{Family, FamilyDef, HF_NAMING, Naming, mla};
use crate::error::Result;
use crate::spec::fields::Fields;
use crate::spec::{AttentionKind, ModelSpec};

pub(super) struct DeepseekV3;

impl FamilyDef for DeepseekV3 {
    fn model_type(&self) -> &'static str {
        "deepseek_v3"
    }

    fn architecture(&self) -> &'static str {
        "DeepseekV3ForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelSpec> {
        mla::parse(&Fields { map: root, prefix: "" }, Family::DeepseekV3, &mla::DEEPSEEK_DEFAULTS)
    }

    fn validate(&self, spec: &ModelSpec) -> Result<()> {
        mla::validate_dense_first_without_dsa(spec)
    }

    fn attention(&self, spec: &ModelSpec, layer: usize) -> AttentionKind {
        mla::attention(spec, layer)
    }

    fn to_config_json(&self, spec: &ModelSpec, _source: Option<&Value>) -> Value {
        let Some(dims) = &spec.mla else {
            // validate() guarantees MLA dimensions for this family.
            return Value::Null;
        };
        let mut c = mla::config_json(spec, dims);
        c.insert("rope_interleave".into(), json!(dims.rope_interleave));
        Value::Object(c)
    }
}
