//! The in-memory model: its common part ([`CoreSpec`]) and one stored
//! [`LayerSpec`] per decoder layer ([`ModelArch`]).
//!
//! A family file builds it from config.json (`FamilyDef::parse`). It is not
//! what a manifest stores: containers keep the source config.json it is
//! derived from, with a frozen summary to check the derivation against
//! ([`ModelArch::from_stored`]), so the in-memory model can change without
//! changing the container format.

use serde_json::Value;

use super::{
    Family, FfnKind, FfnSpec, GdnSpec, GqaSpec, LayerSpec, MixerSpec, MlaAttention, ModelSpec, MoeBlock, NormKind,
    ResidualKind, RopeSpec,
};
use crate::error::{Error, Result};

/// What a model has once, whatever its layers: vocabulary, hidden width,
/// the final norm, tying and the special tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreSpec {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix (no `lm_head.weight` stored).
    pub tie_word_embeddings: bool,
    /// The norm after the last layer.
    pub final_norm: NormKind,
    /// The RMSNorm of each embedding row as it is looked up (Inkling's
    /// `embed_norm`); `None`: rows as stored.
    pub embed_norm: Option<NormKind>,
    /// The final hidden states are divided by it before lm_head (Inkling's
    /// μP `logits_mup_width_multiplier`).
    pub logits_mup_divisor: Option<f32>,
    /// Logits past the first this many are cut (lm_head padded beyond the
    /// tokenizer's vocabulary); `None`: all `vocab_size`.
    pub unpadded_vocab_size: Option<usize>,
    pub bos_token_id: Option<u32>,
    /// Every end-of-sequence id.
    pub eos_token_ids: Vec<u32>,
}

impl CoreSpec {
    /// Logits per position the model gives: the unpadded vocabulary's, else
    /// every row of lm_head's.
    pub fn logits_width(&self) -> usize {
        self.unpadded_vocab_size.unwrap_or(self.vocab_size)
    }
}

/// A model architecture: the common part and every layer's own spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelArch {
    pub core: CoreSpec,
    /// One entry per decoder layer, in order.
    pub layers: Vec<LayerSpec>,
    /// The multi-token-prediction layers (DeepSeek-V3's
    /// `num_nextn_predict_layers`), which draft tokens ahead of the stack:
    /// numbered after the last decoder layer, the first is layer
    /// `layers.len()`. Empty where the family has none, the config declares
    /// none, or the container was converted without them.
    pub mtp: Vec<LayerSpec>,
    /// How the MTP layers join their inputs and norm their outputs, as the
    /// config says (meaningful only where [`ModelArch::mtp`] has layers).
    pub mtp_form: MtpForm,
}

/// How a model's multi-token-prediction layers are wired, as transformers'
/// `MtpLayer` and `MtpModel` build them from the config: read by the family
/// file, so that neither a reader nor the decoder guesses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtpForm {
    /// `eh_proj` takes `[hnorm(hidden), enorm(embedding)]` (Inkling's
    /// `mtp_hidden_states_first`) rather than `[enorm(embedding),
    /// hnorm(hidden)]` (DeepSeek-V3's).
    pub hidden_first: bool,
    /// What norms each MTP layer's output before the lm head and the next
    /// MTP layer.
    pub output_norm: MtpOutputNorm,
}

/// The norm of an MTP layer's output (`MtpModel`: a config with
/// `chain_hidden_post_norm` has no per-layer norm, and one shared norm
/// where the key is true).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtpOutputNorm {
    /// Each layer's own, `shared_head.norm` (DeepSeek-V3's `post_norm`).
    PerLayer,
    /// One norm after every layer (Inkling's `chain_norm` with
    /// `chain_hidden_post_norm`).
    Chain,
    /// None: the output goes to the lm head as it is (Inkling without
    /// `chain_hidden_post_norm`).
    Unnormed,
}

impl MtpForm {
    /// transformers' `MtpModel` for a config without Inkling's keys
    /// (DeepSeek-V3, GLM-5): the embedding first, each layer its own norm.
    pub const DEEPSEEK_V3: MtpForm = MtpForm { hidden_first: false, output_norm: MtpOutputNorm::PerLayer };

    /// The line `strata info` prints.
    pub fn describe(&self) -> String {
        let order = if self.hidden_first { "[hidden, embedding]" } else { "[embedding, hidden]" };
        let norm = match self.output_norm {
            MtpOutputNorm::PerLayer => "a norm per layer",
            MtpOutputNorm::Chain => "the shared chain norm",
            MtpOutputNorm::Unnormed => "no output norm",
        };
        format!("{order} joined, {norm}")
    }
}

impl ModelArch {
    /// Parses and validates a config.json document (4.x or 5.x spelling)
    /// through its family file.
    pub fn from_config_json(text: &str) -> Result<ModelArch> {
        let value: Value =
            serde_json::from_str(text).map_err(|source| Error::Json { what: "config.json".to_owned(), source })?;
        Self::from_config_value(&value)
    }

    /// As [`ModelArch::from_config_json`], from an already parsed document.
    pub fn from_config_value(value: &Value) -> Result<ModelArch> {
        let map = value.as_object().ok_or_else(|| Error::invalid("<root>", "config.json must be a JSON object"))?;
        let family: Family = Family::of_config(map)?;
        let arch = family.def().parse(map)?;
        arch.validate()?;
        Ok(arch)
    }

    /// A transformers-loadable config.json (5.x spelling, `dtype: float32`)
    /// that parses back to an equal architecture.
    pub fn to_config_json(&self) -> Value {
        self.core.family.def().to_config_json(self, None)
    }

    /// As [`ModelArch::to_config_json`], keeping what the architecture does
    /// not describe (a vision tower's config, say) from `source`, the config
    /// the model was converted from.
    pub fn to_config_json_from(&self, source: &Value) -> Value {
        self.core.family.def().to_config_json(self, Some(source))
    }

    /// Each layer's feed-forward kind, in order.
    pub fn layer_kinds(&self) -> Vec<FfnKind> {
        self.layers.iter().map(|l| l.ffn.kind()).collect()
    }

    /// Indices of the MoE layers, ascending.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.layers.len()).filter(|&l| self.layers[l].ffn.kind() == FfnKind::Moe).collect()
    }

    /// Layer `l`: a decoder layer, or past them a multi-token-prediction
    /// layer ([`ModelArch::mtp`]).
    pub fn layer(&self, l: usize) -> Option<&LayerSpec> {
        self.layers.get(l).or_else(|| self.mtp.get(l.checked_sub(self.layers.len())?))
    }

    /// Layers of the container, the stack's and then the MTP layers: the
    /// indices [`ModelArch::layer`] answers for.
    pub fn stored_layers(&self) -> usize {
        self.layers.len() + self.mtp.len()
    }

    /// Every layer index with routed experts, MTP layers included,
    /// ascending: one expert file each.
    pub fn expert_layers(&self) -> Vec<usize> {
        let all = self.layers.iter().chain(&self.mtp).enumerate();
        all.filter(|(_, layer)| layer.ffn.kind() == FfnKind::Moe).map(|(l, _)| l).collect()
    }

    /// The same model without its multi-token-prediction layers.
    pub fn without_mtp(self) -> ModelArch {
        ModelArch { mtp: Vec::new(), ..self }
    }

    /// The stack's residual: every layer's (they agree, [`ModelArch::validate`]
    /// checks), hence its streams and head.
    pub fn residual(&self) -> ResidualKind {
        self.layers.first().map_or(ResidualKind::Plain, |layer| layer.residual)
    }

    /// The first MoE layer's block (`None`: every layer is dense).
    pub fn first_moe(&self) -> Option<&MoeBlock> {
        self.layers.iter().find_map(|l| match &l.ffn {
            FfnSpec::Moe(moe) => Some(moe),
            FfnSpec::Dense { .. } => None,
        })
    }

    /// Routed experts of the MoE layers (0 when every layer is dense).
    pub fn num_experts(&self) -> usize {
        self.first_moe().map_or(0, |moe| moe.num_experts)
    }

    /// Experts each token runs in the MoE layers (0 when every layer is
    /// dense).
    pub fn experts_per_token(&self) -> usize {
        self.first_moe().map_or(0, |moe| moe.top_k)
    }

    /// Width of each routed expert's hidden layer (0 when every layer is
    /// dense).
    pub fn expert_intermediate_size(&self) -> usize {
        self.first_moe().map_or(0, |moe| moe.intermediate_size)
    }

    /// The first dense layer's MLP width, MTP layers included (Inkling's
    /// are dense and as wide as its stack's dense layers); `None`: no dense
    /// layer.
    pub fn dense_intermediate_size(&self) -> Option<usize> {
        self.layers.iter().chain(&self.mtp).find_map(|l| match l.ffn {
            FfnSpec::Dense { intermediate_size, .. } => Some(intermediate_size),
            FfnSpec::Moe(_) => None,
        })
    }

    /// The first grouped-query attention block.
    pub fn first_gqa(&self) -> Option<&GqaSpec> {
        self.layers.iter().find_map(|l| match &l.mixer {
            MixerSpec::Gqa(gqa) => Some(gqa),
            _ => None,
        })
    }

    /// The first latent attention block.
    pub fn first_mla(&self) -> Option<&MlaAttention> {
        self.layers.iter().find_map(|l| match &l.mixer {
            MixerSpec::Mla(mla) => Some(mla),
            _ => None,
        })
    }

    /// The first Gated DeltaNet block.
    pub fn first_gdn(&self) -> Option<&GdnSpec> {
        self.layers.iter().find_map(|l| match &l.mixer {
            MixerSpec::GatedDeltaNet(gdn) => Some(gdn),
            _ => None,
        })
    }

    /// The first rotary embedding a layer applies.
    pub fn first_rope(&self) -> Option<&RopeSpec> {
        self.layers.iter().find_map(|l| l.mixer.rope())
    }

    /// A stored model's architecture: derived from the config it was
    /// converted from (`hf_config`), and refused unless it agrees with the
    /// frozen spec stored beside it (`frozen`), naming the first difference.
    pub fn from_stored(hf_config: &str, frozen: &ModelSpec) -> Result<ModelArch> {
        let derived = ModelArch::from_config_json(hf_config)?;
        let stored = frozen.arch();
        if derived.core != stored.core {
            return Err(disagreement(format!("core: {:?} != {:?}", derived.core, stored.core)));
        }
        if derived.layers.len() != stored.layers.len() {
            return Err(disagreement(format!("{} layers != {}", derived.layers.len(), stored.layers.len())));
        }
        let differs = derived.layers.iter().zip(&stored.layers).position(|(a, b)| a != b);
        if let Some(layer) = differs {
            return Err(disagreement(format!(
                "layer {layer}: {} != {}",
                derived.layers[layer].describe(),
                stored.layers[layer].describe()
            )));
        }
        Ok(derived)
    }

    /// Bytes (f32) one token adds to a sequence's cache, over all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layers.iter().map(LayerSpec::cache_floats_per_token).sum::<usize>() * size_of::<f32>()
    }

    /// Bytes (f32) of fixed state one sequence keeps, over all layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.layers.iter().map(LayerSpec::state_floats).sum::<usize>() * size_of::<f32>()
    }

    /// An upper estimate of the activation bytes one token holds at once in
    /// a forward pass: the widest layer's (see
    /// [`LayerSpec::activation_floats_per_token`]).
    pub fn activation_bytes_per_token(&self) -> usize {
        let floats = self.layers.iter().map(|l| l.activation_floats_per_token(self.core.hidden_size)).max();
        floats.unwrap_or(0) * size_of::<f32>()
    }
}

fn disagreement(what: String) -> Error {
    Error::SpecDisagrees { what }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::spec::LayerType;
    use crate::synth::like_config;

    fn like(name: &str) -> String {
        like_config(name, None).unwrap()
    }

    /// The engine sized prefill chunks by `hidden·(4 + 2·top_k) + 2·q_dim +
    /// experts` floats per token before the estimate moved to the layers;
    /// a model whose layers are alike must keep that number.
    #[test]
    fn the_activation_estimate_of_alike_layers_is_the_engines_former_one() {
        let spec = ModelSpec::from_config_json(&like("qwen3-30b-a3b")).unwrap();
        let floats = spec.hidden_size * (4 + 2 * spec.moe.top_k) + 2 * spec.q_dim() + spec.moe.num_experts;
        assert_eq!(spec.arch().activation_bytes_per_token(), 4 * floats);
    }

    #[test]
    fn a_stored_spec_whose_mixers_differ_from_its_config_is_refused_naming_the_layer() {
        let config = like("qwen3-next-80b-a3b");
        let mut frozen = ModelSpec::from_config_json(&config).unwrap();
        assert_eq!(ModelArch::from_stored(&config, &frozen).unwrap(), frozen.arch());
        let first_linear = frozen.mixers.iter().position(|m| *m == LayerType::Linear).unwrap();
        frozen.mixers[first_linear] = LayerType::Full;
        let err = ModelArch::from_stored(&config, &frozen).unwrap_err();
        assert!(matches!(err, Error::SpecDisagrees { .. }), "{err}");
        assert!(err.to_string().contains(&format!("layer {first_linear}: gated deltanet")), "{err}");
    }

    #[test]
    fn a_layer_describes_its_own_window_and_cache() {
        let mut config: Value = serde_json::from_str(&like("mixtral-8x7b")).unwrap();
        config["sliding_window"] = json!(4096);
        let arch = ModelArch::from_config_value(&config).unwrap();
        let line = arch.layers[0].describe();
        assert!(line.starts_with("gqa 32 q / 8 kv heads x 128, rope 128, window 4096;"), "{line}");
        // The window's ring: keys and values of 8 heads x 128 for 4096 positions.
        assert!(line.ends_with("; moe 8 experts top-2 x 14336; 8388608 f32 state"), "{line}");
    }
}
