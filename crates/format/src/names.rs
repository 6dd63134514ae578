//! Tensor names and shapes as published on the Hugging Face Hub: the roles
//! of the blocks each layer's [`crate::LayerSpec`] names, spelled by the
//! family's naming rules (in its file under `crate::family`).
//!
//! These names are also the canonical names inside a Strata container, so a
//! tensor can be traced from the Hub file to the container and back without a
//! translation table. Shapes are PyTorch `nn.Linear` shapes: `[out, in]`.

mod inkling;

use serde::{Deserialize, Serialize};

pub use self::inkling::{embed_norm_name, global_scale_name, sink_shared_expert_names};
use crate::family::Naming;
use crate::spec::{
    Compression, CompressorState, CoreSpec, ExpertKind, FfnSpec, GateRank, GdnProjections, GdnSpec, GqaSpec, HyperHead,
    IndexerKind, LayerSpec, MixerSpec, MlaAttention, ModelArch, MtpForm, MtpOutputNorm, PleSpec, QkNorm, ResidualKind,
    RouterKind, SharedExperts, SharedKvAttention,
};

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
    /// A projection bias (1-D), or a learned additive term (the pooled DSA
    /// indexer's position bias, `[pool, head_dim]`).
    Bias,
    /// A parameter of a recurrent layer: the short convolution's kernel
    /// (`[channels, 1, taps]`, depthwise), decay rates and time-step biases.
    /// Kept f32: their errors compound over every token of a sequence.
    Recurrence,
    /// A hyper-connection's weights (`hc_*_fn`, `_base`, `_scale`): kept
    /// f32, as transformers keeps them, since every later layer's streams
    /// are mixed by them.
    HyperConnection,
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

fn naming(core: &CoreSpec) -> &'static Naming {
    core.family.def().naming()
}

/// A tensor of decoder layer `layer`: `suffix` after its prefix
/// (`model.layers.{layer}.` in most families), e.g.
/// `layer_tensor(core, 3, "self_attn.kv_b_proj.weight")`.
pub fn layer_tensor(core: &CoreSpec, layer: usize, suffix: &str) -> String {
    format!("{}layers.{layer}.{suffix}", naming(core).model_prefix)
}

/// The token embedding, `[vocab, hidden]`.
pub fn embedding_name(core: &CoreSpec) -> String {
    format!("{}embed_tokens.weight", naming(core).model_prefix)
}

/// The final RMSNorm weight, `[hidden]`.
pub fn final_norm_name(core: &CoreSpec) -> String {
    format!("{}norm.weight", naming(core).model_prefix)
}

/// The output projection: `lm_head.weight`, or the embedding when tied.
pub fn lm_head_name(core: &CoreSpec) -> String {
    if core.tie_word_embeddings { embedding_name(core) } else { naming(core).lm_head.to_owned() }
}

/// The router weight of a MoE layer, `[num_experts, hidden]`.
pub fn router_name(core: &CoreSpec, layer: usize) -> String {
    layer_tensor(core, layer, &format!("{}.gate.weight", naming(core).moe_module))
}

/// The per-expert selection bias of a sigmoid router, `[num_experts]`.
pub fn correction_bias_name(core: &CoreSpec, layer: usize) -> String {
    layer_tensor(core, layer, &format!("{}.gate.e_score_correction_bias", naming(core).moe_module))
}

/// The expert ids of each token of a hash-routed layer ([`RouterKind::Hash`]),
/// `[vocab, top_k]`.
pub fn hash_table_name(core: &CoreSpec, layer: usize) -> String {
    layer_tensor(core, layer, &format!("{}.gate.tid2eid", naming(core).moe_module))
}

/// The bias of a router that has one ([`RouterKind::TopKThenSoftmax`]),
/// `[num_experts]`, beside its weight.
pub fn router_bias_name(core: &CoreSpec, layer: usize) -> String {
    router_name(core, layer).replace(".weight", ".bias")
}

/// The block a layer's hyper-connection wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HyperSite {
    Attention,
    Ffn,
}

/// The weights of layer `layer`'s hyper-connection around `site`, as the
/// hub names them (transformers: `attn_hc.fn`, ...): `fn` `[(2 + streams)
/// · streams, streams · hidden]`, `base` `[(2 + streams) · streams]`,
/// `scale` `[3]`.
pub fn hyper_connection_names(core: &CoreSpec, layer: usize, site: HyperSite) -> [String; 3] {
    let block = match site {
        HyperSite::Attention => "attn",
        HyperSite::Ffn => "ffn",
    };
    ["fn", "base", "scale"].map(|part| layer_tensor(core, layer, &format!("hc_{block}_{part}")))
}

/// A block's gated residual ([`ResidualKind::GatedStreams`]), as the hub
/// names them (transformers' `attn_hyper_connection` / `mlp_hyper_connection`):
/// the per-stream norm `[streams · hidden]` (applied as `1 + w`), `down`
/// `[lowrank, streams · hidden]`, `up` `[streams · hidden, lowrank]` and
/// `inject` `[streams, streams · hidden]`.
pub fn gated_residual_names(core: &CoreSpec, layer: usize, site: HyperSite) -> [String; 4] {
    let block = match site {
        HyperSite::Attention => "attn",
        HyperSite::Ffn => "mlp",
    };
    GATED_RESIDUAL_PARTS.map(|part| layer_tensor(core, layer, &format!("{block}_hyper_connection.{part}")))
}

/// The final mixer of gated residual streams, before `lm_head`: a block's
/// gated residual without `inject` (`hyper_connection_mixer`).
pub fn gated_head_names(core: &CoreSpec) -> [String; 3] {
    let [norm, down, up, _] = GATED_RESIDUAL_PARTS;
    [norm, down, up].map(|part| format!("{}hyper_connection_mixer.{part}", naming(core).model_prefix))
}

/// The norm `[hidden]` and score projection `[1, hidden]` of layer
/// `layer`'s Attention Residuals mix before `site`
/// ([`ResidualKind::AttentionResiduals`]), as Kimi K3 names them.
pub fn attn_res_names(core: &CoreSpec, layer: usize, site: HyperSite) -> [String; 2] {
    let block = match site {
        HyperSite::Attention => "self_attention",
        HyperSite::Ffn => "mlp",
    };
    ["norm", "proj"].map(|part| layer_tensor(core, layer, &format!("{block}_res_{part}.weight")))
}

/// The Attention Residuals mix before the final norm: its norm and score
/// projection, under the model prefix.
pub fn attn_res_head_names(core: &CoreSpec) -> [String; 2] {
    ["norm", "proj"].map(|part| format!("{}output_attn_res_{part}.weight", naming(core).model_prefix))
}

/// An Attention Residuals mix's norm `[hidden]` and projection `[1, hidden]`.
fn push_attn_res(hidden: usize, [norm, proj]: [String; 2], push: &mut Push<'_>) {
    push(norm, vec![hidden], TensorKind::HyperConnection);
    push(proj, vec![1, hidden], TensorKind::HyperConnection);
}

/// A gated residual's norm, `down` and `up`, over `width = streams · hidden`.
fn push_gated(width: usize, lowrank: usize, [norm, down, up]: [String; 3], push: &mut Push<'_>) {
    push(norm, vec![width], TensorKind::HyperConnection);
    push(down, vec![lowrank, width], TensorKind::HyperConnection);
    push(up, vec![width, lowrank], TensorKind::HyperConnection);
}

const GATED_RESIDUAL_PARTS: [&str; 4] =
    ["hc_norm.weight", "input_mix_weight_down.weight", "input_mix_weight_up.weight", "block_inject_weight.weight"];

/// The weights of the σ-weighted head ([`HyperHead::Sigmoid`]) beside the
/// final norm, as the hub names them (transformers: `hc_head.hc_fn`,
/// ...): `fn` `[streams, streams · hidden]`, `base` `[streams]`, `scale`
/// `[1]`.
pub fn hyper_head_names(core: &CoreSpec) -> [String; 3] {
    ["fn", "base", "scale"].map(|part| format!("{}hc_head_{part}", naming(core).model_prefix))
}

/// Each attention head's learned sink logit, `[num_heads]`.
pub fn sinks_name(core: &CoreSpec, layer: usize) -> String {
    layer_tensor(core, layer, "self_attn.sinks")
}

/// The biases of a layer's biased experts ([`ExpertKind::ClampedSwiGlu`]),
/// resident: gate and up (`[num_experts, intermediate]`, split at import
/// from the checkpoint's interleaved `gate_up_proj_bias`) and down
/// (`[num_experts, hidden]`, the checkpoint's `down_proj_bias`).
pub fn expert_bias_names(core: &CoreSpec, layer: usize) -> [String; 3] {
    let base = layer_tensor(core, layer, &format!("{}.experts.", naming(core).moe_module));
    ["gate_proj_bias", "up_proj_bias", "down_proj_bias"].map(|p| format!("{base}{p}"))
}

/// The fused tensors of a layer's biased experts
/// ([`ExpertKind::ClampedSwiGlu`]) as transformers' `save_pretrained`
/// writes gpt-oss's: `gate_up_proj` `[E, hidden, 2·intermediate]` (gate
/// on even columns, up on odd ones), `gate_up_proj_bias`
/// `[E, 2·intermediate]` (interleaved alike) and `down_proj`
/// `[E, intermediate, hidden]`; `down_proj_bias` is
/// [`expert_bias_names`]'s own. Read by `checkpoint::InterleavedExperts`.
pub fn interleaved_expert_names(core: &CoreSpec, layer: usize) -> [String; 3] {
    let base = layer_tensor(core, layer, &format!("{}.experts.", naming(core).moe_module));
    ["gate_up_proj", "gate_up_proj_bias", "down_proj"].map(|p| format!("{base}{p}"))
}

/// The shared experts of a MoE layer: gate, up, down (`shared_experts`
/// when ungated, DeepSeek's name; `shared_expert` beside its gate, Qwen's).
pub fn shared_expert_names(core: &CoreSpec, layer: usize, shared: SharedExperts) -> [String; 3] {
    let module = match shared {
        SharedExperts::Gated { .. } => "shared_expert",
        SharedExperts::Plain { .. } | SharedExperts::Sink { .. } | SharedExperts::None => "shared_experts",
    };
    let moe = naming(core).moe_module;
    ["gate_proj", "up_proj", "down_proj"].map(|p| layer_tensor(core, layer, &format!("{moe}.{module}.{p}.weight")))
}

/// The gate of a gated shared expert, `[1, hidden]`.
pub fn shared_expert_gate_name(core: &CoreSpec, layer: usize) -> String {
    layer_tensor(core, layer, "mlp.shared_expert_gate.weight")
}

/// A Gated DeltaNet layer's tensor `suffix` (under `linear_attn.`).
pub fn linear_attn_tensor(core: &CoreSpec, projections: GdnProjections, layer: usize, suffix: &str) -> String {
    layer_tensor(core, layer, &format!("{}.{suffix}", projections.module()))
}

/// The dense MLP of a dense layer: gate, up, down.
pub fn dense_mlp_names(core: &CoreSpec, layer: usize) -> [String; 3] {
    ["gate_proj", "up_proj", "down_proj"].map(|p| layer_tensor(core, layer, &format!("mlp.{p}.weight")))
}

/// Published names of expert `expert` of `layer`: gate, up, down.
pub fn expert_names(core: &CoreSpec, layer: usize, expert: usize) -> [String; 3] {
    let naming = naming(core);
    let base = layer_tensor(core, layer, &format!("{}.experts.{expert}.", naming.moe_module));
    naming.expert_projections.map(|p| format!("{base}{p}.weight"))
}

/// Expert names with `{expert}` in place of the index (manifest templates).
pub fn expert_name_templates(core: &CoreSpec, layer: usize) -> [String; 3] {
    // Built from a sentinel index so the template cannot drift from
    // `expert_names`.
    expert_names(core, layer, 0).map(|n| n.replace(".experts.0.", ".experts.{expert}."))
}

/// Shapes `[rows, cols]` of gate, up, down for every expert of the model:
/// over the hidden width, or a latent MoE's latent.
pub fn expert_shapes(arch: &ModelArch) -> [[usize; 2]; 3] {
    let moe = arch.first_moe();
    let i = moe.map_or(0, |moe| moe.intermediate_size);
    let h = moe.and_then(|moe| moe.latent).map_or(arch.core.hidden_size, |latent| latent.width);
    [[i, h], [i, h], [h, i]]
}

/// A latent MoE's ([`crate::LatentMoe`]) shared projections and norm:
/// `routed_expert_down_proj` `[width, hidden]`, `routed_expert_up_proj`
/// `[hidden, width]`, `routed_expert_norm` `[width]`.
pub fn latent_moe_names(core: &CoreSpec, layer: usize) -> [String; 3] {
    let module = naming(core).moe_module;
    ["routed_expert_down_proj", "routed_expert_up_proj", "routed_expert_norm"]
        .map(|part| layer_tensor(core, layer, &format!("{module}.{part}.weight")))
}

/// Names of the fused 3-D expert tensors transformers 5.x keeps in memory
/// (`[E, 2I, H]` gate‖up and `[E, H, I]` down) and writes when saving with
/// `save_original_format=False`. Always under `mlp.` (mixtral's
/// `block_sparse_moe` is renamed to `mlp` by the 5.x conversion mapping).
pub fn fused_expert_names(layer: usize) -> (String, String) {
    let p = format!("model.layers.{layer}.");
    (format!("{p}mlp.experts.gate_up_proj"), format!("{p}mlp.experts.down_proj"))
}

/// A layer's routed experts as its family's hub stores them when that
/// spelling renames transformers' fused tensors (Inkling's `w13_weight`,
/// gate and up rows paired, `[E, 2I, H]`, and `w2_weight`, `[E, H, I]`;
/// read by `checkpoint/paired.rs`); `None` for other families.
pub fn paired_expert_names(core: &CoreSpec, layer: usize) -> Option<[String; 2]> {
    let (gate_up, down) = fused_expert_names(layer);
    let hub = respelled(&gate_up, core.family.def().hub_spelling());
    (hub != gate_up).then(|| [hub, respelled(&down, core.family.def().hub_spelling())])
}

/// `name` with each of `renames` (`(canonical, stored)` parts) applied in
/// order, to every occurrence: a later rename sees the earlier ones' output,
/// as transformers' conversion mapping renames one key step by step.
pub(crate) fn respelled(name: &str, renames: &[(&str, &str)]) -> String {
    renames.iter().fold(name.to_owned(), |name, (canonical, stored)| name.replace(canonical, stored))
}

/// Other names under which a checkpoint may store canonical tensor `name`
/// (transformers 5.x renames some modules when loading, and saves them so
/// unless asked for the original format; a family's saved spelling, whole;
/// an alias part of the name or of its saved spelling, e.g. DeepSeek V4's
/// hub names: its saved names without the `model.` prefix; a family's hub
/// spelling, whole; an MTP layer's tensor as the family's hub keeps it).
pub fn aliases(arch: &ModelArch, name: &str) -> Vec<String> {
    let core = &arch.core;
    let naming = naming(core);
    let saved = respelled(name, naming.saved_as);
    let hub = respelled(name, core.family.def().hub_spelling());
    let mtp_hub = mtp_layer_part(arch, name).and_then(|(k, suffix)| core.family.def().hub_mtp_name(k, suffix));
    let aliased = |base: &str| -> Vec<String> {
        naming
            .aliases
            .iter()
            .filter(|(canonical, _)| base.contains(canonical))
            .map(|(canonical, stored)| base.replacen(canonical, stored, 1))
            .collect()
    };
    let mut out: Vec<String> = Vec::new();
    for candidate in aliased(name).into_iter().chain([saved.clone()]).chain(aliased(&saved)).chain([hub]).chain(mtp_hub)
    {
        if candidate != name && !out.contains(&candidate) {
            out.push(candidate);
        }
    }
    out
}

/// `(k, suffix)` where `name` is tensor `suffix` of `arch`'s MTP layer `k`
/// (the container's layer `layers.len() + k`).
fn mtp_layer_part<'a>(arch: &ModelArch, name: &'a str) -> Option<(usize, &'a str)> {
    let rest = name.strip_prefix(naming(&arch.core).model_prefix)?.strip_prefix("layers.")?;
    let (index, suffix) = rest.split_once('.')?;
    let k = index.parse::<usize>().ok()?.checked_sub(arch.layers.len())?;
    (k < arch.mtp.len()).then_some((k, suffix))
}

/// Canonical tensor `name` as transformers' `save_pretrained` writes it
/// (gpt-oss's router is `mlp.router.`; every part of DeepSeek V4's),
/// which export writes.
pub fn saved_name(core: &CoreSpec, name: &str) -> String {
    respelled(name, naming(core).saved_as)
}

/// Every non-expert tensor of the model, in file order: embeddings, then each
/// layer (norms, attention, MLP or router), then the final norm and lm_head,
/// then the multi-token-prediction layers.
pub fn dense_tensors(arch: &ModelArch) -> Vec<TensorDesc> {
    let core = &arch.core;
    let h = core.hidden_size;
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, kind: TensorKind| out.push(TensorDesc { name, shape, kind });
    push(embedding_name(core), vec![core.vocab_size, h], TensorKind::Embedding);
    if core.embed_norm.is_some() {
        push(embed_norm_name(core), vec![h], TensorKind::Norm);
    }
    for (layer, blocks) in arch.layers.iter().enumerate() {
        layer_tensors(core, layer, blocks, &mut push);
    }
    if let ResidualKind::AttentionResiduals { .. } = arch.residual() {
        push_attn_res(h, attn_res_head_names(core), &mut push);
    }
    if let ResidualKind::GatedStreams { streams, lowrank } = arch.residual() {
        push_gated(streams * h, lowrank, gated_head_names(core), &mut push);
    }
    if let ResidualKind::HyperConnections { streams, head: HyperHead::Sigmoid, .. } = arch.residual() {
        let [mixes, base, scale] = hyper_head_names(core);
        push(mixes, vec![streams, streams * h], TensorKind::HyperConnection);
        push(base, vec![streams], TensorKind::HyperConnection);
        push(scale, vec![1], TensorKind::HyperConnection);
    }
    if arch.residual().has_layer_norms() {
        push(final_norm_name(core), vec![h], TensorKind::Norm);
    }
    if !core.tie_word_embeddings {
        push(lm_head_name(core), vec![core.vocab_size, h], TensorKind::LmHead);
    }
    for (k, blocks) in arch.mtp.iter().enumerate() {
        mtp_tensors(core, arch.layers.len() + k, blocks, arch.mtp_form, &mut push);
    }
    if !arch.mtp.is_empty() && arch.mtp_form.output_norm == MtpOutputNorm::Chain {
        push(mtp_chain_norm_name(core), vec![h], TensorKind::Norm);
    }
    out
}

/// The norm every MTP layer's output passes where the form has one shared
/// norm ([`MtpOutputNorm::Chain`]), `[hidden]`: Inkling's hub name,
/// `model.mtp.chain_norm` (`MtpModel`'s `shared_post_norm`).
pub fn mtp_chain_norm_name(core: &CoreSpec) -> String {
    format!("{}mtp.chain_norm.weight", naming(core).model_prefix)
}

/// The first MTP layer's `eh_proj`: whether a checkpoint or container
/// holds `arch`'s multi-token-prediction layers.
pub fn mtp_probe(arch: &ModelArch) -> Option<String> {
    (!arch.mtp.is_empty()).then(|| layer_tensor(&arch.core, arch.layers.len(), MTP_PROJECTION))
}

/// The projection of an MTP layer's joined embedding and hidden state.
const MTP_PROJECTION: &str = "eh_proj.weight";

/// A multi-token-prediction layer `layer`: DeepSeek-V3's `enorm` (the next
/// token's embedding) and `hnorm` (the stack's hidden state), `eh_proj`
/// over the two joined, the decoder layer `blocks`, and, where the form
/// gives each layer its own norm, `shared_head.norm` before the model's own
/// lm head. (Checkpoints also copy the embedding and lm head into each MTP
/// layer; the model's own are read instead, as transformers' `MtpModel`
/// does.)
fn mtp_tensors(core: &CoreSpec, layer: usize, blocks: &LayerSpec, form: MtpForm, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let t = |suffix: &str| layer_tensor(core, layer, suffix);
    push(t("enorm.weight"), vec![h], TensorKind::Norm);
    push(t("hnorm.weight"), vec![h], TensorKind::Norm);
    push(t(MTP_PROJECTION), vec![h, 2 * h], TensorKind::Linear);
    layer_tensors(core, layer, blocks, push);
    if form.output_norm == MtpOutputNorm::PerLayer {
        push(t(MTP_HEAD_NORM), vec![h], TensorKind::Norm);
    }
}

/// An MTP layer's own output norm ([`MtpOutputNorm::PerLayer`]).
pub const MTP_HEAD_NORM: &str = "shared_head.norm.weight";

/// One decoder layer's tensors: norms, attention, MLP or router and shared
/// experts, residual streams.
fn layer_tensors(core: &CoreSpec, layer: usize, blocks: &LayerSpec, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let t = |suffix: &str| layer_tensor(core, layer, suffix);
    let norms = blocks.residual.has_layer_norms();
    if norms {
        push(t("input_layernorm.weight"), vec![h], TensorKind::Norm);
    }
    match &blocks.mixer {
        MixerSpec::Gqa(gqa) => gqa_attention_tensors(core, gqa, layer, push),
        MixerSpec::Mla(mla) => mla_attention_tensors(core, mla, layer, push),
        MixerSpec::GatedDeltaNet(gdn) => gdn_tensors(core, gdn, layer, push),
        MixerSpec::Inkling(attn) => inkling::attention_tensors(core, attn, layer, push),
        MixerSpec::SharedKv(sk) => shared_kv_tensors(core, sk, layer, push),
    }
    if norms {
        push(t("post_attention_layernorm.weight"), vec![h], TensorKind::Norm);
    }
    match &blocks.ffn {
        FfnSpec::Moe(moe) => {
            push(router_name(core, layer), vec![moe.router_rows(), h], TensorKind::Router);
            match moe.router {
                RouterKind::SharedExpertSink { .. } => {
                    push(correction_bias_name(core, layer), vec![moe.num_experts], TensorKind::Bias);
                    push(global_scale_name(core, layer, "mlp.gate"), vec![1], TensorKind::Norm);
                }
                RouterKind::GroupedSigmoid { .. } | RouterKind::SqrtSoftplus { .. } => {
                    push(correction_bias_name(core, layer), vec![moe.num_experts], TensorKind::Bias);
                }
                RouterKind::TopKThenSoftmax => {
                    push(router_bias_name(core, layer), vec![moe.num_experts], TensorKind::Bias);
                }
                RouterKind::Hash { .. } => {
                    // Expert ids (integers in the checkpoint), f32 like a
                    // router: exact below 2^24, far above any expert count.
                    push(hash_table_name(core, layer), vec![core.vocab_size, moe.top_k], TensorKind::Router);
                }
                RouterKind::SoftmaxTopK { .. } => {}
            }
            if let Some(latent) = moe.latent {
                let [down, up, norm] = latent_moe_names(core, layer);
                push(down, vec![latent.width, h], TensorKind::Linear);
                push(up, vec![h, latent.width], TensorKind::Linear);
                push(norm, vec![latent.width], TensorKind::Norm);
            }
            if let ExpertKind::ClampedSwiGlu { .. } = moe.experts {
                let [gate, up, down] = expert_bias_names(core, layer);
                push(gate, vec![moe.num_experts, moe.intermediate_size], TensorKind::Bias);
                push(up, vec![moe.num_experts, moe.intermediate_size], TensorKind::Bias);
                push(down, vec![moe.num_experts, h], TensorKind::Bias);
            }
            match moe.shared {
                SharedExperts::None => {}
                SharedExperts::Plain { intermediate_size } => {
                    swiglu_tensors(shared_expert_names(core, layer, moe.shared), h, intermediate_size, push);
                }
                SharedExperts::Gated { intermediate_size } => {
                    swiglu_tensors(shared_expert_names(core, layer, moe.shared), h, intermediate_size, push);
                    push(shared_expert_gate_name(core, layer), vec![1, h], TensorKind::Router);
                }
                SharedExperts::Sink { count, intermediate_size: i } => {
                    let [gate, up, down] = sink_shared_expert_names(core, layer);
                    push(gate, vec![count, i, h], TensorKind::Linear);
                    push(up, vec![count, i, h], TensorKind::Linear);
                    push(down, vec![count, h, i], TensorKind::Linear);
                }
            }
        }
        FfnSpec::Dense { intermediate_size, global_scale, .. } => {
            swiglu_tensors(dense_mlp_names(core, layer), h, *intermediate_size, push);
            if *global_scale {
                push(global_scale_name(core, layer, "mlp"), vec![1], TensorKind::Norm);
            }
        }
    }
    if let Some(conv) = blocks.ffn_output_conv {
        inkling::short_conv_tensor(core, layer, "mlp_sconv", conv, push);
    }
    if let Some(ple) = &blocks.ple {
        ple_tensors(core, ple, layer, push);
    }
    if let ResidualKind::HyperConnections { streams, .. } = blocks.residual {
        for site in [HyperSite::Attention, HyperSite::Ffn] {
            let [mixes, base, scale] = hyper_connection_names(core, layer, site);
            let width = (2 + streams) * streams;
            push(mixes, vec![width, streams * h], TensorKind::HyperConnection);
            push(base, vec![width], TensorKind::HyperConnection);
            push(scale, vec![3], TensorKind::HyperConnection);
        }
    }
    if let ResidualKind::AttentionResiduals { .. } = blocks.residual {
        for site in [HyperSite::Attention, HyperSite::Ffn] {
            push_attn_res(h, attn_res_names(core, layer, site), push);
        }
    }
    if let ResidualKind::GatedStreams { streams, lowrank } = blocks.residual {
        for site in [HyperSite::Attention, HyperSite::Ffn] {
            let [norm, down, up, inject] = gated_residual_names(core, layer, site);
            push_gated(streams * h, lowrank, [norm, down, up], push);
            push(inject, vec![streams, streams * h], TensorKind::HyperConnection);
        }
    }
}

/// The PLE of layer `layer`: its table (`[rows, head_dim]`, quantized
/// like the embedding table and, like it, read by row), the key and value
/// projections, the three grouped norms and the dilated convolution.
fn ple_tensors(core: &CoreSpec, ple: &PleSpec, layer: usize, push: &mut Push<'_>) {
    let [table, key, value, norm_key, norm_query, norm_conv, conv] = ple_names(core, layer);
    // Validated: the rows do not overflow.
    let rows = ple.table_rows().unwrap_or(0);
    push(table, vec![rows, ple.head_dim()], TensorKind::Embedding);
    push(key, vec![ple.channels, ple.embed_dim], TensorKind::Linear);
    push(value, vec![core.hidden_size, ple.embed_dim], TensorKind::Linear);
    for norm in [norm_key, norm_query, norm_conv] {
        push(norm, vec![ple.channels], TensorKind::Norm);
    }
    push(conv, vec![ple.channels, 1, ple.conv_kernel], TensorKind::Recurrence);
}

/// Layer `layer`'s PLE tensors: the table, `key_proj`, `value_proj`,
/// `norm_key`, `norm_query`, `norm_conv`, `conv1d`.
pub fn ple_names(core: &CoreSpec, layer: usize) -> [String; 7] {
    [
        PLE_TABLE,
        "ple.key_proj.weight",
        "ple.value_proj.weight",
        "ple.norm_key.weight",
        "ple.norm_query.weight",
        "ple.norm_conv.weight",
        "ple.conv1d.weight",
    ]
    .map(|suffix| layer_tensor(core, layer, suffix))
}

/// A PLE table's name within its layer; the hub splits it by rows into
/// `ngram_embedding.shard_{k}.weight` (`split_ngram_parts` of them).
pub const PLE_TABLE: &str = "ple.ple_embedding.ngram_embedding.weight";

/// Whether `name` is a PLE table: read by row, like the embedding table.
pub fn is_ple_table(name: &str) -> bool {
    name.ends_with(PLE_TABLE)
}

type Push<'a> = dyn FnMut(String, Vec<usize>, TensorKind) + 'a;

/// A SwiGLU MLP's gate, up and down matrices.
fn swiglu_tensors([gate, up, down]: [String; 3], hidden: usize, intermediate_size: usize, push: &mut Push<'_>) {
    push(gate, vec![intermediate_size, hidden], TensorKind::Linear);
    push(up, vec![intermediate_size, hidden], TensorKind::Linear);
    push(down, vec![hidden, intermediate_size], TensorKind::Linear);
}

/// q/k/v/o projections, their biases and q/k norms.
fn gqa_attention_tensors(core: &CoreSpec, gqa: &GqaSpec, layer: usize, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let t = |suffix: &str| layer_tensor(core, layer, suffix);
    let (q_dim, kv_dim) = (gqa.q_dim(), gqa.kv_dim());
    // A gated layer's q_proj yields each head's query, then its gate.
    let q_rows = if gqa.output_gate { 2 * q_dim } else { q_dim };
    let projections = [("q_proj", q_rows, h), ("k_proj", kv_dim, h), ("v_proj", kv_dim, h), ("o_proj", h, q_dim)];
    for (proj, rows, cols) in projections {
        push(t(&format!("self_attn.{proj}.weight")), vec![rows, cols], TensorKind::Linear);
        if gqa.bias {
            push(t(&format!("self_attn.{proj}.bias")), vec![rows], TensorKind::Bias);
        }
    }
    let qk_norm_dims = match gqa.qk_norm {
        QkNorm::None => None,
        QkNorm::Full => Some((q_dim, kv_dim)),
        QkNorm::PerHead => Some((gqa.head_dim, gqa.head_dim)),
    };
    if let Some((q, k)) = qk_norm_dims {
        push(t("self_attn.q_norm.weight"), vec![q], TensorKind::Norm);
        push(t("self_attn.k_norm.weight"), vec![k], TensorKind::Norm);
    }
    if gqa.sinks {
        // Logits beside the scores: kept f32 like the biases.
        push(sinks_name(core, layer), vec![gqa.num_heads], TensorKind::Bias);
    }
    if let Some(qsa) = &gqa.qsa {
        let [qk, q_norm, k_norm] = qsa_names(core, layer);
        push(qk, vec![(qsa.n_heads + 1) * qsa.head_dim, h], TensorKind::Linear);
        push(q_norm, vec![qsa.head_dim], TensorKind::Norm);
        push(k_norm, vec![qsa.head_dim], TensorKind::Norm);
    }
}

/// A QSA layer's indexer ([`crate::QsaSpec`]): `index_qk_proj` `[(n_heads
/// + 1) · head_dim, hidden]` (the query heads, then the one raw key), and
/// the query and block-key norms `q_layernorm`, `k_layernorm` `[head_dim]`
/// (applied as `1 + w`).
pub fn qsa_names(core: &CoreSpec, layer: usize) -> [String; 3] {
    ["index_qk_proj", "q_layernorm", "k_layernorm"]
        .map(|part| layer_tensor(core, layer, &format!("self_attn.indexer.{part}.weight")))
}

/// Multi-head Latent Attention: the (compressed) query, the latent
/// down-projection and its norm, the up-projection `kv_b_proj`, o_proj, and
/// on full DSA layers the lightning indexer (with its pooling weights when
/// pooled).
fn mla_attention_tensors(core: &CoreSpec, attn: &MlaAttention, layer: usize, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let t = |suffix: &str| layer_tensor(core, layer, suffix);
    let (mla, heads) = (&attn.dims, attn.num_heads);
    let q_rows = heads * mla.qk_head_dim();
    let mut linear = |name: &str, rows: usize, cols: usize, bias: bool| {
        push(t(&format!("self_attn.{name}.weight")), vec![rows, cols], TensorKind::Linear);
        if bias && attn.bias {
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
    if attn.bias {
        push(t("self_attn.kv_a_proj_with_mqa.bias"), vec![r + mla.qk_rope_head_dim], TensorKind::Bias);
    }
    push(t("self_attn.kv_a_layernorm.weight"), vec![r], TensorKind::Norm);
    push(t("self_attn.kv_b_proj.weight"), vec![heads * (mla.qk_nope_head_dim + mla.v_head_dim), r], TensorKind::Linear);
    push(t("self_attn.o_proj.weight"), vec![h, heads * mla.v_head_dim], TensorKind::Linear);
    if attn.output_gate {
        push(t("self_attn.g_proj.weight"), vec![heads * mla.v_head_dim, h], TensorKind::Linear);
    }
    if attn.bias {
        push(t("self_attn.o_proj.bias"), vec![h], TensorKind::Bias);
    }
    if let (Some(indexer), Some(rank)) = (attn.indexer, mla.q_lora_rank)
        && indexer.kind == IndexerKind::Full
    {
        let (n, d) = (indexer.n_heads, indexer.head_dim);
        push(t("self_attn.indexer.wq_b.weight"), vec![n * d, rank], TensorKind::Linear);
        push(t("self_attn.indexer.wk.weight"), vec![d, h], TensorKind::Linear);
        push(t("self_attn.indexer.k_norm.weight"), vec![d], TensorKind::Norm);
        push(t("self_attn.indexer.k_norm.bias"), vec![d], TensorKind::Bias);
        // Its output weighs the heads' scores that pick tokens: f32, like a
        // router (transformers keeps it in fp32 too).
        push(t("self_attn.indexer.weights_proj.weight"), vec![n, h], TensorKind::Router);
        if let Some(pool) = indexer.pool {
            // The pooling weights pick tokens too (through the pooled keys):
            // f32, the gate as a router and the position bias as a bias.
            push(t("self_attn.indexer.index_kpool_compress_gate"), vec![d, h], TensorKind::Router);
            push(t("self_attn.indexer.index_kpool_compress_ape"), vec![pool, d], TensorKind::Bias);
        }
    }
}

/// DeepSeek V4's attention tensors: the q-LoRA, the shared key-value head,
/// the grouped output projection, the sinks, and on compressed layers the
/// compressor (and on CSA layers its indexer) under `self_attn.compressor.`.
fn shared_kv_tensors(core: &CoreSpec, sk: &SharedKvAttention, layer: usize, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let t = |suffix: &str| layer_tensor(core, layer, &format!("self_attn.{suffix}"));
    let (rank, q_dim, d) = (sk.q_lora_rank, sk.q_dim(), sk.head_dim);
    let o_width = sk.o_groups * sk.o_lora_rank;
    push(t("q_a_proj.weight"), vec![rank, h], TensorKind::Linear);
    push(t("q_a_norm.weight"), vec![rank], TensorKind::Norm);
    push(t("q_b_proj.weight"), vec![q_dim, rank], TensorKind::Linear);
    push(t("kv_proj.weight"), vec![d, h], TensorKind::Linear);
    push(t("kv_norm.weight"), vec![d], TensorKind::Norm);
    push(t("o_a_proj.weight"), vec![o_width, q_dim / sk.o_groups], TensorKind::Linear);
    push(t("o_b_proj.weight"), vec![h, o_width], TensorKind::Linear);
    // Logits beside the scores: kept f32 like the biases.
    push(sinks_name(core, layer), vec![sk.num_heads], TensorKind::Bias);
    let mut compressor = |module: &str, state: &CompressorState| {
        let projection = state.projection_width();
        push(t(&format!("{module}.kv_proj.weight")), vec![projection, h], TensorKind::Linear);
        push(t(&format!("{module}.gate_proj.weight")), vec![projection, h], TensorKind::Linear);
        // Added to the gate logits of each slot of a window: f32 as a bias.
        push(t(&format!("{module}.position_bias")), vec![state.ratio, projection], TensorKind::Bias);
        push(t(&format!("{module}.kv_norm.weight")), vec![state.width], TensorKind::Norm);
    };
    let states = sk.compressors();
    if let Some(state) = states.first() {
        compressor("compressor", state);
    }
    if let (Some(state), Some(Compression::Sparse { indexer, .. })) = (states.get(1), sk.compression) {
        compressor("compressor.indexer", state);
        let (n, d) = (indexer.n_heads, indexer.head_dim);
        push(t("compressor.indexer.q_b_proj.weight"), vec![n * d, rank], TensorKind::Linear);
        // Its output weighs the heads' scores that pick entries: f32, like
        // a router (transformers keeps it in fp32 too).
        push(t("compressor.indexer.scorer.weights_proj.weight"), vec![n, h], TensorKind::Router);
    }
}

/// A Gated DeltaNet layer: its input projections (fused per key-head group
/// or split), the depthwise convolution, decay parameters, gated output
/// norm and output projection.
fn gdn_tensors(core: &CoreSpec, gdn: &GdnSpec, layer: usize, push: &mut Push<'_>) {
    let h = core.hidden_size;
    let d = &gdn.dims;
    let t = |suffix: &str| linear_attn_tensor(core, d.projections, layer, suffix);
    let (key_dim, value_dim, n_v) = (d.key_dim(), d.value_dim(), d.num_v_heads);
    let projections: &[(&str, usize, usize)] = match d.projections {
        GdnProjections::Grouped => &[("in_proj_qkvz", 2 * key_dim + 2 * value_dim, h), ("in_proj_ba", 2 * n_v, h)],
        GdnProjections::Split => &[
            ("in_proj_qkv", 2 * key_dim + value_dim, h),
            ("in_proj_z", value_dim, h),
            ("in_proj_b", n_v, h),
            ("in_proj_a", n_v, h),
        ],
        GdnProjections::Kimi => &[
            ("q_proj", key_dim, h),
            ("k_proj", key_dim, h),
            ("v_proj", value_dim, h),
            ("b_proj", n_v, h),
            ("f_a_proj", d.head_k_dim, h),
            ("f_b_proj", key_dim, d.head_k_dim),
        ],
    };
    let gate: &[(&str, usize, usize)] = match (d.projections, gdn.output_gate_rank) {
        (GdnProjections::Kimi, GateRank::Low) => {
            &[("g_a_proj", d.head_v_dim, h), ("g_b_proj", value_dim, d.head_v_dim)]
        }
        (GdnProjections::Kimi, GateRank::Full) => &[("g_proj", value_dim, h)],
        // GDN's gate `z` is one of its input projections.
        _ => &[],
    };
    let projections = projections.iter().chain(gate);
    for &(name, rows, cols) in projections {
        push(t(&format!("{name}.weight")), vec![rows, cols], TensorKind::Linear);
    }
    if d.projections == GdnProjections::Kimi {
        for (conv, channels) in KIMI_CONVS.into_iter().zip([key_dim, key_dim, value_dim]) {
            push(t(&format!("{conv}.weight")), vec![channels, 1, d.conv_kernel], TensorKind::Recurrence);
        }
        // Per key channel; A_log as the hub shapes it: Kimi's to broadcast
        // over `[batch, tokens, heads, d_k]`, the bounded gate's per head.
        push(t("dt_bias"), vec![key_dim], TensorKind::Recurrence);
        let a_log = match (gdn.a_log_padded_to, gdn.gate_lower_bound) {
            (Some(padded), _) => vec![padded],
            (None, Some(_)) => vec![n_v],
            (None, None) => vec![1, 1, n_v, 1],
        };
        push(t("A_log"), a_log, TensorKind::Recurrence);
        push(t("o_norm.weight"), vec![d.head_v_dim], TensorKind::Norm);
        push(t("o_proj.weight"), vec![h, value_dim], TensorKind::Linear);
        return;
    }
    push(t("conv1d.weight"), vec![d.conv_dim(), 1, d.conv_kernel], TensorKind::Recurrence);
    push(t("dt_bias"), vec![n_v], TensorKind::Recurrence);
    push(t("A_log"), vec![n_v], TensorKind::Recurrence);
    push(t("norm.weight"), vec![d.head_v_dim], TensorKind::Norm);
    push(t("out_proj.weight"), vec![h, value_dim], TensorKind::Linear);
}

/// Kimi Delta Attention's convolutions, one per input (q, k, v), in the
/// order the block joins them into one over `conv_dim` channels.
pub const KIMI_CONVS: [&str; 3] = ["q_conv1d", "k_conv1d", "v_conv1d"];
