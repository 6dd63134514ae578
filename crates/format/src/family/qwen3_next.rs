//! Qwen3-Next (`qwen3_next`, `Qwen3NextConfig`): three Gated DeltaNet layers
//! to one gated full-attention layer by default, the DeltaNet projections
//! fused per key-head group (`in_proj_qkvz`, `in_proj_ba`), a softmax router
//! honouring `norm_topk_prob`, a sigmoid-gated shared expert, and dense
//! layers where `mlp_only_layers` or `decoder_sparse_step` put them.

use serde_json::{Map, Value, json};

use super::{Family, FamilyDef, HF_NAMING, Naming, hybrid};
use crate::error::{Error, Result};
use crate::spec::fields::Fields;
use crate::spec::{AttentionKind, GdnProjections, LayerKind, ModelSpec};

pub(super) struct Qwen3Next;

impl FamilyDef for Qwen3Next {
    fn model_type(&self) -> &'static str {
        "qwen3_next"
    }

    fn architecture(&self) -> &'static str {
        "Qwen3NextForCausalLM"
    }

    fn naming(&self) -> &'static Naming {
        &HF_NAMING
    }

    fn parse(&self, root: &Map<String, Value>) -> Result<ModelSpec> {
        let cfg = Fields { map: root, prefix: "" };
        let (mut spec, cfg) = hybrid::parse(cfg, Family::Qwen3Next, GdnProjections::Grouped)?;
        spec.moe.norm_topk_prob = cfg.bool("norm_topk_prob")?.unwrap_or(true);
        let step = cfg.usize("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(Error::invalid("decoder_sparse_step", "must be >= 1"));
        }
        let num_layers = spec.num_layers;
        let mlp_only = cfg.usize_list("mlp_only_layers")?.unwrap_or_default();
        if let Some(&bad) = mlp_only.iter().find(|&&l| l >= num_layers) {
            return Err(Error::invalid("mlp_only_layers", format!("layer {bad} >= num_hidden_layers {num_layers}")));
        }
        // Qwen3NextDecoderLayer.__init__: sparse iff not listed in
        // mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
        spec.layers =
            (0..num_layers)
                .map(|i| {
                    if !mlp_only.contains(&i) && (i + 1).is_multiple_of(step) {
                        LayerKind::Moe
                    } else {
                        LayerKind::Dense
                    }
                })
                .collect();
        Ok(spec)
    }

    fn validate(&self, spec: &ModelSpec) -> Result<()> {
        hybrid::validate(spec)
    }

    fn attention(&self, spec: &ModelSpec, layer: usize) -> AttentionKind {
        hybrid::attention(spec, layer)
    }

    fn to_config_json(&self, spec: &ModelSpec, _source: Option<&Value>) -> Value {
        let mut c = hybrid::config_json(spec);
        let dense: Vec<usize> = (0..spec.num_layers).filter(|&l| !spec.is_moe(l)).collect();
        c.insert("intermediate_size".into(), json!(spec.dense_intermediate_size));
        c.insert("norm_topk_prob".into(), json!(spec.moe.norm_topk_prob));
        c.insert("decoder_sparse_step".into(), json!(1));
        c.insert("mlp_only_layers".into(), json!(dense));
        Value::Object(c)
    }
}
