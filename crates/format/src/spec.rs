//! The typed, validated description of a model architecture ([`ModelArch`]:
//! its common part and one [`LayerSpec`] per layer), built from a Hugging
//! Face `config.json` by the family's file; and [`ModelSpec`], the flat form
//! manifests of earlier versions store, frozen.
//!
//! Two spellings of config.json exist in the wild and both are accepted:
//!
//! * transformers 4.x / most Hub repos: `torch_dtype`, top-level `rope_theta`,
//!   `rope_scaling: {type|rope_type, factor}`;
//! * transformers 5.x `save_pretrained`: `dtype`,
//!   `rope_parameters: {rope_type, rope_theta, ...}`.
//!
//! Each family's fields and defaults are in its own file under
//! `crate::family`; defaults mirror the transformers 5.23 config classes for
//! scalar hyper-parameters. Fields that fix tensor shapes (`hidden_size`, `vocab_size`, expert counts, ...) are
//! required instead: the class defaults there describe one arbitrary model
//! size, and silently assuming them would only move the error to a confusing
//! shape mismatch later.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
pub use crate::family::Family;
use fields::{Fields, as_u32};
pub use limits::{
    MAX_EOS_TOKENS, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_MANIFEST_BYTES,
    MAX_POSITIONS, MAX_SINKHORN_ITERS, MAX_STREAMS, MAX_TOKENIZER_BYTES, MAX_VOCAB, read_at_most,
};

/// Where RMSNorm is applied to queries and keys (before RoPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// No q/k normalization (mixtral).
    None,
    /// One RMSNorm over the whole projection: q over `num_heads * head_dim`,
    /// k over `num_kv_heads * head_dim` (olmoe).
    Full,
    /// RMSNorm over each head's `head_dim` slice with one shared weight of
    /// length `head_dim` (qwen3_moe).
    PerHead,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type: "default"`).
    None,
    /// Position interpolation: positions are divided by `factor`.
    Linear { factor: f64 },
    /// YaRN (`_compute_yarn_parameters`), accepted for the MLA families.
    /// Values are as transformers resolves them: `beta_fast`/`beta_slow`
    /// already defaulted (32/1), `mscale`/`mscale_all_dim` 0 when not given
    /// (transformers tests them for truthiness, so 0 and absent agree).
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        mscale: f64,
        mscale_all_dim: f64,
        /// Overrides the cos/sin scaling derived from `mscale`s.
        #[serde(default)]
        attention_factor: Option<f64>,
        /// Round the correction range outward to whole dimensions.
        #[serde(default = "yes")]
        truncate: bool,
    },
}

fn yes() -> bool {
    true
}

impl RopeScaling {
    /// The YaRN cos/sin multiplier (`attention_factor`), 1 for other types.
    pub fn attention_factor(&self) -> f64 {
        match *self {
            RopeScaling::Yarn { factor, mscale, mscale_all_dim, attention_factor, .. } => {
                attention_factor.unwrap_or(if mscale != 0.0 && mscale_all_dim != 0.0 {
                    yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                } else {
                    yarn_mscale(factor, 1.0)
                })
            }
            RopeScaling::None | RopeScaling::Linear { .. } => 1.0,
        }
    }

    /// The multiplier of the MLA softmax scale (`yarn_apply_mscale`):
    /// `mscale(factor, mscale_all_dim)^2` for YaRN with `mscale_all_dim`.
    pub fn softmax_scale_factor(&self) -> f64 {
        match *self {
            RopeScaling::Yarn { factor, mscale_all_dim, .. } if mscale_all_dim != 0.0 => {
                let m = yarn_mscale(factor, mscale_all_dim);
                m * m
            }
            _ => 1.0,
        }
    }
}

/// `get_mscale(scale, mscale)` of transformers' YaRN code.
fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 }
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    /// Base wavelength (`rope_theta`).
    pub theta: f64,
    pub scaling: RopeScaling,
    /// Leading dimensions of each head that are rotated (`head_dim` unless a
    /// `partial_rotary_factor` says otherwise). Always even.
    pub rotary_dim: usize,
}

/// What the feed-forward block of one decoder layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FfnKind {
    /// A dense SwiGLU MLP of `dense_intermediate_size` (qwen3_moe only).
    Dense,
    /// A routed mixture of experts.
    Moe,
}

/// What an RMSNorm multiplies the normalised row by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormStyle {
    /// `w · x̂` (Llama).
    #[default]
    Weight,
    /// `(1 + w) · x̂`: weights stored centred at zero (Qwen3-Next, Qwen3.5).
    OnePlusWeight,
}

impl NormStyle {
    fn is_weight(&self) -> bool {
        *self == NormStyle::Weight
    }
}

/// The routed-experts hyper-parameters shared by every MoE layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeSpec {
    pub num_experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of each expert's SwiGLU hidden layer.
    pub intermediate_size: usize,
    /// Renormalize the top-k softmax probabilities to sum to 1.
    pub norm_topk_prob: bool,
}

/// How a router turns its logits into expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoringFunc {
    /// Softmax over all experts (olmoe, qwen3_moe, mixtral).
    #[default]
    Softmax,
    /// An independent sigmoid per expert (DeepSeek-V3's `noaux_tc`).
    Sigmoid,
}

/// Routing beyond plain softmax top-k. The default is the GQA families'
/// router: softmax, one group, weights unscaled, no correction bias.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RouterSpec {
    pub scoring: ScoringFunc,
    /// Experts form `n_group` groups of consecutive experts; only experts of
    /// the `topk_group` best groups (ranked by the sum of their two best
    /// scores) may be chosen.
    pub n_group: usize,
    pub topk_group: usize,
    /// Multiplies the final routing weights.
    pub routed_scaling_factor: f64,
    /// Each MoE layer has an `e_score_correction_bias` (f32, one per expert)
    /// added to the scores for choosing experts, not for weighting them.
    pub score_correction_bias: bool,
}

impl Default for RouterSpec {
    fn default() -> Self {
        Self {
            scoring: ScoringFunc::Softmax,
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
            score_correction_bias: false,
        }
    }
}

/// The flat spec manifests of earlier versions store: frozen (no new
/// fields, ever); a layer's spec is derived from it in `legacy.rs` only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope: RopeSpec,
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix (no `lm_head.weight` stored).
    pub tie_word_embeddings: bool,
    /// q/k/v/o projections carry biases.
    pub attention_bias: bool,
    pub qk_norm: QkNorm,
    /// Clamp q, k, v to `[-c, c]` after projection (olmoe).
    pub clip_qkv: Option<f32>,
    /// Attend only to the last `w` positions.
    pub sliding_window: Option<usize>,
    pub moe: MoeSpec,
    /// Scoring, grouping and scaling of the routers (absent in manifests
    /// written before the MLA families: the softmax default).
    #[serde(default)]
    pub router: RouterSpec,
    /// Width of the shared experts every MoE layer applies besides the
    /// routed ones (`moe_intermediate_size * n_shared_experts`), if any.
    /// They are dense tensors, resident like attention.
    #[serde(default)]
    pub shared_intermediate_size: Option<usize>,
    /// Multi-head Latent Attention dimensions (MLA families only).
    #[serde(default)]
    pub mla: Option<MlaSpec>,
    /// The DSA lightning indexer (glm_moe_dsa only).
    #[serde(default)]
    pub dsa: Option<DsaSpec>,
    /// Width of the dense MLP used by [`FfnKind::Dense`] layers; the config's
    /// `intermediate_size` (equal to the expert width for olmoe/mixtral).
    pub dense_intermediate_size: usize,
    /// One entry per decoder layer.
    pub layers: Vec<FfnKind>,
    /// Each layer's token mixer (hybrid families); empty: every layer is
    /// full attention (and manifests written before hybrids keep meaning so).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mixers: Vec<LayerType>,
    /// The Gated DeltaNet layers' dimensions, on hybrid families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<GdnDims>,
    /// What every RMSNorm of the decoder (q/k norms included) does with its
    /// weight: `w · x̂` unless the family centres it at zero.
    #[serde(default, skip_serializing_if = "NormStyle::is_weight")]
    pub norm_style: NormStyle,
    /// Full attention multiplies its output by `sigmoid(gate)`, the gate a
    /// second half of each head's `q_proj` rows (Qwen3-Next, Qwen3.5).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attn_output_gate: bool,
    /// The shared expert's output is scaled by `sigmoid(shared_expert_gate · x)`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_expert_gate: bool,
    pub bos_token_id: Option<u32>,
    /// Every end-of-sequence id (`eos_token_id` may be an int or a list).
    pub eos_token_ids: Vec<u32>,
}

impl ModelSpec {
    /// The flat spec of a config.json document (4.x or 5.x spelling), as
    /// manifests of earlier versions store it: parsed and validated as
    /// [`ModelArch::from_config_json`], then [`ModelSpec::frozen`].
    pub fn from_config_json(text: &str) -> Result<ModelSpec> {
        ModelArch::from_config_json(text).and_then(|arch| ModelSpec::frozen(&arch))
    }

    /// As [`ModelSpec::from_config_json`], from an already parsed document.
    pub fn from_config_value(value: &Value) -> Result<ModelSpec> {
        ModelArch::from_config_value(value).and_then(|arch| ModelSpec::frozen(&arch))
    }

    /// Width of the concatenated query heads: `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Whether decoder layer `layer` is a MoE layer.
    pub fn is_moe(&self, layer: usize) -> bool {
        self.layers.get(layer) == Some(&FfnKind::Moe)
    }

    /// Indices of the MoE layers, ascending.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_layers).filter(|&l| self.is_moe(l)).collect()
    }

    /// A transformers-loadable config.json (5.x spelling, `dtype: float32`)
    /// that parses back to an equal spec.
    pub fn to_config_json(&self) -> Value {
        self.arch().to_config_json()
    }

    /// As [`ModelSpec::to_config_json`], keeping what the spec does not
    /// describe (a vision tower's config, say) from `source`, the config the
    /// model was converted from.
    pub fn to_config_json_from(&self, source: &Value) -> Value {
        self.arch().to_config_json_from(source)
    }
}

/// The config.json keys every family writes the same way: the common part,
/// the attention heads `(num_attention_heads, num_key_value_heads)` and the
/// rotary embedding, whose `partial_rotary_factor` is relative to
/// `rotated_dim`.
pub(crate) fn common_config(
    core: &CoreSpec,
    num_layers: usize,
    (num_heads, num_kv_heads): (usize, usize),
    rope_spec: &RopeSpec,
    rotated_dim: usize,
) -> Map<String, Value> {
    let mut rope = Map::new();
    match rope_spec.scaling {
        RopeScaling::None => {
            rope.insert("rope_type".into(), json!("default"));
        }
        RopeScaling::Linear { factor } => {
            rope.insert("rope_type".into(), json!("linear"));
            rope.insert("factor".into(), json!(factor));
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            attention_factor,
            truncate,
        } => {
            rope.insert("rope_type".into(), json!("yarn"));
            rope.insert("factor".into(), json!(factor));
            rope.insert("original_max_position_embeddings".into(), json!(original_max_position_embeddings));
            rope.insert("beta_fast".into(), json!(beta_fast));
            rope.insert("beta_slow".into(), json!(beta_slow));
            // 0 stands for "not given" (see RopeScaling::Yarn).
            for (key, value) in [("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
                if value != 0.0 {
                    rope.insert(key.into(), json!(value));
                }
            }
            if let Some(a) = attention_factor {
                rope.insert("attention_factor".into(), json!(a));
            }
            if !truncate {
                rope.insert("truncate".into(), json!(false));
            }
        }
    }
    rope.insert("rope_theta".into(), json!(rope_spec.theta));
    if rope_spec.rotary_dim != rotated_dim {
        rope.insert("partial_rotary_factor".into(), json!(rope_spec.rotary_dim as f64 / rotated_dim as f64));
    }

    let eos = match core.eos_token_ids.as_slice() {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    };
    let mut c = Map::new();
    c.insert("architectures".into(), json!([core.family.architecture()]));
    c.insert("model_type".into(), json!(core.family.model_type()));
    c.insert("dtype".into(), json!("float32"));
    c.insert("vocab_size".into(), json!(core.vocab_size));
    c.insert("hidden_size".into(), json!(core.hidden_size));
    c.insert("num_hidden_layers".into(), json!(num_layers));
    c.insert("num_attention_heads".into(), json!(num_heads));
    c.insert("num_key_value_heads".into(), json!(num_kv_heads));
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("max_position_embeddings".into(), json!(core.max_position_embeddings));
    c.insert("rms_norm_eps".into(), json!(f32_to_json(core.final_norm.eps())));
    c.insert("rope_parameters".into(), Value::Object(rope));
    c.insert("tie_word_embeddings".into(), json!(core.tie_word_embeddings));
    c.insert("bos_token_id".into(), json!(core.bos_token_id));
    c.insert("eos_token_id".into(), eos);
    c
}

/// An f32 as the JSON number with its shortest decimal spelling (`1e-5`,
/// not `9.999999747378752e-6`), so exported configs read like the originals.
pub(crate) fn f32_to_json(x: f32) -> f64 {
    x.to_string().parse::<f64>().unwrap_or(f64::from(x))
}

/// `bos_token_id` and every `eos_token_id` (an int or a list), with the
/// class defaults when absent; `null` means none.
pub(crate) fn special_tokens(
    cfg: &Fields<'_>,
    (default_bos, default_eos): (Option<u32>, Vec<u32>),
) -> Result<(Option<u32>, Vec<u32>)> {
    let bos_token_id = match cfg.raw("bos_token_id") {
        None => default_bos,
        Some(_) => cfg.u32("bos_token_id")?,
    };
    let eos_token_ids = match cfg.raw("eos_token_id") {
        None => default_eos,
        Some(Value::Null) => vec![],
        Some(Value::Array(items)) => items.iter().map(|v| as_u32(v, "eos_token_id")).collect::<Result<_>>()?,
        Some(v) => vec![as_u32(v, "eos_token_id")?],
    };
    Ok((bos_token_id, eos_token_ids))
}

/// Reads the expert count under the family's `own` name or its `alias`,
/// rejecting a config where both are given and disagree.
pub(crate) fn expert_count(cfg: &Fields<'_>, (own, alias): (&str, &str)) -> Result<usize> {
    match (cfg.usize(own)?, cfg.usize(alias)?) {
        (Some(a), Some(b)) if a != b => Err(Error::invalid(own, format!("{own} = {a} contradicts {alias} = {b}"))),
        (Some(n), _) | (None, Some(n)) => Ok(n),
        (None, None) => Err(Error::MissingField { field: own.to_owned() }),
    }
}

/// Resolves RoPE parameters the way `convert_rope_params_to_dict` does in
/// transformers 5.x: a non-null legacy `rope_scaling` wins over
/// `rope_parameters`; `rope_theta` inside the dict wins over the top-level
/// one, which wins over the class default.
///
/// `default_theta` is the family's class default; YaRN is accepted only
/// where `allow_yarn` says so.
pub(crate) fn parse_rope(
    cfg: &Fields<'_>,
    default_theta: f64,
    allow_yarn: bool,
    head_dim: usize,
    max_position_embeddings: usize,
) -> Result<RopeSpec> {
    let (params, prefix) = match (cfg.object("rope_scaling")?, cfg.object("rope_parameters")?) {
        (Some(p), _) => (Some(p), "rope_scaling."),
        (None, Some(p)) => (Some(p), "rope_parameters."),
        // No object: its keys are all absent, named as 5.x spells them.
        (None, None) => (None, "rope_parameters."),
    };
    let empty = Map::new();
    let p = Fields { map: params.unwrap_or(&empty), prefix };
    let theta = match p.f64("rope_theta")? {
        Some(t) => t,
        None => cfg.f64("rope_theta")?.unwrap_or(default_theta),
    };
    let rope_type = match p.str("rope_type")? {
        Some(t) => t,
        None => p.str("type")?.unwrap_or("default"),
    };
    let scaling = match rope_type {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: p.req_f64("factor")? },
        "yarn" if allow_yarn => parse_yarn(cfg, &p, max_position_embeddings)?,
        other => {
            return Err(Error::UnsupportedRope { rope_type: other.to_owned() });
        }
    };
    let partial = match p.f64("partial_rotary_factor")? {
        Some(f) => Some(f),
        None => cfg.f64("partial_rotary_factor")?,
    };
    let rotary_dim = match partial {
        None => head_dim,
        Some(f) if f > 0.0 && f <= 1.0 => {
            // transformers: dim = int(head_dim * partial_rotary_factor).
            (head_dim as f64 * f) as usize
        }
        Some(f) => {
            return Err(Error::invalid("partial_rotary_factor", format!("{f} is not in (0, 1]")));
        }
    };
    Ok(RopeSpec { theta, scaling, rotary_dim })
}

/// YaRN parameters resolved as `standardize_rope_params` and
/// `_compute_yarn_parameters` resolve them.
fn parse_yarn(cfg: &Fields<'_>, p: &Fields<'_>, max_position_embeddings: usize) -> Result<RopeScaling> {
    // standardize_rope_params: the top-level attribute wins, else the
    // value in the dict, else max_position_embeddings.
    let original_max_position_embeddings = match cfg.usize("original_max_position_embeddings")? {
        Some(n) => n,
        None => p.usize("original_max_position_embeddings")?.unwrap_or(max_position_embeddings),
    };
    if original_max_position_embeddings == 0 {
        return Err(Error::invalid("original_max_position_embeddings", "must be > 0"));
    }
    let factor = match p.f64("factor")? {
        Some(f) => f,
        None => max_position_embeddings as f64 / original_max_position_embeddings as f64,
    };
    // `get("beta_fast") or 32`: 0 and null both take the default.
    let or_default = |v: Option<f64>, default: f64| v.filter(|&x| x != 0.0).unwrap_or(default);
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast: or_default(p.f64("beta_fast")?, 32.0),
        beta_slow: or_default(p.f64("beta_slow")?, 1.0),
        mscale: p.f64("mscale")?.unwrap_or(0.0),
        mscale_all_dim: p.f64("mscale_all_dim")?.unwrap_or(0.0),
        attention_factor: p.f64("attention_factor")?,
        truncate: p.bool("truncate")?.unwrap_or(true),
    })
}

mod arch;
pub(crate) mod fields;
mod inkling;
mod layer;
mod legacy;
pub(crate) mod limits;
mod linear;
mod mla;
#[cfg(test)]
mod mla_tests;
mod ple;
mod shared_kv;
#[cfg(test)]
mod tests;
mod validate;

pub use arch::{CoreSpec, ModelArch, MtpForm, MtpOutputNorm};
pub use inkling::{InklingAttention, LogScaling, ShortConv};
pub use layer::{
    ExpertKind, FfnSpec, GateActivation, GateRank, GdnSpec, GqaSpec, HyperHead, IndexerSpec, LatentMoe, LayerSpec,
    MixerSpec, MlaAttention, MoeBlock, NormKind, QsaSpec, ResidualKind, RouterKind, SharedExperts, SwiGlu,
};
pub use linear::{GdnDims, GdnProjections, LayerType};
pub use mla::{DsaSpec, IndexerKind, LATENT_NORM_EPS, MlaSpec};
pub use ple::{MAX_NGRAM_SIZE, MAX_NGRAM_VOCAB_BASE, PleSpec, is_prime};
pub use shared_kv::{CompressedIndexer, Compression, CompressorState, SharedKvAttention};
