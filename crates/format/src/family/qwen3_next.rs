//! Qwen3-Next (`qwen3_next`, `Qwen3NextConfig`): three Gated DeltaNet layers
//! to one gated full-attention layer by default, the DeltaNet projections
//! fused per key-head group (`in_proj_qkvz`, `in_proj_ba`), a softmax router
//! honouring `norm_topk_prob`, a sigmoid-gated shared expert, and dense
//! layers where `mlp_only_layers` or `decoder_sparse_step` put them. The
//! hub's multi-token-prediction module (`mtp.`, `mtp_num_hidden_layers`)
//! is kept as layers `num_hidden_layers + k` (`hybrid::Parsed::with_mtp`).

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, HF_NAMING, Naming, gqa, hybrid};
use crate::error::Result;
use crate::spec::fields::Fields;
use crate::spec::{GdnProjections, ModelArch};

pub(super) struct Qwen3Next;

/// What a qwen3_next checkpoint may hold (`Qwen3NextConfig`, and the Hub's
/// multi-token-prediction module's keys; the module sits under `mtp.`,
/// unread where it is not kept: `--no-mtp`, or a config that declares
/// none).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[
            CORE_READ,
            gqa::READ,
            gqa::SPARSE_STEP_READ,
            hybrid::READ,
            hybrid::MTP_KEYS,
            &["num_experts", "num_local_experts", "moe_intermediate_size", "norm_topk_prob"],
        ],
        inert: &[HF_INERT],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &["mtp.*"],
    extra_layers_unused: false,
};

impl FamilyDef for Qwen3Next {
    fn model_type(&self) -> &'static str {
        "qwen3_next"
    }

    fn architecture(&self) -> &'static str {
        "Qwen3NextForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let cfg = Fields { map: root, prefix: "" };
        let mut parsed = hybrid::parse(
            cfg,
            &hybrid::Hybrid {
                family: Family::Qwen3Next,
                projections: GdnProjections::Grouped,
                partial_rotary_factor: Some(hybrid::QWEN_PARTIAL_ROTARY_FACTOR),
                full_attention: hybrid::FULL_ATTENTION,
            },
        )?
        .with_mtp()?;
        let renormalize = parsed.cfg().bool("norm_topk_prob")?.unwrap_or(true);
        let kinds = gqa::sparse_step_layer_kinds(parsed.cfg(), parsed.gqa.num_layers)?;
        parsed.gqa.softmax_router(renormalize);
        parsed.build(&kinds)
    }

    fn hub_mtp_name(&self, k: usize, suffix: &str) -> Option<String> {
        Some(hybrid::hub_mtp_name(k, suffix))
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        hybrid::validate(arch)
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let mut c = hybrid::config_json(arch);
        c.insert("intermediate_size".into(), json!(arch.dense_intermediate_size().unwrap_or(0)));
        let renormalize = arch.first_moe().is_none_or(|moe| moe.router.renormalizes());
        c.insert("norm_topk_prob".into(), json!(renormalize));
        gqa::sparse_step_config(arch, &mut c);
        Value::Object(c)
    }
}
