//! What one decoder layer is made of: an attention block, a feed-forward
//! block and the kind of its norms ([`LayerSpec`]).
//!
//! The layer, not the family, is the unit the model graph composes: a
//! family only says which blocks each of its layers has. The list is derived
//! from a [`ModelSpec`]'s stored fields ([`ModelSpec::layer_specs`]) rather
//! than stored itself, so manifests written before it existed describe the
//! same layers and the container format does not change.

use super::{GdnDims, IndexerKind, LayerKind, MixerKind, MlaSpec, ModelSpec, NormStyle, QkNorm, ScoringFunc};

/// The blocks of one decoder layer: `x += attention(norm(x))`, then
/// `x += ffn(norm(x))`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub attention: AttentionKind,
    pub ffn: FfnKind,
    /// Both of the layer's norms (before attention and before the FFN).
    pub norm: NormKind,
}

/// The token-mixing block of a layer.
#[derive(Debug, Clone, PartialEq)]
pub enum AttentionKind {
    /// Grouped-query attention (OLMoE, Qwen3-MoE, Mixtral).
    Gqa(GqaSpec),
    /// Multi-head Latent Attention (DeepSeek-V3, Kimi K2.5, GLM-5).
    Mla(MlaAttention),
    /// Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): a fixed-size
    /// recurrent state per sequence instead of rows per token.
    GatedDeltaNet(GdnSpec),
}

impl AttentionKind {
    /// Width of each head's rotated part, which fixes the RoPE table
    /// (`None`: the block uses no positions).
    pub fn rotary_dim(&self) -> Option<usize> {
        match self {
            AttentionKind::Gqa(gqa) => Some(gqa.rotary_dim),
            AttentionKind::Mla(mla) => Some(mla.dims.qk_rope_head_dim),
            AttentionKind::GatedDeltaNet(_) => None,
        }
    }
}

impl AttentionKind {
    /// f32 values one token adds to this layer's cache: keys and values
    /// (GQA); the latent with its rotary key, plus the indexer key with DSA
    /// (MLA); none for a recurrent layer.
    pub fn cache_floats_per_token(&self) -> usize {
        match self {
            AttentionKind::Gqa(gqa) => 2 * gqa.kv_dim(),
            AttentionKind::Mla(mla) => mla.dims.latent_dim() + mla.indexer.map_or(0, |i| i.head_dim),
            AttentionKind::GatedDeltaNet(_) => 0,
        }
    }

    /// f32 values of fixed state one sequence keeps in this layer.
    pub fn state_floats(&self) -> usize {
        match self {
            AttentionKind::Gqa(_) | AttentionKind::Mla(_) => 0,
            AttentionKind::GatedDeltaNet(gdn) => gdn.dims.state_floats(),
        }
    }
}

/// Grouped-query attention with its optional refinements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GqaSpec {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub qk_norm: QkNorm,
    /// Clamp q, k, v to `[-c, c]` after projection.
    pub clip_qkv: Option<f32>,
    /// q/k/v/o projections carry biases.
    pub bias: bool,
    /// Keys visible to a query, itself included (`None`: all earlier keys).
    pub sliding_window: Option<usize>,
    /// Leading dimensions of each head that RoPE rotates.
    pub rotary_dim: usize,
    /// `q_proj` yields a gate per head after its query (`[q d | gate d]`
    /// per head) and the output is multiplied by `sigmoid(gate)`.
    pub output_gate: bool,
}

impl GqaSpec {
    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// Multi-head Latent Attention, optionally sparse (DSA).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaAttention {
    pub num_heads: usize,
    pub dims: MlaSpec,
    /// The down-projections and o_proj carry biases.
    pub bias: bool,
    /// The DSA lightning indexer, on models that have one.
    pub indexer: Option<IndexerSpec>,
}

/// A Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnSpec {
    pub dims: GdnDims,
    /// Epsilon of the gated output norm (the model's `rms_norm_eps`).
    pub eps: f32,
}

/// One layer's part in DeepSeek Sparse Attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerSpec {
    /// Own indexer weights, or the previous full layer's selection.
    pub kind: IndexerKind,
    /// Positions a query may see once there are more than this.
    pub topk: usize,
    pub head_dim: usize,
    pub n_heads: usize,
}

/// The feed-forward block of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FfnKind {
    /// A resident SwiGLU MLP.
    Dense { intermediate_size: usize },
    /// Routed SwiGLU experts streamed through the expert store.
    Moe(MoeBlock),
}

/// A mixture-of-experts block: a router, the routed experts, and the shared
/// experts every token also runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeBlock {
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Width of each routed expert's hidden layer.
    pub intermediate_size: usize,
    pub router: RouterKind,
    pub shared: SharedExperts,
}

/// How a router turns its logits into each token's experts and weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouterKind {
    /// Softmax over all experts, then the top-k, optionally renormalised to
    /// sum to one.
    SoftmaxTopK { renormalize: bool },
    /// DeepSeek-V3's `noaux_tc`: sigmoid scores, a per-expert correction
    /// bias for choosing, the `topk_group` best of `n_group` groups eligible,
    /// weights optionally renormalised and then scaled.
    GroupedSigmoid { n_group: usize, topk_group: usize, renormalize: bool, scaling: f64 },
}

/// Experts applied to every token besides the routed ones (resident).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedExperts {
    None,
    /// Added unscaled to the routed sum; `intermediate_size` is all shared
    /// experts' widths together.
    Plain {
        intermediate_size: usize,
    },
    /// One shared expert whose output is scaled by `sigmoid(w · x)`, `w`
    /// a `[1, hidden]` gate (Qwen3-Next, Qwen3.5).
    Gated {
        intermediate_size: usize,
    },
}

/// What an RMSNorm does with its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    /// `w · x̂` (Llama's RMSNorm), with this epsilon.
    Weight { eps: f32 },
    /// `(1 + w) · x̂`, with this epsilon.
    OnePlusWeight { eps: f32 },
}

impl ModelSpec {
    /// The blocks of every decoder layer, in order.
    pub fn layer_specs(&self) -> Vec<LayerSpec> {
        (0..self.num_layers).map(|l| self.layer_spec(l)).collect()
    }

    /// The blocks of decoder layer `layer` (`layer < num_layers`).
    pub fn layer_spec(&self, layer: usize) -> LayerSpec {
        let linear = self.mixers.get(layer) == Some(&MixerKind::Linear);
        let attention = match (&self.mla, self.linear_attention) {
            (_, Some(dims)) if linear => AttentionKind::GatedDeltaNet(GdnSpec { dims, eps: self.rms_norm_eps }),
            (Some(dims), _) => AttentionKind::Mla(MlaAttention {
                num_heads: self.num_heads,
                dims: *dims,
                bias: self.attention_bias,
                indexer: self.dsa.as_ref().map(|dsa| IndexerSpec {
                    kind: dsa.indexer_types[layer],
                    topk: dsa.index_topk,
                    head_dim: dsa.index_head_dim,
                    n_heads: dsa.index_n_heads,
                }),
            }),
            (None, _) => AttentionKind::Gqa(GqaSpec {
                num_heads: self.num_heads,
                num_kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
                qk_norm: self.qk_norm,
                clip_qkv: self.clip_qkv,
                bias: self.attention_bias,
                sliding_window: self.sliding_window,
                rotary_dim: self.rope.rotary_dim,
                output_gate: self.attn_output_gate,
            }),
        };
        let ffn = match self.layers[layer] {
            LayerKind::Dense => FfnKind::Dense { intermediate_size: self.dense_intermediate_size },
            LayerKind::Moe => FfnKind::Moe(MoeBlock {
                num_experts: self.moe.num_experts,
                top_k: self.moe.top_k,
                intermediate_size: self.moe.intermediate_size,
                router: match self.router.scoring {
                    ScoringFunc::Softmax => RouterKind::SoftmaxTopK { renormalize: self.moe.norm_topk_prob },
                    ScoringFunc::Sigmoid => RouterKind::GroupedSigmoid {
                        n_group: self.router.n_group,
                        topk_group: self.router.topk_group,
                        renormalize: self.moe.norm_topk_prob,
                        scaling: self.router.routed_scaling_factor,
                    },
                },
                shared: match self.shared_intermediate_size {
                    Some(intermediate_size) if self.shared_expert_gate => SharedExperts::Gated { intermediate_size },
                    Some(intermediate_size) => SharedExperts::Plain { intermediate_size },
                    None => SharedExperts::None,
                },
            }),
        };
        LayerSpec { attention, ffn, norm: self.norm_kind() }
    }

    /// Bytes (f32) one token adds to a sequence's cache, over all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.layer_specs().iter().map(|l| l.attention.cache_floats_per_token()).sum::<usize>() * size_of::<f32>()
    }

    /// Bytes (f32) of fixed state one sequence keeps, over all layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.layer_specs().iter().map(|l| l.attention.state_floats()).sum::<usize>() * size_of::<f32>()
    }

    /// The kind of every RMSNorm of the decoder stack, the final one included.
    pub fn norm_kind(&self) -> NormKind {
        let eps = self.rms_norm_eps;
        match self.norm_style {
            NormStyle::Weight => NormKind::Weight { eps },
            NormStyle::OnePlusWeight => NormKind::OnePlusWeight { eps },
        }
    }
}
