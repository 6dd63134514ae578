//! What the grouped-query-attention families (OLMoE, Qwen3-MoE, Mixtral)
//! read and check alike; each family file adds its own fields and defaults.

use serde_json::{Map, Value, json};

use super::{CoreDims, Family, Ffns, stack};
use crate::error::{Error, Result};
use crate::spec::MtpForm;
use crate::spec::fields::Fields;
use crate::spec::{
    CoreSpec, ExpertKind, FfnKind, FfnSpec, GqaSpec, LayerSpec, MixerSpec, ModelArch, MoeBlock, NormKind, QkNorm,
    RopeScaling, RopeSpec, RouterKind, SharedExperts, SwiGlu, common_config, expert_count, parse_rope, special_tokens,
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

/// The keys every GQA family reads alike, beyond [`super::CORE_READ`]
/// (the expert count's and width's names are the family's own).
pub(super) const READ: &[&str] = &["num_key_value_heads", "head_dim", "num_experts_per_tok", "intermediate_size"];

/// The keys of Qwen's layer pattern ([`sparse_step_layer_kinds`]).
pub(super) const SPARSE_STEP_READ: &[&str] = &["decoder_sparse_step", "mlp_only_layers"];

/// What every GQA family reads alike: the common part, the model's
/// attention block (no biases, q/k norms, clip or window; RoPE on every
/// layer) and its feed-forward blocks (experts as wide as the family's
/// `expert_width`, a softmax router that does not renormalise, no shared
/// experts), with the config they came from, for the family file to finish.
pub(super) struct Parsed<'a> {
    pub core: CoreSpec,
    pub num_layers: usize,
    pub attention: GqaSpec,
    pub ffns: Ffns,
    pub cfg: Fields<'a>,
}

impl Parsed<'_> {
    /// The model whose layer `l` has the attention block `attention(l)` and
    /// the feed-forward block `kinds[l]` names.
    pub(super) fn build(self, kinds: &[FfnKind], attention: impl Fn(usize) -> MixerSpec) -> Result<ModelArch> {
        let layers = stack(kinds, &self.ffns, self.core.final_norm, attention)?;
        Ok(ModelArch { core: self.core, layers, mtp: Vec::new(), mtp_form: MtpForm::DEEPSEEK_V3 })
    }

    /// The model whose every layer has the model's attention block and the
    /// feed-forward block `kinds[l]` names.
    pub(super) fn build_alike(self, kinds: &[FfnKind]) -> Result<ModelArch> {
        let attention = MixerSpec::Gqa(self.attention);
        self.build(kinds, |_| attention.clone())
    }

    /// Sets the router: softmax top-k, renormalised or not.
    pub(super) fn softmax_router(&mut self, renormalize: bool) {
        self.ffns.moe.router = RouterKind::SoftmaxTopK { renormalize };
    }
}

/// [`Parsed`] of a config at the document's root.
pub(super) fn parse<'a>(map: &'a Map<String, Value>, family: Family, defaults: &Defaults) -> Result<Parsed<'a>> {
    parse_fields(Fields { map, prefix: "" }, family, defaults)
}

/// [`parse`] of a config object that may sit inside another (`cfg.prefix`
/// names where, for errors).
pub(super) fn parse_fields<'a>(cfg: Fields<'a>, family: Family, defaults: &Defaults) -> Result<Parsed<'a>> {
    let CoreDims { vocab_size, hidden_size, num_layers, num_heads } = CoreDims::read(&cfg)?;
    if num_heads == 0 {
        return Err(Error::invalid("num_attention_heads", "must be > 0"));
    }
    // null means "same as num_attention_heads" in every family's
    // __post_init__ (and in 4.x); an absent key takes the class default.
    let num_kv_heads = match cfg.raw("num_key_value_heads") {
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
    // Only dense layers use it; their validation requires it > 0.
    let dense_intermediate_size = cfg.usize("intermediate_size")?.unwrap_or(0);
    let (bos_token_id, eos_token_ids) = special_tokens(&cfg, (defaults.bos_token_id, defaults.eos_token_ids.to_vec()))?;

    let core = CoreSpec {
        family,
        vocab_size,
        hidden_size,
        max_position_embeddings,
        tie_word_embeddings,
        final_norm: NormKind::Weight { eps: rms_norm_eps },
        embed_norm: None,
        logits_mup_divisor: None,
        unpadded_vocab_size: None,
        bos_token_id,
        eos_token_ids,
    };
    let attention = GqaSpec {
        num_heads,
        num_kv_heads,
        head_dim,
        qk_norm: QkNorm::None,
        clip_qkv: None,
        bias: false,
        sliding_window: None,
        rope: Some(rope),
        sinks: false,
        output_gate: false,
        qsa: None,
    };
    let moe = MoeBlock {
        num_experts,
        top_k,
        intermediate_size,
        router: RouterKind::SoftmaxTopK { renormalize: false },
        shared: SharedExperts::None,
        experts: ExpertKind::SwiGlu,
        swiglu: SwiGlu::Plain,
        latent: None,
    };
    Ok(Parsed { core, num_layers, attention, ffns: Ffns { moe, dense_intermediate_size }, cfg })
}

/// Qwen's layer pattern (`Qwen3MoeDecoderLayer`, `Qwen3NextDecoderLayer`):
/// sparse iff not listed in `mlp_only_layers` and `(i + 1) %
/// decoder_sparse_step == 0`.
pub(super) fn sparse_step_layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<FfnKind>> {
    let step = cfg.usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(Error::invalid("decoder_sparse_step", "must be >= 1"));
    }
    let mlp_only = cfg.usize_list("mlp_only_layers")?.unwrap_or_default();
    if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
        return Err(Error::invalid("mlp_only_layers", format!("layer {bad} >= num_hidden_layers {num_layers}")));
    }
    let kind = |i: usize| {
        if !mlp_only.contains(&i) && (i + 1).is_multiple_of(step) { FfnKind::Moe } else { FfnKind::Dense }
    };
    Ok((0..num_layers).map(kind).collect())
}

/// The config.json keys of Qwen's layer pattern: `decoder_sparse_step = 1`
/// plus an explicit `mlp_only_layers` reproduces any pattern exactly.
pub(super) fn sparse_step_config(arch: &ModelArch, c: &mut Map<String, Value>) {
    let dense: Vec<usize> =
        arch.layer_kinds().iter().enumerate().filter(|(_, k)| **k == FfnKind::Dense).map(|(l, _)| l).collect();
    c.insert("decoder_sparse_step".into(), json!(1));
    c.insert("mlp_only_layers".into(), json!(dense));
}

/// What every GQA family's model keeps: every layer grouped-query
/// attention, dense layers only where the family has them, and a softmax
/// router without shared experts.
pub(super) fn validate(arch: &ModelArch, has_dense_layers: bool) -> Result<()> {
    let family = arch.core.family;
    if arch.dense_intermediate_size().is_some() && !has_dense_layers {
        return Err(Error::invalid("mlp_only_layers", format!("{family} has no dense layers")));
    }
    // The GQA families implement exactly the softmax router and no MLA.
    let plain = |layer: &LayerSpec| {
        let moe_ok = match &layer.ffn {
            FfnSpec::Moe(moe) => {
                matches!(moe.router, RouterKind::SoftmaxTopK { .. }) && moe.shared == SharedExperts::None
            }
            FfnSpec::Dense { .. } => true,
        };
        moe_ok && matches!(layer.mixer, MixerSpec::Gqa(_))
    };
    if !arch.layers.iter().all(plain) {
        return Err(Error::invalid(
            "model_type",
            format!("{family} has no MLA, DSA, shared experts or sigmoid routing"),
        ));
    }
    Ok(())
}

/// Every GQA layer keeps `holds`; else the error names `field` and says
/// `what` the family requires.
pub(super) fn every_gqa(arch: &ModelArch, holds: impl Fn(&GqaSpec) -> bool, field: &str, what: &str) -> Result<()> {
    let all = arch.layers.iter().all(|l| match &l.mixer {
        MixerSpec::Gqa(gqa) => holds(gqa),
        _ => true,
    });
    if !all {
        return Err(Error::invalid(field, format!("{} {what}", arch.core.family)));
    }
    Ok(())
}

/// The attention block a config writes for the model (the first GQA
/// layer's), and its MoE block (the first MoE layer's). A model may lack
/// either (a hybrid without full layers, a model of dense layers): a config
/// still gives them, and any valid value parses back to the same layers.
pub(super) fn blocks(arch: &ModelArch) -> (GqaSpec, MoeBlock) {
    let head_dim = 2;
    let gqa = arch.first_gqa().copied().unwrap_or(GqaSpec {
        num_heads: 1,
        num_kv_heads: 1,
        head_dim,
        qk_norm: QkNorm::None,
        clip_qkv: None,
        bias: false,
        sliding_window: None,
        rope: Some(RopeSpec { theta: 10_000.0, scaling: RopeScaling::None, rotary_dim: head_dim }),
        sinks: false,
        output_gate: false,
        qsa: None,
    });
    let moe = arch.first_moe().copied().unwrap_or(MoeBlock {
        num_experts: 1,
        top_k: 1,
        intermediate_size: 1,
        router: RouterKind::SoftmaxTopK { renormalize: false },
        shared: SharedExperts::None,
        experts: ExpertKind::SwiGlu,
        swiglu: SwiGlu::Plain,
        latent: None,
    });
    (gqa, moe)
}

/// The config.json keys every GQA family writes alike, for its attention
/// block `gqa` and MoE block `moe`.
pub(super) fn config_json(arch: &ModelArch, gqa: &GqaSpec, moe: &MoeBlock) -> Map<String, Value> {
    let rope = gqa.rope.unwrap_or(RopeSpec { theta: 10_000.0, scaling: RopeScaling::None, rotary_dim: gqa.head_dim });
    let heads = (gqa.num_heads, gqa.num_kv_heads);
    let mut c = common_config(&arch.core, arch.layers.len(), heads, &rope, gqa.head_dim);
    c.insert("head_dim".into(), gqa.head_dim.into());
    c.insert("num_experts_per_tok".into(), moe.top_k.into());
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::like_config;

    /// gpt-oss's shape: a family file gives each layer its own window and
    /// heads, and one no RoPE, through the same builder.
    #[test]
    fn a_family_file_can_give_each_layer_its_own_window_heads_and_rope() {
        let config: Value = serde_json::from_str(&like_config("mixtral-8x7b", Some(3)).unwrap()).unwrap();
        let parsed = parse(config.as_object().unwrap(), Family::Mixtral, &super::super::mixtral::DEFAULTS).unwrap();
        let full = parsed.attention;
        let own = |l: usize| {
            let mut gqa = full;
            match l {
                0 => gqa.sliding_window = Some(128),
                1 => gqa.num_kv_heads = gqa.num_heads,
                _ => gqa.rope = None,
            }
            MixerSpec::Gqa(gqa)
        };
        let arch = parsed.build(&[FfnKind::Moe; 3], own).unwrap();
        arch.validate().unwrap();
        let lines: Vec<String> = arch.layers.iter().map(LayerSpec::describe).collect();
        assert!(lines[0].starts_with("gqa 32 q / 8 kv heads x 128, rope 128, window 128;"), "{}", lines[0]);
        assert!(lines[1].starts_with("gqa 32 q / 32 kv heads x 128, rope 128;"), "{}", lines[1]);
        assert!(lines[2].starts_with("gqa 32 q / 8 kv heads x 128, no rope;"), "{}", lines[2]);
    }
}
