//! What the DeepSeek-V3-bodied families (DeepSeek-V3, Kimi K2.5, GLM-5)
//! read and check alike: Multi-head Latent Attention, the sigmoid
//! group-limited router with a correction bias, shared experts, dense
//! layers first. Each family file adds its own fields and defaults
//! (`DeepseekV3Config`, `GlmMoeDsaConfig` of transformers 5.23); fields that
//! fix tensor shapes are required, as for the GQA families.

use serde_json::{Map, Value, json};

use super::{CoreDims, Family, Ffns, stack};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::limits::{MAX_MTP_LAYERS, at_most};
use crate::spec::{
    CoreSpec, ExpertKind, FfnKind, FfnSpec, IndexerSpec, LATENT_NORM_EPS, MixerSpec, MlaAttention, MlaSpec, ModelArch,
    MoeBlock, MtpForm, NormKind, RopeScaling, RopeSpec, RouterKind, SharedExperts, SwiGlu, common_config, expert_count,
    parse_rope, special_tokens,
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

/// The keys every MLA family reads alike, beyond [`super::CORE_READ`].
pub(super) const READ: &[&str] = &[
    "num_key_value_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "original_max_position_embeddings",
    "n_routed_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "scoring_func",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
    "n_shared_experts",
    "attention_bias",
    "intermediate_size",
    "first_k_dense_replace",
];

/// Keys of the MLA families' configs that transformers does not read:
/// `head_dim` and `qk_head_dim` are recomputed by `__post_init__`,
/// multi-token prediction does not change the next token's logits, and the
/// rest are DeepSeek's training settings (`topk_method` and
/// `moe_layer_freq` included: the 5.23 model routes by `noaux_tc` and
/// places MoE layers by `first_k_dense_replace` only).
pub(super) const INERT: &[&str] = &[
    "head_dim",
    "qk_head_dim",
    "pretraining_tp",
    "topk_method",
    "moe_layer_freq",
    "aux_loss_alpha",
    "seq_aux",
    "ep_size",
];

/// The keys that declare multi-token-prediction layers (transformers 5.x
/// reads `num_nextn_predict_layers` as `num_mtp_layers`): read by the
/// families whose MTP layers Strata runs, inert in the others (their MTP
/// layers are left unread, `Known::extra_layers_unused`).
pub(super) const MTP_KEYS: &[&str] = &["num_nextn_predict_layers", "num_mtp_layers"];

/// What every MLA family reads alike: the common part, the latent
/// attention block (no indexer), the feed-forward blocks and the layer
/// pattern (`first_k_dense_replace` dense layers first), for the family
/// file to finish.
pub(super) struct Parsed {
    pub core: CoreSpec,
    pub attention: MlaAttention,
    pub ffns: Ffns,
    pub kinds: Vec<FfnKind>,
    /// Multi-token-prediction layers after the stack (0 unless the family
    /// reads them, [`Parsed::with_mtp`]).
    pub mtp_layers: usize,
}

impl Parsed {
    /// The same, with the MTP layers `cfg` declares: `num_nextn_predict_layers`
    /// (DeepSeek's spelling), else `num_mtp_layers` (transformers 5.x's),
    /// else none. Each is a MoE layer whatever `first_k_dense_replace` says,
    /// as transformers' `get_mtp_config` builds it.
    pub(super) fn with_mtp(self, cfg: &Fields<'_>) -> Result<Self> {
        let declared = match (cfg.usize("num_nextn_predict_layers")?, cfg.usize("num_mtp_layers")?) {
            (Some(n), _) => ("num_nextn_predict_layers", n),
            (None, n) => ("num_mtp_layers", n.unwrap_or(0)),
        };
        let mtp_layers = at_most(declared.0, declared.1, MAX_MTP_LAYERS)?;
        Ok(Parsed { mtp_layers, ..self })
    }

    /// The model whose layer `l` has the latent attention block with the
    /// indexer `indexer(l)`.
    pub(super) fn build(self, indexer: impl Fn(usize) -> Option<IndexerSpec>) -> Result<ModelArch> {
        let attention = |l| MixerSpec::Mla(MlaAttention { indexer: indexer(l), ..self.attention });
        let mut kinds = self.kinds.clone();
        kinds.extend(std::iter::repeat_n(FfnKind::Moe, self.mtp_layers));
        let mut layers = stack(&kinds, &self.ffns, self.core.final_norm, attention)?;
        let mtp = layers.split_off(self.kinds.len());
        Ok(ModelArch { core: self.core, layers, mtp, mtp_form: MtpForm::DEEPSEEK_V3 })
    }
}

/// Parses the fields every MLA family reads alike from `cfg` (the text
/// model's config), as `DeepseekV3Config` reads them.
pub(super) fn parse(cfg: &Fields<'_>, family: Family, defaults: &Defaults) -> Result<Parsed> {
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
    let q_lora_rank = match cfg.raw("q_lora_rank") {
        None => return Err(Error::MissingField { field: "q_lora_rank".into() }),
        Some(_) => cfg.usize("q_lora_rank")?,
    };
    let dims = MlaSpec {
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
    let rope = parse_rope(cfg, 10_000.0, true, dims.qk_rope_head_dim, max_position_embeddings)?;

    let num_experts = expert_count(cfg, ("n_routed_experts", "num_local_experts"))?;
    let top_k = cfg.req_usize("num_experts_per_tok")?;
    let moe_intermediate_size = cfg.req_usize("moe_intermediate_size")?;
    if let Some(scoring) = cfg.str("scoring_func")?
        && scoring != "sigmoid"
    {
        return Err(Error::invalid("scoring_func", format!("{scoring:?} is not supported (only \"sigmoid\")")));
    }
    let router = RouterKind::GroupedSigmoid {
        n_group: cfg.usize("n_group")?.unwrap_or(defaults.n_group),
        topk_group: cfg.usize("topk_group")?.unwrap_or(defaults.topk_group),
        renormalize: cfg.bool("norm_topk_prob")?.unwrap_or(true),
        scaling: cfg.f64("routed_scaling_factor")?.unwrap_or(2.5),
    };
    let n_shared = cfg.usize("n_shared_experts")?.unwrap_or(1);
    let shared = match moe_intermediate_size.checked_mul(n_shared) {
        _ if n_shared == 0 => SharedExperts::None,
        Some(intermediate_size) => SharedExperts::Plain { intermediate_size },
        None => return Err(Error::invalid("n_shared_experts", "tensor sizes overflow usize")),
    };
    let (bos_token_id, eos_token_ids) = special_tokens(cfg, (Some(0), vec![1]))?;

    let core = CoreSpec {
        family,
        vocab_size,
        hidden_size,
        max_position_embeddings,
        tie_word_embeddings: cfg.bool("tie_word_embeddings")?.unwrap_or(false),
        final_norm: NormKind::Weight { eps: rms_norm_eps },
        embed_norm: None,
        logits_mup_divisor: None,
        unpadded_vocab_size: None,
        bos_token_id,
        eos_token_ids,
    };
    let attention = MlaAttention {
        num_heads,
        dims,
        rope: Some(rope),
        latent_norm_eps: LATENT_NORM_EPS,
        bias: cfg.bool("attention_bias")?.unwrap_or(false),
        indexer: None,
        output_gate: false,
    };
    let moe = MoeBlock {
        num_experts,
        top_k,
        intermediate_size: moe_intermediate_size,
        router,
        shared,
        experts: ExpertKind::SwiGlu,
        swiglu: SwiGlu::Plain,
        latent: None,
    };
    let ffns = Ffns { moe, dense_intermediate_size: cfg.req_usize("intermediate_size")? };
    let kinds = dense_first_layer_kinds(cfg, num_layers)?;
    Ok(Parsed { core, attention, ffns, kinds, mtp_layers: 0 })
}

/// DeepseekV3DecoderLayer: MoE iff `layer >= first_k_dense_replace`.
pub(super) fn dense_first_layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<FfnKind>> {
    let dense = cfg.usize("first_k_dense_replace")?.unwrap_or(3);
    Ok((0..num_layers).map(|l| if l >= dense { FfnKind::Moe } else { FfnKind::Dense }).collect())
}

/// A list of strings, or `None` when absent or null.
pub(super) fn string_list(cfg: &Fields<'_>, key: &str) -> Result<Option<Vec<String>>> {
    match cfg.raw(key) {
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

/// The MLA invariants every family shares (every layer's own are checked
/// first): every layer latent attention, routed by sigmoid scores with a
/// correction bias, its shared experts whole experts.
pub(super) fn validate(arch: &ModelArch) -> Result<()> {
    let family = arch.core.family;
    for layer in &arch.layers {
        if !matches!(layer.mixer, MixerSpec::Mla(_)) {
            return Err(Error::invalid("kv_lora_rank", format!("{family} needs its MLA dimensions")));
        }
        validate_ffn(&layer.ffn)?;
    }
    Ok(())
}

/// A layer's feed-forward block as the DeepSeek-V3 MoE has it: routed by
/// sigmoid scores with a correction bias, its shared experts whole experts.
pub(super) fn validate_ffn(ffn: &FfnSpec) -> Result<()> {
    let FfnSpec::Moe(moe) = ffn else { return Ok(()) };
    if !matches!(moe.router, RouterKind::GroupedSigmoid { .. }) {
        return Err(Error::invalid("scoring_func", "the MLA families route by sigmoid with a correction bias"));
    }
    match moe.shared {
        SharedExperts::None => Ok(()),
        SharedExperts::Plain { intermediate_size } if intermediate_size.is_multiple_of(moe.intermediate_size) => Ok(()),
        _ => Err(Error::invalid("n_shared_experts", "shared experts must be whole experts")),
    }
}

/// The checks of a family whose config says only `first_k_dense_replace`
/// and has no DSA indexer.
pub(super) fn validate_dense_first_without_dsa(arch: &ModelArch) -> Result<()> {
    validate(arch)?;
    validate_dense_first(arch)
}

/// The layer pattern `first_k_dense_replace` can say, and no DSA indexer.
pub(super) fn validate_dense_first(arch: &ModelArch) -> Result<()> {
    // The layer pattern must be expressible in the family's config.json.
    let kinds = arch.layer_kinds();
    let dense = kinds.iter().take_while(|&&k| k == FfnKind::Dense).count();
    if kinds[dense..].contains(&FfnKind::Dense) {
        return Err(Error::invalid("first_k_dense_replace", "dense layers must all come first"));
    }
    if indexers(arch).next().is_some() {
        return Err(dsa_mismatch(arch.core.family));
    }
    Ok(())
}

/// Each layer's DSA indexer, where it has one.
pub(super) fn indexers(arch: &ModelArch) -> impl Iterator<Item = &IndexerSpec> {
    arch.layers.iter().filter_map(|l| match &l.mixer {
        MixerSpec::Mla(mla) => mla.indexer.as_ref(),
        _ => None,
    })
}

/// The error for a DSA indexer where the family has none, or none where it
/// has one.
pub(super) fn dsa_mismatch(family: Family) -> Error {
    Error::invalid("index_topk", format!("{family} and DSA: only glm_moe_dsa has an indexer"))
}

/// The config.json keys every MLA family writes alike (5.x spelling), for
/// its latent attention block `mla`. (A latent model's layers all have
/// one; its MoE block, on a model of dense layers only, the GQA families'
/// stand-in.)
pub(super) fn config_json(arch: &ModelArch, mla: &MlaAttention) -> Map<String, Value> {
    let dims = &mla.dims;
    let moe = super::gqa::blocks(arch).1;
    let (n_group, topk_group, scaling) = match moe.router {
        RouterKind::GroupedSigmoid { n_group, topk_group, scaling, .. } => (n_group, topk_group, scaling),
        RouterKind::SoftmaxTopK { .. }
        | RouterKind::TopKThenSoftmax
        | RouterKind::SharedExpertSink { .. }
        | RouterKind::SqrtSoftplus { .. }
        | RouterKind::Hash { .. } => (1, 1, 1.0),
    };
    let heads = (mla.num_heads, mla.num_heads);
    // Without RoPE the rope keys written are transformers' defaults (the
    // whole rope part rotated), which the config's reader ignores.
    let unrotated = RopeSpec { theta: 10_000.0, scaling: RopeScaling::None, rotary_dim: dims.qk_rope_head_dim };
    let rope = mla.rope.unwrap_or(unrotated);
    let mut c = common_config(&arch.core, arch.layers.len(), heads, &rope, dims.qk_rope_head_dim);
    c.insert("q_lora_rank".into(), json!(dims.q_lora_rank));
    c.insert("kv_lora_rank".into(), json!(dims.kv_lora_rank));
    c.insert("qk_nope_head_dim".into(), json!(dims.qk_nope_head_dim));
    c.insert("qk_rope_head_dim".into(), json!(dims.qk_rope_head_dim));
    c.insert("v_head_dim".into(), json!(dims.v_head_dim));
    c.insert("intermediate_size".into(), json!(arch.dense_intermediate_size().unwrap_or(0)));
    c.insert("moe_intermediate_size".into(), json!(moe.intermediate_size));
    c.insert("n_routed_experts".into(), json!(moe.num_experts));
    let n_shared = moe.shared.total_intermediate_size() / moe.intermediate_size;
    c.insert("n_shared_experts".into(), json!(n_shared));
    c.insert("num_experts_per_tok".into(), json!(moe.top_k));
    c.insert("norm_topk_prob".into(), json!(moe.router.renormalizes()));
    c.insert("n_group".into(), json!(n_group));
    c.insert("topk_group".into(), json!(topk_group));
    c.insert("routed_scaling_factor".into(), json!(scaling));
    c.insert("attention_bias".into(), json!(mla.bias));
    let dense = arch.layer_kinds().iter().take_while(|&&k| k == FfnKind::Dense).count();
    c.insert("first_k_dense_replace".into(), json!(dense));
    // Declared only where kept: a family that does not read it has none.
    if !arch.mtp.is_empty() {
        c.insert("num_nextn_predict_layers".into(), json!(arch.mtp.len()));
    }
    c
}
