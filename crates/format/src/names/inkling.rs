//! The tensors of Inkling's blocks, as transformers' `save_pretrained`
//! writes `inkling_text` (5.x fused names, docs/inkling.md).

use super::{Push, TensorKind, layer_tensor, naming};
use crate::spec::{CoreSpec, InklingAttention, ShortConv};

/// The RMSNorm of the embedding rows (`CoreSpec::embed_norm`), `[hidden]`.
pub fn embed_norm_name(core: &CoreSpec) -> String {
    format!("{}embed_tokens.embed_norm.weight", naming(core).model_prefix)
}

/// A learned scalar scaling a block's output (the dense MLP's
/// `mlp.global_scale`, the sink router's `mlp.gate.global_scale`), `[1]`.
pub fn global_scale_name(core: &CoreSpec, layer: usize, module: &str) -> String {
    layer_tensor(core, layer, &format!("{module}.global_scale"))
}

/// The shared experts a sink router weighs, each `[count, ·, ·]`: gate
/// and up `[count, intermediate, hidden]`, down `[count, hidden,
/// intermediate]`.
pub fn sink_shared_expert_names(core: &CoreSpec, layer: usize) -> [String; 3] {
    let moe = naming(core).moe_module;
    ["gate_proj", "up_proj", "down_proj"].map(|p| layer_tensor(core, layer, &format!("{moe}.shared_experts.{p}")))
}

/// A short convolution's kernel, `[channels, 1, taps]`, under `module`.
pub(super) fn short_conv_tensor(core: &CoreSpec, layer: usize, module: &str, conv: ShortConv, push: &mut Push<'_>) {
    let name = layer_tensor(core, layer, &format!("{module}.conv1d.weight"));
    push(name, vec![conv.channels, 1, conv.kernel], TensorKind::Recurrence);
}

/// q, k, v, r and o projections, the q/k norms of one head, the k and v
/// convolutions, the bias table and the output convolution.
pub(super) fn attention_tensors(core: &CoreSpec, attn: &InklingAttention, layer: usize, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let t = |suffix: &str| layer_tensor(core, layer, suffix);
    let (q_dim, kv_dim) = (attn.q_dim(), attn.kv_dim());
    let r_dim = attn.num_heads * attn.d_rel;
    let projections = [("q_proj", q_dim, h), ("k_proj", kv_dim, h), ("v_proj", kv_dim, h), ("r_proj", r_dim, h)];
    for (proj, rows, cols) in projections.into_iter().chain([("o_proj", h, q_dim)]) {
        push(t(&format!("self_attn.{proj}.weight")), vec![rows, cols], TensorKind::Linear);
    }
    push(t("self_attn.q_norm.weight"), vec![attn.head_dim], TensorKind::Norm);
    push(t("self_attn.k_norm.weight"), vec![attn.head_dim], TensorKind::Norm);
    short_conv_tensor(core, layer, "self_attn.k_sconv", attn.kv_conv(), push);
    short_conv_tensor(core, layer, "self_attn.v_sconv", attn.kv_conv(), push);
    // Scores' addends, like a sink's: kept f32.
    push(t("self_attn.rel_logits_proj.proj"), vec![attn.d_rel, attn.rel_extent], TensorKind::Bias);
    short_conv_tensor(core, layer, "attn_sconv", attn.output_conv(), push);
}
