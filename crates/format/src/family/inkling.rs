//! Inkling (`inkling_text`, `InklingTextConfig`; the Hub's
//! `inkling_mm_model` nests it in `text_config`): attention without RoPE
//! with a bias by backward distance and short convolutions of k, v and
//! every block's output, `hybrid_sliding` layers with their own heads beside
//! `hybrid` full ones, dense layers first with a learned `global_scale`,
//! then MoE layers whose router's shared-expert sink weighs the shared
//! experts; the embedding RMS-normalised and the logits divided by the μP
//! multiplier and cut to the unpadded vocabulary (docs/inkling.md).
//!
//! Tensors are named as transformers' `save_pretrained` writes the text
//! model, or as the Hub's checkpoints do (`HUB_SPELLING`: `model.llm.…`,
//! gate and up rows paired in `w13`); the Hub's NVFP4 experts are refused.
//!
//! The multi-token-prediction layers (`num_mtp_layers`, or the wrapper's
//! `mtp_config`) are kept as layers `num_hidden_layers + k`, each an
//! Inkling layer with a dense MLP, in the form `MtpModel` gives them
//! (`MtpForm`: the hidden state first, the shared chain norm or none); the
//! hub keeps them under `model.mtp.` (`HUB_MTP_OWN`).

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known};
use super::{CoreDims, Family, FamilyDef, Ffns, HF_NAMING, Naming, stack};
use crate::error::{Error, Result};
use crate::names::respelled;
use crate::spec::fields::Fields;
use crate::spec::limits::{MAX_MTP_LAYERS, at_most};
use crate::spec::{
    CoreSpec, ExpertKind, FfnKind, FfnSpec, InklingAttention, LayerSpec, LogScaling, MixerSpec, ModelArch, MoeBlock,
    MtpForm, MtpOutputNorm, NormKind, RouterKind, SharedExperts, ShortConv, SwiGlu, expert_count, f32_to_json,
    special_tokens,
};

pub(super) struct Inkling;

/// `model_type` of the text model alone (what `save_pretrained` writes).
const TEXT_MODEL_TYPE: &str = "inkling_text";

/// `model_type` of the Hub's multimodal wrapper.
const WRAPPER_MODEL_TYPE: &str = "inkling_mm_model";

/// `save_pretrained`'s names (canonical) → the hub's, the inverse of
/// transformers 5.23's `inkling_mm_model` conversion mapping, in order:
/// the model's own tensors under `model.llm.`, the attention under `attn.`
/// with the hub's projection names, the convolutions without `conv1d.`,
/// the norms by block, the router's bias, dense `w2_md` and the fused
/// experts' `w13_weight`/`w2_weight`. The gate and up halves of dense
/// `w13_dn` and shared `shared_w13_weight` keep their canonical ends and
/// are read from the pair (`checkpoint/paired.rs`).
const HUB_SPELLING: &[(&str, &str)] = &[
    ("model.embed_tokens.embed_norm.", "model.llm.embed_norm."),
    ("model.embed_tokens.", "model.llm.embed."),
    ("model.norm.", "model.llm.norm."),
    ("lm_head.", "model.llm.unembed."),
    ("model.layers.", "model.llm.layers."),
    (".self_attn.q_proj.", ".attn.wq_du."),
    (".self_attn.k_proj.", ".attn.wk_dv."),
    (".self_attn.v_proj.", ".attn.wv_dv."),
    (".self_attn.r_proj.", ".attn.wr_du."),
    (".self_attn.o_proj.", ".attn.wo_ud."),
    // q_norm, k_norm, k_sconv, v_sconv, rel_logits_proj.
    (".self_attn.", ".attn."),
    ("_sconv.conv1d.", "_sconv."),
    (".input_layernorm.", ".attn_norm."),
    (".post_attention_layernorm.", ".mlp_norm."),
    (".mlp.gate.e_score_correction_bias", ".mlp.gate.bias"),
    (".mlp.down_proj.", ".mlp.w2_md."),
    (".mlp.shared_experts.down_proj", ".mlp.shared_experts.shared_w2_weight"),
    (".mlp.experts.gate_up_proj", ".mlp.experts.w13_weight"),
    (".mlp.experts.down_proj", ".mlp.experts.w2_weight"),
];

/// An MTP layer's own tensors (canonical suffix → the hub's), the inverse
/// of transformers 5.23's `MtpModel` conversion mapping for Inkling: the
/// norms of the stack's hidden state and of the embedding and the
/// projection of the two sit at `model.mtp.layers.{k}.`; the decoder block
/// under `transformer_block.` with the stack's hub names; the chain norm
/// is `model.mtp.chain_norm`, canonical as it is.
const HUB_MTP_OWN: &[(&str, &str)] =
    &[("hnorm.", "hidden_norm."), ("enorm.", "embed_norm."), ("eh_proj.", "input_proj.")];

/// The text model's keys, with the spellings `InklingTextConfig`'s
/// `attribute_map` and `__post_init__` accept from checkpoints.
const TEXT: ConfigKeys = ConfigKeys {
    read: &[
        &["model_type", "vocab_size", "unpadded_vocab_size", "hidden_size", "num_hidden_layers", "hidden_act"],
        &["num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "bos_token_id", "eos_token_id"],
        &["swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim", "sliding_window_size"],
        &["sliding_window", "d_rel", "rel_extent", "log_scaling_n_floor", "log_scaling_alpha"],
        &["layer_types", "local_layer_ids", "mlp_layer_types", "dense_mlp_idx", "conv_kernel_size"],
        &["sconv_kernel_size", "max_position_embeddings", "model_max_length", "intermediate_size"],
        &["dense_intermediate_size", "moe_intermediate_size", "n_routed_experts", "num_local_experts"],
        &["num_experts_per_tok", "n_shared_experts", "route_scale", "logits_mup_width_multiplier"],
        &["embedding_multiplier"],
        // The multi-token-prediction layers, kept for speculative decoding.
        &["num_mtp_layers", "chain_hidden_post_norm", "mtp_hidden_states_first", "mtp_local_layer_ids"],
    ],
    inert: &[
        HF_INERT,
        // Read by no module of transformers 5.23 (the router has no norm;
        // the shared experts are always the sink's; nothing is tied).
        &["rms_norm_eps_moe_gate", "shared_expert_sink", "tie_word_embeddings"],
        // Set by `__post_init__` (always 4: k, v, attention and MLP
        // convolutions) and written back by `save_pretrained`.
        &["number_of_conv_states"],
    ],
    nested: &[],
};

/// The wrapper's `mtp_config`: what the text model's MTP keys default to
/// (`InklingConfig.__post_init__`).
const MTP_CONFIG: ConfigKeys = ConfigKeys {
    read: &[&["num_nextn_predict_layers", "chain_hidden_post_norm", "local_layer_ids"]],
    inert: &[],
    nested: &[],
};

/// What an Inkling checkpoint may hold: the text model, flat or in the
/// wrapper's `text_config` beside the vision and audio towers, which are
/// not loaded, and the multi-token-prediction module, which is kept unless
/// convert is asked to drop it (`model.mtp.*` is then left unread).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[&["model_type", "bos_token_id", "eos_token_id"]],
        inert: &[
            HF_INERT,
            &["vision_config", "audio_config", "tie_word_embeddings"],
            &["image_token_id", "audio_token_id", "image_bos_token_id", "audio_bos_token_id"],
        ],
        nested: &[("text_config", &TEXT), ("mtp_config", &MTP_CONFIG)],
    },
    unused_tensors: &["model.mtp.*"],
    extra_layers_unused: false,
};

/// `InklingTextConfig`'s defaults for the scalars.
const RMS_NORM_EPS: f64 = 1e-6;
const MAX_POSITIONS: usize = 131_072;
const SLIDING_WINDOW: usize = 512;
const D_REL: usize = 16;
const REL_EXTENT: usize = 1024;
const LOG_SCALING_ALPHA: f64 = 0.1;
const CONV_KERNEL: usize = 4;
const ROUTE_SCALE: f64 = 8.0;
const LOGITS_MUP_WIDTH_MULTIPLIER: f64 = 24.0;
/// Every sixth layer is full when neither `layer_types` nor
/// `local_layer_ids` says otherwise.
const FULL_EVERY: usize = 6;

/// `own`, or the `alias` transformers maps onto it; both given must agree.
fn aliased(cfg: &Fields<'_>, own: &str, alias: &str) -> Result<Option<usize>> {
    match (cfg.usize(own)?, cfg.usize(alias)?) {
        (Some(a), Some(b)) if a != b => Err(Error::invalid(own, format!("{own} = {a} contradicts {alias} = {b}"))),
        (a, b) => Ok(a.or(b)),
    }
}

/// As [`aliased`], for a float.
fn aliased_f64(cfg: &Fields<'_>, own: &str, alias: &str) -> Result<Option<f64>> {
    match (cfg.f64(own)?, cfg.f64(alias)?) {
        (Some(a), Some(b)) if a != b => Err(Error::invalid(own, format!("{own} = {a} contradicts {alias} = {b}"))),
        (a, b) => Ok(a.or(b)),
    }
}

/// A per-layer list of strings, each one of two names: `true` for `yes`.
fn per_layer(cfg: &Fields<'_>, key: &str, num_layers: usize, [yes, no]: [&str; 2]) -> Result<Option<Vec<bool>>> {
    let Some(items) = cfg.raw(key).filter(|v| !v.is_null()) else { return Ok(None) };
    let items = items.as_array().ok_or_else(|| Error::invalid(key, "must be a list of strings"))?;
    if items.len() != num_layers {
        return Err(Error::invalid(key, format!("{} entries for {num_layers} layers", items.len())));
    }
    let flag = |item: &Value| match item.as_str() {
        Some(s) if s == yes => Ok(true),
        Some(s) if s == no => Ok(false),
        _ => Err(Error::invalid(key, format!("{item} is not {yes:?} or {no:?}"))),
    };
    items.iter().map(flag).collect::<Result<Vec<bool>>>().map(Some)
}

/// Which layers slide: `layer_types`, else `local_layer_ids`, else all but
/// every sixth (`InklingTextConfig.__post_init__`).
fn sliding_layers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<bool>> {
    let types = per_layer(cfg, "layer_types", num_layers, ["hybrid_sliding", "hybrid"])?;
    let local = cfg.usize_list("local_layer_ids")?;
    if let Some(types) = types {
        return Ok(types);
    }
    Ok(match local {
        Some(local) => (0..num_layers).map(|l| local.contains(&l)).collect(),
        None => (0..num_layers).map(|l| !(l + 1).is_multiple_of(FULL_EVERY)).collect(),
    })
}

/// Each layer's FFN: `mlp_layer_types`, else dense below `dense_mlp_idx`
/// (0: none).
fn ffn_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<FfnKind>> {
    let types = per_layer(cfg, "mlp_layer_types", num_layers, ["dense", "sparse"])?;
    let dense_below = cfg.usize("dense_mlp_idx")?.unwrap_or(0);
    let dense: Vec<bool> = types.unwrap_or_else(|| (0..num_layers).map(|l| l < dense_below).collect());
    Ok(dense.into_iter().map(|d| if d { FfnKind::Dense } else { FfnKind::Moe }).collect())
}

/// Where the text model's MTP key `own` is read: its own config where it
/// has the key (null included: `InklingConfig.__post_init__` only
/// `setdefault`s it), else the wrapper's `mtp_config` (if any) as `outer`.
fn mtp_source<'a, 'k>(
    cfg: Fields<'a>,
    mtp_config: Option<Fields<'a>>,
    own: &'k str,
    outer: &'k str,
) -> (Fields<'a>, &'k str) {
    match mtp_config {
        Some(wrapper) if cfg.raw(own).is_none() => (wrapper, outer),
        _ => (cfg, own),
    }
}

/// The multi-token-prediction layers the config declares: how many
/// (`num_mtp_layers`, none if null), which slide (`mtp_local_layer_ids`,
/// else none: `mtp_layer_types`) and their form. `MtpModel` gives Inkling
/// no per-layer norm (its config has `chain_hidden_post_norm`), one shared
/// norm where that key is true.
fn mtp_layers(root: &Map<String, Value>, cfg: Fields<'_>) -> Result<(Vec<bool>, MtpForm)> {
    let top = Fields { map: root, prefix: "" };
    let wrapper = match cfg.prefix.is_empty() {
        true => None,
        false => top.object("mtp_config")?.map(|map| Fields { map, prefix: "mtp_config." }),
    };
    let (fields, key) = mtp_source(cfg, wrapper, "num_mtp_layers", "num_nextn_predict_layers");
    let count = at_most(key, fields.usize(key)?.unwrap_or(0), MAX_MTP_LAYERS)?;
    let (fields, key) = mtp_source(cfg, wrapper, "chain_hidden_post_norm", "chain_hidden_post_norm");
    let chain_norm = fields.bool(key)?.unwrap_or(false);
    let (fields, key) = mtp_source(cfg, wrapper, "mtp_local_layer_ids", "local_layer_ids");
    let local = fields.usize_list(key)?.unwrap_or_default();
    let form = MtpForm {
        hidden_first: cfg.bool("mtp_hidden_states_first")?.unwrap_or(true),
        output_norm: if chain_norm { MtpOutputNorm::Chain } else { MtpOutputNorm::Unnormed },
    };
    Ok(((0..count).map(|k| local.contains(&k)).collect(), form))
}

/// The text model's config: the document itself, or the wrapper's
/// `text_config`, with the wrapper's special ids over the text model's.
fn text_config(root: &Map<String, Value>) -> Result<(Fields<'_>, Map<String, Value>)> {
    let top = Fields { map: root, prefix: "" };
    if top.str("model_type")? == Some(TEXT_MODEL_TYPE) {
        return Ok((top, root.clone()));
    }
    let text = top.object("text_config")?.ok_or_else(|| Error::MissingField { field: "text_config".into() })?;
    let mut ids = text.clone();
    for key in ["bos_token_id", "eos_token_id"] {
        if let Some(v) = top.raw(key) {
            ids.insert(key.to_owned(), v.clone());
        }
    }
    Ok((Fields { map: text, prefix: "text_config." }, ids))
}

impl FamilyDef for Inkling {
    fn model_type(&self) -> &'static str {
        WRAPPER_MODEL_TYPE
    }

    fn also_reads(&self) -> &'static [&'static str] {
        &[TEXT_MODEL_TYPE]
    }

    fn architecture(&self) -> &'static str {
        "InklingForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn hub_spelling(&self) -> &'static [(&'static str, &'static str)] {
        HUB_SPELLING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let (cfg, ids) = text_config(root)?;
        let CoreDims { vocab_size, hidden_size, num_layers, num_heads } = CoreDims::read(&cfg)?;
        let eps = cfg.f64("rms_norm_eps")?.unwrap_or(RMS_NORM_EPS) as f32;
        let max_position_embeddings =
            aliased(&cfg, "max_position_embeddings", "model_max_length")?.unwrap_or(MAX_POSITIONS);
        let (bos_token_id, eos_token_ids) = special_tokens(&Fields { map: &ids, prefix: "" }, (Some(1), vec![2]))?;
        let core = CoreSpec {
            family: Family::Inkling,
            vocab_size,
            hidden_size,
            max_position_embeddings,
            tie_word_embeddings: false,
            final_norm: NormKind::Weight { eps },
            bos_token_id,
            eos_token_ids,
            embed_norm: Some(NormKind::Weight { eps }),
            logits_mup_divisor: Some(
                aliased_f64(&cfg, "logits_mup_width_multiplier", "embedding_multiplier")?
                    .unwrap_or(LOGITS_MUP_WIDTH_MULTIPLIER) as f32,
            ),
            unpadded_vocab_size: cfg.usize("unpadded_vocab_size")?,
        };

        let full_heads = (num_heads, cfg.req_usize("num_key_value_heads")?, cfg.req_usize("head_dim")?);
        let sliding_heads = (
            cfg.req_usize("swa_num_attention_heads")?,
            cfg.req_usize("swa_num_key_value_heads")?,
            cfg.req_usize("swa_head_dim")?,
        );
        let window = aliased(&cfg, "sliding_window_size", "sliding_window")?.unwrap_or(SLIDING_WINDOW);
        let d_rel = cfg.usize("d_rel")?.unwrap_or(D_REL);
        let rel_extent = cfg.usize("rel_extent")?.unwrap_or(REL_EXTENT);
        let alpha = cfg.f64("log_scaling_alpha")?.unwrap_or(LOG_SCALING_ALPHA) as f32;
        let log_scaling = cfg.usize("log_scaling_n_floor")?.map(|n_floor| LogScaling { n_floor, alpha });
        let conv_kernel = aliased(&cfg, "conv_kernel_size", "sconv_kernel_size")?.unwrap_or(CONV_KERNEL);
        let sliding = sliding_layers(&cfg, num_layers)?;
        let attention = |slides: bool| {
            let ((num_heads, num_kv_heads, head_dim), sliding_window) =
                if slides { (sliding_heads, Some(window)) } else { (full_heads, None) };
            MixerSpec::Inkling(InklingAttention {
                num_heads,
                num_kv_heads,
                head_dim,
                sliding_window,
                d_rel,
                // A sliding layer's bias spans its window.
                rel_extent: if slides { window } else { rel_extent },
                log_scaling: if slides { None } else { log_scaling },
                conv_kernel,
                hidden_size,
            })
        };

        // With `dense_intermediate_size` (the Hub's spelling),
        // `intermediate_size` is the experts' width (transformers #49416).
        let width = cfg.req_usize("intermediate_size")?;
        let moe_width = cfg.usize("moe_intermediate_size")?;
        let (expert_width, dense_width) = match cfg.usize("dense_intermediate_size")? {
            Some(dense) => (width, dense),
            None => (moe_width.ok_or_else(|| Error::MissingField { field: "moe_intermediate_size".into() })?, width),
        };
        let moe = MoeBlock {
            num_experts: expert_count(&cfg, ("n_routed_experts", "num_local_experts"))?,
            top_k: cfg.req_usize("num_experts_per_tok")?,
            intermediate_size: expert_width,
            router: RouterKind::SharedExpertSink { route_scale: cfg.f64("route_scale")?.unwrap_or(ROUTE_SCALE) },
            shared: SharedExperts::Sink { count: cfg.req_usize("n_shared_experts")?, intermediate_size: expert_width },
            experts: ExpertKind::SwiGlu,
            swiglu: SwiGlu::Plain,
            latent: None,
        };
        let kinds = ffn_kinds(&cfg, num_layers)?;
        let ffns = Ffns { moe, dense_intermediate_size: dense_width };
        let norm = NormKind::Weight { eps };
        let inkling_layers = |mut layers: Vec<LayerSpec>| {
            for layer in &mut layers {
                layer.ffn_output_conv = Some(ShortConv { kernel: conv_kernel, channels: hidden_size });
                if let FfnSpec::Dense { global_scale, .. } = &mut layer.ffn {
                    *global_scale = true;
                }
            }
            layers
        };
        let layers = inkling_layers(stack(&kinds, &ffns, norm, |l| attention(sliding[l]))?);
        // Every MTP layer's MLP is dense (`mtp_mlp_layer_types`), as wide
        // as the stack's dense ones (`InklingMLP` reads `intermediate_size`).
        let (mtp_sliding, mtp_form) = mtp_layers(root, cfg)?;
        let mtp_kinds = vec![FfnKind::Dense; mtp_sliding.len()];
        let mtp = inkling_layers(stack(&mtp_kinds, &ffns, norm, |k| attention(mtp_sliding[k]))?);
        Ok(ModelArch { core, layers, mtp, mtp_form })
    }

    fn hub_mtp_name(&self, k: usize, suffix: &str) -> Option<String> {
        let layer = format!("model.mtp.layers.{k}.");
        let own = HUB_MTP_OWN.iter().find_map(|(own, hub)| suffix.strip_prefix(own).map(|rest| format!("{hub}{rest}")));
        // The block's parts are renamed as a stack layer's: every part of
        // `HUB_SPELLING` that applies inside a layer begins with a dot.
        let block = || format!("transformer_block{}", respelled(&format!(".{suffix}"), HUB_SPELLING));
        Some(format!("{layer}{}", own.unwrap_or_else(block)))
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        let core = &arch.core;
        let ours = core.embed_norm.is_some()
            && core.logits_mup_divisor.is_some()
            && arch.layers.iter().chain(&arch.mtp).all(|l| {
                let ffn = match &l.ffn {
                    FfnSpec::Dense { global_scale, .. } => *global_scale,
                    FfnSpec::Moe(moe) => matches!(moe.router, RouterKind::SharedExpertSink { .. }),
                };
                matches!(l.mixer, MixerSpec::Inkling(_)) && l.ffn_output_conv.is_some() && ffn
            });
        if !ours {
            return Err(Error::invalid(
                "model_type",
                "inkling is Inkling attention, output convolutions and the shared-expert sink throughout",
            ));
        }
        // `MtpModel` gives a config with `chain_hidden_post_norm` no
        // per-layer norm, and an Inkling MTP layer's MLP is dense.
        let mtp_dense = arch.mtp.iter().all(|l| matches!(l.ffn, FfnSpec::Dense { .. }));
        if !mtp_dense || (!arch.mtp.is_empty() && arch.mtp_form.output_norm == MtpOutputNorm::PerLayer) {
            return Err(Error::invalid(
                "num_mtp_layers",
                "Inkling's MTP layers have a dense MLP and the chain norm or none, not a norm each",
            ));
        }
        Ok(())
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let core = &arch.core;
        let attention = |sliding: bool| {
            let mut blocks = arch.layers.iter().chain(&arch.mtp).filter_map(|l| match &l.mixer {
                MixerSpec::Inkling(ink) => Some(ink),
                _ => None,
            });
            let first = blocks.clone().next().copied();
            blocks.find(|ink| ink.sliding_window.is_some() == sliding).copied().or(first)
        };
        let (Some(full), Some(sliding)) = (attention(false), attention(true)) else {
            // validate() guarantees Inkling attention on every layer.
            return Value::Null;
        };
        let slides = |l: &LayerSpec| matches!(&l.mixer, MixerSpec::Inkling(ink) if ink.sliding_window.is_some());
        let layer_types: Vec<&str> =
            arch.layers.iter().map(|l| if slides(l) { "hybrid_sliding" } else { "hybrid" }).collect();
        let mlp_layer_types: Vec<&str> =
            arch.layer_kinds().iter().map(|k| if *k == FfnKind::Dense { "dense" } else { "sparse" }).collect();
        let moe = arch.first_moe().copied();
        let shared = match moe.map(|m| m.shared) {
            Some(SharedExperts::Sink { count, .. }) => count,
            _ => 0,
        };
        let route_scale = match moe.map(|m| m.router) {
            Some(RouterKind::SharedExpertSink { route_scale }) => route_scale,
            _ => ROUTE_SCALE,
        };
        let eos: Value = match core.eos_token_ids.as_slice() {
            [one] => json!(one),
            ids => json!(ids),
        };
        let mut config = json!({
            "architectures": [self.architecture()],
            "model_type": TEXT_MODEL_TYPE,
            "dtype": "float32",
            "vocab_size": core.vocab_size,
            "unpadded_vocab_size": core.unpadded_vocab_size,
            "hidden_size": core.hidden_size,
            "num_hidden_layers": arch.layers.len(),
            "num_attention_heads": full.num_heads,
            "num_key_value_heads": full.num_kv_heads,
            "head_dim": full.head_dim,
            "swa_num_attention_heads": sliding.num_heads,
            "swa_num_key_value_heads": sliding.num_kv_heads,
            "swa_head_dim": sliding.head_dim,
            "sliding_window_size": sliding.sliding_window.unwrap_or(SLIDING_WINDOW),
            "d_rel": full.d_rel,
            "rel_extent": full.rel_extent,
            "log_scaling_n_floor": full.log_scaling.map(|s| s.n_floor),
            "log_scaling_alpha": f32_to_json(full.log_scaling.map_or(LOG_SCALING_ALPHA as f32, |s| s.alpha)),
            "layer_types": layer_types,
            "mlp_layer_types": mlp_layer_types,
            "conv_kernel_size": full.conv_kernel,
            "intermediate_size": arch.dense_intermediate_size().unwrap_or(0),
            "moe_intermediate_size": arch.expert_intermediate_size(),
            "n_routed_experts": arch.num_experts(),
            "num_experts_per_tok": arch.experts_per_token(),
            "n_shared_experts": shared,
            "route_scale": route_scale,
            "logits_mup_width_multiplier": f32_to_json(core.logits_mup_divisor.unwrap_or(1.0)),
            "rms_norm_eps": f32_to_json(core.final_norm.eps()),
            "max_position_embeddings": core.max_position_embeddings,
            "bos_token_id": core.bos_token_id,
            "eos_token_id": eos,
            "tie_word_embeddings": false,
        });
        // Declared only where kept: a container converted without them
        // (or from a checkpoint lacking them) has none.
        if let (Some(c), false) = (config.as_object_mut(), arch.mtp.is_empty()) {
            let local: Vec<usize> = (0..arch.mtp.len()).filter(|&k| slides(&arch.mtp[k])).collect();
            c.insert("num_mtp_layers".into(), json!(arch.mtp.len()));
            c.insert("mtp_local_layer_ids".into(), json!(local));
            c.insert("mtp_hidden_states_first".into(), json!(arch.mtp_form.hidden_first));
            c.insert("chain_hidden_post_norm".into(), json!(arch.mtp_form.output_norm == MtpOutputNorm::Chain));
        }
        config
    }
}

#[cfg(test)]
mod tests;
