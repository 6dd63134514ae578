//! What one decoder layer is made of: an attention block with its own
//! dimensions, a feed-forward block, the kind of its norms and of its
//! residual ([`LayerSpec`]).
//!
//! The layer, not the family, is the unit the model graph composes, and a
//! model stores one spec per layer ([`super::ModelArch`]): layers with their
//! own heads, windows or no RoPE are expressible. Every fact about a layer
//! that more than one crate needs (cache floats per token, fixed state,
//! activation width, what `strata info` prints) is a method here, computed
//! in this one place.

use super::{
    Compression, FfnKind, GdnDims, GdnProjections, IndexerKind, InklingAttention, MlaSpec, PleSpec, QkNorm, RopeSpec,
    SharedKvAttention, ShortConv,
};

/// The blocks of one decoder layer: `x += attention(norm(x))`, then
/// `x += ffn(norm(x))`, the additions as `residual` says.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub mixer: MixerSpec,
    pub ffn: FfnSpec,
    /// Both of the layer's norms (before attention and before the FFN).
    pub norm: NormKind,
    pub residual: ResidualKind,
    /// The short convolution the FFN's output passes before the residual
    /// add (Inkling); its state is the FFN's, after the mixer's.
    pub ffn_output_conv: Option<ShortConv>,
    /// The n-gram Per-Layer Embedding added to the streams before the
    /// layer's blocks (Qwen3.8-Flash-Next); its token ids and convolution
    /// state follow the mixer's (and the FFN's) in the layer's cache.
    pub ple: Option<PleSpec>,
}

/// How a block's output joins the hidden states.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ResidualKind {
    /// One stream, `x += block(norm(x))`.
    Plain,
    /// Manifold-constrained hyper-connections (mHC: GLM-5.3-Flash,
    /// DeepSeek V4): `streams` copies of the hidden state (`hc_mult`), each
    /// block wrapped by weights computed per token from the unweighted
    /// RMSNorm of the streams flattened: `pre` (`σ(·) + eps`) mixes the
    /// block's input, `post` (`2σ(·)`) spreads its output over the streams
    /// and `comb` (a softmax, `+ eps`, then Sinkhorn normalisations) mixes
    /// the streams themselves: `x ← post ⊗ out + combᵀ · x`. The head
    /// collapses the streams before the final norm. Every layer of a model
    /// has the same one.
    HyperConnections {
        streams: usize,
        /// `hc_sinkhorn_iters`: the column normalisation that follows the
        /// softmax, then this many minus one (row, column) rounds.
        sinkhorn_iters: usize,
        /// `hc_eps`: added to `pre`, to `comb` after its softmax and to
        /// every Sinkhorn sum (the unweighted norm takes the layer norm's).
        eps: f32,
        head: HyperHead,
    },
    /// Gated residual hyper-connections (Qwen3.8-Flash-Next:
    /// transformers' `Qwen4ExpTextGatedResidual`): `streams` copies of the
    /// hidden state (`hc_count`), each normed on its own with `1 + w`; the
    /// block's input is the mean over streams of `σ(up(SiLU(down(x̂) /
    /// streams))) ⊙ x̂` (`down` to `lowrank`, `hc_lowrank`), and every
    /// stream gains the block's output times its own `2σ(inject(x̂) /
    /// streams)`. The streams never mix with each other; the head is the
    /// same mix without injection (`hyper_connection_mixer`).
    GatedStreams { streams: usize, lowrank: usize },
    /// Attention Residuals (Kimi K3): one running partial sum and the
    /// snapshots of finished blocks, the embeddings the first. Each block's
    /// input is a mix of the snapshots and the partial sum, weighted by a
    /// softmax of `proj · RMSNorm(v)` (a norm and projection per block, and
    /// one before the final norm). A layer whose index is a multiple of
    /// `block_size` (`attn_res_block_size`) snapshots the partial sum after
    /// its attention's mix read it, and its attention output starts the
    /// next; every other output adds to the partial sum.
    AttentionResiduals { block_size: usize },
}

impl ResidualKind {
    /// Copies of the hidden state the stack carries.
    pub fn streams(&self) -> usize {
        match *self {
            ResidualKind::Plain | ResidualKind::AttentionResiduals { .. } => 1,
            ResidualKind::HyperConnections { streams, .. } | ResidualKind::GatedStreams { streams, .. } => streams,
        }
    }

    /// Whether the layer norms each block's input (`input_layernorm`,
    /// `post_attention_layernorm`) and the stack norms its output before
    /// `lm_head`. Gated streams do not: their mix norms every stream
    /// itself, and the final mixer is the last step before `lm_head`.
    pub fn has_layer_norms(&self) -> bool {
        !matches!(self, ResidualKind::GatedStreams { .. })
    }
}

/// How hyper-connections' streams become one hidden state before the final
/// norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HyperHead {
    /// GLM-5.3-Flash: their mean.
    Mean,
    /// DeepSeek V4: weighted by `σ(hc_head_fn · x̂ · hc_head_scale +
    /// hc_head_base) + eps`, `x̂` the streams flattened and RMS-normed
    /// without weight.
    Sigmoid,
}

impl LayerSpec {
    /// f32 values one token adds to this layer's cache.
    pub fn cache_floats_per_token(&self) -> usize {
        // A PLE layer keeps each token's id (4 bytes, one f32's room).
        self.mixer.cache_floats_per_token() + usize::from(self.ple.is_some())
    }

    /// f32 values of fixed state one sequence keeps in this layer.
    pub fn state_floats(&self) -> usize {
        self.mixer.state_floats()
            + self.ffn_output_conv.map_or(0, |conv| conv.state_floats())
            + self.ple.map_or(0, |ple| ple.conv_state_floats())
    }

    /// An upper estimate of the f32 values one token of a forward pass
    /// holds at once in this layer, for hidden states `hidden` wide: the
    /// residual and normed rows and two more, the routed experts' output
    /// slots and per-expert copies (2 × top-k rows) and router logits, and
    /// twice the attention's working row (its input and its output).
    pub fn activation_floats_per_token(&self, hidden: usize) -> usize {
        let experts = match &self.ffn {
            FfnSpec::Dense { .. } => 0,
            FfnSpec::Moe(moe) => 2 * moe.top_k * hidden + moe.num_experts,
        };
        4 * hidden + experts + 2 * self.mixer.working_floats_per_token() + self.streams_floats_per_token(hidden)
    }

    /// What hyper-connections add to [`Self::activation_floats_per_token`]:
    /// the other streams and their normed copy, the block's mixed input
    /// and output slot, and each token's mixing weights.
    fn streams_floats_per_token(&self, hidden: usize) -> usize {
        match self.residual {
            ResidualKind::Plain => 0,
            ResidualKind::HyperConnections { streams, .. } => (2 * streams + 1) * hidden + 2 * (2 + streams) * streams,
            // The normed streams and their gates, the block's input and
            // output, the low-rank row and the injection weights.
            ResidualKind::GatedStreams { streams, lowrank } => (2 * streams + 2) * hidden + lowrank + streams,
            // The block's input and a restarted partial sum; the snapshots,
            // one per block, grow with the stack and are not counted here.
            ResidualKind::AttentionResiduals { .. } => 2 * hidden,
        }
    }

    /// One line saying what the layer is: its mixer with its dimensions, its
    /// feed-forward block, and what a sequence keeps in it.
    pub fn describe(&self) -> String {
        let mixer = match &self.mixer {
            MixerSpec::Gqa(gqa) => {
                let rope = gqa.rope.map_or("no rope".to_owned(), |r| format!("rope {}", r.rotary_dim));
                let window = gqa.sliding_window.map(|w| format!(", window {w}")).unwrap_or_default();
                let flags = [(gqa.bias, ", bias"), (gqa.sinks, ", sinks"), (gqa.output_gate, ", gated")];
                let flags: String = flags.iter().filter(|(on, _)| *on).map(|(_, name)| *name).collect();
                let qsa = gqa.qsa.map_or(String::new(), |qsa| {
                    format!(
                        ", qsa {} heads x {}, {} tokens in blocks of {}",
                        qsa.n_heads, qsa.head_dim, qsa.budget_tokens, qsa.block_tokens
                    )
                });
                format!(
                    "gqa {} q / {} kv heads x {}, {rope}{window}{flags}{qsa}",
                    gqa.num_heads, gqa.num_kv_heads, gqa.head_dim
                )
            }
            MixerSpec::Mla(mla) => {
                let index = match mla.indexer {
                    None => String::new(),
                    Some(ix) if ix.kind == IndexerKind::Full => {
                        let pools = ix.pool.map(|k| format!(" in pools of {k}")).unwrap_or_default();
                        format!(", {} index-key top-{}{pools}", ix.head_dim, ix.topk)
                    }
                    Some(_) => ", shared index".to_owned(),
                };
                let rope = if mla.rope.is_some() { "" } else { ", no rope" };
                format!("mla {} heads, {} latent{rope}{index}", mla.num_heads, mla.dims.latent_dim())
            }
            MixerSpec::Inkling(ink) => {
                let window = ink.sliding_window.map(|w| format!(", window {w}")).unwrap_or_default();
                let scaling = if ink.log_scaling.is_some() { ", log scaling" } else { "" };
                format!(
                    "inkling {} q / {} kv heads x {}{window}, bias {} back x {}{scaling}, conv {}",
                    ink.num_heads, ink.num_kv_heads, ink.head_dim, ink.rel_extent, ink.d_rel, ink.conv_kernel
                )
            }
            MixerSpec::GatedDeltaNet(gdn) => {
                let d = gdn.dims;
                match d.projections {
                    // One head count for q, k and v, and d_k = d_v.
                    GdnProjections::Kimi => {
                        format!(
                            "kimi delta attention {} heads x {}, conv {}",
                            d.num_v_heads, d.head_k_dim, d.conv_kernel
                        )
                    }
                    GdnProjections::Grouped | GdnProjections::Split => format!(
                        "gated deltanet {} k / {} v heads x {}/{}, conv {}{}",
                        d.num_k_heads,
                        d.num_v_heads,
                        d.head_k_dim,
                        d.head_v_dim,
                        d.conv_kernel,
                        match gdn.output_gate {
                            GateActivation::Silu => "",
                            GateActivation::Sigmoid => ", sigmoid output gate",
                        }
                    ),
                }
            }
            MixerSpec::SharedKv(sk) => {
                let compression = match sk.compression {
                    None => String::new(),
                    Some(Compression::Heavy { ratio }) => format!(", compressed 1:{ratio}"),
                    Some(Compression::Sparse { ratio, indexer }) => {
                        format!(", compressed 1:{ratio}, {} index-key top-{}", indexer.head_dim, indexer.topk)
                    }
                };
                format!(
                    "shared-kv {} heads x {}, rope {}, window {}{compression}",
                    sk.num_heads, sk.head_dim, sk.rope.rotary_dim, sk.window
                )
            }
        };
        let ffn = match &self.ffn {
            FfnSpec::Dense { intermediate_size, swiglu, global_scale } => {
                let scaled = if *global_scale { ", scaled" } else { "" };
                format!("dense {intermediate_size}{}{scaled}", swiglu.describe())
            }
            FfnSpec::Moe(moe) => {
                let shared = match moe.shared {
                    SharedExperts::None => String::new(),
                    SharedExperts::Plain { intermediate_size } => format!(" + shared {intermediate_size}"),
                    SharedExperts::Gated { intermediate_size } => format!(" + gated shared {intermediate_size}"),
                    SharedExperts::Sink { count, intermediate_size } => {
                        format!(" + {count} weighted shared x {intermediate_size}")
                    }
                };
                let experts = match moe.experts {
                    ExpertKind::SwiGlu => String::new(),
                    ExpertKind::ClampedSwiGlu { limit, .. } => format!(", biased, clamped at {limit}"),
                };
                let router = match moe.router {
                    RouterKind::TopKThenSoftmax => ", top-k then softmax",
                    RouterKind::SharedExpertSink { .. } => ", shared-expert sink",
                    RouterKind::SqrtSoftplus { .. } => ", sqrt-softplus",
                    RouterKind::Hash { .. } => ", hash-routed",
                    RouterKind::SoftmaxTopK { .. } | RouterKind::GroupedSigmoid { .. } => "",
                };
                format!(
                    "moe {} experts top-{} x {}{experts}{router}{shared}{}",
                    moe.num_experts,
                    moe.top_k,
                    moe.intermediate_size,
                    moe.swiglu.describe()
                )
            }
        };
        let conv = if self.ffn_output_conv.is_some() { " + output conv" } else { "" };
        let state = match (self.cache_floats_per_token(), self.state_floats()) {
            (rows, 0) => format!("{rows} f32/token"),
            (0, fixed) => format!("{fixed} f32 state"),
            (rows, fixed) => format!("{rows} f32/token + {fixed} f32 state"),
        };
        let streams = match self.residual {
            ResidualKind::Plain => String::new(),
            ResidualKind::HyperConnections { streams, .. } => format!("; {streams} hyper-connection streams"),
            ResidualKind::GatedStreams { streams, .. } => format!("; {streams} gated residual streams"),
            ResidualKind::AttentionResiduals { block_size } => {
                format!("; attention residuals every {block_size} layers")
            }
        };
        let ple = self.ple.map_or(String::new(), |ple| {
            format!(
                "; n-gram PLE {} heads x {} ({}-grams), conv {} dilated {}",
                ple.heads(),
                ple.head_dim(),
                ple.ngram_size,
                ple.conv_kernel,
                ple.ngram_size
            )
        });
        format!("{mixer}; {ffn}{conv}; {state}{streams}{ple}")
    }
}

/// The token-mixing block of a layer.
#[derive(Debug, Clone, PartialEq)]
pub enum MixerSpec {
    /// Grouped-query attention (OLMoE, Qwen3-MoE, Mixtral).
    Gqa(GqaSpec),
    /// Multi-head Latent Attention (DeepSeek-V3, Kimi K2.5, GLM-5).
    Mla(MlaAttention),
    /// Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): a fixed-size
    /// recurrent state per sequence instead of rows per token.
    GatedDeltaNet(GdnSpec),
    /// Inkling's attention: no RoPE, a bias by backward distance, short
    /// convolutions of k, v and the output.
    Inkling(InklingAttention),
    /// DeepSeek V4's shared key-value attention over a sliding window, with
    /// compressed entries on CSA and HCA layers.
    SharedKv(SharedKvAttention),
}

impl MixerSpec {
    /// The rotary embedding the block applies, which fixes its RoPE table
    /// (`None`: the block uses no positions).
    pub fn rope(&self) -> Option<&RopeSpec> {
        match self {
            MixerSpec::Gqa(gqa) => gqa.rope.as_ref(),
            MixerSpec::Mla(mla) => mla.rope.as_ref(),
            MixerSpec::GatedDeltaNet(_) | MixerSpec::Inkling(_) => None,
            MixerSpec::SharedKv(sk) => Some(&sk.rope),
        }
    }

    /// Widest per-token row the block holds besides its cache: the queries
    /// (GQA, Inkling), every head's query or value (MLA), the convolved q,
    /// k and v (Gated DeltaNet).
    pub fn working_floats_per_token(&self) -> usize {
        match self {
            MixerSpec::Gqa(gqa) => gqa.q_dim(),
            MixerSpec::Mla(mla) => mla.num_heads * mla.dims.qk_head_dim().max(mla.dims.v_head_dim),
            MixerSpec::GatedDeltaNet(gdn) => gdn.dims.conv_dim(),
            MixerSpec::Inkling(ink) => ink.q_dim(),
            MixerSpec::SharedKv(sk) => sk.q_dim(),
        }
    }
}

impl MixerSpec {
    /// f32 values one token adds to this layer's cache: keys and values,
    /// plus the raw indexer key with QSA (GQA; none under a sliding window,
    /// whose ring is fixed state); the latent with its rotary key, plus the
    /// indexer's keys with DSA (MLA); none for a recurrent layer.
    pub fn cache_floats_per_token(&self) -> usize {
        match self {
            MixerSpec::Gqa(gqa) if gqa.sliding_window.is_some() => 0,
            MixerSpec::Gqa(gqa) => 2 * gqa.kv_dim() + gqa.qsa.map_or(0, |qsa| qsa.head_dim),
            MixerSpec::Mla(mla) => mla.dims.latent_dim() + mla.indexer.map_or(0, |i| i.cache_floats_per_token()),
            MixerSpec::GatedDeltaNet(_) => 0,
            MixerSpec::Inkling(ink) => ink.cache_floats_per_token(),
            MixerSpec::SharedKv(sk) => sk.cache_floats_per_token(),
        }
    }

    /// f32 values of fixed state one sequence keeps in this layer: the
    /// keys and values of a sliding window's last `window` positions, a
    /// pooled indexer's open pool, a recurrent state, Inkling's convolutions.
    pub fn state_floats(&self) -> usize {
        match self {
            MixerSpec::Gqa(gqa) => gqa.sliding_window.map_or(0, |window| 2 * gqa.kv_dim() * window),
            MixerSpec::Mla(mla) => mla.indexer.map_or(0, |i| i.state_floats()),
            MixerSpec::GatedDeltaNet(gdn) => gdn.dims.state_floats(),
            MixerSpec::Inkling(ink) => ink.state_floats(),
            MixerSpec::SharedKv(sk) => sk.state_floats(),
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
    /// The rotary embedding of queries and keys, over each head's leading
    /// `rope.rotary_dim` values (`None`: no positions, NoPE).
    pub rope: Option<RopeSpec>,
    /// Each head has a learned sink logit that joins its softmax.
    pub sinks: bool,
    /// `q_proj` yields a gate per head after its query (`[q d | gate d]`
    /// per head) and the output is multiplied by `sigmoid(gate)`.
    pub output_gate: bool,
    /// QSA block selection: each query attends only to the keys its indexer
    /// keeps (Qwen3.8-Flash-Next).
    pub qsa: Option<QsaSpec>,
}

/// QSA, the block-sparse selection of a GQA layer (transformers'
/// `Qwen4ExpTextQSAIndexer`): `index_qk_proj` gives `n_heads` query heads
/// and one raw key per token, `head_dim` wide; a query keeps the
/// `budget_tokens / block_tokens` best complete blocks of the keys it sees
/// (raw keys mean-pooled, normed with `1 + k_layernorm`, rotated at the
/// block's first position, scored `Σ_h relu(q_h · k) / √head_dim`) and the
/// incomplete tail block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QsaSpec {
    /// `indexer_n_heads`.
    pub n_heads: usize,
    /// `indexer_head_dim`: of each query head and of the one key head.
    pub head_dim: usize,
    /// `indexer_budget`: tokens of complete blocks a query keeps, a
    /// multiple of `block_tokens`.
    pub budget_tokens: usize,
    /// `indexer_compress_ratio`: tokens per block.
    pub block_tokens: usize,
}

impl QsaSpec {
    /// The complete blocks a query keeps.
    pub fn kept_blocks(&self) -> usize {
        self.budget_tokens / self.block_tokens
    }
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
    /// The rotary embedding of the `qk_rope_head_dim` part; under YaRN it
    /// also scales the softmax. `None`: no rotation anywhere (Kimi-Linear:
    /// the `qk_rope_head_dim` part, if any, is attended unrotated).
    pub rope: Option<RopeSpec>,
    /// Epsilon of the latent norms (`q_a_layernorm`, `kv_a_layernorm`).
    pub latent_norm_eps: f32,
    /// The down-projections and o_proj carry biases.
    pub bias: bool,
    /// The DSA lightning indexer, on models that have one.
    pub indexer: Option<IndexerSpec>,
    /// Kimi K3's `mla_use_output_gate`: each head's value context times
    /// `σ(g_proj x)` (full rank, `[heads · v_head_dim, hidden]`) before
    /// `o_proj`.
    pub output_gate: bool,
}

/// A Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnSpec {
    pub dims: GdnDims,
    /// Epsilon of the gated output norm (the model's `rms_norm_eps`).
    pub eps: f32,
    /// Kimi Delta Attention only: GLM-5.3-Flash's bounded forget gate,
    /// `g = bound · sigmoid(exp(A_log) · (f + dt_bias))` with this (negative)
    /// bound (`linear_lower_bound`), instead of Kimi's
    /// `−exp(A_log) · softplus(f + dt_bias)`.
    pub gate_lower_bound: Option<f32>,
    /// The activation of the output norm's gate.
    pub output_gate: GateActivation,
    /// How the output norm's gate is projected (Kimi Delta Attention).
    pub output_gate_rank: GateRank,
    /// Kimi K3: `A_log` is stored zero-padded to this many values, of which
    /// the first `num_v_heads` are read (docs/kimi_k3.md, inferred point 3).
    pub a_log_padded_to: Option<usize>,
}

/// How a Kimi Delta Attention layer projects its output gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRank {
    /// Kimi-Linear, GLM-5.3-Flash: `g_b_proj(g_a_proj x)` through
    /// `head_v_dim` (and every GDN layer, whose `z` is an input projection).
    Low,
    /// Kimi K3: one `g_proj` `[value_dim, hidden]`.
    Full,
}

/// The activation of a gate that scales a normed output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    /// Qwen3-Next, Qwen3.5: `x · σ(x)`.
    Silu,
    /// Kimi Delta Attention, and Qwen3.8-Flash-Next's `output_gate_type`
    /// `sigmoid`: `σ(x)`.
    Sigmoid,
}

/// One layer's part in DeepSeek Sparse Attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerSpec {
    /// Own indexer weights, or the previous full layer's selection.
    pub kind: IndexerKind,
    /// Positions a query may see once there are more than this (besides,
    /// when pooled, its own incomplete pool).
    pub topk: usize,
    pub head_dim: usize,
    pub n_heads: usize,
    /// `None`: one key per token, rotated by the layer's RoPE (GLM-5).
    /// `Some(k)`: GLM-5.3-Flash's pooled indexer (`index_kpool`): unrotated
    /// keys, one per pool of `k` tokens (their softmax-weighted mean), the
    /// `topk / k` best pools chosen and expanded to their tokens, plus the
    /// query's own incomplete pool.
    pub pool: Option<usize>,
}

impl IndexerSpec {
    /// f32 values one token adds to the layer's cache for the indexer: a
    /// key per token, or per pool (rounded up per token); a sharing layer
    /// keeps none of its own when pooled (GLM-5's keeps a zero row).
    pub fn cache_floats_per_token(&self) -> usize {
        match (self.pool, self.kind) {
            (None, _) => self.head_dim,
            (Some(pool), IndexerKind::Full) => self.head_dim.div_ceil(pool),
            (Some(_), IndexerKind::Shared) => 0,
        }
    }

    /// f32 values of fixed state one sequence keeps for a pooled indexer:
    /// the keys and gate logits of the open pool's tokens (at most `k − 1`).
    pub fn state_floats(&self) -> usize {
        match (self.pool, self.kind) {
            (Some(pool), IndexerKind::Full) => 2 * (pool - 1) * self.head_dim,
            _ => 0,
        }
    }
}

/// The feed-forward block of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FfnSpec {
    /// A resident SwiGLU MLP, its output times a learned scalar
    /// (`global_scale`, Inkling) when `global_scale`.
    Dense { intermediate_size: usize, swiglu: SwiGlu, global_scale: bool },
    /// Routed SwiGLU experts streamed through the expert store.
    Moe(MoeBlock),
}

impl FfnSpec {
    /// Whether the block is dense or routed.
    pub fn kind(&self) -> FfnKind {
        match self {
            FfnSpec::Dense { .. } => FfnKind::Dense,
            FfnSpec::Moe(_) => FfnKind::Moe,
        }
    }
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
    /// What each routed expert computes.
    pub experts: ExpertKind,
    /// The SwiGLU of the shared experts, and of the routed ones when
    /// `experts` is [`ExpertKind::SwiGlu`].
    pub swiglu: SwiGlu,
    /// Kimi K3's latent MoE: the routed experts run in a narrower latent.
    pub latent: Option<LatentMoe>,
}

/// Kimi K3's latent MoE (`block_sparse_moe`): the router reads the
/// full-width input `x`; every routed expert runs on `z =
/// routed_expert_down_proj(x)` (`width` wide, so the expert records are
/// `[intermediate, width]` and `[width, intermediate]`); their weighted sum
/// is RMS-normed (`routed_expert_norm`, `norm_eps`) and brought back by
/// `routed_expert_up_proj`; the shared experts run on `x` and are added.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentMoe {
    /// `routed_expert_hidden_size`.
    pub width: usize,
    /// Epsilon of `routed_expert_norm` (`rms_norm_eps`).
    pub norm_eps: f32,
}

/// What a SwiGLU computes between its gate/up products and its down
/// product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SwiGlu {
    /// `silu(gate) * up`.
    Plain,
    /// `silu(min(gate, limit)) * clamp(up, -limit, limit)`, the config's
    /// `swiglu_limit` (GLM-5.3-Flash, DeepSeek V4; a NaN stays NaN, as
    /// through torch's `clamp`).
    Limited { limit: f32 },
    /// Kimi K3's SiTU-GLU, `b1·tanh(g/b1)·σ(g) · b2·tanh(u/b2)`: `beta` is
    /// `activation_situ_beta` (b1), `linear_beta`
    /// `activation_situ_linear_beta` (b2).
    Situ { beta: f32, linear_beta: f32 },
}

impl SwiGlu {
    /// What `strata info` adds to the block's line.
    fn describe(self) -> String {
        match self {
            SwiGlu::Plain => String::new(),
            SwiGlu::Limited { limit } => format!(", swiglu limit {limit}"),
            SwiGlu::Situ { beta, linear_beta } => format!(", SiTU-GLU betas {beta}, {linear_beta}"),
        }
    }
}

impl MoeBlock {
    /// Rows of the router's weight: one per routed expert, and one per
    /// shared expert under the shared-expert sink.
    pub fn router_rows(&self) -> usize {
        match self.shared {
            SharedExperts::Sink { count, .. } => self.num_experts + count,
            _ => self.num_experts,
        }
    }
}

/// The feed-forward of each routed expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertKind {
    /// `down(silu(gate(x)) * up(x))`, no biases.
    SwiGlu,
    /// gpt-oss: gate, up and down carry biases (`[num_experts, width]`,
    /// resident); `g = min(gate(x), limit)`, `u = clamp(up(x), ±limit)`,
    /// `down((u + 1) · g · sigmoid(alpha · g))`. The checkpoint's fused
    /// `gate_up_proj` interleaves gate (even) and up (odd) columns; import
    /// splits them into the record's gate and up.
    ClampedSwiGlu { alpha: f32, limit: f32 },
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
    /// gpt-oss: a router with a bias (`[num_experts]`), the top-k of its
    /// logits, then a softmax over those k alone.
    TopKThenSoftmax,
    /// Inkling's shared-expert sink: the gate has a row per routed and per
    /// shared expert ([`SharedExperts::Sink`]); the top-k routed by
    /// `sigmoid + correction bias`; weights the softmax over the log-sigmoids
    /// of [the chosen routed logits, the shared logits], times
    /// `route_scale` and a learned scalar (`global_scale`).
    SharedExpertSink { route_scale: f64 },
    /// DeepSeek V4: scores `sqrt(softplus(logit))`, a per-expert correction
    /// bias for choosing only, the chosen scores always renormalised (plus
    /// 1e-20) and then scaled.
    SqrtSoftplus { scaling: f64 },
    /// DeepSeek V4's first layers: each token's experts from a fixed table by
    /// its id (`tid2eid`, `[vocab, top_k]`), weighted by their sqrt-softplus
    /// scores renormalised (plus 1e-20) and scaled.
    Hash { scaling: f64 },
}

impl RouterKind {
    /// Whether the chosen experts' weights are renormalised to sum to one
    /// (before any scaling).
    pub fn renormalizes(&self) -> bool {
        match *self {
            RouterKind::SoftmaxTopK { renormalize } | RouterKind::GroupedSigmoid { renormalize, .. } => renormalize,
            // The softmax over the chosen k (and the sink) already sums to one.
            RouterKind::TopKThenSoftmax | RouterKind::SharedExpertSink { .. } => false,
            RouterKind::SqrtSoftplus { .. } | RouterKind::Hash { .. } => true,
        }
    }
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
    /// `count` experts `intermediate_size` wide, each scaled by its
    /// router weight before `down` ([`RouterKind::SharedExpertSink`]).
    Sink {
        count: usize,
        intermediate_size: usize,
    },
}

impl SharedExperts {
    /// Width of all shared experts' hidden layers together.
    pub fn total_intermediate_size(&self) -> usize {
        match *self {
            SharedExperts::None => 0,
            SharedExperts::Plain { intermediate_size } | SharedExperts::Gated { intermediate_size } => {
                intermediate_size
            }
            SharedExperts::Sink { count, intermediate_size } => count * intermediate_size,
        }
    }
}

/// What an RMSNorm does with its weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NormKind {
    /// `w · x̂` (Llama's RMSNorm), with this epsilon.
    Weight { eps: f32 },
    /// `(1 + w) · x̂`, with this epsilon.
    OnePlusWeight { eps: f32 },
}

impl NormKind {
    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f32 {
        let (NormKind::Weight { eps } | NormKind::OnePlusWeight { eps }) = *self;
        eps
    }
}
