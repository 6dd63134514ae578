//! The typed, validated description of a model architecture ([`ModelSpec`]),
//! parsed from a Hugging Face `config.json`.
//!
//! Two spellings of config.json exist in the wild and both are accepted:
//!
//! * transformers 4.x / most Hub repos: `torch_dtype`, top-level `rope_theta`,
//!   `rope_scaling: {type|rope_type, factor}`;
//! * transformers 5.x `save_pretrained`: `dtype`,
//!   `rope_parameters: {rope_type, rope_theta, ...}`.
//!
//! Defaults mirror the transformers 5.23 config classes (`OlmoeConfig`,
//! `Qwen3MoeConfig`, `MixtralConfig`) for scalar hyper-parameters. Fields that
//! fix tensor shapes (`hidden_size`, `vocab_size`, expert counts, ...) are
//! required instead: the class defaults there describe one arbitrary model
//! size, and silently assuming them would only move the error to a confusing
//! shape mismatch later.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

/// Model families this build knows, one per Hugging Face `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Family {
    #[serde(rename = "olmoe")]
    Olmoe,
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    #[serde(rename = "mixtral")]
    Mixtral,
}

/// The supported `model_type` strings, for error messages.
const SUPPORTED_MODEL_TYPES: &str = "olmoe, qwen3_moe, mixtral";

impl Family {
    /// Every supported family.
    pub const ALL: [Family; 3] = [Family::Olmoe, Family::Qwen3Moe, Family::Mixtral];

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Olmoe => "olmoe",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Mixtral => "mixtral",
        }
    }

    /// The transformers class written to `architectures` on export.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Olmoe => "OlmoeForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
        }
    }

    /// `RotaryEmbeddingConfigMixin.default_theta` as overridden per class.
    fn default_rope_theta(self) -> f64 {
        match self {
            Family::Olmoe | Family::Qwen3Moe => 10_000.0,
            Family::Mixtral => 1_000_000.0,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

impl FromStr for Family {
    type Err = Error;

    fn from_str(model_type: &str) -> Result<Self> {
        Family::ALL.into_iter().find(|family| family.model_type() == model_type).ok_or_else(|| {
            Error::UnsupportedModelType { model_type: model_type.to_owned(), supported: SUPPORTED_MODEL_TYPES }
        })
    }
}

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
    /// YaRN. Not produced by the parser yet (arrives with DeepSeek); listed
    /// so that downstream matches are already exhaustive over it.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        mscale: f64,
        mscale_all_dim: f64,
    },
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
pub enum LayerKind {
    /// A dense SwiGLU MLP of `dense_intermediate_size` (qwen3_moe only).
    Dense,
    /// A routed mixture of experts.
    Moe,
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

/// A typed, validated model architecture.
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
    /// Width of the dense MLP used by [`LayerKind::Dense`] layers; the config's
    /// `intermediate_size` (equal to the expert width for olmoe/mixtral).
    pub dense_intermediate_size: usize,
    /// One entry per decoder layer.
    pub layers: Vec<LayerKind>,
    pub bos_token_id: Option<u32>,
    /// Every end-of-sequence id (`eos_token_id` may be an int or a list).
    pub eos_token_ids: Vec<u32>,
}

impl ModelSpec {
    /// Parses and validates a config.json document (4.x or 5.x spelling).
    pub fn from_config_json(text: &str) -> Result<ModelSpec> {
        let value: Value =
            serde_json::from_str(text).map_err(|source| Error::Json { what: "config.json".to_owned(), source })?;
        Self::from_config_value(&value)
    }

    /// As [`ModelSpec::from_config_json`], from an already parsed document.
    pub fn from_config_value(value: &Value) -> Result<ModelSpec> {
        let map = value.as_object().ok_or_else(|| Error::invalid("<root>", "config.json must be a JSON object"))?;
        let cfg = Fields { map, prefix: "" };

        let model_type = cfg.req_str("model_type")?;
        let family: Family = model_type.parse()?;

        if let Some(act) = cfg.str("hidden_act")?
            && act != "silu"
        {
            return Err(Error::invalid("hidden_act", format!("{act:?} is not supported (only \"silu\")")));
        }

        let vocab_size = cfg.req_usize("vocab_size")?;
        let hidden_size = cfg.req_usize("hidden_size")?;
        let num_layers = cfg.req_usize("num_hidden_layers")?;
        let num_heads = cfg.req_usize("num_attention_heads")?;
        if num_heads == 0 {
            return Err(Error::invalid("num_attention_heads", "must be > 0"));
        }
        // null means "same as num_attention_heads" in every family's
        // __post_init__ (and in 4.x); an absent key takes the class default,
        // which is None (olmoe) or a fixed number (qwen3_moe: 4, mixtral: 8).
        let num_kv_heads = match map.get("num_key_value_heads") {
            None => match family {
                Family::Olmoe => num_heads,
                Family::Qwen3Moe => 4,
                Family::Mixtral => 8,
            },
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

        let rms_norm_eps = cfg.f64("rms_norm_eps")?.unwrap_or(match family {
            Family::Olmoe | Family::Mixtral => 1e-5,
            Family::Qwen3Moe => 1e-6,
        }) as f32;
        let max_position_embeddings = cfg.usize("max_position_embeddings")?.unwrap_or(match family {
            Family::Olmoe => 4096,
            Family::Qwen3Moe => 32768,
            Family::Mixtral => 4096 * 32,
        });
        let tie_word_embeddings = cfg.bool("tie_word_embeddings")?.unwrap_or(false);
        let rope = parse_rope(&cfg, family, head_dim)?;

        // Expert count: each class aliases `num_experts` and
        // `num_local_experts` through its attribute_map, and 5.x writes the
        // aliased name (qwen3_moe saves `num_local_experts`), so read both.
        let num_experts = expert_count(&cfg, family)?;
        let top_k = cfg.req_usize("num_experts_per_tok")?;
        let intermediate_size = cfg.req_usize("intermediate_size")?;

        let (attention_bias, qk_norm, clip_qkv, sliding_window, moe, layers) = match family {
            Family::Olmoe => {
                let moe = MoeSpec {
                    num_experts,
                    top_k,
                    intermediate_size,
                    norm_topk_prob: cfg.bool("norm_topk_prob")?.unwrap_or(false),
                };
                let clip = cfg.f64("clip_qkv")?.map(|c| c as f32);
                (
                    cfg.bool("attention_bias")?.unwrap_or(false),
                    QkNorm::Full,
                    clip,
                    None,
                    moe,
                    vec![LayerKind::Moe; num_layers],
                )
            }
            Family::Qwen3Moe => {
                let moe = MoeSpec {
                    num_experts,
                    top_k,
                    intermediate_size: cfg.req_usize("moe_intermediate_size")?,
                    norm_topk_prob: cfg.bool("norm_topk_prob")?.unwrap_or(false),
                };
                let step = cfg.usize("decoder_sparse_step")?.unwrap_or(1);
                if step == 0 {
                    return Err(Error::invalid("decoder_sparse_step", "must be >= 1"));
                }
                let mlp_only = cfg.usize_list("mlp_only_layers")?.unwrap_or_default();
                if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
                    return Err(Error::invalid(
                        "mlp_only_layers",
                        format!("layer {bad} >= num_hidden_layers {num_layers}"),
                    ));
                }
                // Qwen3MoeDecoderLayer.__init__: sparse iff not listed in
                // mlp_only_layers, experts exist, and (i+1) % step == 0.
                let layers = (0..num_layers)
                    .map(|i| {
                        if !mlp_only.contains(&i) && num_experts > 0 && (i + 1).is_multiple_of(step) {
                            LayerKind::Moe
                        } else {
                            LayerKind::Dense
                        }
                    })
                    .collect();
                // __post_init__ drops the window unless use_sliding_window.
                let window = if cfg.bool("use_sliding_window")?.unwrap_or(false) {
                    match map.get("sliding_window") {
                        None => Some(4096),
                        Some(_) => cfg.usize("sliding_window")?,
                    }
                } else {
                    None
                };
                (cfg.bool("attention_bias")?.unwrap_or(false), QkNorm::PerHead, None, window, moe, layers)
            }
            Family::Mixtral => {
                // MixtralTopKRouter always renormalizes the top-k weights.
                let moe = MoeSpec { num_experts, top_k, intermediate_size, norm_topk_prob: true };
                (false, QkNorm::None, None, cfg.usize("sliding_window")?, moe, vec![LayerKind::Moe; num_layers])
            }
        };

        let (default_bos, default_eos) = match family {
            Family::Olmoe => (None, vec![50279]),
            Family::Qwen3Moe => (None, vec![]),
            Family::Mixtral => (Some(1), vec![2]),
        };
        let bos_token_id = match map.get("bos_token_id") {
            None => default_bos,
            Some(_) => cfg.u32("bos_token_id")?,
        };
        let eos_token_ids = match map.get("eos_token_id") {
            None => default_eos,
            Some(Value::Null) => vec![],
            Some(Value::Array(items)) => items.iter().map(|v| as_u32(v, "eos_token_id")).collect::<Result<_>>()?,
            Some(v) => vec![as_u32(v, "eos_token_id")?],
        };

        let spec = ModelSpec {
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
            attention_bias,
            qk_norm,
            clip_qkv,
            sliding_window,
            moe,
            dense_intermediate_size: intermediate_size,
            layers,
            bos_token_id,
            eos_token_ids,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every invariant the rest of the engine relies on. Errors name
    /// the config.json field at fault.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("num_experts", self.moe.num_experts),
            ("num_experts_per_tok", self.moe.top_k),
            ("expert intermediate_size", self.moe.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(Error::invalid(field, "must be > 0"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Error::invalid(
                "num_key_value_heads",
                format!("{} does not divide num_attention_heads {}", self.num_kv_heads, self.num_heads),
            ));
        }
        if self.moe.top_k > self.moe.num_experts {
            return Err(Error::invalid(
                "num_experts_per_tok",
                format!("{} exceeds the number of experts {}", self.moe.top_k, self.moe.num_experts),
            ));
        }
        if self.layers.len() != self.num_layers {
            return Err(Error::invalid(
                "num_hidden_layers",
                format!("{} layers declared but {} layer kinds given", self.num_layers, self.layers.len()),
            ));
        }
        if self.layers.contains(&LayerKind::Dense) && self.dense_intermediate_size == 0 {
            return Err(Error::invalid("intermediate_size", "must be > 0"));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(Error::invalid("rms_norm_eps", "must be finite and > 0"));
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return Err(Error::invalid("rope_theta", "must be finite and > 0"));
        }
        if self.rope.rotary_dim == 0 || !self.rope.rotary_dim.is_multiple_of(2) || self.rope.rotary_dim > self.head_dim
        {
            return Err(Error::invalid(
                "partial_rotary_factor",
                format!(
                    "rotary dimension {} must be even, > 0 and <= head_dim {}",
                    self.rope.rotary_dim, self.head_dim
                ),
            ));
        }
        match self.rope.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } | RopeScaling::Yarn { factor, .. } => {
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(Error::invalid("rope_parameters.factor", "must be finite and > 0"));
                }
            }
        }
        if let Some(clip) = self.clip_qkv
            && !(clip.is_finite() && clip > 0.0)
        {
            return Err(Error::invalid("clip_qkv", "must be finite and > 0"));
        }
        if self.sliding_window == Some(0) {
            return Err(Error::invalid("sliding_window", "must be > 0"));
        }
        // Overflow guard: every later size computation multiplies these.
        let q_dim = self.num_heads.checked_mul(self.head_dim);
        let embed = self.vocab_size.checked_mul(self.hidden_size);
        let expert = self.moe.intermediate_size.checked_mul(self.hidden_size).and_then(|n| n.checked_mul(4 * 3));
        if q_dim.is_none() || embed.is_none() || expert.is_none() {
            return Err(Error::invalid("hidden_size", "tensor sizes overflow usize"));
        }
        match self.family {
            Family::Olmoe => {
                // OlmoeAttention sizes q_norm by hidden_size and k_norm by
                // (hidden_size / heads) * kv_heads: only consistent when
                // head_dim == hidden_size / num_heads.
                if self.q_dim() != self.hidden_size {
                    return Err(Error::invalid(
                        "head_dim",
                        format!(
                            "olmoe requires num_attention_heads * head_dim == hidden_size \
                             ({} * {} != {})",
                            self.num_heads, self.head_dim, self.hidden_size
                        ),
                    ));
                }
                if self.qk_norm != QkNorm::Full {
                    return Err(Error::invalid("model_type", "olmoe uses full q/k norms"));
                }
            }
            Family::Qwen3Moe => {
                if self.qk_norm != QkNorm::PerHead {
                    return Err(Error::invalid("model_type", "qwen3_moe uses per-head q/k norms"));
                }
            }
            Family::Mixtral => {
                if self.layers.contains(&LayerKind::Dense) {
                    return Err(Error::invalid("model_type", "mixtral has no dense layers"));
                }
                if self.qk_norm != QkNorm::None || self.attention_bias {
                    return Err(Error::invalid("model_type", "mixtral has neither q/k norms nor attention biases"));
                }
            }
        }
        if self.family != Family::Qwen3Moe && self.layers.contains(&LayerKind::Dense) {
            return Err(Error::invalid("mlp_only_layers", format!("{} has no dense layers", self.family)));
        }
        Ok(())
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
        self.layers.get(layer) == Some(&LayerKind::Moe)
    }

    /// Indices of the MoE layers, ascending.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_layers).filter(|&l| self.is_moe(l)).collect()
    }

    /// A transformers-loadable config.json (5.x spelling, `dtype: float32`)
    /// that parses back to an equal spec.
    pub fn to_config_json(&self) -> Value {
        let mut rope = Map::new();
        match self.rope.scaling {
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
            } => {
                rope.insert("rope_type".into(), json!("yarn"));
                rope.insert("factor".into(), json!(factor));
                rope.insert("original_max_position_embeddings".into(), json!(original_max_position_embeddings));
                rope.insert("beta_fast".into(), json!(beta_fast));
                rope.insert("beta_slow".into(), json!(beta_slow));
                rope.insert("mscale".into(), json!(mscale));
                rope.insert("mscale_all_dim".into(), json!(mscale_all_dim));
            }
        }
        rope.insert("rope_theta".into(), json!(self.rope.theta));
        if self.rope.rotary_dim != self.head_dim {
            rope.insert("partial_rotary_factor".into(), json!(self.rope.rotary_dim as f64 / self.head_dim as f64));
        }

        let eos = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let mut c = Map::new();
        c.insert("architectures".into(), json!([self.family.architecture()]));
        c.insert("model_type".into(), json!(self.family.model_type()));
        c.insert("dtype".into(), json!("float32"));
        c.insert("vocab_size".into(), json!(self.vocab_size));
        c.insert("hidden_size".into(), json!(self.hidden_size));
        c.insert("num_hidden_layers".into(), json!(self.num_layers));
        c.insert("num_attention_heads".into(), json!(self.num_heads));
        c.insert("num_key_value_heads".into(), json!(self.num_kv_heads));
        c.insert("head_dim".into(), json!(self.head_dim));
        c.insert("hidden_act".into(), json!("silu"));
        c.insert("max_position_embeddings".into(), json!(self.max_position_embeddings));
        c.insert("rms_norm_eps".into(), json!(f32_to_json(self.rms_norm_eps)));
        c.insert("rope_parameters".into(), Value::Object(rope));
        c.insert("tie_word_embeddings".into(), json!(self.tie_word_embeddings));
        c.insert("bos_token_id".into(), json!(self.bos_token_id));
        c.insert("eos_token_id".into(), eos);
        c.insert("num_experts_per_tok".into(), json!(self.moe.top_k));
        match self.family {
            Family::Olmoe => {
                c.insert("intermediate_size".into(), json!(self.moe.intermediate_size));
                c.insert("num_experts".into(), json!(self.moe.num_experts));
                c.insert("norm_topk_prob".into(), json!(self.moe.norm_topk_prob));
                c.insert("attention_bias".into(), json!(self.attention_bias));
                c.insert("clip_qkv".into(), json!(self.clip_qkv.map(f32_to_json)));
            }
            Family::Qwen3Moe => {
                // decoder_sparse_step = 1 plus an explicit list reproduces
                // any layer pattern exactly.
                let dense: Vec<usize> = (0..self.num_layers).filter(|&l| !self.is_moe(l)).collect();
                c.insert("intermediate_size".into(), json!(self.dense_intermediate_size));
                c.insert("moe_intermediate_size".into(), json!(self.moe.intermediate_size));
                c.insert("num_experts".into(), json!(self.moe.num_experts));
                c.insert("norm_topk_prob".into(), json!(self.moe.norm_topk_prob));
                c.insert("decoder_sparse_step".into(), json!(1));
                c.insert("mlp_only_layers".into(), json!(dense));
                c.insert("attention_bias".into(), json!(self.attention_bias));
                c.insert("use_sliding_window".into(), json!(self.sliding_window.is_some()));
                c.insert("sliding_window".into(), json!(self.sliding_window));
            }
            Family::Mixtral => {
                c.insert("intermediate_size".into(), json!(self.moe.intermediate_size));
                c.insert("num_local_experts".into(), json!(self.moe.num_experts));
                c.insert("sliding_window".into(), json!(self.sliding_window));
            }
        }
        Value::Object(c)
    }
}

/// An f32 as the JSON number with its shortest decimal spelling (`1e-5`,
/// not `9.999999747378752e-6`), so exported configs read like the originals.
fn f32_to_json(x: f32) -> f64 {
    x.to_string().parse::<f64>().unwrap_or(f64::from(x))
}

/// Reads `num_experts` / `num_local_experts`, preferring the family's own
/// name and rejecting a config where both are given and disagree.
fn expert_count(cfg: &Fields<'_>, family: Family) -> Result<usize> {
    let (own, alias) = match family {
        Family::Olmoe | Family::Qwen3Moe => ("num_experts", "num_local_experts"),
        Family::Mixtral => ("num_local_experts", "num_experts"),
    };
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
fn parse_rope(cfg: &Fields<'_>, family: Family, head_dim: usize) -> Result<RopeSpec> {
    let (params, prefix) = match (cfg.object("rope_scaling")?, cfg.object("rope_parameters")?) {
        (Some(p), _) => (Some(p), "rope_scaling."),
        (None, Some(p)) => (Some(p), "rope_parameters."),
        (None, None) => (None, ""),
    };
    let empty = Map::new();
    let p = Fields { map: params.unwrap_or(&empty), prefix };
    let theta = match p.f64("rope_theta")? {
        Some(t) => t,
        None => cfg.f64("rope_theta")?.unwrap_or_else(|| family.default_rope_theta()),
    };
    let rope_type = match p.str("rope_type")? {
        Some(t) => t,
        None => p.str("type")?.unwrap_or("default"),
    };
    let scaling = match rope_type {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: p.req_f64("factor")? },
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

fn as_u32(v: &Value, field: &str) -> Result<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| Error::invalid(field, format!("expected a token id, got {v}")))
}

/// Typed access to one JSON object, naming `prefix + key` in errors. Absent
/// and `null` are both "not given", as in transformers.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: &'static str,
}

impl<'a> Fields<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn wrong(&self, key: &str, expected: &str, v: &Value) -> Error {
        Error::invalid(self.name(key), format!("expected {expected}, got {v}"))
    }

    fn missing(&self, key: &str) -> Error {
        Error::MissingField { field: self.name(key) }
    }

    fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong(key, "a non-negative integer", v))
            })
            .transpose()
    }

    fn req_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.missing(key))
    }

    fn u32(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| as_u32(v, &self.name(key))).transpose()
    }

    fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.wrong(key, "a number", v))).transpose()
    }

    fn req_f64(&self, key: &str) -> Result<f64> {
        self.f64(key)?.ok_or_else(|| self.missing(key))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key).map(|v| v.as_bool().ok_or_else(|| self.wrong(key, "true or false", v))).transpose()
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key).map(|v| v.as_str().ok_or_else(|| self.wrong(key, "a string", v))).transpose()
    }

    fn req_str(&self, key: &str) -> Result<&'a str> {
        self.str(key)?.ok_or_else(|| self.missing(key))
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.get(key).map(|v| v.as_object().ok_or_else(|| self.wrong(key, "an object", v))).transpose()
    }

    fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        self.get(key)
            .map(|v| {
                let items = v.as_array().ok_or_else(|| self.wrong(key, "a list of integers", v))?;
                items
                    .iter()
                    .map(|item| {
                        item.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or_else(|| self.wrong(key, "a list of integers", v))
                    })
                    .collect()
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests;
