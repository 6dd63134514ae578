//! GLM-5.3-Flash (`glm5_next`, `Glm5NextConfig` / `Glm5NextTextConfig` of
//! transformers 5.23): three Kimi Delta Attention layers (forget gate
//! bounded below by `linear_lower_bound`) for every Multi-head Latent
//! Attention layer, which has no RoPE and is sparse through a DSA indexer
//! over pools of `index_kpool` tokens (own or shared); hyper-connections
//! (`hc_mult` residual streams, their mean at the head); SwiGLU clamped at
//! `swiglu_limit` in every MLP; DeepSeek-V3's grouped sigmoid router; three
//! dense layers first. Published as the multimodal wrapper (the text
//! config in `text_config`, tensors under `model.language_model.`, the
//! vision tower not loaded) or flat (the text fields at the top, which
//! `Glm5NextConfig` forwards to its text config); the text model alone is
//! `glm5_next_text`, for which transformers has no causal-LM class.

use serde_json::{Map, Value, json};

use super::glm_moe_dsa::indexer_types;
use super::known::{ConfigKeys, HF_INERT, Known, QUANTIZATION, ROPE};
use super::mla::string_list;
use super::{CORE_READ, Family, FamilyDef, Naming, mla, stack};
use crate::error::{Error, Result};
use crate::spec::MtpForm;
use crate::spec::fields::Fields;
use crate::spec::limits::{self, MAX_HEAD_DIM, MAX_HEADS};
use crate::spec::{
    FfnKind, FfnSpec, GateActivation, GateRank, GdnDims, GdnProjections, GdnSpec, HyperHead, IndexerKind, IndexerSpec,
    LayerSpec, MixerSpec, MlaAttention, ModelArch, ResidualKind, SwiGlu,
};

pub(super) struct Glm5Next;

/// `Glm5NextTextConfig`'s defaults for the fields the MLA reader reads.
const DEFAULTS: mla::Defaults =
    mla::Defaults { rms_norm_eps: 1e-5, max_position_embeddings: 1_048_576, n_group: 1, topk_group: 1 };

/// `Glm5NextTextConfig`'s defaults where the MLA reader has none or
/// DeepSeek-V3's differ (the published model's sizes).
fn class_defaults() -> [(&'static str, Value); 17] {
    [
        ("vocab_size", json!(154_880)),
        ("hidden_size", json!(4096)),
        ("intermediate_size", json!(12_288)),
        ("moe_intermediate_size", json!(2048)),
        ("num_hidden_layers", json!(45)),
        ("num_attention_heads", json!(64)),
        ("n_routed_experts", json!(288)),
        ("routed_scaling_factor", json!(2.5)),
        ("kv_lora_rank", json!(512)),
        ("q_lora_rank", json!(1536)),
        ("qk_rope_head_dim", json!(0)),
        ("v_head_dim", json!(256)),
        ("qk_nope_head_dim", json!(256)),
        ("num_experts_per_tok", json!(8)),
        ("bos_token_id", Value::Null),
        ("eos_token_id", Value::Null),
        ("first_k_dense_replace", json!(DENSE_LAYERS)),
    ]
}

/// Dense layers before the sparse ones when `mlp_layer_types` is not given.
const DENSE_LAYERS: usize = 3;

/// Every fourth layer (the fourth, eighth, …) is MLA when `layer_types` is
/// not given (`idx % 4 != 3` is KDA).
const MLA_EVERY: usize = 4;

/// The KDA keys: `(Glm5NextTextConfig's, linear_attn_config's, default)`.
const LINEAR_DIMS: [(&str, &str, usize); 3] = [
    ("linear_num_heads", "num_heads", 64),
    ("linear_head_dim", "head_dim", 128),
    ("linear_conv_kernel_dim", "short_conv_kernel_size", 4),
];

/// `linear_lower_bound`'s default, and the bound `safe_gate` restores.
const LOWER_BOUND: f64 = -5.0;

/// The hyper-connections' defaults: `hc_mult`, `hc_sinkhorn_iters`, `hc_eps`.
const HC_DEFAULTS: (usize, usize, f64) = (4, 20, 1e-6);

/// The indexer's defaults: `index_topk`, `index_head_dim`, `index_n_heads`,
/// `index_kpool`.
const INDEX_DEFAULTS: (usize, usize, usize, usize) = (2048, 128, 32, 16);

/// The keys `Glm5NextTextConfig` reads, beyond the MLA families' own.
const GLM_READ: &[&str] = &[
    "mlp_layer_types",
    "layer_types",
    "indexer_types",
    "index_topk_pattern",
    "index_topk_freq",
    "index_skip_topk_offset",
    "index_topk",
    "index_head_dim",
    "index_n_heads",
    "index_kpool",
    "index_kpool_always_select_tail",
    "swiglu_limit",
    "hc_mult",
    "hc_eps",
    "hc_sinkhorn_iters",
    "linear_num_heads",
    "linear_head_dim",
    "linear_conv_kernel_dim",
    "linear_lower_bound",
];

/// Objects of the text model's config read key by key: the hub's
/// `linear_attn_config`, a quantization, and a rope object, which
/// transformers ignores (the model has no RoPE) and which the MLA reader
/// only checks.
const TEXT_NESTED: &[(&str, &ConfigKeys)] = &[
    ("linear_attn_config", &LINEAR_ATTN_CONFIG),
    ("rope_parameters", &ROPE),
    ("rope_scaling", &ROPE),
    ("quantization_config", &QUANTIZATION),
];

/// The text model's keys (`Glm5NextTextConfig`), in `text_config` or at
/// the top of a flat or text-only config.
const TEXT: ConfigKeys = ConfigKeys {
    read: &[CORE_READ, mla::READ, GLM_READ],
    inert: &[HF_INERT, mla::INERT, mla::MTP_KEYS, NO_ROPE_INERT],
    nested: TEXT_NESTED,
};

/// Without RoPE, the MLA reader's `rope_interleave` changes nothing.
const NO_ROPE_INERT: &[&str] = &["rope_interleave"];

/// The hub's `linear_attn_config`.
const LINEAR_ATTN_CONFIG: ConfigKeys = ConfigKeys {
    read: &[&["num_heads", "head_dim", "short_conv_kernel_size", "gate_lower_bound", "safe_gate"]],
    inert: &[],
    nested: &[],
};

/// The wrapper's keys (`Glm5NextConfig`) that change nothing the text
/// model computes: the vision tower's config and the media token ids.
const WRAPPER_INERT: &[&str] = &[
    "vision_config",
    "image_token_id",
    "video_token_id",
    "image_start_token_id",
    "image_end_token_id",
    "video_start_token_id",
    "video_end_token_id",
];

/// What a glm5_next checkpoint may hold: the wrapper's keys with the text
/// model's nested in `text_config` or at the top (`Glm5NextConfig` reads a
/// flat config as its text config), the vision tower and the
/// multi-token-prediction layer (past the last decoder layer, with its
/// `shared_head`), which are not loaded.
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[CORE_READ, mla::READ, GLM_READ],
        inert: &[HF_INERT, mla::INERT, mla::MTP_KEYS, NO_ROPE_INERT, WRAPPER_INERT],
        nested: &[
            ("text_config", &TEXT),
            ("linear_attn_config", &LINEAR_ATTN_CONFIG),
            ("rope_parameters", &ROPE),
            ("rope_scaling", &ROPE),
            ("quantization_config", &QUANTIZATION),
        ],
    },
    unused_tensors: &["model.visual.*", "*.shared_head.*"],
    extra_layers_unused: true,
};

/// `model_type` of the text model alone.
const TEXT_MODEL_TYPE: &str = "glm5_next_text";

const NAMING: Naming = Naming {
    model_prefix: "model.language_model.",
    lm_head: "lm_head.weight",
    moe_module: "mlp",
    expert_projections: ["gate_proj", "up_proj", "down_proj"],
    // A text-only checkpoint, saved without the wrapper.
    aliases: &[("model.language_model.", "model.")],
    saved_as: &[],
};

/// The text model's fields (`text`, under `prefix`) with the class
/// defaults filled in, and `linear_attn_config`'s spellings read into the
/// class fields, which it overrides (`Glm5NextTextConfig.__post_init__`).
fn normalized(text: &Map<String, Value>, prefix: &'static str) -> Result<Map<String, Value>> {
    let mut map = text.clone();
    for (key, default) in class_defaults() {
        map.entry(key).or_insert(default);
    }
    let cfg = Fields { map: text, prefix };
    if let Some(linear) = cfg.object("linear_attn_config")? {
        let nested = if prefix.is_empty() { "linear_attn_config." } else { "text_config.linear_attn_config." };
        let linear = Fields { map: linear, prefix: nested };
        for (field, key, _) in LINEAR_DIMS {
            if let Some(v) = linear.raw(key) {
                map.insert(field.to_owned(), v.clone());
            }
        }
        if let Some(bound) = linear.raw("gate_lower_bound") {
            map.insert("linear_lower_bound".to_owned(), bound.clone());
        }
        // `safe_gate` (true unless said) restores the default bound.
        if linear.bool("safe_gate")?.unwrap_or(true) && map.get("linear_lower_bound").is_some_and(Value::is_null) {
            map.insert("linear_lower_bound".to_owned(), json!(LOWER_BOUND));
        }
    }
    Ok(map)
}

/// Whether each layer is MLA: `layer_types` (`"linear_attention"`, or
/// `"indexed_attention"` / `"full_attention"`), else every
/// [`MLA_EVERY`]-th.
fn mla_layers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<bool>> {
    let Some(listed) = string_list(cfg, "layer_types")? else {
        return Ok((0..num_layers).map(|l| l % MLA_EVERY == MLA_EVERY - 1).collect());
    };
    if listed.len() != num_layers {
        return Err(Error::invalid("layer_types", format!("{} entries for {num_layers} layers", listed.len())));
    }
    listed
        .iter()
        .map(|t| match t.as_str() {
            "linear_attention" => Ok(false),
            "indexed_attention" | "full_attention" => Ok(true),
            other => Err(Error::invalid(
                "layer_types",
                format!("{other:?} is not \"linear_attention\" or \"indexed_attention\""),
            )),
        })
        .collect()
}

/// `mlp_layer_types` ("dense" / "sparse"), else [`DENSE_LAYERS`] dense
/// layers first.
fn ffn_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<FfnKind>> {
    let Some(listed) = string_list(cfg, "mlp_layer_types")? else {
        return Ok((0..num_layers).map(|l| if l < DENSE_LAYERS { FfnKind::Dense } else { FfnKind::Moe }).collect());
    };
    if listed.len() != num_layers {
        return Err(Error::invalid("mlp_layer_types", format!("{} entries for {num_layers} layers", listed.len())));
    }
    listed
        .iter()
        .map(|t| match t.as_str() {
            "dense" => Ok(FfnKind::Dense),
            "sparse" => Ok(FfnKind::Moe),
            other => Err(Error::invalid("mlp_layer_types", format!("{other:?} is not \"dense\" or \"sparse\""))),
        })
        .collect()
}

/// The KDA layers' block: the dimensions, the output norm's eps and the
/// forget gate's bound (a config without one, `safe_gate: false`, is
/// Kimi's unbounded gate, which GLM-5.3-Flash does not publish: refused).
fn kda(cfg: &Fields<'_>, eps: f32) -> Result<GdnSpec> {
    let read = |(field, _, default): (&str, &str, usize)| -> Result<usize> { Ok(cfg.usize(field)?.unwrap_or(default)) };
    let heads = limits::at_most("linear_num_heads", read(LINEAR_DIMS[0])?, MAX_HEADS)?;
    let head_dim = limits::at_most("linear_head_dim", read(LINEAR_DIMS[1])?, MAX_HEAD_DIM)?;
    let dims = GdnDims {
        num_k_heads: heads,
        num_v_heads: heads,
        head_k_dim: head_dim,
        head_v_dim: head_dim,
        conv_kernel: limits::at_most("linear_conv_kernel_dim", read(LINEAR_DIMS[2])?, 64)?,
        projections: GdnProjections::Kimi,
    };
    let bound = match cfg.raw("linear_lower_bound") {
        None => LOWER_BOUND,
        Some(Value::Null) => {
            return Err(Error::invalid("linear_lower_bound", "an unbounded forget gate is not supported"));
        }
        Some(_) => cfg.req_f64("linear_lower_bound")?,
    };
    Ok(GdnSpec {
        dims,
        eps,
        gate_lower_bound: Some(bound as f32),
        output_gate: GateActivation::Sigmoid,
        output_gate_rank: GateRank::Low,
        a_log_padded_to: None,
    })
}

/// Each layer's indexer (`indexer_types` and its spellings, as GLM-5
/// reads them), over pools of `index_kpool` tokens; the tail of the open
/// pool is always selected (`index_kpool_always_select_tail: false` is
/// refused).
fn indexers(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<IndexerSpec>> {
    if cfg.bool("index_kpool_always_select_tail")? == Some(false) {
        return Err(Error::invalid("index_kpool_always_select_tail", "only the default, true, is supported"));
    }
    let (topk, head_dim, n_heads, pool) = INDEX_DEFAULTS;
    let read = |key: &str, default: usize| -> Result<usize> { Ok(cfg.usize(key)?.unwrap_or(default)) };
    let (topk, head_dim, n_heads, pool) = (
        read("index_topk", topk)?,
        read("index_head_dim", head_dim)?,
        read("index_n_heads", n_heads)?,
        read("index_kpool", pool)?,
    );
    let kinds = indexer_types(cfg, num_layers)?;
    if kinds.len() != num_layers {
        return Err(Error::invalid("indexer_types", format!("{} entries for {num_layers} layers", kinds.len())));
    }
    Ok(kinds.into_iter().map(|kind| IndexerSpec { kind, topk, head_dim, n_heads, pool: Some(pool) }).collect())
}

/// The hyper-connections every layer has (`hc_mult` streams, averaged at
/// the head).
fn hyper_connections(cfg: &Fields<'_>) -> Result<ResidualKind> {
    let (streams, sinkhorn_iters, eps) = HC_DEFAULTS;
    Ok(ResidualKind::HyperConnections {
        streams: cfg.usize("hc_mult")?.unwrap_or(streams),
        sinkhorn_iters: cfg.usize("hc_sinkhorn_iters")?.unwrap_or(sinkhorn_iters),
        eps: cfg.f64("hc_eps")?.unwrap_or(eps) as f32,
        head: HyperHead::Mean,
    })
}

impl FamilyDef for Glm5Next {
    fn model_type(&self) -> &'static str {
        "glm5_next"
    }

    fn also_reads(&self) -> &'static [&'static str] {
        &[TEXT_MODEL_TYPE]
    }

    fn architecture(&self) -> &'static str {
        "Glm5NextForConditionalGeneration"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let top = Fields { map: root, prefix: "" };
        let (text, prefix) = match top.object("text_config")? {
            Some(text) => (text, "text_config."),
            None => (root, ""),
        };
        let map = normalized(text, prefix)?;
        let cfg = Fields { map: &map, prefix };
        let mut parsed = mla::parse(&cfg, Family::Glm5Next, &DEFAULTS)?;
        let num_layers = parsed.kinds.len();
        let eps = parsed.core.final_norm.eps();
        let limit = cfg.f64("swiglu_limit")?.unwrap_or(SWIGLU_LIMIT) as f32;
        parsed.ffns.moe.swiglu = SwiGlu::Limited { limit };
        // No RoPE anywhere; the latent norms take rms_norm_eps.
        let attention = MlaAttention { rope: None, latent_norm_eps: eps, ..parsed.attention };
        let (mla_layers, indexers) = (mla_layers(&cfg, num_layers)?, indexers(&cfg, num_layers)?);
        let kda = kda(&cfg, eps)?;
        let mixer = |l: usize| match mla_layers[l] {
            true => MixerSpec::Mla(MlaAttention { indexer: Some(indexers[l]), ..attention }),
            false => MixerSpec::GatedDeltaNet(kda),
        };
        let mut layers = stack(&ffn_kinds(&cfg, num_layers)?, &parsed.ffns, parsed.core.final_norm, mixer)?;
        let residual = hyper_connections(&cfg)?;
        layers.iter_mut().for_each(|layer| layer.residual = residual);
        let mut core = parsed.core;
        if let Some(tie) = top.bool("tie_word_embeddings")? {
            // The wrapper's own (class default false) decides.
            core.tie_word_embeddings = tie;
        }
        Ok(ModelArch { core, layers, mtp: Vec::new(), mtp_form: MtpForm::DEEPSEEK_V3 })
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        for (l, layer) in arch.layers.iter().enumerate() {
            match &layer.mixer {
                // transformers requires NoPE (`qk_rope_head_dim` 0) too.
                MixerSpec::Mla(mla) if mla.dims.qk_rope_head_dim > 0 => {
                    return Err(Error::invalid("qk_rope_head_dim", "glm5_next has no RoPE: must be 0"));
                }
                MixerSpec::Mla(mla) if mla.rope.is_none() && mla.indexer.is_some_and(|ix| ix.pool.is_some()) => {}
                MixerSpec::GatedDeltaNet(gdn)
                    if gdn.dims.projections == GdnProjections::Kimi && gdn.gate_lower_bound.is_some() => {}
                _ => return Err(Error::invalid("layer_types", "glm5_next has only KDA and pooled sparse MLA layers")),
            }
            if shares_without_a_full_layer_before(arch, l) {
                return Err(Error::invalid(
                    "indexer_types",
                    format!("layer {l} shares the selection of the layer before it, which is not a full MLA layer"),
                ));
            }
            mla::validate_ffn(&layer.ffn)?;
        }
        if arch.first_mla().is_none() {
            // Its config.json carries the latent dimensions, which only an
            // MLA layer says.
            return Err(Error::invalid("layer_types", "glm5_next needs an indexed_attention layer"));
        }
        Ok(())
    }

    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value {
        let (Some(attention), Some(kda)) = (arch.first_mla(), arch.first_gdn()) else {
            return arch.first_mla().map_or(Value::Null, |a| Value::Object(mla::config_json(arch, a)));
        };
        let mut text = mla::config_json(arch, attention);
        text.insert("model_type".into(), json!(TEXT_MODEL_TYPE));
        let d = kda.dims;
        for ((field, _, _), value) in LINEAR_DIMS.into_iter().zip([d.num_v_heads, d.head_k_dim, d.conv_kernel]) {
            text.insert(field.into(), json!(value));
        }
        text.insert("linear_lower_bound".into(), json!(kda.gate_lower_bound));
        let is_mla = |l: &LayerSpec| matches!(l.mixer, MixerSpec::Mla(_));
        let types: Vec<&str> =
            arch.layers.iter().map(|l| if is_mla(l) { "indexed_attention" } else { "linear_attention" }).collect();
        text.insert("layer_types".into(), json!(types));
        let kinds: Vec<&str> =
            arch.layer_kinds().iter().map(|k| if *k == FfnKind::Dense { "dense" } else { "sparse" }).collect();
        text.insert("mlp_layer_types".into(), json!(kinds));
        if let Some(ix) = attention.indexer {
            // Every layer has an entry; a KDA layer's is never read.
            let kinds: Vec<IndexerKind> = arch
                .layers
                .iter()
                .map(|l| match &l.mixer {
                    MixerSpec::Mla(mla) => mla.indexer.map_or(IndexerKind::Full, |ix| ix.kind),
                    _ => IndexerKind::Full,
                })
                .collect();
            text.insert("indexer_types".into(), json!(kinds));
            text.insert("index_topk".into(), json!(ix.topk));
            text.insert("index_head_dim".into(), json!(ix.head_dim));
            text.insert("index_n_heads".into(), json!(ix.n_heads));
            text.insert("index_kpool".into(), json!(ix.pool));
        }
        // The config has one `swiglu_limit` for every SwiGLU of the model.
        let swiglu = arch.layers.first().map(|layer| match layer.ffn {
            FfnSpec::Dense { swiglu, .. } => swiglu,
            FfnSpec::Moe(moe) => moe.swiglu,
        });
        if let Some(SwiGlu::Limited { limit }) = swiglu {
            text.insert("swiglu_limit".into(), json!(limit));
        }
        if let ResidualKind::HyperConnections { streams, sinkhorn_iters, eps, .. } = arch.residual() {
            text.insert("hc_mult".into(), json!(streams));
            text.insert("hc_sinkhorn_iters".into(), json!(sinkhorn_iters));
            text.insert("hc_eps".into(), json!(eps));
        }
        // Glm5NextTextConfig's default pad id (154820) lies outside any
        // smaller vocabulary, and transformers refuses to build such an
        // embedding: the source's pad id is kept, else none is named.
        let source_text = source.map(|s| s.get("text_config").unwrap_or(s));
        let pad = source_text.and_then(|t| t.get("pad_token_id")).cloned().unwrap_or(Value::Null);
        text.insert("pad_token_id".into(), pad);
        // Back into the wrapper the checkpoint came in, vision config and
        // all, or a wrapper of the text model alone.
        let wrapper = source.and_then(Value::as_object).filter(|s| s.contains_key("text_config"));
        let mut c = wrapper.cloned().unwrap_or_default();
        c.insert("model_type".into(), json!(self.model_type()));
        c.insert("tie_word_embeddings".into(), json!(arch.core.tie_word_embeddings));
        c.insert("text_config".into(), Value::Object(text));
        c.insert("architectures".into(), json!([self.architecture()]));
        c.insert("dtype".into(), json!("float32"));
        Value::Object(c)
    }
}

/// The SwiGLU clamp when `swiglu_limit` is not given.
const SWIGLU_LIMIT: f64 = 10.0;

/// Whether layer `l` shares a selection without a full indexed layer right
/// before it (transformers passes only the previous layer's).
fn shares_without_a_full_layer_before(arch: &ModelArch, l: usize) -> bool {
    let kind = |layer: usize| match &arch.layers[layer].mixer {
        MixerSpec::Mla(mla) => mla.indexer.map(|ix| ix.kind),
        _ => None,
    };
    kind(l) == Some(IndexerKind::Shared) && (l == 0 || kind(l - 1) != Some(IndexerKind::Full))
}
