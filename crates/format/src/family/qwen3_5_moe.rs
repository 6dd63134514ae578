//! Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`, text model `Qwen3_5MoeTextConfig`):
//! the Qwen3-Next body with separate DeltaNet projections (`in_proj_qkv`,
//! `in_proj_z`, `in_proj_b`, `in_proj_a`), every layer MoE, and a router
//! that always renormalises. Published checkpoints are the multimodal
//! wrapper (`model_type: qwen3_5_moe`, the text config in `text_config`,
//! tensors under `model.language_model.`, the vision tower not loaded);
//! `Qwen3_5MoeForCausalLM` saves the flat text config
//! (`qwen3_5_moe_text`). Both are read. The hub's multi-token-prediction
//! module (`mtp.`, `mtp_num_hidden_layers`) is kept as layers
//! `num_hidden_layers + k` (`hybrid::Parsed::with_mtp`).

use serde_json::{Map, Value};

use super::known::{ConfigKeys, HF_INERT, Known, QUANTIZATION, ROPE};
use super::{CORE_READ, Family, FamilyDef, Naming, gqa, hybrid};
use crate::error::{Error, Result};
use crate::spec::{FfnKind, GdnProjections, ModelArch};

pub(super) struct Qwen35Moe;

/// The rope object of the Hub's configs: multimodal RoPE's sections give a
/// text token the same position in each, the plain rotation.
const MROPE: ConfigKeys =
    ConfigKeys { read: ROPE.read, inert: &[&["mrope_section", "mrope_interleaved"]], nested: &[] };

/// The text model's keys (`Qwen3_5MoeTextConfig`), in `text_config` or
/// at the top of a text model saved on its own, and the Hub's
/// multi-token-prediction module's.
const TEXT: ConfigKeys = ConfigKeys {
    read: &[
        CORE_READ,
        gqa::READ,
        hybrid::READ,
        hybrid::MTP_KEYS,
        &["num_experts", "num_local_experts", "moe_intermediate_size"],
    ],
    inert: &[HF_INERT],
    nested: &[("rope_parameters", &MROPE), ("rope_scaling", &MROPE), ("quantization_config", &QUANTIZATION)],
};

/// What a qwen3_5_moe checkpoint may hold (`Qwen3_5MoeConfig`): the
/// wrapper's tying and special ids, the text model, and the vision tower's
/// config, token ids and tensors, which are not loaded; the Hub's
/// multi-token-prediction module sits under `mtp.` (unread where it is
/// not kept: `--no-mtp`, or a config that declares none).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[&["model_type", "tie_word_embeddings", "bos_token_id", "eos_token_id"]],
        inert: &[
            HF_INERT,
            &["vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"],
        ],
        nested: &[("text_config", &TEXT), ("quantization_config", &QUANTIZATION)],
    },
    unused_tensors: &["model.visual.*", "visual.*", "mtp.*"],
    extra_layers_unused: false,
};

/// `model_type` of the text model alone.
const TEXT_MODEL_TYPE: &str = "qwen3_5_moe_text";

pub(super) const NAMING: Naming = Naming {
    model_prefix: "model.language_model.",
    lm_head: "lm_head.weight",
    moe_module: "mlp",
    expert_projections: ["gate_proj", "up_proj", "down_proj"],
    // A text-only checkpoint saved without the conversion mapping.
    aliases: &[("model.language_model.", "model.")],
    saved_as: &[],
};

impl FamilyDef for Qwen35Moe {
    fn model_type(&self) -> &'static str {
        "qwen3_5_moe"
    }

    fn also_reads(&self) -> &'static [&'static str] {
        &[TEXT_MODEL_TYPE]
    }

    fn architecture(&self) -> &'static str {
        "Qwen3_5MoeForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let (cfg, nested) = hybrid::text_config(root, TEXT_MODEL_TYPE)?;
        let mut parsed = hybrid::parse(
            cfg,
            &hybrid::Hybrid {
                family: Family::Qwen35Moe,
                projections: GdnProjections::Split,
                partial_rotary_factor: Some(hybrid::QWEN_PARTIAL_ROTARY_FACTOR),
                full_attention: hybrid::FULL_ATTENTION,
            },
        )?
        .with_mtp()?;
        // Qwen3_5MoeTopKRouter always renormalises; every layer is MoE.
        parsed.gqa.softmax_router(true);
        let kinds = vec![FfnKind::Moe; parsed.gqa.num_layers];
        if nested {
            hybrid::take_wrapper_fields(root, &mut parsed)?;
        }
        parsed.build(&kinds)
    }

    fn hub_mtp_name(&self, k: usize, suffix: &str) -> Option<String> {
        Some(hybrid::hub_mtp_name(k, suffix))
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        if arch.dense_intermediate_size().is_some() {
            return Err(Error::invalid("model_type", "qwen3_5_moe has no dense layers"));
        }
        hybrid::validate(arch)
    }

    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value {
        hybrid::wrapped_config_json(hybrid::config_json(arch), TEXT_MODEL_TYPE, source)
    }
}
