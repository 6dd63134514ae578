//! What the grouped-query-attention families (OLMoE, Qwen3-MoE, Mixtral)
//! read and check alike; each family file adds its own fields and defaults.

use serde_json::{Map, Value};

use super::{CoreDims, Family};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{
    AttentionKind, CommonFields, GqaSpec, LayerKind, ModelSpec, MoeSpec, RouterSpec, expert_count, parse_rope,
    special_tokens,
};

/// A GQA family's config-class defaults for the fields all of them read.
pub(super) struct Defaults {
    /// `num_key_value_heads` when the key is absent (`None`: as many as
    /// `num_attention_heads`).
    pub num_kv_heads: Option<usize>,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: &'static [u32],
    /// The family's name for the expert count, and the alias it also reads.
    pub expert_count: (&'static str, &'static str),
    /// The field holding each routed expert's width (`intermediate_size`
    /// where experts are as wide as a dense MLP would be).
    pub expert_width: &'static str,
}

/// The fields every GQA family reads alike, as a spec whose family-specific
/// fields are neutral (no biases, q/k norms, clip or window; every layer
/// MoE, experts as wide as `intermediate_size`, top-k not renormalised),
/// and the config it came from, for the family file to finish.
pub(super) fn parse<'a>(
    map: &'a Map<String, Value>,
    family: Family,
    defaults: &Defaults,
) -> Result<(ModelSpec, Fields<'a>)> {
    parse_fields(Fields { map, prefix: "" }, family, defaults)
}

/// [`parse`] of a config object that may sit inside another (`cfg.prefix`
/// names where, for errors).
pub(super) fn parse_fields<'a>(
    cfg: Fields<'a>,
    family: Family,
    defaults: &Defaults,
) -> Result<(ModelSpec, Fields<'a>)> {
    let map = cfg.map;
    let CoreDims { vocab_size, hidden_size, num_layers, num_heads } = CoreDims::read(&cfg)?;
    if num_heads == 0 {
        return Err(Error::invalid("num_attention_heads", "must be > 0"));
    }
    // null means "same as num_attention_heads" in every family's
    // __post_init__ (and in 4.x); an absent key takes the class default.
    let num_kv_heads = match map.get("num_key_value_heads") {
        None => defaults.num_kv_heads.unwrap_or(num_heads),
        Some(Value::Null) => num_heads,
        Some(_) => cfg.req_usize("num_key_value_heads")?,
    };
    let head_dim = match cfg.usize("head_dim")? {
        Some(d) => d,
        None => {
            if !hidden_size.is_multiple_of(num_heads) {
                return Err(Error::invalid(
                    "hidden_size",
                    format!(
                        "{hidden_size} is not divisible by num_attention_heads {num_heads} \
                         and no head_dim is given"
                    ),
                ));
            }
            hidden_size / num_heads
        }
    };

    let rms_norm_eps = cfg.f64("rms_norm_eps")?.unwrap_or(defaults.rms_norm_eps) as f32;
    let max_position_embeddings = cfg.usize("max_position_embeddings")?.unwrap_or(defaults.max_position_embeddings);
    let tie_word_embeddings = cfg.bool("tie_word_embeddings")?.unwrap_or(false);
    // YaRN is accepted for the MLA families only: the GQA blocks have not
    // been checked against transformers with it.
    let rope = parse_rope(&cfg, defaults.rope_theta, false, head_dim, max_position_embeddings)?;

    // Expert count: each class aliases `num_experts` and
    // `num_local_experts` through its attribute_map, and 5.x writes the
    // aliased name (qwen3_moe saves `num_local_experts`), so read both.
    let num_experts = expert_count(&cfg, defaults.expert_count)?;
    let top_k = cfg.req_usize("num_experts_per_tok")?;
    let intermediate_size = cfg.req_usize(defaults.expert_width)?;
    // Only dense layers use it; validate() requires it where they exist.
    let dense_intermediate_size = cfg.usize("intermediate_size")?.unwrap_or(0);
    let (bos_token_id, eos_token_ids) = special_tokens(&cfg, (defaults.bos_token_id, defaults.eos_token_ids.to_vec()))?;

    let spec = ModelSpec::from_common(CommonFields {
        family,
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps,
        rope,
        max_position_embeddings,
        tie_word_embeddings,
        moe: MoeSpec { num_experts, top_k, intermediate_size, norm_topk_prob: false },
        dense_intermediate_size,
        bos_token_id,
        eos_token_ids,
    });
    Ok((spec, cfg))
}

/// What every GQA family's spec keeps: dense layers only where the family
/// has them, and no MLA, DSA, shared experts or sigmoid routing.
pub(super) fn validate(spec: &ModelSpec, has_dense_layers: bool) -> Result<()> {
    if spec.layers.contains(&LayerKind::Dense) && !has_dense_layers {
        return Err(Error::invalid("mlp_only_layers", format!("{} has no dense layers", spec.family)));
    }
    // The GQA families implement exactly the softmax router and no MLA.
    if spec.router != RouterSpec::default()
        || spec.shared_intermediate_size.is_some()
        || spec.mla.is_some()
        || spec.dsa.is_some()
    {
        return Err(Error::invalid(
            "model_type",
            format!("{} has no MLA, DSA, shared experts or sigmoid routing", spec.family),
        ));
    }
    Ok(())
}

/// Every layer's mixer: grouped-query attention with the model's heads,
/// rotating every layer.
pub(super) fn attention(spec: &ModelSpec) -> AttentionKind {
    AttentionKind::Gqa(GqaSpec {
        num_heads: spec.num_heads,
        num_kv_heads: spec.num_kv_heads,
        head_dim: spec.head_dim,
        qk_norm: spec.qk_norm,
        clip_qkv: spec.clip_qkv,
        bias: spec.attention_bias,
        sliding_window: spec.sliding_window,
        rope: Some(spec.rope),
        sinks: false,
        output_gate: spec.attn_output_gate,
    })
}

/// The config.json keys every GQA family writes alike.
pub(super) fn config_json(spec: &ModelSpec) -> Map<String, Value> {
    let mut c = spec.common_config(spec.head_dim);
    c.insert("head_dim".into(), spec.head_dim.into());
    c.insert("num_experts_per_tok".into(), spec.moe.top_k.into());
    c
}
