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
use crate::spec::{AttentionKind, GdnDims, GdnProjections, GdnSpec, MixerKind, ModelSpec, NormStyle, QkNorm};

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

/// The fields both families read, as a spec with every layer MoE and the
/// config it came from.
pub(super) fn parse<'a>(
    cfg: Fields<'a>,
    family: Family,
    projections: GdnProjections,
) -> Result<(ModelSpec, Fields<'a>)> {
    let (mut spec, cfg) = gqa::parse_fields(cfg, family, &DEFAULTS)?;
    let rope_params = cfg.object("rope_parameters")?.into_iter().chain(cfg.object("rope_scaling")?);
    let partial_given = cfg.map.contains_key("partial_rotary_factor")
        || rope_params.into_iter().any(|p| p.contains_key("partial_rotary_factor"));
    if !partial_given {
        // transformers: dim = int(head_dim * partial_rotary_factor).
        spec.rope.rotary_dim = (spec.head_dim as f64 * DEFAULT_PARTIAL_ROTARY_FACTOR) as usize;
    }
    let num_layers = spec.num_layers;
    spec.mixers = mixers(&cfg, num_layers)?;
    let head_count = |key: &str, default: usize| -> Result<usize> {
        limits::at_most(key, cfg.usize(key)?.unwrap_or(default), MAX_HEADS)
    };
    let head_dim = |key: &str| -> Result<usize> { limits::at_most(key, cfg.usize(key)?.unwrap_or(128), MAX_HEAD_DIM) };
    spec.linear_attention = Some(GdnDims {
        num_k_heads: head_count("linear_num_key_heads", 16)?,
        num_v_heads: head_count("linear_num_value_heads", 32)?,
        head_k_dim: head_dim("linear_key_head_dim")?,
        head_v_dim: head_dim("linear_value_head_dim")?,
        conv_kernel: limits::at_most("linear_conv_kernel_dim", cfg.usize("linear_conv_kernel_dim")?.unwrap_or(4), 64)?,
        projections,
    });
    spec.shared_intermediate_size = Some(cfg.req_usize("shared_expert_intermediate_size")?);
    spec.attention_bias = cfg.bool("attention_bias")?.unwrap_or(false);
    spec.qk_norm = QkNorm::PerHead;
    spec.norm_style = NormStyle::OnePlusWeight;
    spec.attn_output_gate = true;
    spec.shared_expert_gate = true;
    Ok((spec, cfg))
}

/// `layer_types`, or every `full_attention_interval`-th layer full.
fn mixers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<MixerKind>> {
    let Some(types) = cfg.map.get("layer_types").filter(|v| !v.is_null()) else {
        let interval = cfg.usize("full_attention_interval")?.unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL);
        if interval == 0 {
            return Err(Error::invalid("full_attention_interval", "must be >= 1"));
        }
        return Ok((0..num_layers)
            .map(|i| if (i + 1).is_multiple_of(interval) { MixerKind::Full } else { MixerKind::Linear })
            .collect());
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
            Some("full_attention") => Ok(MixerKind::Full),
            Some("linear_attention") => Ok(MixerKind::Linear),
            _ => {
                Err(Error::invalid("layer_types", format!("{item} is not \"full_attention\" or \"linear_attention\"")))
            }
        })
        .collect()
}

/// What both families' specs keep.
pub(super) fn validate(spec: &ModelSpec) -> Result<()> {
    let Some(dims) = spec.linear_attention else {
        return Err(Error::invalid("model_type", format!("{} has Gated DeltaNet layers", spec.family)));
    };
    let positive = [
        ("linear_num_key_heads", dims.num_k_heads),
        ("linear_num_value_heads", dims.num_v_heads),
        ("linear_key_head_dim", dims.head_k_dim),
        ("linear_value_head_dim", dims.head_v_dim),
        ("shared_expert_intermediate_size", spec.shared_intermediate_size.unwrap_or(0)),
    ];
    if let Some((field, _)) = positive.iter().find(|(_, n)| *n == 0) {
        return Err(Error::invalid(*field, "must be > 0"));
    }
    if dims.conv_kernel < 2 {
        return Err(Error::invalid("linear_conv_kernel_dim", format!("{} must be >= 2", dims.conv_kernel)));
    }
    if !dims.num_v_heads.is_multiple_of(dims.num_k_heads) {
        return Err(Error::invalid(
            "linear_num_value_heads",
            format!("{} is not a multiple of linear_num_key_heads {}", dims.num_v_heads, dims.num_k_heads),
        ));
    }
    if spec.mixers.len() != spec.num_layers {
        return Err(Error::invalid("layer_types", "one entry per layer"));
    }
    if spec.mla.is_some() || spec.dsa.is_some() || spec.clip_qkv.is_some() || spec.qk_norm != QkNorm::PerHead {
        return Err(Error::invalid("model_type", format!("{} has GQA with per-head q/k norms only", spec.family)));
    }
    Ok(())
}

/// Layer `layer`'s mixer: Gated DeltaNet where `layer_types` says linear,
/// else gated full attention.
pub(super) fn attention(spec: &ModelSpec, layer: usize) -> AttentionKind {
    match (spec.mixers.get(layer), spec.linear_attention) {
        (Some(MixerKind::Linear), Some(dims)) => AttentionKind::GatedDeltaNet(GdnSpec { dims, eps: spec.rms_norm_eps }),
        _ => gqa::attention(spec),
    }
}

/// The config.json keys both families write alike.
pub(super) fn config_json(spec: &ModelSpec) -> Map<String, Value> {
    let mut c = gqa::config_json(spec);
    // common_config writes the factor only when it is not 1; ours defaults
    // to 0.25, so write it always.
    if let Some(Value::Object(rope)) = c.get_mut("rope_parameters") {
        rope.insert("partial_rotary_factor".into(), json!(spec.rope.rotary_dim as f64 / spec.head_dim as f64));
    }
    let types: Vec<&str> = spec
        .mixers
        .iter()
        .map(|m| match m {
            MixerKind::Full => "full_attention",
            MixerKind::Linear => "linear_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(types));
    if let Some(d) = spec.linear_attention {
        c.insert("linear_num_key_heads".into(), json!(d.num_k_heads));
        c.insert("linear_num_value_heads".into(), json!(d.num_v_heads));
        c.insert("linear_key_head_dim".into(), json!(d.head_k_dim));
        c.insert("linear_value_head_dim".into(), json!(d.head_v_dim));
        c.insert("linear_conv_kernel_dim".into(), json!(d.conv_kernel));
    }
    c.insert("moe_intermediate_size".into(), json!(spec.moe.intermediate_size));
    c.insert("shared_expert_intermediate_size".into(), json!(spec.shared_intermediate_size));
    c.insert("num_experts".into(), json!(spec.moe.num_experts));
    c.insert("attention_bias".into(), json!(spec.attention_bias));
    c
}
