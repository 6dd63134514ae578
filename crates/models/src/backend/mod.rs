//! The backend: the one place the blocks' weights live and their arithmetic
//! runs. At load every block registers its tensors once ([`Backend::matrix`],
//! [`Backend::vector`], ...) and keeps the typed handles it gets back; a
//! forward pass hands those handles to coarse, declarative operations
//! (attend with a shape, a delta-rule step of a kind, a route of a kind, an
//! expert FFN over a batch union) and never looks a weight up by name.
//! `crates/models` imports the kernels crate and rayon here only
//! (`xtask` tidy test), so a device replaces these bodies, not the blocks.
//!
//! An enum, not a trait: the devices are a closed set this crate builds
//! (`load` picks one), every operation matches on it so a new device cannot
//! miss one, and the blocks stay free of a type parameter or a `dyn` whose
//! methods could not be generic. Every handle names the [`Device`] its
//! tensor lives on, and an operation asserts it is its own.
//!
//! The CPU ([`cpu::Cpu`]) runs everything: its weights are the container's
//! resident bytes, viewed in place, and its operations are
//! `strata-kernels`' SIMD paths on the runtime's pool, the instruction set
//! chosen once when the backend is made. A GPU ([`gpu::Gpu`], wgpu's or
//! CUDA's) takes the q8/q4 products, the dense MLPs and the routed experts
//! its VRAM tier holds, and leaves the rest to its CPU backend.

mod cpu;
mod gpu;

pub use gpu::VramStats;

use std::ops::Range;
use std::sync::{Arc, Mutex};

use strata_format::{CompressorState, Container, MlaSpec, SwiGlu};
use strata_kernels::Accelerator;
use strata_sched::{Guess, LayerStats, RemoteExperts, Route};
use strata_tier::{ExpertStore, TraceWriter};

/// Why a device could not be had: no adapter, or a build without it.
pub use strata_kernels::Error as DeviceError;
/// The CPU's worker pool, which a pass runs on (`Runtime::threads`; the
/// engine owns it).
pub use strata_kernels::Threads;
/// What gates a gated RMSNorm's output: SiLU (Gated DeltaNet) or a sigmoid
/// (Kimi Delta Attention).
pub use strata_kernels::ops::NormGate;

use crate::error::{Error, Result};
use crate::rope::Angles;

/// What a forward pass needs besides the model: the thread pool, the
/// routed-expert store, and where to account time and record routing.
pub struct Runtime<'a> {
    pub threads: &'a Threads,
    pub store: &'a ExpertStore,
    /// Stall and compute time of the MoE pipeline, accumulated.
    pub stats: &'a Mutex<LayerStats>,
    /// Where to record every routing decision, if anywhere.
    pub trace: Option<&'a Mutex<TraceWriter>>,
    /// Workers computing some routed experts on other machines, if any.
    pub remote: Option<&'a dyn RemoteExperts>,
}

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The host: weights in the container's resident bytes.
    Cpu,
    /// A GPU (`strata_kernels::Accelerator`: wgpu's or CUDA's): a matrix
    /// uploaded as the container stores it, whose host bytes stay too.
    Gpu,
}

/// Where a model runs (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// Everything on the CPU.
    #[default]
    Cpu,
    /// The first GPU adapter, holding at most `vram_budget_bytes` of
    /// matrices (`None`: all it takes); the rest on the CPU.
    Gpu { vram_budget_bytes: Option<u64> },
    /// The NVIDIA GPU of ordinal `ordinal` through CUDA, holding at most
    /// `vram_budget_bytes` (`None`: the free memory less a reserve,
    /// `strata_kernels::cuda::auto_vram_budget_bytes`): what `Gpu` runs on
    /// the device runs there, the rest on the CPU, as said at start.
    Cuda { ordinal: usize, vram_budget_bytes: Option<u64> },
}

/// A `[rows, cols]` matrix the backend holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixHandle {
    pub device: Device,
    pub rows: usize,
    pub cols: usize,
    /// Its place in the backend's table of matrices.
    slot: usize,
}

impl MatrixHandle {
    /// The same matrix as the host holds it: the GPU backend keeps every
    /// matrix's host bytes (the container's), so an operation the device
    /// lacks runs there.
    pub fn on_host(self) -> Self {
        Self { device: Device::Cpu, ..self }
    }
}

/// An f32 vector the backend holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorHandle {
    pub device: Device,
    pub len: usize,
    slot: usize,
}

/// A `[rows, cols]` table the backend reads rows of (the token
/// embedding), which may stay on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableHandle {
    pub device: Device,
    pub rows: usize,
    pub cols: usize,
    slot: usize,
}

/// A MoE layer's routed experts, streamed through the expert store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertsHandle {
    pub device: Device,
    pub layer: usize,
}

/// What each routed expert of a layer computes.
#[derive(Debug, Clone, Copy)]
pub enum ExpertFfnKind {
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu,
    /// `down(silu(min(gate(x), limit)) * clamp(up(x), -limit, limit))`.
    LimitedSwiGlu { limit: f32 },
    /// Kimi K3's SiTU-GLU, `down(b1·tanh(g/b1)·σ(g) · b2·tanh(u/b2))`.
    SituGlu { beta: f32, linear_beta: f32 },
    /// gpt-oss's biased experts with the clamped SwiGLU; the biases one row
    /// per expert: gate and up `[num_experts, intermediate]`, down
    /// `[num_experts, hidden]`.
    Clamped { alpha: f32, limit: f32, gate_bias: VectorHandle, up_bias: VectorHandle, down_bias: VectorHandle },
}

/// One Attention Residuals mix's weights (Kimi K3,
/// `strata_format::ResidualKind::AttentionResiduals`): the sources' norm
/// `[hidden]` and the score projection `[hidden]`.
#[derive(Debug, Clone, Copy)]
pub struct AttnResMix {
    pub norm: VectorHandle,
    pub proj: VectorHandle,
    /// The norm's (the layer norms' `rms_norm_eps`).
    pub norm_eps: f32,
}

/// One block's hyper-connection (mHC): its weights and constants
/// (`strata_format::ResidualKind::HyperConnections`).
#[derive(Debug, Clone, Copy)]
pub struct HyperConnection {
    pub streams: usize,
    /// `fn`, `[(2 + streams) · streams, streams · hidden]`: each token's
    /// `pre`, `post` and `comb` logits from its normed streams.
    pub mixes: MatrixHandle,
    /// `[(2 + streams) · streams]`.
    pub base: VectorHandle,
    /// `[3]`: the scales of the `pre`, `post` and `comb` logits.
    pub scale: VectorHandle,
    pub sinkhorn_iters: usize,
    /// `hc_eps`.
    pub eps: f32,
    /// The unweighted input norm's (the layer norms' `rms_norm_eps`).
    pub norm_eps: f32,
}

/// One block's gated residual, or the final mixer of gated residual
/// streams (`strata_format::ResidualKind::GatedStreams`).
#[derive(Debug, Clone, Copy)]
pub struct GatedResidual {
    pub streams: usize,
    /// `hc_norm`, `[streams · hidden]`, applied as `1 + w` per stream.
    pub norm: VectorHandle,
    /// `[lowrank, streams · hidden]`.
    pub down: MatrixHandle,
    /// `[streams · hidden, lowrank]`.
    pub up: MatrixHandle,
    /// `[streams, streams · hidden]`; `None` for the final mixer.
    pub inject: Option<MatrixHandle>,
    pub norm_eps: f32,
}

/// What a hyper-connection's mix hands its combine: each token's `post`
/// (`[tokens, streams]`) and `comb` (`[tokens, streams, streams]`).
pub struct StreamWeights {
    pub post: Vec<f32>,
    pub comb: Vec<f32>,
}

/// How the stack's streams become one hidden state before the final norm.
#[derive(Debug, Clone, Copy)]
pub enum StreamHead {
    /// The one stream of the plain residual, itself.
    One,
    /// The streams' mean (GLM-5.3-Flash).
    Mean { streams: usize },
    /// The streams weighted by `σ(mixes · x̂ · scale + base) + eps`, `x̂`
    /// the streams normed without weight (DeepSeek V4): `mixes` `[streams,
    /// streams · hidden]`, `base` `[streams]`, `scale` `[1]`.
    Sigmoid { streams: usize, mixes: MatrixHandle, base: VectorHandle, scale: VectorHandle, eps: f32, norm_eps: f32 },
    /// The gated mix of the streams without injection (Qwen3.8-Flash-Next's
    /// `hyper_connection_mixer`).
    Gated(GatedResidual),
    /// Attention Residuals' mix of the snapshots and the partial sum (Kimi
    /// K3's `output_attn_res`), which `Streams::collapse` makes itself: the
    /// snapshots are not among the streams.
    AttnRes(AttnResMix),
}

impl HyperConnection {
    /// Its matrices as the host holds them (see [`MatrixHandle::on_host`]).
    fn on_host(&self) -> Self {
        Self { mixes: self.mixes.on_host(), ..*self }
    }
}

impl GatedResidual {
    /// Its matrices as the host holds them (see [`MatrixHandle::on_host`]).
    fn on_host(&self) -> Self {
        Self {
            down: self.down.on_host(),
            up: self.up.on_host(),
            inject: self.inject.map(MatrixHandle::on_host),
            ..*self
        }
    }
}

impl StreamHead {
    /// Its matrices as the host holds them (see [`MatrixHandle::on_host`]).
    fn on_host(&self) -> Self {
        match *self {
            StreamHead::Sigmoid { streams, mixes, base, scale, eps, norm_eps } => {
                StreamHead::Sigmoid { streams, mixes: mixes.on_host(), base, scale, eps, norm_eps }
            }
            StreamHead::Gated(gated) => StreamHead::Gated(gated.on_host()),
            StreamHead::One | StreamHead::Mean { .. } | StreamHead::AttnRes(_) => *self,
        }
    }

    /// The streams it collapses.
    pub fn streams(&self) -> usize {
        match *self {
            StreamHead::One | StreamHead::AttnRes(_) => 1,
            StreamHead::Mean { streams } | StreamHead::Sigmoid { streams, .. } => streams,
            StreamHead::Gated(gated) => gated.streams,
        }
    }
}

/// The devices a model's weights can live on, each with its tensors.
pub enum Backend {
    Cpu(cpu::Cpu),
    /// A GPU through wgpu or CUDA (`strata_kernels::Accelerator`). Boxed:
    /// the device and its tier outweigh the CPU backend.
    Gpu(Box<gpu::Gpu>),
}

/// The shape of one grouped-query attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Keys visible to a query, itself included (`None`: all earlier keys).
    pub window: Option<usize>,
    /// One learned logit per query head that joins the head's softmax
    /// denominator and takes its share of the weight from the keys (gpt-oss);
    /// `None`: a plain softmax.
    pub sinks: Option<VectorHandle>,
    /// Multiplies every `q · k`: `1 / sqrt(head_dim)`, or `1 / head_dim`
    /// where q and k are RMS-normalised per head (Inkling).
    pub scale: f32,
}

/// A bias on each query head's scores by backward distance (Inkling's
/// `rel_logits_proj`): `rows` is `[n, n_heads, extent]`, one row per query
/// and head, and entry `d` of a row is added to the scaled score of the key
/// `d` positions before the query (the query's own at `d = 0`); keys
/// `extent` or more positions back get none.
#[derive(Debug, Clone, Copy)]
pub struct PositionBias<'a> {
    pub rows: &'a [f32],
    pub extent: usize,
}

/// One sequence's causal attention: its queries at positions
/// `start..start + n`, the cached keys and values of positions
/// `first_key..start + n` (0 unless a window's ring holds fewer), the bias
/// by distance of its queries' scores, if any, the keys each query may
/// attend to, if chosen, and where the output goes.
pub struct AttendJob<'a> {
    pub q: &'a [f32],
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub first_key: usize,
    pub start: usize,
    pub bias: Option<PositionBias<'a>>,
    /// `[n, start + n]`: whether query `i` attends to the key at each
    /// position (QSA's choice, [`Backend::qsa_select`]); `None`: to every
    /// key its window shows.
    pub selected: Option<&'a [bool]>,
    pub out: &'a mut [f32],
}

/// One attention layer's QSA indexer (`strata_format::QsaSpec`), its
/// block-key norm's stored weight (applied as `1 + w`) registered.
#[derive(Debug, Clone, Copy)]
pub struct QsaShape {
    pub heads: usize,
    pub head_dim: usize,
    pub budget_tokens: usize,
    pub block_tokens: usize,
    pub k_norm: VectorHandle,
    pub norm_eps: f32,
}

/// One sequence's QSA queries at positions `start..start + n`: `q` `[n,
/// heads · head_dim]`, normed and rotated; the raw key of every position
/// `0..start + n`, `[start + n, head_dim]`; the rotary angles of those
/// positions, which rotate each block's key at its first.
pub struct QsaJob<'a> {
    pub q: &'a [f32],
    pub raw_keys: &'a [f32],
    pub angles: &'a Angles,
    pub start: usize,
}

/// The shape of one shared key-value attention layer (DeepSeek V4): every
/// query head reads the one key-value head, as key and as value.
#[derive(Debug, Clone, Copy)]
pub struct SharedKvShape {
    pub n_heads: usize,
    pub head_dim: usize,
    /// Window rows visible to a query, itself included.
    pub window: usize,
    /// One sink logit per query head.
    pub sinks: VectorHandle,
}

/// One sequence's shared key-value attention: queries at positions
/// `start..start + n`, the window's rows of positions `first_key..start + n`
/// (its ring), the compressed entries `[entries, head_dim]` and, per query,
/// the entries it sees, ascending.
pub struct SharedKvJob<'a> {
    pub q: &'a [f32],
    pub rows: &'a [f32],
    pub first_key: usize,
    pub start: usize,
    pub entries: &'a [f32],
    pub visible: &'a [Vec<usize>],
    pub out: &'a mut [f32],
}

/// The windows `windows` one sequence's compressor closes, read from what
/// its parts hold: the current-half kv of positions `current_from..`
/// (`[_, width]`) and the rest of each token's projection of positions
/// `rest_from..` (`[_, state.rest_width()]`: its gates, and with overlap
/// its first-half kv first), every gate with its slot's position bias.
pub struct CompressJob<'a> {
    pub state: CompressorState,
    pub current: &'a [f32],
    pub current_from: usize,
    pub rest: &'a [f32],
    pub rest_from: usize,
    pub windows: Range<usize>,
}

/// The rows a compressor's parts keep of tokens' projections `kv` and
/// (biased) `gate` (`[n, projection]` each): the current-half kv
/// (`[n, width]`, pending with the entries) and the rest (`[n,
/// rest_width]`: with overlap the first-half kv, then both gates; else the
/// gate), as [`CompressJob`] reads them.
pub fn compressor_rows(state: &CompressorState, kv: &[f32], gate: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (w, p) = (state.width, state.projection_width());
    let current = if state.overlap { w..2 * w } else { 0..w };
    let mut rows = (Vec::with_capacity(kv.len() / p * w), Vec::with_capacity(kv.len() / p * state.rest_width()));
    for (kv, gate) in kv.chunks_exact(p).zip(gate.chunks_exact(p)) {
        rows.0.extend_from_slice(&kv[current.clone()]);
        if state.overlap {
            rows.1.extend_from_slice(&kv[..w]);
        }
        rows.1.extend_from_slice(gate);
    }
    rows
}

/// A delta-rule recurrence and its weights.
#[derive(Debug, Clone, Copy)]
pub enum DeltaKind {
    /// Qwen3-Next's Gated DeltaNet: a causal depthwise convolution + SiLU
    /// over q, k and v, l2-normalised q and k, and the gated delta rule per
    /// value head (docs/gdn.md).
    GatedDeltaNet {
        dims: strata_format::GdnDims,
        /// `[conv_dim, conv_kernel]`.
        conv: VectorHandle,
        /// `[num_v_heads]` each.
        dt_bias: VectorHandle,
        a_log: VectorHandle,
    },
    /// Kimi Delta Attention: the same convolution over q | k | v, q and k
    /// l2-normalised by division, and the delta rule with a decay per key
    /// channel, from Kimi's gate or a bounded one (docs/gdn.md).
    KimiDelta {
        dims: strata_format::GdnDims,
        /// `[conv_dim, conv_kernel]`: the q, k and v convolutions joined.
        conv: VectorHandle,
        /// `[key_dim]`: one per key channel.
        dt_bias: VectorHandle,
        /// `[num_v_heads]`.
        a_log: VectorHandle,
        /// GLM-5.3-Flash's bounded forget gate (`GdnSpec::gate_lower_bound`).
        gate_lower_bound: Option<f32>,
    },
}

/// One sequence's tokens through a delta-rule layer: `qkv` `[m, conv_dim]`
/// (the input projection, convolved in place), the gate inputs `b` (`[m,
/// num_v_heads]`) and `a` (GDN: `[m, num_v_heads]`; KDA: the forget gate's
/// projection, `[m, key_dim]`) from the sequence's first row on, its state (the heads' recurrent
/// states, then the convolution's), and `out` `[m, value_dim]`.
pub struct DeltaJob<'a> {
    pub qkv: &'a mut [f32],
    pub b: &'a [f32],
    pub a: &'a [f32],
    pub state: &'a mut [f32],
    pub out: &'a mut [f32],
}

/// The shape of one Multi-head Latent Attention layer.
#[derive(Debug, Clone, Copy)]
pub struct LatentShape {
    pub heads: usize,
    pub dims: MlaSpec,
    /// Multiplies every score.
    pub scale: f32,
    /// `kv_b_proj`, `[heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]`.
    pub kv_b: MatrixHandle,
}

/// One sequence's latent attention: queries at positions `start..start + n`
/// (`[n, heads * qk_head_dim]`, each head `[nope | rotated rope]`), the
/// cached latents of positions `0..start + n`, and, with DSA, the positions
/// each query may see.
pub struct LatentJob<'a> {
    pub q: &'a [f32],
    pub latents: &'a [f32],
    pub start: usize,
    pub selection: Option<&'a [Vec<usize>]>,
}

/// A lightning indexer's shape.
#[derive(Debug, Clone, Copy)]
pub struct IndexShape {
    pub heads: usize,
    pub head_dim: usize,
    /// Keys a query keeps, or with `pools` tokens (besides its own
    /// incomplete pool).
    pub topk: usize,
    /// Whether each key pools `IndexJob::every` tokens and a chosen one
    /// stands for them (GLM-5.3-Flash), rather than for itself.
    pub pools: bool,
}

/// One sequence's indexer queries at positions `start..start + n`: `q`
/// `[n, heads * head_dim]` (rotated where the layer rotates), `weights`
/// `[n, heads]` (scaled), and every key of the pass (DSA: one per position
/// `0..start + n`, or per whole pool; a compressor: one per window closed
/// by then).
pub struct IndexJob<'a> {
    pub q: &'a [f32],
    pub weights: &'a [f32],
    pub keys: &'a [f32],
    pub start: usize,
    /// Tokens per key: 1 (DSA, a key per position), a pooled indexer's pool
    /// size, or a compressor's ratio (a query at `p` sees the keys of the
    /// `(p + 1) / every` closed pools or windows).
    pub every: usize,
}

/// How a router's logits become each token's experts and weights.
#[derive(Debug, Clone, Copy)]
pub enum RouteKind {
    /// Softmax over all experts, the `top_k` largest, optionally
    /// renormalised (OLMoE, Qwen3-MoE, Mixtral).
    SoftmaxTopK { renormalize: bool },
    /// DeepSeek-V3's group-limited sigmoid (`noaux_tc`).
    GroupedSigmoid {
        n_group: usize,
        topk_group: usize,
        renormalize: bool,
        /// Multiplies the final weights (`routed_scaling_factor`).
        scaling: f32,
        /// `e_score_correction_bias`, one per expert.
        correction_bias: VectorHandle,
    },
    /// gpt-oss: the router's bias added to its logits, the `top_k` largest,
    /// then a softmax over those alone.
    TopKThenSoftmax { bias: VectorHandle },
    /// DeepSeek V4: `sqrt(softplus(logit))` scores, the `top_k` best by score
    /// plus correction bias, renormalised (plus 1e-20) and scaled.
    SqrtSoftplus { scaling: f32, correction_bias: VectorHandle },
    /// Inkling's shared-expert sink: the router's last `n_shared` rows are
    /// the shared experts'; the `top_k` routed by `sigmoid + correction
    /// bias`; the chosen routed and all shared logits' log-sigmoids softmaxed
    /// together, times `route_scale` and `global_scale` (the routed weights
    /// the routes', the shared ones each token's shares).
    SharedExpertSink { n_shared: usize, route_scale: f32, global_scale: f32, correction_bias: VectorHandle },
    /// DeepSeek V4's hash layers: each token's experts from `table`
    /// (`[vocab, top_k]`, whole numbers below the expert count, checked at
    /// load), weighted by their sqrt-softplus scores renormalised and scaled.
    Hash { scaling: f32, table: VectorHandle },
}

/// A router: its weight `[num_experts, hidden]` (with a shared-expert sink,
/// `[num_experts + n_shared, hidden]`), its kind and `top_k`.
#[derive(Debug, Clone, Copy)]
pub struct RouterSpec {
    pub weight: MatrixHandle,
    pub kind: RouteKind,
    pub top_k: usize,
}

/// Which part of each head RoPE rotates: rows hold heads `head_width`
/// apart; each head's values `offset..offset + angles.dim()` turn.
#[derive(Debug, Clone, Copy)]
pub struct Rotary {
    pub head_width: usize,
    pub offset: usize,
    /// Pairs `(x[2i], x[2i+1])` (DeepSeek's layout), else `(x[i], x[i + d/2])`.
    pub interleaved: bool,
}

/// A MoE layer's batch for the routed experts: hidden states `xs`
/// `[n, hidden]`, routes `[n][top_k]`, and a later layer's guess to
/// prefetch.
pub struct MoeJob<'a> {
    pub experts: ExpertsHandle,
    /// What each expert computes.
    pub ffn: ExpertFfnKind,
    pub xs: &'a [f32],
    pub hidden: usize,
    pub routes: &'a [Route],
    pub top_k: usize,
    pub prefetch: Option<Guess<'a>>,
}

/// A PLE's gate and convolution (Qwen3.8-Flash-Next): its three norms'
/// `1 + w`, each `[streams · hidden]`, and the dilated convolution's
/// `[streams · hidden, kernel]` weight; host vectors.
pub struct PleGate {
    pub hidden: usize,
    pub norm_key: VectorHandle,
    pub norm_query: VectorHandle,
    pub norm_conv: VectorHandle,
    pub conv: VectorHandle,
    pub kernel: usize,
    pub dilation: usize,
    pub eps: f32,
}

impl Backend {
    /// The CPU backend over `container`'s resident bytes.
    pub fn cpu(container: Arc<Container>) -> Self {
        Backend::Cpu(cpu::Cpu::new(container))
    }

    /// The GPU backend over `container`, its matrices on the first GPU
    /// adapter within `vram_budget_bytes` (`None`: all the device takes);
    /// fails where there is no adapter, or the build has no GPU support.
    pub fn gpu(container: Arc<Container>, vram_budget_bytes: Option<u64>) -> Result<Self> {
        let device = Accelerator::Wgpu(strata_kernels::gpu::Device::new()?);
        Ok(Backend::Gpu(Box::new(gpu::Gpu::new(container, device, vram_budget_bytes))))
    }

    /// The GPU backend on the NVIDIA GPU of ordinal `ordinal` through CUDA,
    /// within `vram_budget_bytes` (`None`: the free memory less a reserve,
    /// `strata_kernels::cuda::auto_vram_budget_bytes`); fails where the
    /// driver, the device or NVRTC is missing, or the build has no CUDA
    /// support.
    pub fn cuda(container: Arc<Container>, ordinal: usize, vram_budget_bytes: Option<u64>) -> Result<Self> {
        let device = strata_kernels::cuda::CudaDevice::new(ordinal)?;
        let vram_budget_bytes = vram_budget_bytes
            .unwrap_or_else(|| strata_kernels::cuda::auto_vram_budget_bytes(device.free_bytes(), device.total_bytes()));
        let device = Accelerator::Cuda(device);
        Ok(Backend::Gpu(Box::new(gpu::Gpu::new(container, device, Some(vram_budget_bytes)))))
    }

    fn container(&self) -> &Container {
        self.host().container()
    }

    /// Registers the matrix `name`, checked to be `[rows, cols]`.
    pub fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<MatrixHandle> {
        let m = self.container().dense(name)?;
        if (m.rows, m.cols) != (rows, cols) {
            return Err(Error::Shape {
                name: name.to_owned(),
                expected: vec![rows, cols],
                found: vec![m.rows, m.cols],
            });
        }
        let (slot, device) = match self {
            Backend::Cpu(cpu) => (cpu.register_matrix(name)?, Device::Cpu),
            Backend::Gpu(gpu) => gpu.register_matrix(name)?,
        };
        Ok(MatrixHandle { device, rows, cols, slot })
    }

    /// Registers the f32 vector `name`, checked to hold `len` values.
    pub fn vector(&mut self, name: &str, len: usize) -> Result<VectorHandle> {
        let found = self.container().dense_vec(name)?.len();
        if found != len {
            return Err(Error::Shape { name: name.to_owned(), expected: vec![len], found: vec![found] });
        }
        let slot = self.host_mut().register_vector(name)?;
        Ok(VectorHandle { device: Device::Cpu, len, slot })
    }

    /// The values of a registered vector, as the host holds them (to derive
    /// another at load).
    pub fn vector_values(&self, v: VectorHandle) -> &[f32] {
        self.host().vector(v)
    }

    /// Takes `values`, computed at load (a norm's `1 + w`), as a vector.
    pub fn upload_vector(&mut self, values: Vec<f32>) -> VectorHandle {
        let len = values.len();
        let slot = self.host_mut().own_vector(values);
        VectorHandle { device: Device::Cpu, len, slot }
    }

    /// Registers the table `name`, checked to be `[rows, cols]` without
    /// viewing its bytes, which may be on disk
    /// (`strata_format::Embedding::ReadByRow`).
    pub fn table(&mut self, name: &str, rows: usize, cols: usize) -> Result<TableHandle> {
        let found = &self.container().dense_entry(name)?.shape;
        if found[..] != [rows, cols] {
            return Err(Error::Shape { name: name.to_owned(), expected: vec![rows, cols], found: found.clone() });
        }
        let slot = match self {
            Backend::Gpu(gpu) => gpu.register_table(name)?,
            _ => self.host_mut().register_table(name)?,
        };
        Ok(TableHandle { device: Device::Cpu, rows, cols, slot })
    }

    /// The routed experts of MoE layer `layer`, their layout checked present.
    pub fn experts(&mut self, layer: usize) -> Result<ExpertsHandle> {
        self.container().expert_layout(layer)?;
        Ok(ExpertsHandle { device: Device::Cpu, layer })
    }

    /// What runs where, for a start-up line: `None` on the CPU, where
    /// everything does.
    pub fn summary(&self) -> Option<String> {
        match self {
            Backend::Cpu(_) => None,
            Backend::Gpu(gpu) => Some(gpu.summary()),
        }
    }

    /// What the tier of routed experts in VRAM did (`None`: no GPU).
    pub fn vram_stats(&self) -> Option<gpu::VramStats> {
        match self {
            Backend::Gpu(gpu) => Some(gpu.vram_stats()),
            _ => None,
        }
    }

    /// The CPU backend, which runs everything on the CPU and, on a GPU, what
    /// the device does not.
    fn host(&self) -> &cpu::Cpu {
        match self {
            Backend::Cpu(cpu) => cpu,
            Backend::Gpu(gpu) => gpu.host(),
        }
    }

    fn host_mut(&mut self) -> &mut cpu::Cpu {
        match self {
            Backend::Cpu(cpu) => cpu,
            Backend::Gpu(gpu) => gpu.host_mut(),
        }
    }

    /// Rows `rows` of `table`, one after another in `out`.
    pub fn table_rows(&self, table: TableHandle, rows: &[usize], out: &mut [f32]) -> Result<()> {
        self.host().table_rows(table, rows, out)
    }

    /// `out = W xs` for every `w.cols`-wide row of `xs`.
    pub fn matmul(&self, rt: &Runtime<'_>, w: MatrixHandle, xs: &[f32], out: &mut [f32]) {
        match self {
            Backend::Gpu(gpu) => gpu.matmul(rt.threads, w, xs, out),
            _ => self.host().matmul(rt.threads, w, xs, out),
        }
    }

    /// `out = W[rows] xs`: the block `rows` of `w`'s rows (a group of a
    /// block-diagonal projection) for every `w.cols`-wide row of `xs`.
    pub fn matmul_rows(&self, rt: &Runtime<'_>, w: MatrixHandle, rows: Range<usize>, xs: &[f32], out: &mut [f32]) {
        assert!(rows.end <= w.rows, "rows {rows:?} of a {}-row matrix", w.rows);
        self.host().matmul_rows(rt.threads, w.on_host(), rows, xs, out)
    }

    /// Several sequences' shared key-value attention at once (DeepSeek V4).
    pub fn attend_shared_kv(&self, rt: &Runtime<'_>, shape: SharedKvShape, jobs: Vec<SharedKvJob<'_>>) {
        self.host().attend_shared_kv(rt.threads, shape, jobs)
    }

    /// The entries, before their norm and rotation, of the windows a
    /// compressor closes, `[windows, width]`.
    pub fn compress_windows(&self, job: &CompressJob<'_>) -> Vec<f32> {
        self.host().compress_windows(job)
    }

    /// Adds `bias` to every row of `rows`.
    pub fn add_bias(&self, rows: &mut [f32], bias: VectorHandle) {
        self.host().add_bias(rows, bias)
    }

    /// RMS-normalises each `weight.len`-wide row of `xs` into `out`
    /// (`w · x̂`).
    pub fn rmsnorm(&self, weight: VectorHandle, eps: f32, xs: &[f32], out: &mut [f32]) {
        self.host().rmsnorm(weight, eps, xs, out)
    }

    /// RMS-normalises each `weight.len`-wide row of `rows` in place.
    pub fn rmsnorm_rows(&self, weight: VectorHandle, eps: f32, rows: &mut [f32]) {
        self.host().rmsnorm_rows(weight, eps, rows)
    }

    /// The gated RMSNorm of each `weight.len`-wide row of `rows` in place:
    /// `w · x̂ · silu(gate)`, `gates` laid out as `rows`.
    pub fn rmsnorm_gated(&self, weight: VectorHandle, eps: f32, rows: &mut [f32], gates: &[f32], gate_act: NormGate) {
        self.host().rmsnorm_gated(weight, eps, rows, gates, gate_act)
    }

    /// `nn.LayerNorm` of each `weight.len`-wide row of `rows` in place:
    /// `(x - mean) / sqrt(var + eps) * w + b`, biased variance.
    pub fn layer_norm(&self, weight: VectorHandle, bias: VectorHandle, eps: f32, rows: &mut [f32]) {
        self.host().layer_norm(weight, bias, eps, rows)
    }

    /// `ys = down(silu(gate(xs)) * up(xs))`, gate and up clamped first as
    /// `swiglu` says.
    pub fn swiglu(&self, rt: &Runtime<'_>, weights: &[MatrixHandle; 3], swiglu: SwiGlu, xs: &[f32], ys: &mut [f32]) {
        match self {
            Backend::Gpu(gpu) => gpu.swiglu(rt.threads, weights, swiglu, xs, ys),
            _ => self.host().swiglu(rt.threads, weights, swiglu, xs, ys),
        }
    }

    /// A block's input from the streams (`[tokens, streams, hidden]`) into
    /// `input` (`[tokens, hidden]`), and the weights of its combine.
    pub fn hyper_mix(
        &self,
        rt: &Runtime<'_>,
        hc: &HyperConnection,
        streams: &[f32],
        input: &mut [f32],
    ) -> StreamWeights {
        self.host().hyper_mix(rt.threads, &hc.on_host(), streams, input)
    }

    /// The block's output `out` (`[tokens, hidden]`) joins the streams:
    /// `x ← post ⊗ out + combᵀ · x`.
    pub fn hyper_combine(&self, hc: &HyperConnection, weights: &StreamWeights, out: &[f32], streams: &mut [f32]) {
        self.host().hyper_combine(hc, weights, out, streams)
    }

    /// A gated residual's block input from the streams (`[tokens, streams,
    /// hidden]`) into `input` (`[tokens, hidden]`), and each token's
    /// injection weights (`[tokens, streams]`) for [`Self::gated_combine`].
    pub fn gated_mix(&self, rt: &Runtime<'_>, gated: &GatedResidual, streams: &[f32], input: &mut [f32]) -> Vec<f32> {
        self.host().gated_mix(rt.threads, &gated.on_host(), streams, input)
    }

    /// A PLE's output into the streams (`[tokens, streams · hidden]`) of
    /// one sequence, from its tokens' projected rows: `keys`
    /// (`[tokens, streams · hidden]`, normed in place) and `values`
    /// (`[tokens, hidden]`); `state` is the sequence's convolution inputs.
    pub fn ple_inject(&self, ple: &PleGate, keys: &mut [f32], values: &[f32], streams: &mut [f32], state: &mut [f32]) {
        self.host().ple_inject(ple, keys, values, streams, state)
    }

    /// The block's output `out` (`[tokens, hidden]`) into every stream,
    /// times the stream's injection weight.
    pub fn gated_combine(&self, gated: &GatedResidual, injection: &[f32], out: &[f32], streams: &mut [f32]) {
        cpu::Cpu::gated_combine(gated, injection, out, streams)
    }

    /// The streams (`[tokens, head.streams(), hidden]`) as one hidden state
    /// per token, `[tokens, hidden]`.
    pub fn collapse_streams(&self, rt: &Runtime<'_>, head: &StreamHead, streams: Vec<f32>, hidden: usize) -> Vec<f32> {
        self.host().collapse_streams(rt.threads, &head.on_host(), streams, hidden)
    }

    /// One Attention Residuals mix of every token: `input` (`[tokens,
    /// hidden]`) from the block snapshots and the partial sum, each
    /// `[tokens, hidden]`.
    pub fn attn_res_mix(&self, mix: &AttnResMix, snapshots: &[Vec<f32>], partial: &[f32], input: &mut [f32]) {
        self.host().attn_res_mix(mix, snapshots, partial, input)
    }

    /// Scales `xs` by the sigmoids of `gates`, each gate over
    /// `xs.len() / gates.len()` consecutive values.
    pub fn sigmoid_gate(&self, xs: &mut [f32], gates: &[f32]) {
        self.host().sigmoid_gate(xs, gates)
    }

    /// Rotates each row `i` of `rows` by `angles.at(i)`, where `rotary`
    /// says.
    pub fn rotate(&self, rows: &mut [f32], angles: &Angles, rotary: Rotary) {
        self.host().rotate(rows, angles, rotary)
    }

    /// Several sequences' causal grouped-query attention at once.
    pub fn attend(&self, rt: &Runtime<'_>, shape: AttnShape, jobs: Vec<AttendJob<'_>>) {
        self.host().attend(rt.threads, shape, jobs)
    }

    /// The keys each of one sequence's queries attends to under QSA, `[n,
    /// start + n]` (see [`AttendJob::selected`]).
    pub fn qsa_select(&self, rt: &Runtime<'_>, shape: QsaShape, job: QsaJob<'_>) -> Vec<bool> {
        self.host().qsa_select(rt.threads, shape, job)
    }

    /// One sequence's tokens through a delta-rule layer of kind `kind`.
    pub fn delta_step(&self, rt: &Runtime<'_>, kind: &DeltaKind, job: DeltaJob<'_>) {
        self.host().delta_step(rt.threads, kind, job)
    }

    /// One sequence's latent attention, `[n, heads * v_head_dim]`.
    pub fn attend_latent(&self, rt: &Runtime<'_>, shape: &LatentShape, job: LatentJob<'_>) -> Vec<f32> {
        let shape = LatentShape { kv_b: shape.kv_b.on_host(), ..*shape };
        self.host().attend_latent(rt.threads, &shape, job)
    }

    /// The DSA indexer's choice for each query: the positions it may attend
    /// to, ascending (see `crate::dsa`).
    pub fn index_select(&self, rt: &Runtime<'_>, shape: IndexShape, job: IndexJob<'_>) -> Vec<Vec<usize>> {
        self.host().index_select(rt.threads, shape, job)
    }

    /// The pooled indexer's key of each whole pool of `keys` and their gate
    /// logits `gates` (`[pools · pool, head_dim]`, `pool` the rows of `ape`
    /// `[pool, head_dim]`), `[pools, head_dim]` (see `crate::dsa`).
    pub fn pool_index_keys(&self, ape: VectorHandle, pool: usize, keys: &[f32], gates: &[f32]) -> Vec<f32> {
        self.host().pool_index_keys(ape, pool, keys, gates)
    }

    /// Each row of `xs`'s `top_k` routes, `[n][top_k]`; row `i` is token
    /// `tokens[i]`'s (which a hash router reads).
    pub fn route(&self, rt: &Runtime<'_>, router: &RouterSpec, xs: &[f32], tokens: &[u32]) -> Vec<Route> {
        self.route_with_shares(rt, router, xs, tokens).0
    }

    /// [`Self::route`], and with a shared-expert sink each row's shared
    /// experts' weights, `[n, n_shared]` (empty for other kinds).
    pub fn route_with_shares(
        &self,
        rt: &Runtime<'_>,
        router: &RouterSpec,
        xs: &[f32],
        tokens: &[u32],
    ) -> (Vec<Route>, Vec<f32>) {
        let router = RouterSpec { weight: router.weight.on_host(), ..*router };
        self.host().route(rt.threads, &router, xs, tokens)
    }

    /// Adds the shared experts a sink router weighs to `out`: expert `s`'s
    /// `down_s(silu(gate_s(x)) · up_s(x) · share)` per row, `shares` `[n,
    /// count]`, the experts' gate and up stacked `[count · intermediate,
    /// hidden]` and down `[count · hidden, intermediate]`, summed in order.
    pub fn weighted_shared_experts(
        &self,
        rt: &Runtime<'_>,
        weights: &[MatrixHandle; 3],
        xs: &[f32],
        shares: &[f32],
        out: &mut [f32],
    ) {
        self.host().weighted_shared_experts(rt.threads, &weights.map(MatrixHandle::on_host), xs, shares, out)
    }

    /// A short convolution (Inkling's): each `channels`-wide row of `rows`
    /// in place becomes the depthwise causal conv1d of the rows before it
    /// (the first from `state`, the last `kernel - 1` inputs, updated) plus
    /// itself; `weight` is `[channels, kernel]`.
    pub fn short_conv(&self, weight: VectorHandle, channels: usize, rows: &mut [f32], state: &mut [f32]) {
        self.host().short_conv(weight, channels, rows, state)
    }

    /// Each query head's bias by backward distance (Inkling's
    /// `rel_logits_proj`): every `d_rel`-wide row of `relative` times
    /// `proj` (`[d_rel, extent]`), `[rows, extent]`.
    pub fn relative_bias(&self, proj: VectorHandle, d_rel: usize, relative: &[f32]) -> Vec<f32> {
        self.host().relative_bias(proj, d_rel, relative)
    }

    /// Adds a MoE layer's routed experts' weighted outputs to `out`, the
    /// experts of the batch's union each run once (`strata_sched`).
    pub fn run_moe_layer(
        &self,
        rt: &Runtime<'_>,
        job: &MoeJob<'_>,
        out: &mut [f32],
        stats: &mut LayerStats,
    ) -> Result<()> {
        let vram = match self {
            Backend::Gpu(gpu) => Some(gpu.vram_experts(rt.store)),
            _ => None,
        };
        self.host().run_moe_layer(rt.threads, rt.store, rt.remote, vram, job, out, stats)
    }
}
