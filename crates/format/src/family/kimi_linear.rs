//! Kimi-Linear (`kimi_linear`, `KimiLinearConfig` of transformers 5.23):
//! Kimi Delta Attention layers between Multi-head Latent Attention layers
//! without RoPE, DeepSeek-V3's grouped sigmoid router with a correction
//! bias, shared experts, `first_k_dense_replace` dense layers first (one by
//! default). The config spells several DeepSeek fields its own way (the
//! class's `attribute_map`), and the hub nests the KDA dimensions and the
//! layer pattern in `linear_attn_config`; the hub names attention
//! `self_attn.` on every layer and the MoE `block_sparse_moe.` with
//! Mixtral's `w1`/`w3`/`w2`.

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, CoreDims, Family, FamilyDef, Naming, hybrid, mla, stack};
use crate::error::{Error, Result};
use crate::spec::MtpForm;
use crate::spec::fields::Fields;
use crate::spec::limits::{self, MAX_HEAD_DIM, MAX_HEADS};
use crate::spec::{
    FfnKind, GateActivation, GateRank, GdnDims, GdnProjections, GdnSpec, LayerType, MixerSpec, MlaAttention, ModelArch,
    RouterKind,
};

pub(super) struct KimiLinear;

/// `KimiLinearConfig`'s defaults for the fields the MLA families read.
const DEFAULTS: mla::Defaults =
    mla::Defaults { rms_norm_eps: 1e-5, max_position_embeddings: 1_048_576, n_group: 1, topk_group: 1 };

/// `attribute_map`: `(the spelling the MLA reader takes, Kimi's)`. A
/// config may give either; transformers reads both into one field.
pub(super) const SPELLINGS: [(&str, &str); 6] = [
    ("max_position_embeddings", "model_max_length"),
    ("norm_topk_prob", "moe_renormalize"),
    ("n_group", "num_expert_group"),
    ("num_local_experts", "num_experts"),
    ("num_experts_per_tok", "num_experts_per_token"),
    ("n_shared_experts", "num_shared_experts"),
];

/// `KimiLinearConfig`'s defaults where they differ from DeepSeek-V3's (or
/// where the MLA reader has none): no query low-rank, one dense layer, its
/// router's scale and its special ids.
fn class_defaults() -> [(&'static str, Value); 6] {
    [
        ("q_lora_rank", Value::Null),
        ("first_k_dense_replace", json!(1)),
        ("routed_scaling_factor", json!(2.446)),
        ("num_experts_per_tok", json!(8)),
        ("bos_token_id", json!(163_584)),
        ("eos_token_id", json!(163_586)),
    ]
}

/// The KDA dimensions' keys: `(KimiLinearConfig's, linear_attn_config's,
/// default)`.
const LINEAR_DIMS: [(&str, &str, usize); 3] = [
    ("linear_num_heads", "num_heads", 32),
    ("linear_head_dim", "head_dim", 128),
    ("linear_conv_kernel_dim", "short_conv_kernel_size", 4),
];

/// Every full layer is one in four after the first when nothing says
/// otherwise (`"full_attention" if i and i % 4 == 0`).
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// Mixtral's expert names under `block_sparse_moe.`; the dense layers'
/// MLP sits under `mlp.` on the hub, and `save_pretrained` (which renames
/// every `.mlp.` back) writes it under `block_sparse_moe.` too.
const NAMING: Naming = Naming {
    model_prefix: "model.",
    lm_head: "lm_head.weight",
    moe_module: "block_sparse_moe",
    expert_projections: ["w1", "w3", "w2"],
    aliases: &[],
    saved_as: &[(".mlp.", ".block_sparse_moe.")],
};

/// The keys `KimiLinearConfig` reads beyond the MLA families' own.
pub(super) const KIMI_READ: &[&str] = &[
    "model_max_length",
    "moe_renormalize",
    "num_expert_group",
    "num_experts",
    "num_experts_per_token",
    "num_shared_experts",
    "num_local_experts",
    "mlp_layer_types",
    "layer_types",
    "linear_num_heads",
    "linear_head_dim",
    "linear_conv_kernel_dim",
    "rope_interleave",
];

/// What a kimi_linear checkpoint may hold (`KimiLinearConfig`, and the
/// hub's `linear_attn_config`).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[CORE_READ, mla::READ, KIMI_READ, &HUB_SWITCHES],
        inert: &[HF_INERT, mla::INERT, mla::MTP_KEYS],
        nested: &[
            ("linear_attn_config", &LINEAR_ATTN_CONFIG),
            ROPE_AND_QUANTIZATION[0],
            ROPE_AND_QUANTIZATION[1],
            ROPE_AND_QUANTIZATION[2],
        ],
    },
    unused_tensors: &[],
    extra_layers_unused: true,
};

/// Switches of the hub's config.json (Moonshot's own `KimiLinearConfig`)
/// that transformers' class does not read: it always routes by sigmoid,
/// always group-limits the top-k and never rotates the latent layers. A
/// config is converted only where each says what transformers runs.
pub(super) const HUB_SWITCHES: [&str; 3] = ["moe_router_activation_func", "use_grouped_topk", "mla_use_nope"];

/// Refuses a hub switch ([`HUB_SWITCHES`]) that asks for other arithmetic
/// than transformers' kimi_linear does, for a model routed by `router`.
pub(super) fn check_hub_switches(cfg: &Fields<'_>, router: RouterKind) -> Result<()> {
    if let Some(activation) = cfg.str("moe_router_activation_func")?
        && activation != "sigmoid"
    {
        return Err(Error::invalid(
            "moe_router_activation_func",
            format!("{activation:?} is not supported (kimi_linear routes by \"sigmoid\" only)"),
        ));
    }
    if cfg.bool("mla_use_nope")? == Some(false) {
        return Err(Error::invalid(
            "mla_use_nope",
            "false rotates the latent layers' rope part, which kimi_linear never does (only true is supported)",
        ));
    }
    // Without groups Moonshot's router takes the top-k of all experts,
    // which group-limited routing equals only when every group is kept.
    let RouterKind::GroupedSigmoid { n_group, topk_group, .. } = router else {
        unreachable!("mla::parse builds the grouped sigmoid router");
    };
    if cfg.bool("use_grouped_topk")? == Some(false) && topk_group < n_group {
        return Err(Error::invalid(
            "use_grouped_topk",
            format!(
                "false routes over all experts, but transformers keeps {topk_group} of {n_group} expert groups \
                 (only true, or topk_group equal to num_expert_group, is supported)"
            ),
        ));
    }
    Ok(())
}

/// The hub's `linear_attn_config`.
pub(super) const LINEAR_ATTN_CONFIG: ConfigKeys = ConfigKeys {
    read: &[&["num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers"]],
    inert: &[],
    nested: &[],
};

/// `root` (its fields named after `prefix`) with Kimi's spellings read into
/// the MLA reader's and the class defaults filled in; a field given in
/// both spellings must agree.
pub(super) fn normalized(root: &Map<String, Value>, prefix: &'static str) -> Result<Map<String, Value>> {
    let mut map = root.clone();
    let top = Fields { map: root, prefix };
    for (theirs, kimi) in SPELLINGS {
        let Some(v) = top.raw(kimi) else { continue };
        if root.get(theirs).is_some_and(|other| other != v) {
            return Err(Error::invalid(kimi, format!("disagrees with {theirs} ({} vs {v})", root[theirs])));
        }
        map.insert(theirs.to_owned(), v.clone());
    }
    for (key, default) in class_defaults() {
        map.entry(key).or_insert(default);
    }
    Ok(map)
}

/// The KDA dimensions: `linear_attn_config`'s, else the class fields.
pub(super) fn linear_dims(cfg: &Fields<'_>, linear: Option<&Fields<'_>>) -> Result<GdnDims> {
    let read = |(field, nested, default): (&str, &str, usize)| -> Result<usize> {
        let given = match linear {
            Some(linear) if linear.raw(nested).is_some() => linear.usize(nested)?,
            _ => cfg.usize(field)?,
        };
        Ok(given.unwrap_or(default))
    };
    let heads = limits::at_most("linear_num_heads", read(LINEAR_DIMS[0])?, MAX_HEADS)?;
    let head_dim = limits::at_most("linear_head_dim", read(LINEAR_DIMS[1])?, MAX_HEAD_DIM)?;
    Ok(GdnDims {
        num_k_heads: heads,
        num_v_heads: heads,
        head_k_dim: head_dim,
        head_v_dim: head_dim,
        conv_kernel: limits::at_most("linear_conv_kernel_dim", read(LINEAR_DIMS[2])?, 64)?,
        projections: GdnProjections::Kimi,
    })
}

/// `layer_types`, else `linear_attn_config`'s 1-based `kda_layers` and
/// `full_attn_layers` (both, covering every layer once), else the class
/// default.
pub(super) fn layer_types(cfg: &Fields<'_>, linear: Option<&Fields<'_>>, num_layers: usize) -> Result<Vec<LayerType>> {
    if let Some(listed) = hybrid::listed_layer_types(cfg, num_layers, hybrid::FULL_ATTENTION)? {
        return Ok(listed);
    }
    let lists = match linear {
        Some(linear) => (linear.usize_list("kda_layers")?, linear.usize_list("full_attn_layers")?),
        None => (None, None),
    };
    let (Some(kda), Some(full)) = lists else {
        return Ok((0..num_layers)
            .map(|i| {
                if i > 0 && i.is_multiple_of(DEFAULT_FULL_ATTENTION_INTERVAL) {
                    LayerType::Full
                } else {
                    LayerType::Linear
                }
            })
            .collect());
    };
    let mut types = vec![None; num_layers];
    for (list, kind) in [(full, LayerType::Full), (kda, LayerType::Linear)] {
        for layer in list {
            let slot = layer.checked_sub(1).and_then(|i| types.get_mut(i)).ok_or_else(|| {
                Error::invalid("linear_attn_config", format!("layer {layer} is not in 1..={num_layers}"))
            })?;
            if slot.replace(kind).is_some() {
                return Err(Error::invalid("linear_attn_config", format!("layer {layer} is listed twice")));
            }
        }
    }
    types
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.ok_or_else(|| Error::invalid("linear_attn_config", format!("layer {} is in neither list", i + 1)))
        })
        .collect()
}

/// Each layer's feed-forward kind: `mlp_layer_types` (`dense` or `sparse`
/// per layer), else `first_k_dense_replace`'s (`dense_first`).
pub(super) fn ffn_kinds(cfg: &Fields<'_>, dense_first: Vec<FfnKind>, num_layers: usize) -> Result<Vec<FfnKind>> {
    match mla::string_list(cfg, "mlp_layer_types")? {
        None => Ok(dense_first),
        Some(listed) if listed.len() == num_layers => listed
            .iter()
            .map(|t| match t.as_str() {
                "dense" => Ok(FfnKind::Dense),
                "sparse" => Ok(FfnKind::Moe),
                other => Err(Error::invalid("mlp_layer_types", format!("{other:?} is not \"dense\" or \"sparse\""))),
            })
            .collect(),
        Some(listed) => {
            Err(Error::invalid("mlp_layer_types", format!("{} entries for {num_layers} layers", listed.len())))
        }
    }
}

impl FamilyDef for KimiLinear {
    fn model_type(&self) -> &'static str {
        "kimi_linear"
    }

    fn architecture(&self) -> &'static str {
        "KimiLinearForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let map = normalized(root, "")?;
        let cfg = Fields { map: &map, prefix: "" };
        let linear_map = cfg.object("linear_attn_config")?;
        let linear = linear_map.map(|map| Fields { map, prefix: "linear_attn_config." });
        let num_layers = CoreDims::read(&cfg)?.num_layers;
        let parsed = mla::parse(&cfg, Family::KimiLinear, &DEFAULTS)?;
        check_hub_switches(&cfg, parsed.ffns.moe.router)?;
        // KimiLinearModel builds no rotary embedding: the latent layers'
        // rope part is attended unrotated.
        let full = MlaAttention { rope: None, ..parsed.attention };
        let gdn = GdnSpec {
            dims: linear_dims(&cfg, linear.as_ref())?,
            eps: parsed.core.final_norm.eps(),
            gate_lower_bound: None,
            output_gate: GateActivation::Sigmoid,
            output_gate_rank: GateRank::Low,
            a_log_padded_to: None,
        };
        let types = layer_types(&cfg, linear.as_ref(), num_layers)?;
        let kinds = ffn_kinds(&cfg, parsed.kinds, num_layers)?;
        let mixer = |l: usize| match types[l] {
            LayerType::Full => MixerSpec::Mla(full),
            LayerType::Linear => MixerSpec::GatedDeltaNet(gdn),
        };
        let layers = stack(&kinds, &parsed.ffns, parsed.core.final_norm, mixer)?;
        Ok(ModelArch { core: parsed.core, layers, mtp: Vec::new(), mtp_form: MtpForm::DEEPSEEK_V3 })
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        for layer in &arch.layers {
            match &layer.mixer {
                MixerSpec::Mla(mla) if mla.rope.is_none() => {}
                MixerSpec::GatedDeltaNet(gdn) if gdn.dims.projections == GdnProjections::Kimi => {}
                _ => return Err(Error::invalid("layer_types", "kimi_linear has only KDA and unrotated MLA layers")),
            }
            mla::validate_ffn(&layer.ffn)?;
        }
        if arch.first_mla().is_none() {
            // Its config.json carries the latent dimensions, which only a
            // full layer says.
            return Err(Error::invalid("layer_types", "kimi_linear needs a full_attention layer"));
        }
        mla::validate_dense_first(arch)
    }

    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value {
        // validate() guarantees a latent layer.
        let Some(attention) = arch.first_mla() else { return Value::Null };
        let mut c = mla::config_json(arch, attention);
        for (theirs, kimi) in SPELLINGS {
            if let Some(v) = c.remove(theirs) {
                c.insert(kimi.into(), v);
            }
        }
        // mla::config_json writes DeepSeek's expert count.
        if let Some(v) = c.remove("n_routed_experts") {
            c.insert("num_experts".into(), v);
        }
        // A model of latent layers alone has no KDA dimensions to write.
        if let Some(gdn) = arch.first_gdn() {
            let d = gdn.dims;
            for ((field, _, _), value) in LINEAR_DIMS.into_iter().zip([d.num_v_heads, d.head_k_dim, d.conv_kernel]) {
                c.insert(field.into(), json!(value));
            }
        }
        // Always written: without it the class default pattern would apply.
        let types: Vec<&str> = arch
            .layers
            .iter()
            .map(|l| if matches!(l.mixer, MixerSpec::Mla(_)) { "full_attention" } else { "linear_attention" })
            .collect();
        c.insert("layer_types".into(), json!(types));
        // KimiLinearConfig's default pad id (163839) lies outside any smaller
        // vocabulary, and transformers refuses to build such an embedding:
        // the source's pad id is kept, else none is named.
        let pad = source.and_then(|s| s.get("pad_token_id")).cloned().unwrap_or(Value::Null);
        c.insert("pad_token_id".into(), pad);
        Value::Object(c)
    }
}
