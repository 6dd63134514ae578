//! Kimi K3 (issue 35; docs/kimi_k3.md): Kimi-Linear's body with what K3
//! adds. Its text config says `model_type: kimi_linear`, but transformers'
//! `kimi_linear` is Kimi-Linear-48B and computes none of it, so a config
//! is K3's by its keys ([`is_k3_text`]), never by its `model_type`, and is
//! never read as Kimi-Linear's. The hub nests the text config in
//! `text_config` and the tensors under `language_model.`; a flat text
//! config (`model_type: kimi_linear` with K3's keys) reads the same. What
//! K3 adds to Kimi-Linear's blocks: a full-rank sigmoid output gate on KDA
//! (`g_proj`) and on MLA (`mla_use_output_gate`), the KDA gate bounded below
//! (`linear_attn_config.gate_lower_bound`, −5) with `A_log` zero-padded,
//! Attention Residuals (`attn_res_block_size`), the latent MoE
//! (`routed_expert_hidden_size`) and SiTU-GLU in every MLP.

use serde_json::{Map, Value, json};

use super::kimi_linear::{self, KimiLinear};
use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::{CORE_READ, CoreDims, Family, FamilyDef, Naming, mla, stack};
use crate::error::{Error, Result};
use crate::spec::MtpForm;
use crate::spec::fields::Fields;
use crate::spec::{
    FfnSpec, GateActivation, GateRank, GdnSpec, LatentMoe, LayerType, MixerSpec, MlaAttention, ModelArch, ResidualKind,
    SwiGlu, special_tokens,
};

pub(super) struct KimiK3;

/// `KimiLinearConfig`'s defaults for the fields the MLA families read.
const DEFAULTS: mla::Defaults =
    mla::Defaults { rms_norm_eps: 1e-5, max_position_embeddings: 1_048_576, n_group: 1, topk_group: 1 };

/// The keys only a K3 text config has: any one of them makes a
/// `kimi_linear` config K3's.
const K3_KEYS: [&str; 5] = [
    "attn_res_block_size",
    "routed_expert_hidden_size",
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "mla_use_output_gate",
];

/// SiTU-GLU's betas when the config leaves them out (k3.c `load_cfg`).
const SITU_BETAS: (f64, f64) = (4.0, 25.0);

/// The KDA gate's lower bound when `linear_attn_config` leaves it out
/// (k3.c `load_cfg`).
const GATE_LOWER_BOUND: f64 = -5.0;

/// The text model's `model_type` (k3.c's registry, public K3 ports).
const TEXT_MODEL_TYPE: &str = "kimi_linear";

/// The hub's `linear_attn_config`: Kimi-Linear's and the gate's bound.
const LINEAR_ATTN_CONFIG: ConfigKeys = ConfigKeys {
    read: &[&["num_heads", "head_dim", "short_conv_kernel_size", "kda_layers", "full_attn_layers", "gate_lower_bound"]],
    inert: &[],
    nested: &[],
};

/// The text model's keys: Kimi-Linear's and K3's.
const TEXT: ConfigKeys = ConfigKeys {
    read: &[CORE_READ, mla::READ, kimi_linear::KIMI_READ, &kimi_linear::HUB_SWITCHES, &K3_KEYS],
    inert: &[HF_INERT, mla::INERT, mla::MTP_KEYS],
    nested: &[
        ("linear_attn_config", &LINEAR_ATTN_CONFIG),
        ROPE_AND_QUANTIZATION[0],
        ROPE_AND_QUANTIZATION[1],
        ("quantization_config", &COMPRESSED_TENSORS),
    ],
};

/// What a kimi_k3 checkpoint may hold: the wrapper's tying and special
/// ids, the text model, and a vision tower, which is not loaded.
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[&["model_type", "tie_word_embeddings", "bos_token_id", "eos_token_id"]],
        inert: &[HF_INERT, &["vision_config", "media_placeholder_token_id"]],
        nested: &[("text_config", &TEXT), ("quantization_config", &COMPRESSED_TENSORS)],
    },
    unused_tensors: &["vision_tower.*", "mm_projector.*"],
    extra_layers_unused: true,
};

/// The hub's `quantization_config` (compressed-tensors): every key is read
/// by [`check_quantization`] but the bookkeeping ones, which say nothing
/// about the values.
const COMPRESSED_TENSORS: ConfigKeys = ConfigKeys {
    read: &[&[
        "quant_method",
        "format",
        "config_groups",
        "ignore",
        "quantization_status",
        "kv_cache_scheme",
        "sparsity_config",
        "transform_config",
    ]],
    inert: &[&["global_compression_ratio", "version"]],
    nested: &[],
};

/// The one quantization K3 is read with: compressed-tensors' MXFP4 weights
/// (`weight_packed`/`weight_scale`, what `checkpoint::packed` decodes).
const QUANT_METHOD: &str = "compressed-tensors";
const MXFP4_FORMAT: &str = "mxfp4-pack-quantized";
/// The only statuses whose tensors are stored packed.
const PACKED_STATUSES: [&str; 2] = ["compressed", "frozen"];

/// Checks a compressed-tensors `quantization_config` (at `prefix`) against
/// what the reader implements, naming the first key that asks for anything
/// else: MXFP4 weights (4-bit floats, symmetric, one scale per group of
/// 32 along a row) and nothing on activations or the KV cache. Which
/// modules are quantized (`targets`, `ignore`) is not checked against the
/// tensors: the tensors say it themselves (a module with `weight_packed`
/// and no `weight` is read as MXFP4, any other as stored), so the lists
/// only need to be lists of names.
fn check_quantization(quant: &Map<String, Value>, prefix: &str) -> Result<()> {
    let cfg = At { map: quant, prefix: prefix.to_owned() };
    let method = cfg.str("quant_method")?.ok_or_else(|| Error::MissingField { field: cfg.name("quant_method") })?;
    if method != QUANT_METHOD {
        return Err(Error::invalid(
            cfg.name("quant_method"),
            format!("{method:?}: K3 is read as {QUANT_METHOD:?} only"),
        ));
    }
    cfg.check_format()?;
    if let Some(status) = cfg.str("quantization_status")?
        && !PACKED_STATUSES.contains(&status)
    {
        return Err(Error::invalid(
            cfg.name("quantization_status"),
            format!("{status:?}: only packed weights ({PACKED_STATUSES:?}) are read"),
        ));
    }
    for key in ["kv_cache_scheme", "sparsity_config", "transform_config"] {
        if let Some(v) = cfg.get(key)
            && v.as_object().is_none_or(|o| !o.is_empty())
        {
            return Err(Error::invalid(cfg.name(key), format!("{v}: not implemented (only null is)")));
        }
    }
    cfg.check_names("ignore")?;
    let groups =
        cfg.object("config_groups")?.ok_or_else(|| Error::MissingField { field: cfg.name("config_groups") })?;
    for (group_name, group) in groups {
        let group_field = cfg.name(&format!("config_groups.{group_name}"));
        let group = group
            .as_object()
            .ok_or_else(|| Error::invalid(&group_field, format!("expected an object, got {group}")))?;
        let scheme = At { map: group, prefix: format!("{group_field}.") };
        scheme.check_format()?;
        scheme.check_names("targets")?;
        for key in ["input_activations", "output_activations"] {
            if let Some(v) = scheme.get(key) {
                return Err(Error::invalid(scheme.name(key), format!("{v}: only weight quantization is implemented")));
            }
        }
        scheme.check_keys(&SCHEME_KEYS)?;
        let weights = scheme.object("weights")?.ok_or_else(|| Error::MissingField { field: scheme.name("weights") })?;
        check_mxfp4_args(&At { map: weights, prefix: scheme.name("weights.") })?;
    }
    Ok(())
}

/// A config object and the prefix its keys are named by (built at run
/// time: a config group's name is the checkpoint's).
struct At<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> At<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// `key`'s value; null reads as absent, as compressed-tensors writes
    /// its unset fields.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| Error::invalid(self.name(key), format!("expected a string, got {v}"))))
            .transpose()
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.get(key)
            .map(|v| {
                v.as_object().ok_or_else(|| Error::invalid(self.name(key), format!("expected an object, got {v}")))
            })
            .transpose()
    }

    /// `format`, if given, is MXFP4's.
    fn check_format(&self) -> Result<()> {
        match self.str("format")? {
            None | Some(MXFP4_FORMAT) => Ok(()),
            Some(other) => {
                Err(Error::invalid(self.name("format"), format!("{other:?}: only {MXFP4_FORMAT:?} is implemented")))
            }
        }
    }

    /// `key`, if given, is a list of module names or patterns.
    fn check_names(&self, key: &str) -> Result<()> {
        match self.get(key) {
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => Ok(()),
            Some(v) => Err(Error::invalid(self.name(key), format!("expected a list of names, got {v}"))),
            None => Ok(()),
        }
    }

    /// Every key is one of `known`.
    fn check_keys(&self, known: &[&str]) -> Result<()> {
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(unknown) => Err(Error::invalid(self.name(unknown), "not a key K3's reader knows")),
            None => Ok(()),
        }
    }
}

/// A quantization scheme's keys (compressed-tensors `QuantizationScheme`).
const SCHEME_KEYS: [&str; 5] = ["targets", "weights", "input_activations", "output_activations", "format"];

/// compressed-tensors `QuantizationArgs` of MXFP4 weights: what each key
/// must say, and whether it must be given (`num_bits`, `type` and
/// `group_size` default to int8 per channel; `symmetric` defaults to true
/// and `strategy` follows from `group_size`).
fn mxfp4_args() -> [(&'static str, Value, bool); 5] {
    [
        ("num_bits", json!(4), true),
        ("type", json!("float"), true),
        ("group_size", json!(32), true),
        ("symmetric", json!(true), false),
        ("strategy", json!("group"), false),
    ]
}

/// The other keys: `dynamic` (checked below) and those that only say how
/// the weights were calibrated or which dtype their scales had, which the
/// stored bytes already fix.
const OTHER_ARGS: [&str; 6] = ["dynamic", "observer", "observer_kwargs", "actorder", "scale_dtype", "zp_dtype"];

fn check_mxfp4_args(args: &At<'_>) -> Result<()> {
    let mxfp4 = mxfp4_args();
    for (key, want, required) in &mxfp4 {
        match args.get(key) {
            Some(v) if v != want => {
                return Err(Error::invalid(args.name(key), format!("{v}: MXFP4 is {want}")));
            }
            None if *required => return Err(Error::MissingField { field: args.name(key) }),
            _ => {}
        }
    }
    if let Some(v) = args.get("dynamic")
        && v != &Value::Bool(false)
    {
        return Err(Error::invalid(args.name("dynamic"), format!("{v}: the weights' scales are stored (false)")));
    }
    let known: Vec<&str> = mxfp4.iter().map(|(key, ..)| *key).chain(OTHER_ARGS).collect();
    args.check_keys(&known)
}

/// The hub's names (k3.c `model_init`, `expert_table_init`): the text model
/// under `language_model.`, Kimi-Linear's module names below it.
const NAMING: Naming = Naming {
    model_prefix: "language_model.model.",
    lm_head: "language_model.lm_head.weight",
    moe_module: "block_sparse_moe",
    expert_projections: ["w1", "w3", "w2"],
    aliases: &[],
    saved_as: &[],
};

/// Whether `text` (a text config) is K3's: it has one of [`K3_KEYS`].
fn is_k3_text(text: &Map<String, Value>) -> bool {
    K3_KEYS.iter().any(|key| text.contains_key(*key))
}

/// Whether a config.json whose `model_type` reads as kimi_linear is K3's
/// (flat, or nesting its text config).
pub(super) fn is_k3(root: &Map<String, Value>) -> bool {
    is_k3_text(root) || root.get("text_config").and_then(Value::as_object).is_some_and(is_k3_text)
}

/// The text config and the prefix its fields are named by in errors.
fn text_config(root: &Map<String, Value>) -> Result<(&Map<String, Value>, &'static str)> {
    let top = Fields { map: root, prefix: "" };
    let Some(text) = top.object("text_config")? else { return Ok((root, "")) };
    let cfg = Fields { map: text, prefix: "text_config." };
    match cfg.str("model_type")? {
        None | Some(TEXT_MODEL_TYPE) => Ok((text, "text_config.")),
        Some(other) => Err(Error::invalid(
            "text_config.model_type",
            format!("{other:?} is not K3's text model ({TEXT_MODEL_TYPE:?})"),
        )),
    }
}

impl FamilyDef for KimiK3 {
    fn model_type(&self) -> &'static str {
        "kimi_k3"
    }

    fn architecture(&self) -> &'static str {
        "KimiK3ForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &NAMING
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let (text, prefix) = text_config(root)?;
        if !is_k3_text(text) {
            return Err(Error::MissingField { field: format!("{prefix}attn_res_block_size") });
        }
        // KimiLinearConfig's default factor (2.446) is Kimi-Linear's, and
        // k3.c applies none: K3's must be given (docs/kimi_k3.md, point 1).
        if !text.contains_key("routed_scaling_factor") {
            return Err(Error::MissingField { field: format!("{prefix}routed_scaling_factor") });
        }
        let top = Fields { map: root, prefix: "" };
        if let Some(quant) = top.object("quantization_config")? {
            check_quantization(quant, "quantization_config.")?;
        }
        if !prefix.is_empty()
            && let Some(quant) = (Fields { map: text, prefix }).object("quantization_config")?
        {
            check_quantization(quant, &format!("{prefix}quantization_config."))?;
        }
        let map = kimi_linear::normalized(text, prefix)?;
        let cfg = Fields { map: &map, prefix };
        let linear_map = cfg.object("linear_attn_config")?;
        let linear = linear_map.map(|map| Fields { map, prefix: "linear_attn_config." });
        let num_layers = CoreDims::read(&cfg)?.num_layers;
        let mut parsed = mla::parse(&cfg, Family::KimiK3, &DEFAULTS)?;
        kimi_linear::check_hub_switches(&cfg, parsed.ffns.moe.router)?;
        // k3.c passes its one eps to every norm (docs/kimi_k3.md, point 2).
        let eps = parsed.core.final_norm.eps();
        let full = MlaAttention {
            rope: None,
            latent_norm_eps: eps,
            output_gate: cfg.bool("mla_use_output_gate")?.unwrap_or(true),
            ..parsed.attention
        };
        let dims = kimi_linear::linear_dims(&cfg, linear.as_ref())?;
        let bound = match &linear {
            Some(linear) => linear.f64("gate_lower_bound")?,
            None => None,
        };
        let gdn = GdnSpec {
            dims,
            eps,
            gate_lower_bound: Some(bound.unwrap_or(GATE_LOWER_BOUND) as f32),
            output_gate: GateActivation::Sigmoid,
            output_gate_rank: GateRank::Full,
            // k3.c: "[128] = per-head [96] zero-padded" with 96 heads of
            // 128 (docs/kimi_k3.md, point 3).
            a_log_padded_to: Some(dims.num_v_heads.max(dims.head_k_dim)),
        };
        let moe = &mut parsed.ffns.moe;
        moe.swiglu = SwiGlu::Situ {
            beta: cfg.f64("activation_situ_beta")?.unwrap_or(SITU_BETAS.0) as f32,
            linear_beta: cfg.f64("activation_situ_linear_beta")?.unwrap_or(SITU_BETAS.1) as f32,
        };
        moe.latent = Some(LatentMoe { width: cfg.req_usize("routed_expert_hidden_size")?, norm_eps: eps });
        let types = kimi_linear::layer_types(&cfg, linear.as_ref(), num_layers)?;
        let kinds = kimi_linear::ffn_kinds(&cfg, parsed.kinds, num_layers)?;
        let mixer = |l: usize| match types[l] {
            LayerType::Full => MixerSpec::Mla(full),
            LayerType::Linear => MixerSpec::GatedDeltaNet(gdn),
        };
        let mut layers = stack(&kinds, &parsed.ffns, parsed.core.final_norm, mixer)?;
        let residual = ResidualKind::AttentionResiduals { block_size: cfg.req_usize("attn_res_block_size")? };
        for layer in &mut layers {
            layer.residual = residual;
        }
        if !prefix.is_empty() {
            // The wrapper's tying and special ids win over the text model's.
            let top = Fields { map: root, prefix: "" };
            let mut merged = map.clone();
            for key in ["bos_token_id", "eos_token_id"] {
                if let Some(v) = top.raw(key) {
                    merged.insert(key.to_owned(), v.clone());
                }
            }
            let core = &mut parsed.core;
            let defaults = (core.bos_token_id, core.eos_token_ids.clone());
            (core.bos_token_id, core.eos_token_ids) = special_tokens(&Fields { map: &merged, prefix: "" }, defaults)?;
            if let Some(tie) = top.bool("tie_word_embeddings")? {
                core.tie_word_embeddings = tie;
            }
        }
        Ok(ModelArch { core: parsed.core, layers, mtp: Vec::new(), mtp_form: MtpForm::DEEPSEEK_V3 })
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        KimiLinear.validate(arch)?;
        for layer in &arch.layers {
            let k3 = match (&layer.mixer, &layer.ffn) {
                (MixerSpec::GatedDeltaNet(gdn), _) if gdn.output_gate_rank != GateRank::Full => false,
                (MixerSpec::GatedDeltaNet(gdn), _) if gdn.gate_lower_bound.is_none() => false,
                (_, FfnSpec::Moe(moe)) => moe.latent.is_some() && matches!(moe.swiglu, SwiGlu::Situ { .. }),
                (_, FfnSpec::Dense { swiglu, .. }) => matches!(swiglu, SwiGlu::Situ { .. }),
            };
            if !k3 || !matches!(layer.residual, ResidualKind::AttentionResiduals { block_size } if block_size > 0) {
                return Err(Error::invalid(
                    "attn_res_block_size",
                    "kimi_k3 has bounded full-gated KDA, SiTU-GLU, latent experts and Attention Residuals",
                ));
            }
        }
        Ok(())
    }

    fn to_config_json(&self, arch: &ModelArch, source: Option<&Value>) -> Value {
        let Value::Object(mut text) = KimiLinear.to_config_json(arch, source) else { return Value::Null };
        let (Some(attention), Some(moe), Some(first)) = (arch.first_mla(), arch.first_moe(), arch.layers.first())
        else {
            // validate() guarantees a latent layer and experts.
            return Value::Null;
        };
        if let (ResidualKind::AttentionResiduals { block_size }, Some(latent), SwiGlu::Situ { beta, linear_beta }) =
            (first.residual, moe.latent, moe.swiglu)
        {
            text.insert("attn_res_block_size".into(), json!(block_size));
            text.insert("routed_expert_hidden_size".into(), json!(latent.width));
            text.insert("activation_situ_beta".into(), json!(beta));
            text.insert("activation_situ_linear_beta".into(), json!(linear_beta));
        }
        text.insert("mla_use_output_gate".into(), json!(attention.output_gate));
        if let Some(bound) = arch.first_gdn().and_then(|gdn| gdn.gate_lower_bound) {
            text.insert("linear_attn_config".into(), json!({ "gate_lower_bound": bound }));
        }
        text.insert("model_type".into(), json!(TEXT_MODEL_TYPE));
        for key in ["architectures", "dtype"] {
            text.remove(key);
        }
        let mut outer = Map::new();
        outer.insert("architectures".into(), json!([self.architecture()]));
        outer.insert("model_type".into(), json!(self.model_type()));
        outer.insert("dtype".into(), json!("float32"));
        if let Some(tie) = text.remove("tie_word_embeddings") {
            outer.insert("tie_word_embeddings".into(), tie);
        }
        outer.insert("text_config".into(), Value::Object(text));
        Value::Object(outer)
    }
}
