//! GLM-5 (`glm_moe_dsa`, `GlmMoeDsaConfig`): the DeepSeek-V3 body with an
//! always-compressed query and interleaved rope, plus DeepSeek Sparse
//! Attention's lightning indexer, own or shared per layer; dense and sparse
//! layers in any order (`mlp_layer_types`).

use serde_json::{Map, Value, json};

use super::mla::{dsa_mismatch, string_list};
use super::{Family, FamilyDef, HF_NAMING, Naming, mla};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{AttentionKind, DsaSpec, IndexerKind, LayerKind, MlaSpec, ModelSpec};

pub(super) struct GlmMoeDsa;

const DEFAULTS: mla::Defaults =
    mla::Defaults { rms_norm_eps: 1e-5, max_position_embeddings: 202_752, n_group: 1, topk_group: 1 };

impl FamilyDef for GlmMoeDsa {
    fn model_type(&self) -> &'static str {
        "glm_moe_dsa"
    }

    fn architecture(&self) -> &'static str {
        "GlmMoeDsaForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelSpec> {
        let cfg = Fields { map: root, prefix: "" };
        let mut spec = mla::parse(&cfg, Family::GlmMoeDsa, &DEFAULTS)?;
        if let Some(dims) = &mut spec.mla {
            // GlmMoeDsaAttention always compresses the query and uses the
            // interleaved rotation.
            dims.q_lora_rank = Some(cfg.req_usize("q_lora_rank")?);
            dims.rope_interleave = true;
        }
        spec.layers = layer_kinds(&cfg, spec.num_layers)?;
        spec.dsa = Some(DsaSpec {
            index_topk: cfg.usize("index_topk")?.unwrap_or(2048),
            index_head_dim: cfg.req_usize("index_head_dim")?,
            index_n_heads: cfg.req_usize("index_n_heads")?,
            indexer_types: indexer_types(&cfg, spec.num_layers)?,
        });
        Ok(spec)
    }

    fn validate(&self, spec: &ModelSpec) -> Result<()> {
        mla::validate(spec)?;
        match (&spec.mla, &spec.dsa) {
            (Some(dims), Some(dsa)) => validate_dsa(spec, dims, dsa),
            _ => Err(dsa_mismatch(spec)),
        }
    }

    fn attention(&self, spec: &ModelSpec, layer: usize) -> AttentionKind {
        mla::attention(spec, layer)
    }

    fn to_config_json(&self, spec: &ModelSpec, _source: Option<&Value>) -> Value {
        let (Some(dims), Some(dsa)) = (&spec.mla, &spec.dsa) else {
            // validate() guarantees MLA dimensions and an indexer.
            return Value::Null;
        };
        let mut c = mla::config_json(spec, dims);
        let kinds: Vec<&str> =
            spec.layers.iter().map(|k| if *k == LayerKind::Dense { "dense" } else { "sparse" }).collect();
        c.insert("mlp_layer_types".into(), json!(kinds));
        c.insert("index_topk".into(), json!(dsa.index_topk));
        c.insert("index_head_dim".into(), json!(dsa.index_head_dim));
        c.insert("index_n_heads".into(), json!(dsa.index_n_heads));
        c.insert("indexer_types".into(), json!(dsa.indexer_types));
        Value::Object(c)
    }
}

/// GlmMoeDsaConfig: `mlp_layer_types` ("dense" / "sparse") if given, else
/// `first_k_dense_replace` dense layers followed by sparse ones.
fn layer_kinds(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<LayerKind>> {
    match string_list(cfg, "mlp_layer_types")? {
        Some(items) => items
            .iter()
            .map(|t| match t.as_str() {
                "dense" => Ok(LayerKind::Dense),
                "sparse" => Ok(LayerKind::Moe),
                other => Err(Error::invalid("mlp_layer_types", format!("unknown layer type {other:?}"))),
            })
            .collect(),
        None => mla::dense_first_layer_kinds(cfg, num_layers),
    }
}
/// GlmMoeDsaConfig.__post_init__: `indexer_types` if given, else the
/// `index_topk_pattern` (a string of F/S or a list), else full iff
/// `max(layer - index_skip_topk_offset + 1, 0) % index_topk_freq == 0`.
fn indexer_types(cfg: &Fields<'_>, num_layers: usize) -> Result<Vec<IndexerKind>> {
    let parse_kind = |t: &str, field: &str| match t {
        "full" | "F" => Ok(IndexerKind::Full),
        "shared" | "S" => Ok(IndexerKind::Shared),
        other => Err(Error::invalid(field, format!("unknown indexer type {other:?}"))),
    };
    if let Some(items) = string_list(cfg, "indexer_types")? {
        return items.iter().map(|t| parse_kind(t, "indexer_types")).collect();
    }
    match cfg.map.get("index_topk_pattern") {
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
fn validate_dsa(spec: &ModelSpec, mla: &MlaSpec, dsa: &DsaSpec) -> Result<()> {
    if mla.q_lora_rank.is_none() {
        return Err(Error::invalid("q_lora_rank", "the DSA indexer reads the compressed query"));
    }
    if dsa.index_topk == 0 || dsa.index_n_heads == 0 {
        return Err(Error::invalid("index_topk", "index_topk and index_n_heads must be > 0"));
    }
    if dsa.index_head_dim < mla.qk_rope_head_dim {
        return Err(Error::invalid(
            "index_head_dim",
            format!("{} is narrower than qk_rope_head_dim {}", dsa.index_head_dim, mla.qk_rope_head_dim),
        ));
    }
    if dsa.indexer_types.len() != spec.num_layers {
        return Err(Error::invalid(
            "indexer_types",
            format!("{} entries for {} layers", dsa.indexer_types.len(), spec.num_layers),
        ));
    }
    if dsa.indexer_types.first() == Some(&IndexerKind::Shared) {
        return Err(Error::invalid("indexer_types", "the first layer has no earlier selection to share"));
    }
    Ok(())
}
