//! GLM-5 (`glm_moe_dsa`, `GlmMoeDsaConfig`): the DeepSeek-V3 body with an
//! always-compressed query and interleaved rope, plus DeepSeek Sparse
//! Attention's lightning indexer, own or shared per layer; dense and sparse
//! layers in any order (`mlp_layer_types`).

use serde_json::{Map, Value, json};

use super::known::{ConfigKeys, HF_INERT, Known, ROPE_AND_QUANTIZATION};
use super::mla::string_list;
use super::{CORE_READ, Family, FamilyDef, HF_NAMING, Naming, mla};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{FfnKind, IndexerKind, IndexerSpec, ModelArch};

pub(super) struct GlmMoeDsa;

/// What a glm_moe_dsa checkpoint may hold (`GlmMoeDsaConfig`: its
/// `layer_types`, `mlp_bias` and `rope_interleave` are not read by the
/// 5.23 model, which always interleaves; its multi-token-prediction layers
/// follow the last decoder layer, DeepSeek-V3's layout, and are kept).
const KNOWN: Known = Known {
    config: ConfigKeys {
        read: &[
            CORE_READ,
            mla::READ,
            &["index_topk", "index_head_dim", "index_n_heads", "mlp_layer_types", "indexer_types"],
            &["index_topk_pattern", "index_topk_freq", "index_skip_topk_offset"],
            mla::MTP_KEYS,
        ],
        inert: &[HF_INERT, mla::INERT, &["layer_types", "mlp_bias", "rope_interleave"]],
        nested: ROPE_AND_QUANTIZATION,
    },
    unused_tensors: &[],
    extra_layers_unused: true,
};

const DEFAULTS: mla::Defaults =
    mla::Defaults { rms_norm_eps: 1e-5, max_position_embeddings: 202_752, n_group: 1, topk_group: 1 };

impl FamilyDef for GlmMoeDsa {
    fn model_type(&self) -> &'static str {
        "glm_moe_dsa"
    }

    fn architecture(&self) -> &'static str {
        "GlmMoeDsaForCausalLM"
    }

    fn known(&self) -> &'static Known {
        &KNOWN
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelArch> {
        let cfg = Fields { map: root, prefix: "" };
        let mut parsed = mla::parse(&cfg, Family::GlmMoeDsa, &DEFAULTS)?.with_mtp(&cfg)?;
        // GlmMoeDsaAttention always compresses the query and uses the
        // interleaved rotation.
        parsed.attention.dims.q_lora_rank = Some(cfg.req_usize("q_lora_rank")?);
        parsed.attention.dims.rope_interleave = true;
        let num_layers = parsed.kinds.len();
        parsed.kinds = layer_kinds(&cfg, num_layers)?;
        let (topk, head_dim, n_heads) = (
            cfg.usize("index_topk")?.unwrap_or(2048),
            cfg.req_usize("index_head_dim")?,
            cfg.req_usize("index_n_heads")?,
        );
        let kinds = indexer_types(&cfg, num_layers)?;
        if kinds.len() != num_layers {
            return Err(Error::invalid("indexer_types", format!("{} entries for {num_layers} layers", kinds.len())));
        }
        if parsed.kinds.len() != num_layers {
            return Err(Error::invalid(
                "mlp_layer_types",
                format!("{} entries for {num_layers} layers", parsed.kinds.len()),
            ));
        }
        // An MTP layer selects with an indexer of its own: it has no earlier
        // layer's selection to share (transformers numbers each MTP layer
        // from 0, whose indexer is always full).
        let kind = |l: usize| kinds.get(l).copied().unwrap_or(IndexerKind::Full);
        parsed.build(|l| Some(IndexerSpec { kind: kind(l), topk, head_dim, n_heads, pool: None }))
    }

    fn validate(&self, arch: &ModelArch) -> Result<()> {
        mla::validate(arch)?;
        if mla::indexers(arch).count() != arch.layers.len() {
            return Err(mla::dsa_mismatch(arch.core.family));
        }
        let compressed = arch.first_mla().is_some_and(|m| m.dims.q_lora_rank.is_some());
        if !compressed {
            return Err(Error::invalid("q_lora_rank", "the DSA indexer reads the compressed query"));
        }
        if mla::indexers(arch).next().map(|i| i.kind) == Some(IndexerKind::Shared) {
            return Err(Error::invalid("indexer_types", "the first layer has no earlier selection to share"));
        }
        Ok(())
    }

    fn to_config_json(&self, arch: &ModelArch, _source: Option<&Value>) -> Value {
        let (Some(attention), Some(indexer)) = (arch.first_mla(), mla::indexers(arch).next()) else {
            // validate() guarantees latent attention and an indexer.
            return Value::Null;
        };
        let mut c = mla::config_json(arch, attention);
        let kinds: Vec<&str> =
            arch.layer_kinds().iter().map(|k| if *k == FfnKind::Dense { "dense" } else { "sparse" }).collect();
        let indexer_types: Vec<IndexerKind> = mla::indexers(arch).map(|i| i.kind).collect();
        c.insert("mlp_layer_types".into(), json!(kinds));
        c.insert("index_topk".into(), json!(indexer.topk));
        c.insert("index_head_dim".into(), json!(indexer.head_dim));
        c.insert("index_n_heads".into(), json!(indexer.n_heads));
        c.insert("indexer_types".into(), json!(indexer_types));
        Value::Object(c)
    }
}

/// GlmMoeDsaConfig: `mlp_layer_types` ("dense" / "sparse") if given, else
/// `first_k_dense_replace` dense layers followed by sparse ones.
fn layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<FfnKind>> {
    match string_list(cfg, "mlp_layer_types")? {
        Some(items) => items
            .iter()
            .map(|t| match t.as_str() {
                "dense" => Ok(FfnKind::Dense),
                "sparse" => Ok(FfnKind::Moe),
                other => Err(Error::invalid("mlp_layer_types", format!("unknown layer type {other:?}"))),
            })
            .collect(),
        None => mla::dense_first_layer_kinds(cfg, num_layers),
    }
}
/// GlmMoeDsaConfig.__post_init__: `indexer_types` if given, else the
/// `index_topk_pattern` (a string of F/S or a list), else full iff
/// `max(layer - index_skip_topk_offset + 1, 0) % index_topk_freq == 0`.
pub(super) fn indexer_types(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<IndexerKind>> {
    let parse_kind = |t: &str, field: &str| match t {
        "full" | "F" => Ok(IndexerKind::Full),
        "shared" | "S" => Ok(IndexerKind::Shared),
        other => Err(Error::invalid(field, format!("unknown indexer type {other:?}"))),
    };
    if let Some(items) = string_list(cfg, "indexer_types")? {
        return items.iter().map(|t| parse_kind(t, "indexer_types")).collect();
    }
    match cfg.raw("index_topk_pattern") {
        Some(Value::String(pattern)) => {
            return pattern.chars().map(|c| parse_kind(&c.to_string(), "index_topk_pattern")).collect();
        }
        Some(Value::Array(_)) => {
            let items = string_list(cfg, "index_topk_pattern")?.unwrap_or_default();
            return items.iter().map(|t| parse_kind(t, "index_topk_pattern")).collect();
        }
        _ => {}
    }
    let freq = cfg.usize("index_topk_freq")?.unwrap_or(1).max(1) as i64;
    let offset = cfg.usize("index_skip_topk_offset")?.unwrap_or(2) as i64;
    Ok((0..num_layers as i64)
        .map(|l| if (l - offset + 1).max(0) % freq == 0 { IndexerKind::Full } else { IndexerKind::Shared })
        .collect())
}
