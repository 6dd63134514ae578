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
//! `Qwen3MoeConfig`, `MixtralConfig`; the MLA families' in `spec/mla.rs`) for
//! scalar hyper-parameters. Fields that
//! fix tensor shapes (`hidden_size`, `vocab_size`, expert counts, ...) are
//! required instead: the class defaults there describe one arbitrary model
//! size, and silently assuming them would only move the error to a confusing
//! shape mismatch later.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use fields::{Fields, as_u32};

/// Model families this build knows, one per Hugging Face `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Family {
    #[serde(rename = "olmoe")]
    Olmoe,
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    #[serde(rename = "mixtral")]
    Mixtral,
    /// DeepSeek-V3 (and V2-style configs without `q_lora_rank`): MLA
    /// attention, sigmoid group-limited routing, shared experts.
    #[serde(rename = "deepseek_v3")]
    DeepseekV3,
    /// GLM-5: the DeepSeek-V3 body plus the DSA lightning indexer.
    #[serde(rename = "glm_moe_dsa")]
    GlmMoeDsa,
    /// Kimi K2.5: a DeepSeek-V3 text model nested in a vision-language
    /// wrapper (`text_config`, tensors under `language_model.`).
    #[serde(rename = "kimi_k25")]
    KimiK25,
}

/// The supported `model_type` strings, for error messages.
const SUPPORTED_MODEL_TYPES: &str = "olmoe, qwen3_moe, mixtral, deepseek_v3, glm_moe_dsa, kimi_k25";

impl Family {
    /// Every supported family.
    pub const ALL: [Family; 6] =
        [Family::Olmoe, Family::Qwen3Moe, Family::Mixtral, Family::DeepseekV3, Family::GlmMoeDsa, Family::KimiK25];

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Olmoe => "olmoe",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Mixtral => "mixtral",
            Family::DeepseekV3 => "deepseek_v3",
            Family::GlmMoeDsa => "glm_moe_dsa",
            Family::KimiK25 => "kimi_k25",
        }
    }

    /// The transformers class written to `architectures` on export.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Olmoe => "OlmoeForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Mixtral => "MixtralForCausalLM",
            Family::DeepseekV3 => "DeepseekV3ForCausalLM",
            Family::GlmMoeDsa => "GlmMoeDsaForCausalLM",
            Family::KimiK25 => "Kimi_K25ForConditionalGeneration",
        }
    }

    /// Whether the family uses Multi-head Latent Attention (and the
    /// DeepSeek-V3 MoE block) rather than grouped-query attention.
    pub fn is_mla(self) -> bool {
        matches!(self, Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25)
    }

    /// `RotaryEmbeddingConfigMixin.default_theta` as overridden per class.
    fn default_rope_theta(self) -> f64 {
        match self {
            Family::Olmoe | Family::Qwen3Moe | Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25 => 10_000.0,
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

/// The grouped-query-attention families, whose config parsing is shared.
#[derive(Clone, Copy)]
enum Gqa {
    Olmoe,
    Qwen3Moe,
    Mixtral,
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
        // The MLA families share nothing with the GQA parsing below.
        let gqa = match family {
            Family::Olmoe => Gqa::Olmoe,
            Family::Qwen3Moe => Gqa::Qwen3Moe,
            Family::Mixtral => Gqa::Mixtral,
            Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25 => {
                let spec = mla::parse(map, family)?;
                spec.validate()?;
                return Ok(spec);
            }
        };

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
            None => match gqa {
                Gqa::Olmoe => num_heads,
                Gqa::Qwen3Moe => 4,
                Gqa::Mixtral => 8,
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

        let rms_norm_eps = cfg.f64("rms_norm_eps")?.unwrap_or(match gqa {
            Gqa::Olmoe | Gqa::Mixtral => 1e-5,
            Gqa::Qwen3Moe => 1e-6,
        }) as f32;
        let max_position_embeddings = cfg.usize("max_position_embeddings")?.unwrap_or(match gqa {
            Gqa::Olmoe => 4096,
            Gqa::Qwen3Moe => 32768,
            Gqa::Mixtral => 4096 * 32,
        });
        let tie_word_embeddings = cfg.bool("tie_word_embeddings")?.unwrap_or(false);
        let rope = parse_rope(&cfg, family, head_dim, max_position_embeddings)?;

        // Expert count: each class aliases `num_experts` and
        // `num_local_experts` through its attribute_map, and 5.x writes the
        // aliased name (qwen3_moe saves `num_local_experts`), so read both.
        let num_experts = expert_count(&cfg, family)?;
        let top_k = cfg.req_usize("num_experts_per_tok")?;
        let intermediate_size = cfg.req_usize("intermediate_size")?;

        let (attention_bias, qk_norm, clip_qkv, sliding_window, moe, layers) = match gqa {
            Gqa::Olmoe => {
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
            Gqa::Qwen3Moe => {
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
            Gqa::Mixtral => {
                // MixtralTopKRouter always renormalizes the top-k weights.
                let moe = MoeSpec { num_experts, top_k, intermediate_size, norm_topk_prob: true };
                (false, QkNorm::None, None, cfg.usize("sliding_window")?, moe, vec![LayerKind::Moe; num_layers])
            }
        };

        let (bos_token_id, eos_token_ids) = special_tokens(&cfg, family)?;

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
            router: RouterSpec::default(),
            shared_intermediate_size: None,
            mla: None,
            dsa: None,
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
            // MLA rotates qk_rope_head_dim values; GQA a fraction of head_dim.
            return Err(Error::invalid(
                if self.mla.is_some() { "qk_rope_head_dim" } else { "partial_rotary_factor" },
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
            Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25 => return mla::validate(self),
        }
        if self.layers.contains(&LayerKind::Dense) && self.family != Family::Qwen3Moe {
            return Err(Error::invalid("mlp_only_layers", format!("{} has no dense layers", self.family)));
        }
        // The GQA graphs implement exactly the softmax router and no MLA.
        if self.router != RouterSpec::default()
            || self.shared_intermediate_size.is_some()
            || self.mla.is_some()
            || self.dsa.is_some()
        {
            return Err(Error::invalid(
                "model_type",
                format!("{} has no MLA, DSA, shared experts or sigmoid routing", self.family),
            ));
        }
        Ok(())
    }

    /// f32 values one token adds to the KV cache in each layer: keys and
    /// values for grouped-query attention; the latent and its rotary key for
    /// MLA, plus the indexer key with DSA.
    pub fn kv_floats_per_token_per_layer(&self) -> usize {
        match &self.mla {
            Some(mla) => mla.latent_dim() + self.dsa.as_ref().map_or(0, |d| d.index_head_dim),
            None => 2 * self.kv_dim(),
        }
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
        if self.family.is_mla() {
            return mla::to_config_json(self);
        }
        let mut c = self.common_config(self.head_dim);
        c.insert("head_dim".into(), json!(self.head_dim));
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
            // Written by mla::to_config_json above.
            Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25 => {}
        }
        Value::Object(c)
    }
}

impl ModelSpec {
    /// The config.json keys every family writes the same way. `rotated_dim`
    /// is the head width RoPE's `partial_rotary_factor` is relative to.
    fn common_config(&self, rotated_dim: usize) -> Map<String, Value> {
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
        rope.insert("rope_theta".into(), json!(self.rope.theta));
        if self.rope.rotary_dim != rotated_dim {
            rope.insert("partial_rotary_factor".into(), json!(self.rope.rotary_dim as f64 / rotated_dim as f64));
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
        c.insert("hidden_act".into(), json!("silu"));
        c.insert("max_position_embeddings".into(), json!(self.max_position_embeddings));
        c.insert("rms_norm_eps".into(), json!(f32_to_json(self.rms_norm_eps)));
        c.insert("rope_parameters".into(), Value::Object(rope));
        c.insert("tie_word_embeddings".into(), json!(self.tie_word_embeddings));
        c.insert("bos_token_id".into(), json!(self.bos_token_id));
        c.insert("eos_token_id".into(), eos);
        c
    }
}

/// An f32 as the JSON number with its shortest decimal spelling (`1e-5`,
/// not `9.999999747378752e-6`), so exported configs read like the originals.
fn f32_to_json(x: f32) -> f64 {
    x.to_string().parse::<f64>().unwrap_or(f64::from(x))
}

/// `bos_token_id` and every `eos_token_id` (an int or a list), with the
/// class defaults when absent; `null` means none.
fn special_tokens(cfg: &Fields<'_>, family: Family) -> Result<(Option<u32>, Vec<u32>)> {
    let (default_bos, default_eos) = match family {
        Family::Olmoe => (None, vec![50279]),
        Family::Qwen3Moe => (None, vec![]),
        Family::Mixtral => (Some(1), vec![2]),
        Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25 => (Some(0), vec![1]),
    };
    let bos_token_id = match cfg.map.get("bos_token_id") {
        None => default_bos,
        Some(_) => cfg.u32("bos_token_id")?,
    };
    let eos_token_ids = match cfg.map.get("eos_token_id") {
        None => default_eos,
        Some(Value::Null) => vec![],
        Some(Value::Array(items)) => items.iter().map(|v| as_u32(v, "eos_token_id")).collect::<Result<_>>()?,
        Some(v) => vec![as_u32(v, "eos_token_id")?],
    };
    Ok((bos_token_id, eos_token_ids))
}

/// Reads `num_experts` / `num_local_experts`, preferring the family's own
/// name and rejecting a config where both are given and disagree.
fn expert_count(cfg: &Fields<'_>, family: Family) -> Result<usize> {
    let (own, alias) = match family {
        Family::Olmoe | Family::Qwen3Moe => ("num_experts", "num_local_experts"),
        Family::Mixtral => ("num_local_experts", "num_experts"),
        Family::DeepseekV3 | Family::GlmMoeDsa | Family::KimiK25 => ("n_routed_experts", "num_local_experts"),
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
///
/// YaRN is accepted for the MLA families only: the GQA graphs have not been
/// checked against transformers with it.
fn parse_rope(cfg: &Fields<'_>, family: Family, head_dim: usize, max_position_embeddings: usize) -> Result<RopeSpec> {
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
        "yarn" if family.is_mla() => parse_yarn(cfg, &p, max_position_embeddings)?,
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

mod fields;
mod layer;
mod mla;
#[cfg(test)]
mod mla_tests;
#[cfg(test)]
mod tests;

pub use layer::{
    AttentionKind, FfnKind, GqaSpec, IndexerSpec, LayerSpec, MlaAttention, MoeBlock, NormKind, RouterKind,
    SharedExperts,
};
pub use mla::{DsaSpec, IndexerKind, MlaSpec};
