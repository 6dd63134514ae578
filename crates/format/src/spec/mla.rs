//! The MLA families: DeepSeek-V3 (`deepseek_v3`), GLM-5 (`glm_moe_dsa`, MLA
//! plus the DSA lightning indexer) and Kimi K2.5 (`kimi_k25`, a DeepSeek-V3
//! text model nested in `text_config`).
//!
//! Defaults mirror `DeepseekV3Config` and `GlmMoeDsaConfig` of transformers
//! 5.23 for scalars; fields that fix tensor shapes are required, as for the
//! GQA families. The exact math is in `docs/mla.md`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::fields::Fields;
use super::limits::{self, MAX_LAYERS};
use super::{
    Family, LayerKind, ModelSpec, MoeSpec, QkNorm, RouterSpec, ScoringFunc, expert_count, parse_rope, special_tokens,
};
use crate::error::{Error, Result};

/// Multi-head Latent Attention dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaSpec {
    /// Rank of the compressed query (`q_a_proj` → `q_a_layernorm` →
    /// `q_b_proj`); `None`: a single `q_proj` (DeepSeek-V2-Lite style).
    pub q_lora_rank: Option<usize>,
    /// Width of the compressed key/value latent, which is what the KV cache
    /// holds.
    pub kv_lora_rank: usize,
    /// Per-head query/key width without position encoding.
    pub qk_nope_head_dim: usize,
    /// Per-head query width, and the one shared key width, that RoPE rotates.
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// RoPE rotates interleaved pairs `(x[2i], x[2i+1])` (DeepSeek's layout)
    /// instead of `(x[i], x[i + d/2])`.
    pub rope_interleave: bool,
}

impl MlaSpec {
    /// Per-head query/key width, `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// What one token caches per layer: the normalised latent and the
    /// rotated shared key, `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// Whether a layer runs its own DSA indexer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexerKind {
    /// The layer scores past tokens with its own indexer.
    Full,
    /// The layer reuses the selection of the closest full layer before it
    /// (and has no indexer weights).
    Shared,
}

/// DeepSeek Sparse Attention: a lightning indexer picks, per query, the
/// `index_topk` past tokens attention may see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsaSpec {
    pub index_topk: usize,
    pub index_head_dim: usize,
    pub index_n_heads: usize,
    /// One entry per decoder layer.
    pub indexer_types: Vec<IndexerKind>,
}

/// Parses the config.json object of an MLA family (already known to be one).
pub(super) fn parse(root: &Map<String, Value>, family: Family) -> Result<ModelSpec> {
    let top = Fields { map: root, prefix: "" };
    let cfg = match family {
        Family::KimiK25 => {
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
            cfg
        }
        _ => Fields { map: root, prefix: "" },
    };
    let glm = family == Family::GlmMoeDsa;

    if let Some(act) = cfg.str("hidden_act")?
        && act != "silu"
    {
        return Err(Error::invalid("hidden_act", format!("{act:?} is not supported (only \"silu\")")));
    }
    let vocab_size = cfg.req_usize("vocab_size")?;
    let hidden_size = cfg.req_usize("hidden_size")?;
    // Bounded before anything is sized by it (a list per layer).
    let num_layers = limits::at_most("num_hidden_layers", cfg.req_usize("num_hidden_layers")?, MAX_LAYERS)?;
    let num_heads = cfg.req_usize("num_attention_heads")?;
    // expand_kv builds num_attention_heads key/value heads from the latent;
    // any other kv head count would make transformers' repeat_kv fail.
    let num_kv_heads = cfg.usize("num_key_value_heads")?.unwrap_or(num_heads);
    if num_kv_heads != num_heads {
        return Err(Error::invalid(
            "num_key_value_heads",
            format!("MLA expands the latent to every head: must equal num_attention_heads ({num_heads})"),
        ));
    }
    let q_lora_rank = match (glm, cfg.map.get("q_lora_rank")) {
        // GlmMoeDsaAttention always compresses the query.
        (true, _) => Some(cfg.req_usize("q_lora_rank")?),
        (false, None) => return Err(Error::MissingField { field: "q_lora_rank".into() }),
        (false, Some(_)) => cfg.usize("q_lora_rank")?,
    };
    let mla = MlaSpec {
        q_lora_rank,
        kv_lora_rank: cfg.req_usize("kv_lora_rank")?,
        qk_nope_head_dim: cfg.req_usize("qk_nope_head_dim")?,
        qk_rope_head_dim: cfg.req_usize("qk_rope_head_dim")?,
        v_head_dim: cfg.req_usize("v_head_dim")?,
        // GLM's attention always uses the interleaved rotation.
        rope_interleave: glm || cfg.bool("rope_interleave")?.unwrap_or(true),
    };

    let rms_norm_eps = cfg.f64("rms_norm_eps")?.unwrap_or(if glm { 1e-5 } else { 1e-6 }) as f32;
    let max_position_embeddings = cfg.usize("max_position_embeddings")?.unwrap_or(if glm { 202_752 } else { 4096 });
    // transformers builds the rotary table for config.head_dim, which
    // __post_init__ sets to qk_rope_head_dim.
    let rope = parse_rope(&cfg, family, mla.qk_rope_head_dim, max_position_embeddings)?;

    let num_experts = expert_count(&cfg, family)?;
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
        n_group: cfg.usize("n_group")?.unwrap_or(if glm { 1 } else { 8 }),
        topk_group: cfg.usize("topk_group")?.unwrap_or(if glm { 1 } else { 4 }),
        routed_scaling_factor: cfg.f64("routed_scaling_factor")?.unwrap_or(2.5),
        score_correction_bias: true,
    };
    let n_shared = cfg.usize("n_shared_experts")?.unwrap_or(1);
    let shared_intermediate_size = (n_shared > 0).then(|| moe_intermediate_size * n_shared);

    let layers = if glm { glm_layer_kinds(&cfg, num_layers)? } else { deepseek_layer_kinds(&cfg, num_layers)? };
    let dsa = if glm {
        Some(DsaSpec {
            index_topk: cfg.usize("index_topk")?.unwrap_or(2048),
            index_head_dim: cfg.req_usize("index_head_dim")?,
            index_n_heads: cfg.req_usize("index_n_heads")?,
            indexer_types: indexer_types(&cfg, num_layers)?,
        })
    } else {
        None
    };

    // Kimi_K25ForConditionalGeneration ties (or not) by its own, top-level
    // flag, whose class default is true; special ids live at the top too.
    let (tie_word_embeddings, (bos_token_id, eos_token_ids)) = match family {
        Family::KimiK25 => {
            let mut merged = cfg.map.clone();
            for key in ["bos_token_id", "eos_token_id"] {
                if let Some(v) = root.get(key) {
                    merged.insert(key.to_owned(), v.clone());
                }
            }
            let tokens = special_tokens(&Fields { map: &merged, prefix: "" }, family)?;
            (top.bool("tie_word_embeddings")?.unwrap_or(true), tokens)
        }
        _ => (cfg.bool("tie_word_embeddings")?.unwrap_or(false), special_tokens(&cfg, family)?),
    };

    Ok(ModelSpec {
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
        tie_word_embeddings,
        attention_bias: cfg.bool("attention_bias")?.unwrap_or(false),
        qk_norm: QkNorm::None,
        clip_qkv: None,
        sliding_window: None,
        moe,
        router,
        shared_intermediate_size,
        mla: Some(mla),
        dsa,
        dense_intermediate_size: cfg.req_usize("intermediate_size")?,
        layers,
        bos_token_id,
        eos_token_ids,
    })
}

/// DeepseekV3DecoderLayer: MoE iff `layer >= first_k_dense_replace`.
fn deepseek_layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerKind>> {
    let dense = cfg.usize("first_k_dense_replace")?.unwrap_or(3);
    Ok((0..num_layers).map(|l| if l >= dense { LayerKind::Moe } else { LayerKind::Dense }).collect())
}

/// GlmMoeDsaConfig: `mlp_layer_types` ("dense" / "sparse") if given, else
/// `first_k_dense_replace` dense layers followed by sparse ones.
fn glm_layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerKind>> {
    match string_list(cfg, "mlp_layer_types")? {
        Some(items) => items
            .iter()
            .map(|t| match t.as_str() {
                "dense" => Ok(LayerKind::Dense),
                "sparse" => Ok(LayerKind::Moe),
                other => Err(Error::invalid("mlp_layer_types", format!("unknown layer type {other:?}"))),
            })
            .collect(),
        None => deepseek_layer_kinds(cfg, num_layers),
    }
}

/// GlmMoeDsaConfig.__post_init__: `indexer_types` if given, else the
/// `index_topk_pattern` (a string of F/S or a list), else full iff
/// `max(layer - index_skip_topk_offset + 1, 0) % index_topk_freq == 0`.
fn indexer_types(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<IndexerKind>> {
    let parse_kind = |t: &str, field: &str| match t {
        "full" | "F" => Ok(IndexerKind::Full),
        "shared" | "S" => Ok(IndexerKind::Shared),
        other => Err(Error::invalid(field, format!("unknown indexer type {other:?}"))),
    };
    if let Some(items) = string_list(cfg, "indexer_types")? {
        return items.iter().map(|t| parse_kind(t, "indexer_types")).collect();
    }
    match cfg.map.get("index_topk_pattern") {
        Some(Value::String(pattern)) => {
            return pattern.chars().map(|c| parse_kind(&c.to_string(), "index_topk_pattern")).collect();
        }
        Some(Value::Array(_)) => {
            let items = string_list(cfg, "index_topk_pattern")?.unwrap_or_default();
            return items.iter().map(|t| parse_kind(t, "index_topk_pattern")).collect();
        }
        _ => {}
    }
    let freq = cfg.usize("index_topk_freq")?.unwrap_or(1).max(1) as i64;
    let offset = cfg.usize("index_skip_topk_offset")?.unwrap_or(2) as i64;
    Ok((0..num_layers as i64)
        .map(|l| if (l - offset + 1).max(0) % freq == 0 { IndexerKind::Full } else { IndexerKind::Shared })
        .collect())
}

fn string_list(cfg: &Fields<'_>, key: &str) -> Result<Option<Vec<String>>> {
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

/// The MLA-specific invariants (the common ones are checked by the caller).
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
    // The layer pattern must be expressible in the family's config.json.
    if spec.family != Family::GlmMoeDsa {
        let dense = spec.layers.iter().take_while(|&&k| k == LayerKind::Dense).count();
        if spec.layers[dense..].contains(&LayerKind::Dense) {
            return Err(Error::invalid("first_k_dense_replace", "dense layers must all come first"));
        }
    }
    match (&spec.dsa, spec.family) {
        (Some(dsa), Family::GlmMoeDsa) => validate_dsa(spec, mla, dsa),
        (None, Family::DeepseekV3 | Family::KimiK25) => Ok(()),
        _ => Err(Error::invalid("index_topk", format!("{} and DSA: only glm_moe_dsa has an indexer", spec.family))),
    }
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

fn validate_dsa(spec: &ModelSpec, mla: &MlaSpec, dsa: &DsaSpec) -> Result<()> {
    if mla.q_lora_rank.is_none() {
        return Err(Error::invalid("q_lora_rank", "the DSA indexer reads the compressed query"));
    }
    if dsa.index_topk == 0 || dsa.index_n_heads == 0 {
        return Err(Error::invalid("index_topk", "index_topk and index_n_heads must be > 0"));
    }
    if dsa.index_head_dim < mla.qk_rope_head_dim {
        return Err(Error::invalid(
            "index_head_dim",
            format!("{} is narrower than qk_rope_head_dim {}", dsa.index_head_dim, mla.qk_rope_head_dim),
        ));
    }
    if dsa.indexer_types.len() != spec.num_layers {
        return Err(Error::invalid(
            "indexer_types",
            format!("{} entries for {} layers", dsa.indexer_types.len(), spec.num_layers),
        ));
    }
    if dsa.indexer_types.first() == Some(&IndexerKind::Shared) {
        return Err(Error::invalid("indexer_types", "the first layer has no earlier selection to share"));
    }
    Ok(())
}

/// config.json (5.x spelling) that transformers loads and that parses back
/// to an equal spec.
pub(super) fn to_config_json(spec: &ModelSpec) -> Value {
    let Some(mla) = &spec.mla else {
        // validate() guarantees MLA dimensions for these families.
        return Value::Null;
    };
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
    if let Some(dsa) = &spec.dsa {
        let kinds: Vec<&str> =
            spec.layers.iter().map(|k| if *k == LayerKind::Dense { "dense" } else { "sparse" }).collect();
        c.insert("mlp_layer_types".into(), json!(kinds));
        c.insert("index_topk".into(), json!(dsa.index_topk));
        c.insert("index_head_dim".into(), json!(dsa.index_head_dim));
        c.insert("index_n_heads".into(), json!(dsa.index_n_heads));
        c.insert("indexer_types".into(), json!(dsa.indexer_types));
    } else {
        c.insert("rope_interleave".into(), json!(mla.rope_interleave));
    }
    if spec.family != Family::KimiK25 {
        return Value::Object(c);
    }
    // The text model nests under the vision-language wrapper, which owns
    // tying and the special ids.
    c.insert("model_type".into(), json!("deepseek_v3"));
    c.remove("architectures");
    c.remove("dtype");
    let mut outer = Map::new();
    outer.insert("architectures".into(), json!([spec.family.architecture()]));
    outer.insert("model_type".into(), json!(spec.family.model_type()));
    outer.insert("dtype".into(), json!("float32"));
    for key in ["tie_word_embeddings", "bos_token_id", "eos_token_id"] {
        if let Some(v) = c.get(key) {
            outer.insert(key.into(), v.clone());
        }
    }
    outer.insert("text_config".into(), Value::Object(c));
    Value::Object(outer)
}
