//! What the hybrid linear-attention families (Qwen3-Next, Qwen3.5/3.6)
//! read alike on top of the GQA fields: the layer pattern, the Gated
//! DeltaNet dimensions, zero-centred norms, gated attention output and the
//! sigmoid-gated shared expert. Each family file adds its projection
//! layout, router and dense layers.

use serde_json::{Map, Value, json};

use super::{Family, gqa};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::limits::{self, MAX_HEAD_DIM, MAX_HEADS};
use crate::spec::{
    FfnKind, FfnSpec, GdnDims, GdnProjections, GdnSpec, LayerSpec, LayerType, MixerSpec, ModelArch, NormKind, QkNorm,
    RouterKind, SharedExperts,
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

/// `partial_rotary_factor` when the config gives none (`__post_init__`'s
/// `kwargs.setdefault("partial_rotary_factor", 0.25)`).
const DEFAULT_PARTIAL_ROTARY_FACTOR: f64 = 0.25;

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

/// The Hub's keys of the multi-token-prediction module both families
/// publish under `mtp.`, which is not loaded.
pub(super) const MTP_INERT: &[&str] = &["mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"];

/// What both families read, on top of the GQA fields: the gated,
/// per-head-normed full attention, the Gated DeltaNet block, each layer's
/// mixer, zero-centred norms and the gated shared expert.
pub(super) struct Parsed<'a> {
    pub gqa: gqa::Parsed<'a>,
    pub gdn: GdnSpec,
    pub mixers: Vec<LayerType>,
}

impl<'a> Parsed<'a> {
    /// The config the fields came from.
    pub(super) fn cfg(&self) -> &Fields<'a> {
        &self.gqa.cfg
    }

    /// The model whose layer `l` runs the mixer `mixers[l]` and the FFN
    /// `kinds[l]` names.
    pub(super) fn build(self, kinds: &[FfnKind]) -> Result<ModelArch> {
        let Parsed { gqa, gdn, mixers } = self;
        let full = gqa.attention;
        gqa.build(kinds, |l| match mixers[l] {
            LayerType::Linear => MixerSpec::GatedDeltaNet(gdn),
            LayerType::Full => MixerSpec::Gqa(full),
        })
    }
}

/// The fields both families read, with every feed-forward block left for
/// the family file to lay out.
pub(super) fn parse<'a>(cfg: Fields<'a>, family: Family, projections: GdnProjections) -> Result<Parsed<'a>> {
    let mut parsed = gqa::parse_fields(cfg, family, &DEFAULTS)?;
    let cfg = &parsed.cfg;
    let rope_params = cfg.object("rope_parameters")?.into_iter().chain(cfg.object("rope_scaling")?);
    let partial_given = cfg.raw("partial_rotary_factor").is_some()
        || rope_params.into_iter().any(|p| p.contains_key("partial_rotary_factor"));
    let attention = &mut parsed.attention;
    if !partial_given && let Some(rope) = &mut attention.rope {
        // transformers: dim = int(head_dim * partial_rotary_factor).
        rope.rotary_dim = (attention.head_dim as f64 * DEFAULT_PARTIAL_ROTARY_FACTOR) as usize;
    }
    let mixers = mixers(cfg, parsed.num_layers)?;
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
    Ok(Parsed { gqa: parsed, gdn: GdnSpec { dims, eps, gate_lower_bound: None }, mixers })
}

/// `layer_types`, or every `full_attention_interval`-th layer full.
fn mixers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerType>> {
    if let Some(listed) = listed_layer_types(cfg, num_layers)? {
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

/// `layer_types` (`full_attention` or `linear_attention`, one per layer),
/// or `None` when absent or null.
pub(super) fn listed_layer_types(cfg: &Fields<'_>, num_layers: usize) -> Result<Option<Vec<LayerType>>> {
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
            Some("full_attention") => Ok(LayerType::Full),
            Some("linear_attention") => Ok(LayerType::Linear),
            _ => {
                Err(Error::invalid("layer_types", format!("{item} is not \"full_attention\" or \"linear_attention\"")))
            }
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
    if !arch.layers.iter().all(hybrid) {
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
    c
}
