//! Qwen3.8-Flash-Next (`qwen4_exp`, text model `Qwen4ExpTextConfig`): the
//! Qwen3.5 body (split Gated DeltaNet projections, gated attention, every
//! layer MoE with a gated shared expert) with QSA block selection on every
//! attention layer, gated residual streams in place of the layer norms,
//! the final mixer in place of the final norm, and the DeltaNet output
//! gate's activation from `output_gate_type`. Published checkpoints are
//! the multimodal wrapper (`model_type: qwen4_exp`, the text config in
//! `text_config`, tensors under `model.language_model.`);
//! `Qwen4ExpForCausalLM` saves the flat text config (`qwen4_exp_text`).
//! Both are read, with the n-gram Per-Layer Embedding on the layers
//! `ple_layer_ids` names (1-based, Gated DeltaNet layers only).

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, QUANTIZATION, ROPE};
use super::{CORE_READ, Family, FamilyDef, Naming, gqa, hybrid, qwen3_5_moe};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::limits::{self, MAX_INTERMEDIATE, MAX_STREAMS};
use crate::spec::{FfnKind, GateActivation, GdnProjections, MixerSpec, ModelArch, PleSpec, QsaSpec, ResidualKind};

pub(super) struct Qwen4Exp;

/// The rope object of the Hub's configs: multimodal RoPE's sections give a
/// text token the same position in each, the plain rotation.
const MROPE: ConfigKeys =
    ConfigKeys { read: ROPE.read, inert: &[&["mrope_section", "mrope_interleaved"]], nested: &[] };

/// The keys of QSA, gated residual streams and the output gate.
const OWN_READ: &[&str] = &[
    "num_experts",
    "num_local_experts",
    "moe_intermediate_size",
    "norm_topk_prob",
    "hc_count",
    "hc_lowrank",
    "output_gate_type",
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
    "ple_layer_ids",
    "ple_embed_dim",
    "ple_conv_kernel_size",
    "ngram_size",
    "heads_per_ngram",
    "ngram_vocab_size_base",
    "make_ngram_vocab_size_divisible_by",
    "seed",
];

/// The cache states `__post_init__` derives from the PLE
/// (`number_of_conv_states`), and how many shards the hub splits each PLE
/// table into (`split_ngram_parts`: the reader finds them by name).
const PLE_INERT: &[&str] = &["number_of_conv_states", "split_ngram_parts"];

/// The text model's keys (`Qwen4ExpTextConfig`), in `text_config` or at
/// the top of a text model saved on its own; the Hub's multi-token
/// prediction module is not loaded.
const TEXT: ConfigKeys = ConfigKeys {
    read: &[CORE_READ, gqa::READ, hybrid::READ, OWN_READ],
    inert: &[HF_INERT, hybrid::MTP_KEYS, PLE_INERT],
    nested: &[("rope_parameters", &MROPE), ("rope_scaling", &MROPE), ("quantization_config", &QUANTIZATION)],
};

/// What a qwen4_exp checkpoint may hold (`Qwen4ExpConfig`): the wrapper's
/// tying and special ids, the text model, and the vision tower's config,
/// token ids and tensors, which are not loaded; the Hub's multi-token
/// prediction module sits under `mtp.`.
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[&["model_type", "tie_word_embeddings", "bos_token_id", "eos_token_id"]],
        inert: &[
            HF_INERT,
            &["vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"],
        ],
        nested: &[("text_config", &TEXT), ("quantization_config", &QUANTIZATION)],
    },
    // The PLE's hash multipliers, primes and offsets (int64 buffers
    // transformers saves) are derived from the config, not read.
    unused_tensors: &[
        "model.visual.*",
        "visual.*",
        "mtp.*",
        "*.ple.ple_embedding.layer_multipliers",
        "*.ple.ple_embedding.ngram_heads_vocab_sizes",
        "*.ple.ple_embedding.ngram_heads_offsets",
    ],
    extra_layers_unused: false,
};

/// `model_type` of the text model alone.
const TEXT_MODEL_TYPE: &str = "qwen4_exp_text";

/// How the family reads its hybrid fields: Qwen3.5's projections, the
/// whole head rotated unless the config says otherwise (the config class
/// sets no partial factor), attention layers spelled `indexed_attention`
/// (or `full_attention`, as the released checkpoint writes them).
const HYBRID: hybrid::Hybrid = hybrid::Hybrid {
    family: Family::Qwen4Exp,
    projections: GdnProjections::Split,
    partial_rotary_factor: None,
    full_attention: &["indexed_attention", "full_attention"],
};

/// `hc_count` and `hc_lowrank` when the config gives none.
const DEFAULT_STREAMS: usize = 4;
const DEFAULT_LOWRANK: usize = 320;

impl FamilyDef for Qwen4Exp {
    fn model_type(&self) -> &'static str {
        "qwen4_exp"
    }

    fn also_reads(&self) -> &'static [&'static str] {
        &[TEXT_MODEL_TYPE]
    }

    fn architecture(&self) -> &'static str {
        "Qwen4ExpForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &qwen3_5_moe::NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let (cfg, nested) = hybrid::text_config(root, TEXT_MODEL_TYPE)?;
        let renormalize = cfg.bool("norm_topk_prob")?.unwrap_or(true);
        let output_gate = match cfg.str("output_gate_type")? {
            // Unset: `hidden_act`, which CoreDims holds to SiLU.
            None | Some("silu") => GateActivation::Silu,
            Some("sigmoid") => GateActivation::Sigmoid,
            Some(other) => {
                return Err(Error::invalid("output_gate_type", format!("{other:?} is not \"sigmoid\" or \"silu\"")));
            }
        };
        let residual = ResidualKind::GatedStreams {
            streams: limits::at_most("hc_count", cfg.usize("hc_count")?.unwrap_or(DEFAULT_STREAMS), MAX_STREAMS)?,
            lowrank: limits::at_most(
                "hc_lowrank",
                cfg.usize("hc_lowrank")?.unwrap_or(DEFAULT_LOWRANK),
                MAX_INTERMEDIATE,
            )?,
        };
        let qsa = qsa(&cfg)?;
        let ple = ple(&cfg, residual.streams())?;
        let mut parsed = hybrid::parse(cfg, &HYBRID)?;
        parsed.gqa.softmax_router(renormalize);
        parsed.gqa.attention.qsa = Some(qsa);
        parsed.gdn.output_gate = output_gate;
        if nested {
            hybrid::take_wrapper_fields(root, &mut parsed)?;
        }
        let kinds = vec![FfnKind::Moe; parsed.gqa.num_layers];
        let mut arch = parsed.build(&kinds)?;
        arch.layers.iter_mut().for_each(|layer| layer.residual = residual);
        if let Some((layer_ids, ple)) = ple {
            place_ple(&mut arch, &layer_ids, ple)?;
        }
        Ok(arch)
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        if arch.dense_intermediate_size().is_some() {
            return Err(Error::invalid("model_type", "qwen4_exp has no dense layers"));
        }
        if arch.residual().streams() < 2 {
            return Err(Error::invalid("hc_count", "qwen4_exp carries more than one residual stream"));
        }
        gqa::every_gqa(arch, |gqa| gqa.qsa.is_some(), "indexer_n_heads", "selects with QSA on every attention layer")?;
        hybrid::validate(arch)
    }

    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value {
        let mut text = hybrid::config_json(arch);
        let attention = arch.first_gqa().and_then(|gqa| gqa.qsa);
        if let Some(qsa) = attention {
            text.insert("indexer_n_heads".into(), json!(qsa.n_heads));
            text.insert("indexer_kv_heads".into(), json!(1));
            text.insert("indexer_head_dim".into(), json!(qsa.head_dim));
            text.insert("indexer_budget".into(), json!(qsa.budget_tokens));
            text.insert("indexer_compress_ratio".into(), json!(qsa.block_tokens));
        }
        if let ResidualKind::GatedStreams { streams, lowrank } = arch.residual() {
            text.insert("hc_count".into(), json!(streams));
            text.insert("hc_lowrank".into(), json!(lowrank));
        }
        if let Some(gdn) = arch.first_gdn() {
            let gate = match gdn.output_gate {
                GateActivation::Silu => "silu",
                GateActivation::Sigmoid => "sigmoid",
            };
            text.insert("output_gate_type".into(), json!(gate));
        }
        let renormalize = arch.first_moe().is_some_and(|moe| moe.router.renormalizes());
        text.insert("norm_topk_prob".into(), json!(renormalize));
        let ple_layers: Vec<(usize, PleSpec)> =
            arch.layers.iter().enumerate().filter_map(|(l, layer)| Some((l + 1, layer.ple?))).collect();
        text.insert("ple_layer_ids".into(), json!(ple_layers.iter().map(|(id, _)| id).collect::<Vec<_>>()));
        if let Some((_, ple)) = ple_layers.first() {
            text.insert("ple_embed_dim".into(), json!(ple.embed_dim));
            text.insert("ple_conv_kernel_size".into(), json!(ple.conv_kernel));
            text.insert("ngram_size".into(), json!(ple.ngram_size));
            text.insert("heads_per_ngram".into(), json!(ple.heads_per_ngram));
            text.insert("ngram_vocab_size_base".into(), json!(ple.vocab_base));
            text.insert("make_ngram_vocab_size_divisible_by".into(), json!(ple.rows_multiple));
            text.insert("seed".into(), json!(ple.seed));
            // The PLE's EOS is the first of the text config's (the
            // wrapper's may differ): written where the core's is not it.
            let first_eos = match text.get("eos_token_id") {
                Some(Value::Array(ids)) => ids.first().cloned(),
                other => other.cloned(),
            };
            if first_eos != Some(json!(ple.eos)) {
                text.insert("eos_token_id".into(), json!(ple.eos));
            }
        }
        hybrid::wrapped_config_json(text, TEXT_MODEL_TYPE, source)
    }
}

/// `Qwen4ExpTextConfig`'s defaults of the PLE's fields.
const DEFAULT_PLE_CONV_KERNEL: usize = 4;
const DEFAULT_NGRAM_SIZE: usize = 3;
const DEFAULT_HEADS_PER_NGRAM: usize = 8;
const DEFAULT_NGRAM_VOCAB_BASE: u64 = 20_000_000;
const DEFAULT_ROWS_MULTIPLE: usize = 128;
const DEFAULT_SEED: u64 = 1234;

/// The PLE layers' ids (1-based, sorted, each once, as `__post_init__`
/// leaves them) and the fields every one shares but its place among them,
/// or `None` without PLE. The EOS is the text config's own (the first of a
/// list): transformers' module reads it, not the wrapper's.
fn ple(cfg: &Fields<'_>, streams: usize) -> Result<Option<(Vec<usize>, PleSpec)>> {
    let mut layer_ids = cfg.usize_list("ple_layer_ids")?.unwrap_or_default();
    layer_ids.sort_unstable();
    layer_ids.dedup();
    if layer_ids.is_empty() {
        return Ok(None);
    }
    let hidden = cfg.req_usize("hidden_size")?;
    let eos = match cfg.raw("eos_token_id") {
        Some(Value::Array(ids)) => ids.first(),
        other => other,
    }
    .ok_or_else(|| Error::invalid("eos_token_id", "the n-gram PLE restarts its history at EOS: one is needed"))?;
    let as_u64 = |key: &str, default: u64| -> Result<u64> {
        match cfg.raw(key) {
            None => Ok(default),
            Some(v) => {
                v.as_u64().ok_or_else(|| Error::invalid(key, format!("expected a non-negative integer, got {v}")))
            }
        }
    };
    let channels = streams.checked_mul(hidden).ok_or_else(|| Error::invalid("hc_count", "too many channels"))?;
    let ple = PleSpec {
        embed_dim: cfg.usize("ple_embed_dim")?.unwrap_or(hidden),
        conv_kernel: cfg.usize("ple_conv_kernel_size")?.unwrap_or(DEFAULT_PLE_CONV_KERNEL),
        ngram_size: cfg.usize("ngram_size")?.unwrap_or(DEFAULT_NGRAM_SIZE),
        heads_per_ngram: cfg.usize("heads_per_ngram")?.unwrap_or(DEFAULT_HEADS_PER_NGRAM),
        vocab_base: as_u64("ngram_vocab_size_base", DEFAULT_NGRAM_VOCAB_BASE)?,
        rows_multiple: cfg.usize("make_ngram_vocab_size_divisible_by")?.unwrap_or(DEFAULT_ROWS_MULTIPLE),
        seed: as_u64("seed", DEFAULT_SEED)?,
        layer_index: 0,
        eos: crate::spec::fields::as_u32(eos, "eos_token_id")?,
        channels,
    };
    Ok(Some((layer_ids, ple)))
}

/// Puts `ple` on each layer `layer_ids` names (1-based), each with its
/// place among them; every one must be a Gated DeltaNet layer, as
/// transformers requires.
fn place_ple(arch: &mut ModelArch, layer_ids: &[usize], ple: PleSpec) -> Result<()> {
    let layers = arch.layers.len();
    for (layer_index, &id) in layer_ids.iter().enumerate() {
        let layer = id
            .checked_sub(1)
            .and_then(|l| arch.layers.get_mut(l))
            .ok_or_else(|| Error::invalid("ple_layer_ids", format!("{id} is not a layer id in 1..={layers}")))?;
        if !matches!(layer.mixer, MixerSpec::GatedDeltaNet(_)) {
            return Err(Error::invalid("ple_layer_ids", format!("layer {id} is not a linear_attention layer")));
        }
        layer.ple = Some(PleSpec { layer_index, ..ple });
    }
    Ok(())
}

/// QSA's fields, every one required (transformers builds an indexer on
/// every attention layer), with its one key head.
fn qsa(cfg: &Fields<'_>) -> Result<QsaSpec> {
    if cfg.req_usize("indexer_kv_heads")? != 1 {
        return Err(Error::invalid("indexer_kv_heads", "QSA has one key head"));
    }
    Ok(QsaSpec {
        n_heads: cfg.req_usize("indexer_n_heads")?,
        head_dim: cfg.req_usize("indexer_head_dim")?,
        budget_tokens: cfg.req_usize("indexer_budget")?,
        block_tokens: cfg.req_usize("indexer_compress_ratio")?,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::*;
    use crate::names::dense_tensors;
    use crate::spec::RopeSpec;
    use crate::spec::limits::MAX_HEADS;

    /// The committed fixture's config: the hub's wrapper around the text
    /// model's.
    fn fixture() -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/qwen4_exp/hf/config.json");
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    fn edited(edit: impl FnOnce(&mut Map<String, Value>)) -> Result<ModelArch> {
        let mut config = fixture();
        edit(config["text_config"].as_object_mut().unwrap());
        ModelArch::from_config_value(&config)
    }

    #[test]
    fn qwen4_exp_attention_selects_with_qsa_the_streams_are_gated_and_no_layer_norms_are_named() {
        let arch = ModelArch::from_config_value(&fixture()).unwrap();
        let MixerSpec::Gqa(attention) = &arch.layers[1].mixer else { panic!("layer 1 is attention") };
        let qsa = QsaSpec { n_heads: 4, head_dim: 12, budget_tokens: 4, block_tokens: 2 };
        assert_eq!(attention.qsa, Some(qsa));
        assert_eq!(attention.rope.map(|rope: RopeSpec| rope.rotary_dim), Some(8), "partial_rotary_factor 0.5");
        assert_eq!(arch.layers[1].cache_floats_per_token(), 2 * attention.kv_dim() + 12, "keys, values, raw key");
        let MixerSpec::GatedDeltaNet(gdn) = &arch.layers[0].mixer else { panic!("layer 0 is DeltaNet") };
        assert_eq!(gdn.output_gate, GateActivation::Sigmoid);
        assert_eq!(arch.residual(), ResidualKind::GatedStreams { streams: 3, lowrank: 8 });
        assert!(!arch.residual().has_layer_norms());
        let names: Vec<String> = dense_tensors(&arch).into_iter().map(|t| t.name).collect();
        assert!(!names.iter().any(|n| n.contains("layernorm.weight") && !n.contains("indexer")), "{names:?}");
        assert!(!names.contains(&"model.language_model.norm.weight".to_owned()), "no final norm");
        for part in ["index_qk_proj", "q_layernorm", "k_layernorm"] {
            let name = format!("model.language_model.layers.3.self_attn.indexer.{part}.weight");
            assert!(names.contains(&name), "{name}");
        }
        assert!(arch.layers[1].describe().contains("qsa 4 heads x 12, 4 tokens in blocks of 2"));
    }

    #[test]
    fn a_qwen4_exp_config_reads_back_from_its_export_and_its_text_models_save() {
        let arch = ModelArch::from_config_value(&fixture()).unwrap();
        let wrapped = Qwen4Exp.to_config_json(&arch, Some(&fixture()));
        assert_eq!(ModelArch::from_config_value(&wrapped).unwrap(), arch);
        let flat = Qwen4Exp.to_config_json(&arch, None);
        assert_eq!(flat["model_type"], TEXT_MODEL_TYPE);
        assert_eq!(ModelArch::from_config_value(&flat).unwrap(), arch);
    }

    #[test]
    fn ple_layers_are_the_deltanet_layers_ple_layer_ids_names_each_with_its_place_and_table() {
        let arch = ModelArch::from_config_value(&fixture()).unwrap();
        let ple: Vec<Option<PleSpec>> = arch.layers.iter().map(|layer| layer.ple).collect();
        let (first, second) = (ple[0].unwrap(), ple[2].unwrap());
        assert!(ple[1].is_none() && ple[3].is_none(), "{ple:?}");
        assert_eq!((first.layer_index, second.layer_index), (0, 1));
        assert_eq!((first.heads(), first.head_dim(), first.channels, first.eos), (4, 32, 3 * 48, 2));
        // Primes 61, 67, 71, 73 (then 79, 83, 89, 97), padded to 32 rows.
        assert_eq!((first.table_rows().unwrap(), second.table_rows().unwrap()), (288, 352));
        assert_eq!(
            arch.layers[0].state_floats(),
            arch.layers[0].mixer.state_floats() + 9 * 144,
            "conv rows (4 - 1) x 3"
        );
        let names: Vec<String> = dense_tensors(&arch).into_iter().map(|t| t.name).collect();
        assert!(names.contains(&"model.language_model.layers.2.ple.ple_embedding.ngram_embedding.weight".to_owned()));
        for (ids, want) in [(json!([4]), "not a linear_attention layer"), (json!([5]), "not a layer id")] {
            let err = edited(|text| {
                text.insert("ple_layer_ids".into(), ids);
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains("ple_layer_ids") && err.contains(want), "{err}");
        }
        let err = edited(|text| {
            text.insert("ple_embed_dim".into(), json!(102));
        })
        .and_then(|arch| arch.validate().map(|()| arch))
        .unwrap_err()
        .to_string();
        assert!(err.contains("ple_embed_dim"), "{err}");
    }

    #[test]
    fn qsa_fields_are_required_bounded_in_whole_blocks_with_one_key_head_and_the_rotation_inside() {
        let cases: [(&str, Value, &str); 6] = [
            ("indexer_budget", Value::Null, "indexer_budget"),
            ("indexer_budget", json!(5), "multiple of indexer_compress_ratio"),
            ("indexer_kv_heads", json!(2), "one key head"),
            ("indexer_head_dim", json!(6), "rotary part 8"),
            ("indexer_n_heads", json!(MAX_HEADS + 1), "indexer_n_heads"),
            ("indexer_compress_ratio", json!(0), "indexer_compress_ratio"),
        ];
        for (key, value, want) in cases {
            let err = edited(|text| {
                match value {
                    Value::Null => text.remove(key),
                    value => text.insert(key.into(), value),
                };
            })
            .and_then(|arch| arch.validate().map(|()| arch))
            .unwrap_err()
            .to_string();
            assert!(err.contains(want), "{key}: {err}");
        }
    }
}
