//! What the hybrid linear-attention families (Qwen3-Next, Qwen3.5/3.6)
//! read alike on top of the GQA fields: the layer pattern, the Gated
//! DeltaNet dimensions, zero-centred norms, gated attention output and the
//! sigmoid-gated shared expert. Each family file adds its projection
//! layout, router and dense layers.

use serde_json::{Map, Value, json};

use super::{Family, gqa};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::limits::{self, MAX_HEAD_DIM, MAX_HEADS, MAX_MTP_LAYERS};
use crate::spec::{
    FfnKind, FfnSpec, GateActivation, GateRank, GdnDims, GdnProjections, GdnSpec, LayerSpec, LayerType, MixerSpec,
    ModelArch, NormKind, QkNorm, RouterKind, SharedExperts, special_tokens,
};

/// The config-class defaults both families share (transformers 5.23
/// `Qwen3NextConfig`, `Qwen3_5MoeTextConfig`).
pub(super) const DEFAULTS: gqa::Defaults = gqa::Defaults {
    num_kv_heads: Some(2),
    rms_norm_eps: 1e-6,
    max_position_embeddings: 32768,
    rope_theta: 10_000.0,
    bos_token_id: None,
    eos_token_ids: &[],
    expert_count: ("num_experts", "num_local_experts"),
    expert_width: "moe_intermediate_size",
};

/// What differs between the hybrid families' configs beyond their own
/// keys.
pub(super) struct Hybrid {
    pub family: Family,
    pub projections: GdnProjections,
    /// `partial_rotary_factor` when the config gives none (Qwen3-Next's and
    /// Qwen3.5's `__post_init__`: `kwargs.setdefault("partial_rotary_factor",
    /// 0.25)`; Qwen3.8-Flash-Next sets none, so the rotation is whole).
    pub partial_rotary_factor: Option<f64>,
    /// How `layer_types` spells a full-attention layer.
    pub full_attention: &'static [&'static str],
}

/// The default `partial_rotary_factor` of Qwen3-Next and Qwen3.5.
pub(super) const QWEN_PARTIAL_ROTARY_FACTOR: f64 = 0.25;

/// `layer_types`' spelling of a full-attention layer in Qwen3-Next and
/// Qwen3.5.
pub(super) const FULL_ATTENTION: &[&str] = &["full_attention"];

/// `full_attention_interval` when neither it nor `layer_types` is given.
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// The keys both families read beyond [`super::CORE_READ`] and
/// [`gqa::READ`]: the layer pattern, the Gated DeltaNet dimensions, the
/// gated shared expert and the attention biases.
pub(super) const READ: &[&str] = &[
    "layer_types",
    "full_attention_interval",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "shared_expert_intermediate_size",
    "attention_bias",
];

/// The Hub's keys of the multi-token-prediction module the hybrid
/// families publish under `mtp.`: read by Qwen3-Next and Qwen3.5/3.6,
/// whose module Strata keeps ([`Parsed::with_mtp`]), inert in
/// Qwen3.8-Flash-Next, whose module is not loaded.
pub(super) const MTP_KEYS: &[&str] = &["mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"];

/// The parts of the hub's `mtp.` module that all its layers share
/// (canonical MTP-layer suffix → the hub's name under `mtp.`): the two
/// pre-norms, `fc` and the output `norm` ([`Parsed::with_mtp`]).
const HUB_MTP_SHARED: &[(&str, &str)] = &[
    ("enorm.", "pre_fc_norm_embedding."),
    ("hnorm.", "pre_fc_norm_hidden."),
    ("eh_proj.", "fc."),
    ("shared_head.norm.", "norm."),
];

/// The hub's name of tensor `suffix` (canonical) of MTP layer `k`: the
/// shared parts at `mtp.` ([`HUB_MTP_SHARED`]), read for every layer, the
/// decoder block at `mtp.layers.{k}.` under the stack's own names (at the
/// checkpoint's root, also in Qwen3.5's multimodal layout).
pub(super) fn hub_mtp_name(k: usize, suffix: &str) -> String {
    let shared = HUB_MTP_SHARED.iter().find_map(|(own, hub)| suffix.strip_prefix(own).map(|rest| (hub, rest)));
    match shared {
        Some((hub, rest)) => format!("mtp.{hub}{rest}"),
        None => format!("mtp.layers.{k}.{suffix}"),
    }
}

/// What both families read, on top of the GQA fields: the gated,
/// per-head-normed full attention, the Gated DeltaNet block, each layer's
/// mixer, zero-centred norms and the gated shared expert.
pub(super) struct Parsed<'a> {
    pub gqa: gqa::Parsed<'a>,
    pub gdn: GdnSpec,
    pub mixers: Vec<LayerType>,
    /// Multi-token-prediction layers after the stack (0 unless the family
    /// reads them, [`Parsed::with_mtp`]).
    pub mtp_layers: usize,
}

impl<'a> Parsed<'a> {
    /// The config the fields came from.
    pub(super) fn cfg(&self) -> &Fields<'a> {
        &self.gqa.cfg
    }

    /// The same, with the multi-token-prediction layers the config declares
    /// (`mtp_num_hidden_layers`; none where it is absent, as in every
    /// config transformers saves).
    ///
    /// transformers ignores the hub's `mtp.` module; its reference is vLLM's
    /// (`vllm/model_executor/models/qwen3_next_mtp.py` at 055e47c,
    /// `Qwen3NextMultiTokenPredictor`, and `qwen3_5_mtp.py` at 01d9980,
    /// `Qwen3_5MultiTokenPredictor`, alike; SGLang's `qwen3_next_mtp.py`
    /// builds the same). `forward` (lines 129-160 of the first) norms the
    /// next token's embedding (`pre_fc_norm_embedding`) and the stack's
    /// hidden state (`pre_fc_norm_hidden`), joins them embedding first
    /// (`torch.cat([inputs_embeds, hidden_states])`), projects the join back
    /// to the hidden size (`fc`, 2H → H, no bias), runs one decoder layer
    /// and norms its output (`norm`) for the shared lm head. The hidden
    /// state is the stack's after its final norm: what `Qwen3NextModel.forward`
    /// returns (`self.norm(hidden_states, residual)`), which the drafter is
    /// handed. Every norm is the family's zero-centred one
    /// (`Qwen3NextRMSNorm` = `GemmaRMSNorm`, `(1 + w) · x̂`). The decoder layer
    /// is built as `layer_type="full_attention"` (lines 91-98): the stack's
    /// gated full attention with its per-head q/k norms and its rotary
    /// embedding, partial rotation included (`get_rope` from the same
    /// config, `Qwen3NextAttention.__init__`); its MLP is chosen by the
    /// stack's rule at the index `extract_layer_index("mtp.layers.{k}")`
    /// gives, k (`Qwen3NextDecoderLayer.__init__`), so MTP layer k has the
    /// MLP the stack's layer k has. That is DeepSeek-V3's wiring
    /// ([`MtpForm::DEEPSEEK_V3`]: the embedding first, a norm after the
    /// layer) under other names ([`hub_mtp_name`]); where a module has
    /// several layers, the join and the norm are one set shared by all
    /// (vLLM runs layer `spec_step_idx % num_mtp_layers` between them),
    /// which convert reads into each layer, the same computation. A module
    /// with its own embedding table (`mtp_use_dedicated_embeddings`, false
    /// in every published config) is not one Strata runs: it keeps none.
    ///
    /// [`MtpForm::DEEPSEEK_V3`]: crate::spec::MtpForm::DEEPSEEK_V3
    pub(super) fn with_mtp(self) -> Result<Self> {
        let cfg = self.cfg();
        let key = "mtp_num_hidden_layers";
        let declared = limits::at_most(key, cfg.usize(key)?.unwrap_or(0), MAX_MTP_LAYERS)?;
        let dedicated = cfg.bool("mtp_use_dedicated_embeddings")?.unwrap_or(false);
        Ok(Parsed { mtp_layers: if dedicated { 0 } else { declared }, ..self })
    }

    /// The model whose layer `l` runs the mixer `mixers[l]` and the FFN
    /// `kinds[l]` names, then its MTP layers ([`Parsed::with_mtp`]).
    pub(super) fn build(self, kinds: &[FfnKind]) -> Result<ModelArch> {
        let Parsed { gqa, gdn, mut mixers, mtp_layers } = self;
        let stack_layers = kinds.len();
        let mtp_kinds = kinds.get(..mtp_layers).ok_or_else(|| {
            Error::invalid("mtp_num_hidden_layers", format!("{mtp_layers} MTP layers over {stack_layers} layers"))
        })?;
        let all_kinds: Vec<FfnKind> = kinds.iter().chain(mtp_kinds).copied().collect();
        mixers.extend(std::iter::repeat_n(LayerType::Full, mtp_layers));
        let full = gqa.attention;
        let mut arch = gqa.build(&all_kinds, |l| match mixers[l] {
            LayerType::Linear => MixerSpec::GatedDeltaNet(gdn),
            LayerType::Full => MixerSpec::Gqa(full),
        })?;
        arch.mtp = arch.layers.split_off(stack_layers);
        Ok(arch)
    }
}

/// The fields both families read, with every feed-forward block left for
/// the family file to lay out.
pub(super) fn parse<'a>(cfg: Fields<'a>, hybrid: &Hybrid) -> Result<Parsed<'a>> {
    let Hybrid { family, projections, partial_rotary_factor, full_attention } = *hybrid;
    let mut parsed = gqa::parse_fields(cfg, family, &DEFAULTS)?;
    let cfg = &parsed.cfg;
    let rope_params = cfg.object("rope_parameters")?.into_iter().chain(cfg.object("rope_scaling")?);
    let partial_given = cfg.raw("partial_rotary_factor").is_some()
        || rope_params.into_iter().any(|p| p.contains_key("partial_rotary_factor"));
    let attention = &mut parsed.attention;
    if !partial_given && let (Some(rope), Some(factor)) = (&mut attention.rope, partial_rotary_factor) {
        // transformers: dim = int(head_dim * partial_rotary_factor).
        rope.rotary_dim = (attention.head_dim as f64 * factor) as usize;
    }
    let mixers = mixers(cfg, parsed.num_layers, full_attention)?;
    let head_count = |key: &str, default: usize| -> Result<usize> {
        limits::at_most(key, cfg.usize(key)?.unwrap_or(default), MAX_HEADS)
    };
    let head_dim = |key: &str| -> Result<usize> { limits::at_most(key, cfg.usize(key)?.unwrap_or(128), MAX_HEAD_DIM) };
    let dims = GdnDims {
        num_k_heads: head_count("linear_num_key_heads", 16)?,
        num_v_heads: head_count("linear_num_value_heads", 32)?,
        head_k_dim: head_dim("linear_key_head_dim")?,
        head_v_dim: head_dim("linear_value_head_dim")?,
        conv_kernel: limits::at_most("linear_conv_kernel_dim", cfg.usize("linear_conv_kernel_dim")?.unwrap_or(4), 64)?,
        projections,
    };
    let shared = SharedExperts::Gated { intermediate_size: cfg.req_usize("shared_expert_intermediate_size")? };
    attention.bias = cfg.bool("attention_bias")?.unwrap_or(false);
    attention.qk_norm = QkNorm::PerHead;
    attention.output_gate = true;
    parsed.ffns.moe.shared = shared;
    let eps = parsed.core.final_norm.eps();
    parsed.core.final_norm = NormKind::OnePlusWeight { eps };
    Ok(Parsed {
        gqa: parsed,
        gdn: GdnSpec {
            dims,
            eps,
            gate_lower_bound: None,
            output_gate: GateActivation::Silu,
            output_gate_rank: GateRank::Low,
            a_log_padded_to: None,
        },
        mixers,
        mtp_layers: 0,
    })
}

/// The text model's config of a checkpoint: the multimodal wrapper's
/// `text_config`, or the document itself where its `model_type` is the
/// text model's own (`text_model_type`, as the text model saves), and
/// whether it was nested.
pub(super) fn text_config<'a>(root: &'a Map<String, Value>, text_model_type: &str) -> Result<(Fields<'a>, bool)> {
    let top = Fields { map: root, prefix: "" };
    let nested = top.str("model_type")? != Some(text_model_type);
    Ok(match top.object("text_config")? {
        Some(text) if nested => (Fields { map: text, prefix: "text_config." }, true),
        None if nested => return Err(Error::MissingField { field: "text_config".into() }),
        _ => (top, false),
    })
}

/// What a multimodal wrapper (`root`) owns over its text config: tying
/// (class default false) and, where it gives them, the special ids.
pub(super) fn take_wrapper_fields(root: &Map<String, Value>, parsed: &mut Parsed<'_>) -> Result<()> {
    let top = Fields { map: root, prefix: "" };
    let mut merged = parsed.cfg().map.clone();
    for key in ["bos_token_id", "eos_token_id"] {
        if let Some(v) = top.raw(key) {
            merged.insert(key.to_owned(), v.clone());
        }
    }
    let core = &mut parsed.gqa.core;
    (core.bos_token_id, core.eos_token_ids) = special_tokens(&Fields { map: &merged, prefix: "" }, (None, Vec::new()))?;
    core.tie_word_embeddings = top.bool("tie_word_embeddings")?.unwrap_or(false);
    Ok(())
}

/// A text model's config (`text`, of `model_type` `text_model_type`) for
/// export: a checkpoint converted from the multimodal wrapper (`source`)
/// goes back into it, vision config and all; otherwise the text model
/// alone.
pub(super) fn wrapped_config_json(
    mut text: Map<String, Value>,
    text_model_type: &str,
    source: Option<&Value>,
) -> Value {
    text.insert("model_type".into(), json!(text_model_type));
    match source.and_then(|s| Some((s.get("text_config")?, s.as_object()?))) {
        Some((_, wrapper)) => {
            let mut c = wrapper.clone();
            for key in ["bos_token_id", "eos_token_id", "tie_word_embeddings"] {
                if let Some(v) = text.get(key) {
                    c.insert(key.into(), v.clone());
                }
            }
            c.insert("text_config".into(), Value::Object(text));
            c.insert("dtype".into(), json!("float32"));
            Value::Object(c)
        }
        None => Value::Object(text),
    }
}

/// `layer_types`, or every `full_attention_interval`-th layer full.
fn mixers(cfg: &Fields<'_>, num_layers: usize, full_attention: &[&str]) -> Result<Vec<LayerType>> {
    if let Some(listed) = listed_layer_types(cfg, num_layers, full_attention)? {
        return Ok(listed);
    }
    let interval = cfg.usize("full_attention_interval")?.unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL);
    if interval == 0 {
        return Err(Error::invalid("full_attention_interval", "must be >= 1"));
    }
    Ok((0..num_layers)
        .map(|i| if (i + 1).is_multiple_of(interval) { LayerType::Full } else { LayerType::Linear })
        .collect())
}

/// `layer_types` (a spelling of `full_attention` or `linear_attention`, one
/// per layer), or `None` when absent or null.
pub(super) fn listed_layer_types(
    cfg: &Fields<'_>,
    num_layers: usize,
    full_attention: &[&str],
) -> Result<Option<Vec<LayerType>>> {
    let Some(types) = cfg.raw("layer_types").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let items = types.as_array().ok_or_else(|| Error::invalid("layer_types", "must be a list of strings"))?;
    if items.len() != num_layers {
        return Err(Error::invalid(
            "layer_types",
            format!("{} entries for num_hidden_layers {num_layers}", items.len()),
        ));
    }
    items
        .iter()
        .map(|item| match item.as_str() {
            Some(full) if full_attention.contains(&full) => Ok(LayerType::Full),
            Some("linear_attention") => Ok(LayerType::Linear),
            _ => Err(Error::invalid(
                "layer_types",
                format!("{item} is not one of {full_attention:?} or \"linear_attention\""),
            )),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// What both families' models keep: every layer Gated DeltaNet or gated
/// full attention with per-head q/k norms, zero-centred norms, a softmax
/// router and a gated shared expert.
pub(super) fn validate(arch: &ModelArch) -> Result<()> {
    let family = arch.core.family;
    let hybrid = |layer: &LayerSpec| {
        let mixer_ok = match &layer.mixer {
            MixerSpec::Gqa(gqa) => gqa.qk_norm == QkNorm::PerHead && gqa.clip_qkv.is_none(),
            MixerSpec::GatedDeltaNet(_) => true,
            MixerSpec::Mla(_) | MixerSpec::Inkling(_) | MixerSpec::SharedKv(_) => false,
        };
        let ffn_ok = match &layer.ffn {
            FfnSpec::Moe(moe) => {
                matches!(moe.router, RouterKind::SoftmaxTopK { .. })
                    && matches!(moe.shared, SharedExperts::Gated { .. })
            }
            FfnSpec::Dense { .. } => true,
        };
        mixer_ok && ffn_ok && matches!(layer.norm, NormKind::OnePlusWeight { .. })
    };
    if !arch.layers.iter().chain(&arch.mtp).all(hybrid) {
        return Err(Error::invalid("model_type", format!("{family} has GQA with per-head q/k norms only")));
    }
    Ok(())
}

/// The config.json keys both families write alike.
pub(super) fn config_json(arch: &ModelArch) -> Map<String, Value> {
    let (attention, moe) = gqa::blocks(arch);
    let mut c = gqa::config_json(arch, &attention, &moe);
    // common_config writes the factor only when it is not 1; ours defaults
    // to 0.25, so write it always.
    if let (Some(Value::Object(rope)), Some(rope_spec)) = (c.get_mut("rope_parameters"), attention.rope) {
        let factor = rope_spec.rotary_dim as f64 / attention.head_dim as f64;
        rope.insert("partial_rotary_factor".into(), json!(factor));
    }
    let types: Vec<&str> = arch
        .layers
        .iter()
        .map(|l| match l.mixer {
            MixerSpec::GatedDeltaNet(_) => "linear_attention",
            _ => "full_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(types));
    if let Some(gdn) = arch.first_gdn() {
        let d = &gdn.dims;
        c.insert("linear_num_key_heads".into(), json!(d.num_k_heads));
        c.insert("linear_num_value_heads".into(), json!(d.num_v_heads));
        c.insert("linear_key_head_dim".into(), json!(d.head_k_dim));
        c.insert("linear_value_head_dim".into(), json!(d.head_v_dim));
        c.insert("linear_conv_kernel_dim".into(), json!(d.conv_kernel));
    }
    let shared = moe.shared.total_intermediate_size();
    c.insert("moe_intermediate_size".into(), json!(moe.intermediate_size));
    c.insert("shared_expert_intermediate_size".into(), json!(shared));
    c.insert("num_experts".into(), json!(moe.num_experts));
    c.insert("attention_bias".into(), json!(attention.bias));
    if !arch.mtp.is_empty() {
        c.insert("mtp_num_hidden_layers".into(), json!(arch.mtp.len()));
    }
    c
}
