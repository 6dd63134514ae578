//! What the DeepSeek-V3-bodied families (DeepSeek-V3, Kimi K2.5, GLM-5)
//! read and check alike: Multi-head Latent Attention, the sigmoid
//! group-limited router with a correction bias, shared experts, dense
//! layers first. Each family file adds its own fields and defaults
//! (`DeepseekV3Config`, `GlmMoeDsaConfig` of transformers 5.23); fields that
//! fix tensor shapes are required, as for the GQA families.

use serde_json::{Map, Value, json};

use super::{CoreDims, Family};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{
    AttentionKind, CommonFields, IndexerSpec, LayerKind, MlaAttention, MlaSpec, ModelSpec, MoeSpec, QkNorm, RouterSpec,
    ScoringFunc, expert_count, parse_rope, special_tokens,
};

/// A family's config-class defaults for the fields all of them read.
pub(super) struct Defaults {
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub n_group: usize,
    pub topk_group: usize,
}

/// `DeepseekV3Config`'s defaults.
pub(super) const DEEPSEEK_DEFAULTS: Defaults =
    Defaults { rms_norm_eps: 1e-6, max_position_embeddings: 4096, n_group: 8, topk_group: 4 };

/// Parses the fields every MLA family reads alike from `cfg` (the text
/// model's config), as `DeepseekV3Config` reads them.
pub(super) fn parse(cfg: &Fields<'_>, family: Family, defaults: &Defaults) -> Result<ModelSpec> {
    let CoreDims { vocab_size, hidden_size, num_layers, num_heads } = CoreDims::read(cfg)?;
    // expand_kv builds num_attention_heads key/value heads from the latent;
    // any other kv head count would make transformers' repeat_kv fail.
    let num_kv_heads = cfg.usize("num_key_value_heads")?.unwrap_or(num_heads);
    if num_kv_heads != num_heads {
        return Err(Error::invalid(
            "num_key_value_heads",
            format!("MLA expands the latent to every head: must equal num_attention_heads ({num_heads})"),
        ));
    }
    let q_lora_rank = match cfg.map.get("q_lora_rank") {
        None => return Err(Error::MissingField { field: "q_lora_rank".into() }),
        Some(_) => cfg.usize("q_lora_rank")?,
    };
    let mla = MlaSpec {
        q_lora_rank,
        kv_lora_rank: cfg.req_usize("kv_lora_rank")?,
        qk_nope_head_dim: cfg.req_usize("qk_nope_head_dim")?,
        qk_rope_head_dim: cfg.req_usize("qk_rope_head_dim")?,
        v_head_dim: cfg.req_usize("v_head_dim")?,
        rope_interleave: cfg.bool("rope_interleave")?.unwrap_or(true),
    };

    let rms_norm_eps = cfg.f64("rms_norm_eps")?.unwrap_or(defaults.rms_norm_eps) as f32;
    let max_position_embeddings = cfg.usize("max_position_embeddings")?.unwrap_or(defaults.max_position_embeddings);
    // transformers builds the rotary table for config.head_dim, which
    // __post_init__ sets to qk_rope_head_dim.
    let rope = parse_rope(cfg, 10_000.0, true, mla.qk_rope_head_dim, max_position_embeddings)?;

    let num_experts = expert_count(cfg, ("n_routed_experts", "num_local_experts"))?;
    let top_k = cfg.req_usize("num_experts_per_tok")?;
    let moe_intermediate_size = cfg.req_usize("moe_intermediate_size")?;
    let moe = MoeSpec {
        num_experts,
        top_k,
        intermediate_size: moe_intermediate_size,
        norm_topk_prob: cfg.bool("norm_topk_prob")?.unwrap_or(true),
    };
    if let Some(scoring) = cfg.str("scoring_func")?
        && scoring != "sigmoid"
    {
        return Err(Error::invalid("scoring_func", format!("{scoring:?} is not supported (only \"sigmoid\")")));
    }
    let router = RouterSpec {
        scoring: ScoringFunc::Sigmoid,
        n_group: cfg.usize("n_group")?.unwrap_or(defaults.n_group),
        topk_group: cfg.usize("topk_group")?.unwrap_or(defaults.topk_group),
        routed_scaling_factor: cfg.f64("routed_scaling_factor")?.unwrap_or(2.5),
        score_correction_bias: true,
    };
    let n_shared = cfg.usize("n_shared_experts")?.unwrap_or(1);
    let shared_intermediate_size = (n_shared > 0).then(|| moe_intermediate_size * n_shared);
    let (bos_token_id, eos_token_ids) = special_tokens(cfg, (Some(0), vec![1]))?;

    let mut spec = ModelSpec::from_common(CommonFields {
        family,
        vocab_size,
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim: mla.qk_head_dim(),
        rms_norm_eps,
        rope,
        max_position_embeddings,
        tie_word_embeddings: cfg.bool("tie_word_embeddings")?.unwrap_or(false),
        moe,
        dense_intermediate_size: cfg.req_usize("intermediate_size")?,
        bos_token_id,
        eos_token_ids,
    });
    spec.attention_bias = cfg.bool("attention_bias")?.unwrap_or(false);
    spec.router = router;
    spec.shared_intermediate_size = shared_intermediate_size;
    spec.mla = Some(mla);
    spec.layers = dense_first_layer_kinds(cfg, num_layers)?;
    Ok(spec)
}

/// DeepseekV3DecoderLayer: MoE iff `layer >= first_k_dense_replace`.
pub(super) fn dense_first_layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerKind>> {
    let dense = cfg.usize("first_k_dense_replace")?.unwrap_or(3);
    Ok((0..num_layers).map(|l| if l >= dense { LayerKind::Moe } else { LayerKind::Dense }).collect())
}

/// A list of strings, or `None` when absent or null.
pub(super) fn string_list(cfg: &Fields<'_>, key: &str) -> Result<Option<Vec<String>>> {
    match cfg.map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_owned).ok_or_else(|| Error::invalid(key, format!("expected strings, got {v}")))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(v) => Err(Error::invalid(key, format!("expected a list of strings, got {v}"))),
    }
}

/// The MLA invariants every family shares (the common ones are checked by
/// the caller).
pub(super) fn validate(spec: &ModelSpec) -> Result<()> {
    let Some(mla) = &spec.mla else {
        return Err(Error::invalid("kv_lora_rank", format!("{} needs its MLA dimensions", spec.family)));
    };
    for (field, value) in [
        ("kv_lora_rank", mla.kv_lora_rank),
        ("qk_nope_head_dim", mla.qk_nope_head_dim),
        ("qk_rope_head_dim", mla.qk_rope_head_dim),
        ("v_head_dim", mla.v_head_dim),
        ("q_lora_rank", mla.q_lora_rank.unwrap_or(1)),
    ] {
        if value == 0 {
            return Err(Error::invalid(field, "must be > 0"));
        }
    }
    if spec.head_dim != mla.qk_head_dim() || spec.num_kv_heads != spec.num_heads {
        return Err(Error::invalid(
            "qk_nope_head_dim",
            "head_dim must be qk_nope_head_dim + qk_rope_head_dim and every head its own kv head",
        ));
    }
    if spec.rope.rotary_dim != mla.qk_rope_head_dim || !mla.qk_rope_head_dim.is_multiple_of(2) {
        return Err(Error::invalid(
            "qk_rope_head_dim",
            format!(
                "RoPE must rotate all {} rope dimensions (an even number), not {}",
                mla.qk_rope_head_dim, spec.rope.rotary_dim
            ),
        ));
    }
    if spec.qk_norm != QkNorm::None || spec.clip_qkv.is_some() || spec.sliding_window.is_some() {
        return Err(Error::invalid("model_type", format!("{} has no q/k norm, clip or window", spec.family)));
    }
    validate_router(spec)?;
    if spec.shared_intermediate_size == Some(0)
        || spec.shared_intermediate_size.is_some_and(|s| !s.is_multiple_of(spec.moe.intermediate_size))
    {
        return Err(Error::invalid("n_shared_experts", "shared experts must be whole experts"));
    }
    Ok(())
}

/// The checks of a family whose config says only `first_k_dense_replace`
/// and has no DSA indexer.
pub(super) fn validate_dense_first_without_dsa(spec: &ModelSpec) -> Result<()> {
    validate(spec)?;
    // The layer pattern must be expressible in the family's config.json.
    let dense = spec.layers.iter().take_while(|&&k| k == LayerKind::Dense).count();
    if spec.layers[dense..].contains(&LayerKind::Dense) {
        return Err(Error::invalid("first_k_dense_replace", "dense layers must all come first"));
    }
    no_dsa(spec)
}

/// The error for a DSA indexer where the family has none, or none where it
/// has one.
pub(super) fn no_dsa(spec: &ModelSpec) -> Result<()> {
    match spec.dsa {
        None => Ok(()),
        Some(_) => Err(dsa_mismatch(spec)),
    }
}

pub(super) fn dsa_mismatch(spec: &ModelSpec) -> Error {
    Error::invalid("index_topk", format!("{} and DSA: only glm_moe_dsa has an indexer", spec.family))
}

fn validate_router(spec: &ModelSpec) -> Result<()> {
    let r = &spec.router;
    let experts = spec.moe.num_experts;
    if r.scoring != ScoringFunc::Sigmoid || !r.score_correction_bias {
        return Err(Error::invalid("scoring_func", "the MLA families route by sigmoid with a correction bias"));
    }
    if r.n_group == 0 || !experts.is_multiple_of(r.n_group) {
        return Err(Error::invalid("n_group", format!("{} does not divide n_routed_experts {experts}", r.n_group)));
    }
    // Groups are ranked by the sum of their two best scores.
    let per_group = experts / r.n_group;
    if per_group < 2 {
        return Err(Error::invalid("n_group", "every group needs at least two experts"));
    }
    if r.topk_group == 0 || r.topk_group > r.n_group {
        return Err(Error::invalid("topk_group", format!("{} is not in 1..={}", r.topk_group, r.n_group)));
    }
    if spec.moe.top_k > r.topk_group * per_group {
        return Err(Error::invalid(
            "num_experts_per_tok",
            format!("{} exceeds the {} experts of the chosen groups", spec.moe.top_k, r.topk_group * per_group),
        ));
    }
    if !r.routed_scaling_factor.is_finite() {
        return Err(Error::invalid("routed_scaling_factor", "must be finite"));
    }
    Ok(())
}

/// Layer `layer`'s mixer: latent attention with its DSA indexer where the
/// model has one.
pub(super) fn attention(spec: &ModelSpec, layer: usize) -> AttentionKind {
    // validate() refuses an MLA family without its dimensions; a spec not
    // validated reads as GQA, as the flat spec always did.
    let Some(dims) = spec.mla else {
        return super::gqa::attention(spec);
    };
    AttentionKind::Mla(MlaAttention {
        num_heads: spec.num_heads,
        dims,
        rope: spec.rope,
        bias: spec.attention_bias,
        indexer: spec.dsa.as_ref().map(|dsa| IndexerSpec {
            kind: dsa.indexer_types[layer],
            topk: dsa.index_topk,
            head_dim: dsa.index_head_dim,
            n_heads: dsa.index_n_heads,
        }),
    })
}

/// The config.json keys every MLA family writes alike (5.x spelling).
pub(super) fn config_json(spec: &ModelSpec, mla: &MlaSpec) -> Map<String, Value> {
    let mut c = spec.common_config(mla.qk_rope_head_dim);
    c.insert("q_lora_rank".into(), json!(mla.q_lora_rank));
    c.insert("kv_lora_rank".into(), json!(mla.kv_lora_rank));
    c.insert("qk_nope_head_dim".into(), json!(mla.qk_nope_head_dim));
    c.insert("qk_rope_head_dim".into(), json!(mla.qk_rope_head_dim));
    c.insert("v_head_dim".into(), json!(mla.v_head_dim));
    c.insert("intermediate_size".into(), json!(spec.dense_intermediate_size));
    c.insert("moe_intermediate_size".into(), json!(spec.moe.intermediate_size));
    c.insert("n_routed_experts".into(), json!(spec.moe.num_experts));
    let n_shared = spec.shared_intermediate_size.map_or(0, |s| s / spec.moe.intermediate_size);
    c.insert("n_shared_experts".into(), json!(n_shared));
    c.insert("num_experts_per_tok".into(), json!(spec.moe.top_k));
    c.insert("norm_topk_prob".into(), json!(spec.moe.norm_topk_prob));
    c.insert("n_group".into(), json!(spec.router.n_group));
    c.insert("topk_group".into(), json!(spec.router.topk_group));
    c.insert("routed_scaling_factor".into(), json!(spec.router.routed_scaling_factor));
    c.insert("attention_bias".into(), json!(spec.attention_bias));
    let dense = spec.layers.iter().take_while(|&&k| k == LayerKind::Dense).count();
    c.insert("first_k_dense_replace".into(), json!(dense));
    c
}
