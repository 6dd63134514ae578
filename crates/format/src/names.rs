//! Tensor names and shapes as published on the Hugging Face Hub, per family.
//!
//! These names are also the canonical names inside a Strata container, so a
//! tensor can be traced from the Hub file to the container and back without a
//! translation table. Shapes are PyTorch `nn.Linear` shapes: `[out, in]`.

use serde::{Deserialize, Serialize};

use crate::spec::{Family, LayerKind, ModelSpec, QkNorm};

/// What role a non-expert tensor plays; decides its storage format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// `model.embed_tokens.weight`, `[vocab, hidden]`.
    Embedding,
    /// `lm_head.weight`, `[vocab, hidden]` (absent when embeddings are tied).
    LmHead,
    /// Any other 2-D projection (attention, dense MLP).
    Linear,
    /// An RMSNorm weight (1-D).
    Norm,
    /// A MoE router `[num_experts, hidden]`; kept f32 because top-k choice is
    /// sensitive to small logit differences.
    Router,
    /// A projection bias (1-D).
    Bias,
}

impl TensorKind {
    /// Whether the kind is a weight matrix that presets may quantize.
    pub fn is_matrix(self) -> bool {
        matches!(self, TensorKind::Embedding | TensorKind::LmHead | TensorKind::Linear)
    }
}

/// One non-expert tensor the model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: TensorKind,
}

/// The three matrices of one SwiGLU expert, in record order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertProj {
    /// `[intermediate, hidden]`; mixtral `w1`.
    Gate,
    /// `[intermediate, hidden]`; mixtral `w3`.
    Up,
    /// `[hidden, intermediate]`; mixtral `w2`.
    Down,
}

impl ExpertProj {
    /// Gate, up, down: the order of components in an expert record.
    pub const ALL: [ExpertProj; 3] = [ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down];

    pub fn name(self) -> &'static str {
        match self {
            ExpertProj::Gate => "gate",
            ExpertProj::Up => "up",
            ExpertProj::Down => "down",
        }
    }
}

/// `model.layers.{layer}.`
pub fn layer_prefix(layer: usize) -> String {
    format!("model.layers.{layer}.")
}

/// The module holding a layer's MoE block: `mlp` (olmoe, qwen3_moe) or
/// `block_sparse_moe` (mixtral, as published).
fn moe_module(family: Family) -> &'static str {
    match family {
        Family::Olmoe | Family::Qwen3Moe => "mlp",
        Family::Mixtral => "block_sparse_moe",
    }
}

/// The router weight of a MoE layer, `[num_experts, hidden]`.
pub fn router_name(spec: &ModelSpec, layer: usize) -> String {
    format!("{}{}.gate.weight", layer_prefix(layer), moe_module(spec.family))
}

/// Published names of expert `expert` of `layer`: gate, up, down.
pub fn expert_names(spec: &ModelSpec, layer: usize, expert: usize) -> [String; 3] {
    let base = format!("{}{}.experts.{expert}.", layer_prefix(layer), moe_module(spec.family));
    match spec.family {
        Family::Olmoe | Family::Qwen3Moe => {
            [format!("{base}gate_proj.weight"), format!("{base}up_proj.weight"), format!("{base}down_proj.weight")]
        }
        Family::Mixtral => [format!("{base}w1.weight"), format!("{base}w3.weight"), format!("{base}w2.weight")],
    }
}

/// Expert names with `{expert}` in place of the index (manifest templates).
pub fn expert_name_templates(spec: &ModelSpec, layer: usize) -> [String; 3] {
    // Built from a sentinel index so the template cannot drift from
    // `expert_names`.
    expert_names(spec, layer, 0).map(|n| n.replace(".experts.0.", ".experts.{expert}."))
}

/// Shapes `[rows, cols]` of gate, up, down for every expert of the model.
pub fn expert_shapes(spec: &ModelSpec) -> [[usize; 2]; 3] {
    let (h, i) = (spec.hidden_size, spec.moe.intermediate_size);
    [[i, h], [i, h], [h, i]]
}

/// Names of the fused 3-D expert tensors transformers 5.x keeps in memory
/// (`[E, 2I, H]` gate‖up and `[E, H, I]` down) and writes when saving with
/// `save_original_format=False`. Always under `mlp.` (mixtral's
/// `block_sparse_moe` is renamed to `mlp` by the 5.x conversion mapping).
pub fn fused_expert_names(layer: usize) -> (String, String) {
    let p = layer_prefix(layer);
    (format!("{p}mlp.experts.gate_up_proj"), format!("{p}mlp.experts.down_proj"))
}

/// Other names under which a checkpoint may store canonical tensor `name`.
///
/// transformers 5.x renames mixtral's `.block_sparse_moe.` to `.mlp.` when
/// loading and only reverts it when saving in the original format.
pub fn aliases(spec: &ModelSpec, name: &str) -> Vec<String> {
    match spec.family {
        Family::Mixtral if name.contains(".block_sparse_moe.") => {
            vec![name.replace(".block_sparse_moe.", ".mlp.")]
        }
        _ => Vec::new(),
    }
}

/// Every non-expert tensor of the model, in file order: embeddings, then each
/// layer (norms, attention, MLP or router), then the final norm and lm_head.
pub fn dense_tensors(spec: &ModelSpec) -> Vec<TensorDesc> {
    let h = spec.hidden_size;
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, kind: TensorKind| out.push(TensorDesc { name, shape, kind });
    push("model.embed_tokens.weight".into(), vec![spec.vocab_size, h], TensorKind::Embedding);
    for layer in 0..spec.num_layers {
        let p = layer_prefix(layer);
        push(format!("{p}input_layernorm.weight"), vec![h], TensorKind::Norm);
        let projections = [
            ("q_proj", spec.q_dim(), h),
            ("k_proj", spec.kv_dim(), h),
            ("v_proj", spec.kv_dim(), h),
            ("o_proj", h, spec.q_dim()),
        ];
        for (proj, rows, cols) in projections {
            push(format!("{p}self_attn.{proj}.weight"), vec![rows, cols], TensorKind::Linear);
            if spec.attention_bias {
                push(format!("{p}self_attn.{proj}.bias"), vec![rows], TensorKind::Bias);
            }
        }
        let qk_norm_dims = match spec.qk_norm {
            QkNorm::None => None,
            QkNorm::Full => Some((spec.q_dim(), spec.kv_dim())),
            QkNorm::PerHead => Some((spec.head_dim, spec.head_dim)),
        };
        if let Some((q, k)) = qk_norm_dims {
            push(format!("{p}self_attn.q_norm.weight"), vec![q], TensorKind::Norm);
            push(format!("{p}self_attn.k_norm.weight"), vec![k], TensorKind::Norm);
        }
        push(format!("{p}post_attention_layernorm.weight"), vec![h], TensorKind::Norm);
        match spec.layers.get(layer) {
            Some(LayerKind::Moe) => push(router_name(spec, layer), vec![spec.moe.num_experts, h], TensorKind::Router),
            Some(LayerKind::Dense) | None => {
                let i = spec.dense_intermediate_size;
                for (proj, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
                    push(format!("{p}mlp.{proj}.weight"), vec![rows, cols], TensorKind::Linear);
                }
            }
        }
    }
    push("model.norm.weight".into(), vec![h], TensorKind::Norm);
    if !spec.tie_word_embeddings {
        push("lm_head.weight".into(), vec![spec.vocab_size, h], TensorKind::LmHead);
    }
    out
}
