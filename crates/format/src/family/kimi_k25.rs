//! Kimi K2.5 (`kimi_k25`, `Kimi_K25Config`): a DeepSeek-V3 text model
//! nested in a vision-language wrapper. The text config sits in
//! `text_config`, tying and the special ids at the top level, and the
//! tensors under `language_model.`; the vision tower is not loaded.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, QUANTIZATION, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, Family, FamilyDef, Naming, mla};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{ModelArch, special_tokens};

pub(super) struct KimiK25;

/// The DeepSeek-V3 text model's keys, in `text_config`.
const TEXT: ConfigKeys = ConfigKeys {
    read: &[CORE_READ, mla::READ, mla::MTP_KEYS, &["rope_interleave"]],
    inert: &[HF_INERT, mla::INERT],
    nested: ROPE_AND_QUANTIZATION,
};

/// What a kimi_k25 checkpoint may hold (`Kimi_K25Config`): the wrapper's
/// tying and special ids, the text model, and the vision tower's config,
/// token ids and tensors, which are not loaded.
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[&["model_type", "tie_word_embeddings", "bos_token_id", "eos_token_id"]],
        inert: &[
            HF_INERT,
            &["vision_config", "projection_hidden_size", "projection_layer_norm_eps", "ignore_index"],
            &["image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"],
            &["media_placeholder_token_id", "use_unified_vision_chunk", "video_placeholder"],
        ],
        nested: &[("text_config", &TEXT), ("quantization_config", &QUANTIZATION)],
    },
    unused_tensors: &["vision_tower.*", "mm_projector.*", "model.vision_tower.*", "model.mm_projector.*"],
    extra_layers_unused: true,
};

const NAMING: Naming = Naming {
    model_prefix: "language_model.model.",
    lm_head: "language_model.lm_head.weight",
    moe_module: "mlp",
    expert_projections: ["gate_proj", "up_proj", "down_proj"],
    // transformers 5.x keeps the text model at `model.language_model` and
    // its head at `lm_head` in memory (conversion_mapping.py).
    aliases: &[("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head.")],
    saved_as: &[],
};

impl FamilyDef for KimiK25 {
    fn model_type(&self) -> &'static str {
        "kimi_k25"
    }

    fn architecture(&self) -> &'static str {
        "Kimi_K25ForConditionalGeneration"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let top = Fields { map: root, prefix: "" };
        let text = top.object("text_config")?.ok_or_else(|| Error::MissingField { field: "text_config".into() })?;
        let cfg = Fields { map: text, prefix: "text_config." };
        // The hub spells it kimi_k2; Kimi_K25Config rewrites that to deepseek_v3.
        match cfg.str("model_type")? {
            None | Some("deepseek_v3" | "kimi_k2") => {}
            Some(other) => {
                return Err(Error::invalid(
                    "text_config.model_type",
                    format!("{other:?} is not a DeepSeek-V3 text model (deepseek_v3 or kimi_k2)"),
                ));
            }
        }
        let mut parsed = mla::parse(&cfg, Family::KimiK25, &mla::DEEPSEEK_DEFAULTS)?.with_mtp(&cfg)?;
        // Kimi_K25ForConditionalGeneration ties (or not) by its own,
        // top-level flag, whose class default is true; special ids live at
        // the top too.
        let mut merged = text.clone();
        for key in ["bos_token_id", "eos_token_id"] {
            if let Some(v) = top.raw(key) {
                merged.insert(key.to_owned(), v.clone());
            }
        }
        let core = &mut parsed.core;
        (core.bos_token_id, core.eos_token_ids) =
            special_tokens(&Fields { map: &merged, prefix: "" }, (Some(0), vec![1]))?;
        core.tie_word_embeddings = top.bool("tie_word_embeddings")?.unwrap_or(true);
        parsed.build(|_| None)
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        mla::validate_dense_first_without_dsa(arch)
    }

    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value {
        let Some(attention) = arch.first_mla() else {
            // validate() guarantees latent attention for this family.
            return Value::Null;
        };
        let mut c = mla::config_json(arch, attention);
        c.insert("rope_interleave".into(), json!(attention.dims.rope_interleave));
        // The text model nests under the vision-language wrapper, which owns
        // tying and the special ids.
        c.insert("model_type".into(), json!("deepseek_v3"));
        c.remove("architectures");
        c.remove("dtype");
        let mut outer = Map::new();
        outer.insert("architectures".into(), json!([self.architecture()]));
        outer.insert("model_type".into(), json!(self.model_type()));
        outer.insert("dtype".into(), json!("float32"));
        for key in ["tie_word_embeddings", "bos_token_id", "eos_token_id"] {
            if let Some(v) = c.get(key) {
                outer.insert(key.into(), v.clone());
            }
        }
        outer.insert("text_config".into(), Value::Object(c));
        // The vision tower is not in the container, but Kimi_K25Config
        // builds one anyway: keep the source's (a default-sized tower would
        // make transformers allocate ~400M random parameters).
        if let Some(vision) = source.and_then(|s| s.get("vision_config")) {
            outer.insert("vision_config".into(), vision.clone());
        }
        Value::Object(outer)
    }
}
