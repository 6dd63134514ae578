//! Tensor names and shapes as published on the Hugging Face Hub, per family.
//!
//! These names are also the canonical names inside a Strata container, so a
//! tensor can be traced from the Hub file to the container and back without a
//! translation table. Shapes are PyTorch `nn.Linear` shapes: `[out, in]`.

use serde::{Deserialize, Serialize};

use crate::spec::{Family, IndexerKind, LayerKind, MlaSpec, ModelSpec, QkNorm};

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
    /// A selection head: a MoE router `[num_experts, hidden]` or the DSA
    /// indexer's head weights; kept f32 because a top-k choice is sensitive
    /// to small score differences.
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

/// Where the decoder stack's tensors live: `model.`, or for kimi_k25's
/// vision-language checkpoint `language_model.model.`.
pub fn model_prefix(family: Family) -> &'static str {
    match family {
        Family::KimiK25 => "language_model.model.",
        _ => "model.",
    }
}

/// `model.layers.{layer}.` (with the family's [`model_prefix`]).
pub fn layer_prefix(family: Family, layer: usize) -> String {
    format!("{}layers.{layer}.", model_prefix(family))
}

/// A tensor of decoder layer `layer`: `suffix` after its prefix, e.g.
/// `layer_tensor(spec, 3, "self_attn.kv_b_proj.weight")`.
pub fn layer_tensor(spec: &ModelSpec, layer: usize, suffix: &str) -> String {
    format!("{}{suffix}", layer_prefix(spec.family, layer))
}

/// The token embedding, `[vocab, hidden]`.
pub fn embedding_name(spec: &ModelSpec) -> String {
    format!("{}embed_tokens.weight", model_prefix(spec.family))
}

/// The final RMSNorm weight, `[hidden]`.
pub fn final_norm_name(spec: &ModelSpec) -> String {
    format!("{}norm.weight", model_prefix(spec.family))
}

/// The output projection: `lm_head.weight`, or the embedding when tied.
pub fn lm_head_name(spec: &ModelSpec) -> String {
    match (spec.tie_word_embeddings, spec.family) {
        (true, _) => embedding_name(spec),
        (false, Family::KimiK25) => "language_model.lm_head.weight".to_owned(),
        (false, _) => "lm_head.weight".to_owned(),
    }
}

/// The module holding a layer's MoE block: `mlp` (olmoe, qwen3_moe, the MLA
/// families) or `block_sparse_moe` (mixtral, as published).
fn moe_module(family: Family) -> &'static str {
    match family {
        Family::Mixtral => "block_sparse_moe",
        _ => "mlp",
    }
}

/// The router weight of a MoE layer, `[num_experts, hidden]`.
pub fn router_name(spec: &ModelSpec, layer: usize) -> String {
    layer_tensor(spec, layer, &format!("{}.gate.weight", moe_module(spec.family)))
}

/// The per-expert selection bias of a sigmoid router, `[num_experts]`.
pub fn correction_bias_name(spec: &ModelSpec, layer: usize) -> String {
    layer_tensor(spec, layer, "mlp.gate.e_score_correction_bias")
}

/// The shared experts of a MoE layer: gate, up, down.
pub fn shared_expert_names(spec: &ModelSpec, layer: usize) -> [String; 3] {
    ["gate_proj", "up_proj", "down_proj"].map(|p| layer_tensor(spec, layer, &format!("mlp.shared_experts.{p}.weight")))
}

/// The dense MLP of a dense layer: gate, up, down.
pub fn dense_mlp_names(spec: &ModelSpec, layer: usize) -> [String; 3] {
    ["gate_proj", "up_proj", "down_proj"].map(|p| layer_tensor(spec, layer, &format!("mlp.{p}.weight")))
}

/// Published names of expert `expert` of `layer`: gate, up, down.
pub fn expert_names(spec: &ModelSpec, layer: usize, expert: usize) -> [String; 3] {
    let base = layer_tensor(spec, layer, &format!("{}.experts.{expert}.", moe_module(spec.family)));
    match spec.family {
        Family::Mixtral => [format!("{base}w1.weight"), format!("{base}w3.weight"), format!("{base}w2.weight")],
        _ => [format!("{base}gate_proj.weight"), format!("{base}up_proj.weight"), format!("{base}down_proj.weight")],
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
    let p = format!("model.layers.{layer}.");
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
        // transformers 5.x keeps Kimi's text model at `model.language_model`
        // and its head at `lm_head` in memory (conversion_mapping.py).
        Family::KimiK25 if name.starts_with("language_model.model.") => {
            vec![name.replacen("language_model.model.", "model.language_model.", 1)]
        }
        Family::KimiK25 if name == "language_model.lm_head.weight" => vec!["lm_head.weight".to_owned()],
        _ => Vec::new(),
    }
}

/// Every non-expert tensor of the model, in file order: embeddings, then each
/// layer (norms, attention, MLP or router), then the final norm and lm_head.
pub fn dense_tensors(spec: &ModelSpec) -> Vec<TensorDesc> {
    let h = spec.hidden_size;
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, kind: TensorKind| out.push(TensorDesc { name, shape, kind });
    push(embedding_name(spec), vec![spec.vocab_size, h], TensorKind::Embedding);
    for layer in 0..spec.num_layers {
        let t = |suffix: &str| layer_tensor(spec, layer, suffix);
        push(t("input_layernorm.weight"), vec![h], TensorKind::Norm);
        match &spec.mla {
            Some(mla) => mla_attention_tensors(spec, mla, layer, &mut push),
            None => gqa_attention_tensors(spec, layer, &mut push),
        }
        push(t("post_attention_layernorm.weight"), vec![h], TensorKind::Norm);
        match spec.layers.get(layer) {
            Some(LayerKind::Moe) => {
                push(router_name(spec, layer), vec![spec.moe.num_experts, h], TensorKind::Router);
                if spec.router.score_correction_bias {
                    push(correction_bias_name(spec, layer), vec![spec.moe.num_experts], TensorKind::Bias);
                }
                if let Some(i) = spec.shared_intermediate_size {
                    let [gate, up, down] = shared_expert_names(spec, layer);
                    push(gate, vec![i, h], TensorKind::Linear);
                    push(up, vec![i, h], TensorKind::Linear);
                    push(down, vec![h, i], TensorKind::Linear);
                }
            }
            Some(LayerKind::Dense) | None => {
                let i = spec.dense_intermediate_size;
                let [gate, up, down] = dense_mlp_names(spec, layer);
                push(gate, vec![i, h], TensorKind::Linear);
                push(up, vec![i, h], TensorKind::Linear);
                push(down, vec![h, i], TensorKind::Linear);
            }
        }
    }
    push(final_norm_name(spec), vec![h], TensorKind::Norm);
    if !spec.tie_word_embeddings {
        push(lm_head_name(spec), vec![spec.vocab_size, h], TensorKind::LmHead);
    }
    out
}

type Push<'a> = dyn FnMut(String, Vec<usize>, TensorKind) + 'a;

/// q/k/v/o projections, their biases and q/k norms.
fn gqa_attention_tensors(spec: &ModelSpec, layer: usize, push: &mut Push<'_>) {
    let h = spec.hidden_size;
    let t = |suffix: &str| layer_tensor(spec, layer, suffix);
    let projections = [
        ("q_proj", spec.q_dim(), h),
        ("k_proj", spec.kv_dim(), h),
        ("v_proj", spec.kv_dim(), h),
        ("o_proj", h, spec.q_dim()),
    ];
    for (proj, rows, cols) in projections {
        push(t(&format!("self_attn.{proj}.weight")), vec![rows, cols], TensorKind::Linear);
        if spec.attention_bias {
            push(t(&format!("self_attn.{proj}.bias")), vec![rows], TensorKind::Bias);
        }
    }
    let qk_norm_dims = match spec.qk_norm {
        QkNorm::None => None,
        QkNorm::Full => Some((spec.q_dim(), spec.kv_dim())),
        QkNorm::PerHead => Some((spec.head_dim, spec.head_dim)),
    };
    if let Some((q, k)) = qk_norm_dims {
        push(t("self_attn.q_norm.weight"), vec![q], TensorKind::Norm);
        push(t("self_attn.k_norm.weight"), vec![k], TensorKind::Norm);
    }
}

/// Multi-head Latent Attention: the (compressed) query, the latent
/// down-projection and its norm, the up-projection `kv_b_proj`, o_proj, and
/// on full DSA layers the lightning indexer.
fn mla_attention_tensors(spec: &ModelSpec, mla: &MlaSpec, layer: usize, push: &mut Push<'_>) {
    let h = spec.hidden_size;
    let t = |suffix: &str| layer_tensor(spec, layer, suffix);
    let heads = spec.num_heads;
    let q_rows = heads * mla.qk_head_dim();
    let mut linear = |name: &str, rows: usize, cols: usize, bias: bool| {
        push(t(&format!("self_attn.{name}.weight")), vec![rows, cols], TensorKind::Linear);
        if bias && spec.attention_bias {
            push(t(&format!("self_attn.{name}.bias")), vec![rows], TensorKind::Bias);
        }
    };
    match mla.q_lora_rank {
        None => linear("q_proj", q_rows, h, false),
        Some(rank) => {
            linear("q_a_proj", rank, h, true);
            push(t("self_attn.q_a_layernorm.weight"), vec![rank], TensorKind::Norm);
            push(t("self_attn.q_b_proj.weight"), vec![q_rows, rank], TensorKind::Linear);
        }
    }
    let r = mla.kv_lora_rank;
    push(t("self_attn.kv_a_proj_with_mqa.weight"), vec![r + mla.qk_rope_head_dim, h], TensorKind::Linear);
    if spec.attention_bias {
        push(t("self_attn.kv_a_proj_with_mqa.bias"), vec![r + mla.qk_rope_head_dim], TensorKind::Bias);
    }
    push(t("self_attn.kv_a_layernorm.weight"), vec![r], TensorKind::Norm);
    push(t("self_attn.kv_b_proj.weight"), vec![heads * (mla.qk_nope_head_dim + mla.v_head_dim), r], TensorKind::Linear);
    push(t("self_attn.o_proj.weight"), vec![h, heads * mla.v_head_dim], TensorKind::Linear);
    if spec.attention_bias {
        push(t("self_attn.o_proj.bias"), vec![h], TensorKind::Bias);
    }
    if let (Some(dsa), Some(rank)) = (&spec.dsa, mla.q_lora_rank)
        && dsa.indexer_types.get(layer) == Some(&IndexerKind::Full)
    {
        let (n, d) = (dsa.index_n_heads, dsa.index_head_dim);
        push(t("self_attn.indexer.wq_b.weight"), vec![n * d, rank], TensorKind::Linear);
        push(t("self_attn.indexer.wk.weight"), vec![d, h], TensorKind::Linear);
        push(t("self_attn.indexer.k_norm.weight"), vec![d], TensorKind::Norm);
        push(t("self_attn.indexer.k_norm.bias"), vec![d], TensorKind::Bias);
        // Its output weighs the heads' scores that pick tokens: f32, like a
        // router (transformers keeps it in fp32 too).
        push(t("self_attn.indexer.weights_proj.weight"), vec![n, h], TensorKind::Router);
    }
}
