//! The model families this build knows: one small file each, holding
//! everything particular to the family (its config.json fields and their
//! defaults, its tensor names, its invariants), and this registry.
//!
//! A family file turns config.json into the model's [`ModelArch`]: its
//! common part and one [`LayerSpec`] per layer, built through the shared
//! readers of its kind (`gqa.rs`, `mla.rs`, `hybrid.rs`) and [`stack`], so
//! a layer may have its own heads, window or RoPE. Every layer's invariants
//! are checked in one place (`spec/validate.rs`); the family's own in its
//! file.
//!
//! A new family is a new file here, one [`Family`] variant and one line in
//! [`Family::def`]; the blocks it is made of come from the generic
//! [`LayerSpec`], and nothing outside this folder names it.

mod deepseek_v3;
mod deepseek_v4;
mod glm5_next;
mod glm_moe_dsa;
mod gpt_oss;
mod gqa;
mod hybrid;
mod inkling;
mod kimi_k25;
mod kimi_k3;
mod kimi_linear;
mod known;
mod mixtral;
mod mla;
mod olmoe;
mod qwen3_5_moe;
mod qwen3_moe;
mod qwen3_next;
mod qwen4_exp;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::limits::{self, MAX_LAYERS};
use crate::spec::{FfnKind, FfnSpec, LayerSpec, MixerSpec, ModelArch, MoeBlock, NormKind, ResidualKind};
pub use known::check_config_keys;
pub(crate) use known::{Known, unknown_tensors};

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
    /// DeepSeek V4: shared key-value attention over a window and
    /// compressed entries, sqrt-softplus and hash routing, hyper-connections.
    #[serde(rename = "deepseek_v4")]
    DeepseekV4,
    /// GLM-5: the DeepSeek-V3 body plus the DSA lightning indexer.
    #[serde(rename = "glm_moe_dsa")]
    GlmMoeDsa,
    /// Kimi K2.5: a DeepSeek-V3 text model nested in a vision-language
    /// wrapper (`text_config`, tensors under `language_model.`).
    #[serde(rename = "kimi_k25")]
    KimiK25,
    /// Qwen3-Next: Gated DeltaNet layers between gated full-attention ones.
    #[serde(rename = "qwen3_next")]
    Qwen3Next,
    /// Qwen3.5 / Qwen3.6 MoE: the Qwen3-Next body, separate DeltaNet
    /// projections, in a multimodal wrapper on the hub.
    #[serde(rename = "qwen3_5_moe")]
    Qwen35Moe,
    /// gpt-oss: sliding-window and full GQA layers with sinks and biases,
    /// biased clamped experts published fused (dequantized or MXFP4).
    #[serde(rename = "gpt_oss")]
    GptOss,
    /// Kimi-Linear: Kimi Delta Attention layers between unrotated MLA
    /// ones, the DeepSeek-V3 MoE.
    #[serde(rename = "kimi_linear")]
    KimiLinear,
    /// Inkling: attention without RoPE, a bias by backward distance and
    /// short convolutions, sliding layers with their own heads, the
    /// shared-expert sink router.
    #[serde(rename = "inkling_mm_model")]
    Inkling,
    /// GLM-5.3-Flash: bounded Kimi Delta Attention layers between unrotated
    /// MLA ones sparse through a pooled DSA indexer, hyper-connections,
    /// clamped SwiGLU, in a multimodal wrapper.
    #[serde(rename = "glm5_next")]
    Glm5Next,
    /// Qwen3.8-Flash-Next: the Qwen3.5 body with QSA block selection,
    /// gated residual streams and no layer norms.
    #[serde(rename = "qwen4_exp")]
    Qwen4Exp,
    /// Kimi K3: Kimi-Linear's body with gated KDA and MLA, Attention
    /// Residuals, a latent MoE and SiTU-GLU; told from Kimi-Linear by its
    /// keys (its text config says `kimi_linear`).
    #[serde(rename = "kimi_k3")]
    KimiK3,
}

/// What a family file provides.
pub(crate) trait FamilyDef: Sync {
    /// The Hugging Face `model_type`.
    fn model_type(&self) -> &'static str;

    /// Other `model_type`s whose configs this family reads (a text model
    /// saved apart from its multimodal wrapper, say).
    fn also_reads(&self) -> &'static [&'static str] {
        &[]
    }

    /// The transformers class written to `architectures` on export.
    fn architecture(&self) -> &'static str;

    /// How the family's tensors are named in its published checkpoints.
    fn naming(&self) -> &'static Naming;

    /// `(canonical, hub)`: how the family's hub checkpoints spell every
    /// canonical name, each part renamed in turn like
    /// [`Naming::saved_as`], when no one part can say it (Inkling's
    /// `model.llm.` prefix and its own module names at once).
    fn hub_spelling(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The hub's name of tensor `suffix` of multi-token-prediction layer
    /// `k`, where the family's hub checkpoints keep those layers apart from
    /// the stack (Inkling's `model.mtp.layers.{k}.…`); `None` where they are
    /// stored as the stack's layer `num_hidden_layers + k`.
    fn hub_mtp_name(&self, _k: usize, _suffix: &str) -> Option<String> {
        None
    }

    /// The config keys the family reads and those known not to change the
    /// computation, and the tensors known to be unused (`known.rs`).
    fn known(&self) -> &'static Known;

    /// A config.json object of this family → its architecture: the common
    /// part and one spec per layer, defaults filled in as the family's
    /// transformers config class fills them (not yet validated).
    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch>;

    /// The family's own invariants, beyond those every layer keeps
    /// ([`ModelArch::validate`] checks those first).
    fn validate(&self, arch: &ModelArch) -> Result<()>;

    /// A transformers-loadable config.json (5.x spelling, `dtype: float32`)
    /// that parses back to an equal architecture. `source` is the config the
    /// container was converted from, for parts the architecture does not
    /// describe.
    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value;
}

/// A family's tensor naming rules.
#[derive(Debug)]
pub(crate) struct Naming {
    /// Where the decoder stack's tensors live, e.g. `model.`.
    pub model_prefix: &'static str,
    /// The output projection when not tied to the embedding.
    pub lm_head: &'static str,
    /// The module holding a layer's MoE block, e.g. `mlp`.
    pub moe_module: &'static str,
    /// An expert's gate, up and down projections, e.g. `gate_proj`.
    pub expert_projections: [&'static str; 3],
    /// `(canonical, stored)`: a checkpoint may spell the part `canonical`
    /// of a tensor name, or of its saved spelling, as `stored` instead (one
    /// part per alias).
    pub aliases: &'static [(&'static str, &'static str)],
    /// `(canonical, saved)`: how transformers' `save_pretrained` spells
    /// canonical names, each part renamed in turn (in order, every
    /// occurrence, so several parts of one name can change together);
    /// export writes that spelling, and a checkpoint may store it.
    pub saved_as: &'static [(&'static str, &'static str)],
}

/// The naming of most Hugging Face MoE checkpoints.
pub(crate) const HF_NAMING: Naming = Naming {
    model_prefix: "model.",
    lm_head: "lm_head.weight",
    moe_module: "mlp",
    expert_projections: ["gate_proj", "up_proj", "down_proj"],
    aliases: &[],
    saved_as: &[],
};

impl Family {
    /// Every supported family.
    pub const ALL: [Family; 15] = [
        Family::Olmoe,
        Family::Qwen3Moe,
        Family::Mixtral,
        Family::DeepseekV3,
        Family::GlmMoeDsa,
        Family::KimiK25,
        Family::Qwen3Next,
        Family::Qwen35Moe,
        Family::GptOss,
        Family::KimiLinear,
        Family::DeepseekV4,
        Family::Inkling,
        Family::Glm5Next,
        Family::Qwen4Exp,
        Family::KimiK3,
    ];

    /// The registry: the file that describes this family.
    pub(crate) fn def(self) -> &'static dyn FamilyDef {
        match self {
            Family::Olmoe => &olmoe::Olmoe,
            Family::Qwen3Moe => &qwen3_moe::Qwen3Moe,
            Family::Mixtral => &mixtral::Mixtral,
            Family::DeepseekV3 => &deepseek_v3::DeepseekV3,
            Family::GlmMoeDsa => &glm_moe_dsa::GlmMoeDsa,
            Family::KimiK25 => &kimi_k25::KimiK25,
            Family::Qwen3Next => &qwen3_next::Qwen3Next,
            Family::Qwen35Moe => &qwen3_5_moe::Qwen35Moe,
            Family::GptOss => &gpt_oss::GptOss,
            Family::KimiLinear => &kimi_linear::KimiLinear,
            Family::DeepseekV4 => &deepseek_v4::DeepseekV4,
            Family::Inkling => &inkling::Inkling,
            Family::Glm5Next => &glm5_next::Glm5Next,
            Family::Qwen4Exp => &qwen4_exp::Qwen4Exp,
            Family::KimiK3 => &kimi_k3::KimiK3,
        }
    }

    /// The family of a config.json object: its `model_type`'s, except that
    /// a `kimi_linear` config with Kimi K3's keys is K3's (transformers'
    /// `kimi_linear` would drop what K3 adds).
    pub(crate) fn of_config(root: &Map<String, Value>) -> Result<Family> {
        let family: Family = Fields { map: root, prefix: "" }.req_str("model_type")?.parse()?;
        Ok(if family == Family::KimiLinear && kimi_k3::is_k3(root) { Family::KimiK3 } else { family })
    }

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        self.def().model_type()
    }

    /// The transformers class written to `architectures` on export.
    pub fn architecture(self) -> &'static str {
        self.def().architecture()
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
        let reads =
            |family: &Family| family.model_type() == model_type || family.def().also_reads().contains(&model_type);
        Family::ALL.into_iter().find(reads).ok_or_else(|| Error::UnsupportedModelType {
            model_type: model_type.to_owned(),
            supported: supported_model_types(),
        })
    }
}

/// The supported `model_type` strings, for error messages.
fn supported_model_types() -> String {
    Family::ALL.map(Family::model_type).join(", ")
}

/// The config keys every family reads alike: [`CoreDims`], the final
/// norm, the rope's top-level spelling (`parse_rope`), tying and the
/// special ids.
pub(crate) const CORE_READ: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_theta",
    "partial_rotary_factor",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
];

/// The dimensions every family reads first, alike: the activation (only
/// SiLU is supported), vocabulary, hidden size, layer count (bounded before
/// anything is sized by it: a list per layer) and attention heads.
pub(crate) struct CoreDims {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
}

impl CoreDims {
    pub(crate) fn read(cfg: &Fields<'_>) -> Result<Self> {
        if let Some(act) = cfg.str("hidden_act")?
            && act != "silu"
        {
            return Err(Error::invalid("hidden_act", format!("{act:?} is not supported (only \"silu\")")));
        }
        Ok(Self {
            vocab_size: cfg.req_usize("vocab_size")?,
            hidden_size: cfg.req_usize("hidden_size")?,
            num_layers: limits::at_most("num_hidden_layers", cfg.req_usize("num_hidden_layers")?, MAX_LAYERS)?,
            num_heads: cfg.req_usize("num_attention_heads")?,
        })
    }
}

/// The feed-forward blocks a family's layers choose between, as its config
/// gives them once for the model. Dense MLPs take the MoE block's SwiGLU:
/// a config has one `swiglu_limit` for every SwiGLU of the model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ffns {
    pub moe: MoeBlock,
    /// Width of the dense MLP of [`FfnKind::Dense`] layers.
    pub dense_intermediate_size: usize,
}

impl Ffns {
    /// The block of a layer of kind `kind`.
    pub(crate) fn of(&self, kind: FfnKind) -> FfnSpec {
        match kind {
            FfnKind::Dense => FfnSpec::Dense {
                intermediate_size: self.dense_intermediate_size,
                swiglu: self.moe.swiglu,
                global_scale: false,
            },
            FfnKind::Moe => FfnSpec::Moe(self.moe),
        }
    }
}

/// The decoder stack every family builds alike: layer `l` mixes tokens with
/// `attention(l)` and runs the FFN `kinds[l]` names, every norm `norm`, the
/// plain residual. The config's MoE block must be valid even where no layer
/// runs it (a config whose every layer is dense still declares experts).
pub(crate) fn stack(
    kinds: &[FfnKind],
    ffns: &Ffns,
    norm: NormKind,
    attention: impl Fn(usize) -> MixerSpec,
) -> Result<Vec<LayerSpec>> {
    FfnSpec::Moe(ffns.moe).validate()?;
    let layer = |(l, kind): (usize, &FfnKind)| LayerSpec {
        mixer: attention(l),
        ffn: ffns.of(*kind),
        norm,
        residual: ResidualKind::Plain,
        ffn_output_conv: None,
        ple: None,
    };
    Ok(kinds.iter().enumerate().map(layer).collect())
}
