//! The CPU backend: weights are the container's resident bytes, resolved
//! once at registration and viewed in place (no copy); operations are
//! `strata-kernels`' SIMD paths on the runtime's pool, on the instruction
//! set detected once, when the backend is made.

mod attend;
mod compress;
mod delta;
mod gated_hyper;
mod hyper;
mod index;
mod inkling;
mod latent;
mod ple;
mod qsa;
mod route;
mod shared_kv;

#[cfg(test)]
mod inkling_torch;
#[cfg(test)]
mod torch_cases;

use std::ops::Range;
use std::sync::Arc;

use strata_format::{Container, DenseId, SwiGlu};
use strata_kernels::simd::Isa;
use strata_kernels::{GatedAct, Matrix, Threads, ops};
use strata_sched::{ExpertFfn, LayerStats, MoeBatch, RemoteExperts, Route, VramExperts, gated_ffn};
use strata_tier::ExpertStore;

use super::{
    AttendJob, AttnResMix, AttnShape, CompressJob, DeltaJob, DeltaKind, Device, ExpertFfnKind, GatedResidual,
    HyperConnection, IndexJob, IndexShape, LatentJob, LatentShape, MatrixHandle, MoeJob, PleGate, QsaJob, QsaShape,
    Rotary, RouteKind, RouterSpec, SharedKvJob, SharedKvShape, StreamHead, StreamWeights, TableHandle, VectorHandle,
};
use crate::error::Result;
use crate::rope::Angles;

/// The CPU's tensors and instruction set.
pub struct Cpu {
    container: Arc<Container>,
    isa: Isa,
    /// Registered matrices and tables, resolved in the container.
    matrices: Vec<DenseId>,
    vectors: Vec<Vector>,
}

/// Where a vector's values are.
enum Vector {
    /// The container's tensor, read in place.
    Stored(DenseId),
    /// Values computed at load.
    Owned(Vec<f32>),
}

impl Cpu {
    pub fn new(container: Arc<Container>) -> Self {
        Self { container, isa: Isa::detect(), matrices: Vec::new(), vectors: Vec::new() }
    }

    pub fn container(&self) -> &Container {
        &self.container
    }

    /// Resolves the resident matrix `name`; the slot of its handle.
    pub fn register_matrix(&mut self, name: &str) -> Result<usize> {
        let id = self.container.dense_id(name)?;
        self.container.dense_at(id)?;
        self.matrices.push(id);
        Ok(self.matrices.len() - 1)
    }

    /// Resolves the f32 vector `name`; the slot of its handle.
    pub fn register_vector(&mut self, name: &str) -> Result<usize> {
        let id = self.container.dense_id(name)?;
        self.container.dense_vec_at(id)?;
        Ok(self.push_vector(Vector::Stored(id)))
    }

    /// Keeps `values`; the slot of their handle.
    pub fn own_vector(&mut self, values: Vec<f32>) -> usize {
        self.push_vector(Vector::Owned(values))
    }

    fn push_vector(&mut self, vector: Vector) -> usize {
        self.vectors.push(vector);
        self.vectors.len() - 1
    }

    /// Resolves the table `name` (its bytes may be on disk); the slot of
    /// its handle.
    pub fn register_table(&mut self, name: &str) -> Result<usize> {
        self.matrices.push(self.container.dense_id(name)?);
        Ok(self.matrices.len() - 1)
    }

    /// The matrix behind `m`, over the container's bytes.
    fn matrix(&self, m: MatrixHandle) -> Matrix<'_> {
        assert_eq!(m.device, Device::Cpu, "a CPU operation reads host tensors");
        let matrix = self.container.dense_at(self.matrices[m.slot]).expect("resident and well-formed when registered");
        assert_eq!((matrix.rows, matrix.cols), (m.rows, m.cols), "the handle's shape is its matrix's");
        matrix
    }

    /// The values behind `v`.
    pub fn vector(&self, v: VectorHandle) -> &[f32] {
        assert_eq!(v.device, Device::Cpu, "a CPU operation reads host tensors");
        let values = match &self.vectors[v.slot] {
            Vector::Stored(id) => self.container.dense_vec_at(*id).expect("an f32 tensor when registered"),
            Vector::Owned(values) => values,
        };
        assert_eq!(values.len(), v.len, "the handle's length is its vector's");
        values
    }

    pub fn table_rows(&self, table: TableHandle, rows: &[usize], out: &mut [f32]) -> Result<()> {
        assert_eq!(table.device, Device::Cpu, "a CPU operation reads host tensors");
        Ok(self.container.dense_rows_at(self.matrices[table.slot], rows, out)?)
    }

    pub fn matmul(&self, threads: &Threads, w: MatrixHandle, xs: &[f32], out: &mut [f32]) {
        let n = xs.len() / w.cols;
        threads.matmul(&self.matrix(w), xs, n, out);
    }

    pub fn matmul_rows(&self, threads: &Threads, w: MatrixHandle, rows: Range<usize>, xs: &[f32], out: &mut [f32]) {
        let block = self.matrix(w).row_range(rows.start, rows.len()).expect("rows within the matrix");
        threads.matmul(&block, xs, xs.len() / w.cols, out);
    }

    pub fn attend_shared_kv(&self, threads: &Threads, shape: SharedKvShape, jobs: Vec<SharedKvJob<'_>>) {
        shared_kv::attend_all(threads, self.isa, &shape, self.vector(shape.sinks), jobs);
    }

    pub fn compress_windows(&self, job: &CompressJob<'_>) -> Vec<f32> {
        compress::compress_windows(job)
    }

    pub fn add_bias(&self, rows: &mut [f32], bias: VectorHandle) {
        let bias = self.vector(bias);
        for row in rows.chunks_exact_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
        }
    }

    pub fn rmsnorm(&self, weight: VectorHandle, eps: f32, xs: &[f32], out: &mut [f32]) {
        let weight = self.vector(weight);
        for (x, o) in xs.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
            ops::rmsnorm(x, weight, eps, o);
        }
    }

    pub fn rmsnorm_rows(&self, weight: VectorHandle, eps: f32, rows: &mut [f32]) {
        let weight = self.vector(weight);
        for row in rows.chunks_exact_mut(weight.len()) {
            ops::rmsnorm_inplace(row, weight, eps);
        }
    }

    pub fn rmsnorm_gated(
        &self,
        weight: VectorHandle,
        eps: f32,
        rows: &mut [f32],
        gates: &[f32],
        gate_act: ops::NormGate,
    ) {
        let weight = self.vector(weight);
        for (row, gate) in rows.chunks_exact_mut(weight.len()).zip(gates.chunks_exact(weight.len())) {
            ops::rmsnorm_gated(row, gate, weight, eps, gate_act);
        }
    }

    pub fn layer_norm(&self, weight: VectorHandle, bias: VectorHandle, eps: f32, rows: &mut [f32]) {
        let (w, b) = (self.vector(weight), self.vector(bias));
        for x in rows.chunks_exact_mut(w.len()) {
            let n = x.len() as f32;
            let mean = x.iter().sum::<f32>() / n;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, &w), &b) in x.iter_mut().zip(w).zip(b) {
                *v = (*v - mean) * inv * w + b;
            }
        }
    }

    pub fn swiglu(
        &self,
        threads: &Threads,
        [gate, up, down]: &[MatrixHandle; 3],
        swiglu: SwiGlu,
        xs: &[f32],
        ys: &mut [f32],
    ) {
        gated_ffn(threads, &[self.matrix(*gate), self.matrix(*up), self.matrix(*down)], swiglu_act(swiglu), xs, ys);
    }

    pub fn hyper_mix(
        &self,
        threads: &Threads,
        hc: &HyperConnection,
        streams: &[f32],
        input: &mut [f32],
    ) -> StreamWeights {
        let n = hc.streams;
        let tokens = streams.len() / hc.mixes.cols;
        let mut weights = StreamWeights { post: vec![0.0; tokens * n], comb: vec![0.0; tokens * n * n] };
        let mixer = hyper::Mixer {
            streams: n,
            mixes: self.matrix(hc.mixes),
            base: self.vector(hc.base),
            scale: self.vector(hc.scale),
            sinkhorn_iters: hc.sinkhorn_iters,
            eps: hc.eps,
            norm_eps: hc.norm_eps,
        };
        hyper::mix(threads, &mixer, streams, input, &mut weights.post, &mut weights.comb);
        weights
    }

    pub fn hyper_combine(&self, hc: &HyperConnection, weights: &StreamWeights, out: &[f32], streams: &mut [f32]) {
        let hidden = hc.mixes.cols / hc.streams;
        hyper::combine(hc.streams, hidden, &weights.post, &weights.comb, out, streams);
    }

    fn gated_mixer(&self, gated: &GatedResidual) -> gated_hyper::GatedMixer<'_> {
        gated_hyper::GatedMixer {
            streams: gated.streams,
            norm: self.vector(gated.norm),
            down: self.matrix(gated.down),
            up: self.matrix(gated.up),
            inject: gated.inject.map(|inject| self.matrix(inject)),
            norm_eps: gated.norm_eps,
        }
    }

    pub fn gated_mix(&self, threads: &Threads, gated: &GatedResidual, streams: &[f32], input: &mut [f32]) -> Vec<f32> {
        assert!(gated.inject.is_some(), "a block's gated residual injects its output");
        gated_hyper::mix(threads, &self.gated_mixer(gated), streams, input)
    }

    pub fn ple_inject(&self, ple: &PleGate, keys: &mut [f32], values: &[f32], streams: &mut [f32], state: &mut [f32]) {
        let mixer = ple::PleMixer {
            hidden: ple.hidden,
            norm_key: self.vector(ple.norm_key),
            norm_query: self.vector(ple.norm_query),
            norm_conv: self.vector(ple.norm_conv),
            conv: self.vector(ple.conv),
            kernel: ple.kernel,
            dilation: ple.dilation,
            eps: ple.eps,
        };
        ple::inject(&mixer, keys, values, streams, state);
    }

    pub fn gated_combine(gated: &GatedResidual, injection: &[f32], out: &[f32], streams: &mut [f32]) {
        gated_hyper::combine(gated.streams, injection, out, streams);
    }

    pub fn collapse_streams(&self, threads: &Threads, head: &StreamHead, streams: Vec<f32>, hidden: usize) -> Vec<f32> {
        let mut out = match *head {
            StreamHead::One => return streams,
            StreamHead::AttnRes(_) => unreachable!("Streams::collapse mixes the attention residuals' head"),
            StreamHead::Mean { .. } | StreamHead::Sigmoid { .. } | StreamHead::Gated(_) => {
                vec![0.0f32; streams.len() / head.streams()]
            }
        };
        match *head {
            StreamHead::One | StreamHead::AttnRes(_) => {}
            StreamHead::Gated(gated) => {
                let injection = gated_hyper::mix(threads, &self.gated_mixer(&gated), &streams, &mut out);
                assert!(injection.is_empty(), "the final mixer injects nothing");
            }
            StreamHead::Mean { streams: n } => hyper::mean_head(n, hidden, &streams, &mut out),
            StreamHead::Sigmoid { streams: n, mixes, base, scale, eps, norm_eps } => {
                let head = hyper::SigmoidHead {
                    streams: n,
                    mixes: self.matrix(mixes),
                    base: self.vector(base),
                    scale: self.vector(scale),
                    eps,
                    norm_eps,
                };
                hyper::sigmoid_head(threads, &head, &streams, &mut out);
            }
        }
        out
    }

    pub fn attn_res_mix(&self, mix: &AttnResMix, snapshots: &[Vec<f32>], partial: &[f32], input: &mut [f32]) {
        let (norm, proj) = (self.vector(mix.norm), self.vector(mix.proj));
        let hidden = norm.len();
        assert!(snapshots.iter().all(|s| s.len() == partial.len()), "every snapshot has the partial sum's rows");
        for (t, out) in input.chunks_exact_mut(hidden).enumerate() {
            let rows = hidden * t..hidden * (t + 1);
            let sources: Vec<&[f32]> =
                snapshots.iter().map(Vec::as_slice).chain([partial]).map(|source| &source[rows.clone()]).collect();
            ops::attn_res_mix(&sources, norm, proj, mix.norm_eps, out);
        }
    }

    pub fn sigmoid_gate(&self, xs: &mut [f32], gates: &[f32]) {
        let width = xs.len() / gates.len();
        assert_eq!(xs.len(), width * gates.len(), "every value has its gate");
        for (span, &gate) in xs.chunks_exact_mut(width).zip(gates) {
            let scale = ops::sigmoid(gate);
            span.iter_mut().for_each(|x| *x *= scale);
        }
    }

    pub fn rotate(&self, rows: &mut [f32], angles: &Angles, rotary: Rotary) {
        if rows.is_empty() {
            return;
        }
        let width = rows.len() / angles.row_count();
        assert_eq!(rows.len(), angles.row_count() * width, "one row per position");
        let span = rotary.offset..rotary.offset + angles.dim();
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            let (cos, sin) = angles.at(i);
            for head in row.chunks_exact_mut(rotary.head_width) {
                let x = &mut head[span.clone()];
                if rotary.interleaved { ops::rope_interleaved(x, cos, sin) } else { ops::rope_neox(x, cos, sin) }
            }
        }
    }

    pub fn attend(&self, threads: &Threads, shape: AttnShape, jobs: Vec<AttendJob<'_>>) {
        let sinks = shape.sinks.map(|sinks| self.vector(sinks));
        attend::attend_all(threads, self.isa, &shape, sinks, jobs);
    }

    pub fn qsa_select(&self, threads: &Threads, shape: QsaShape, job: QsaJob<'_>) -> Vec<bool> {
        let indexer = qsa::QsaIndexer {
            heads: shape.heads,
            head_dim: shape.head_dim,
            budget_tokens: shape.budget_tokens,
            block_tokens: shape.block_tokens,
            k_norm: self.vector(shape.k_norm),
            norm_eps: shape.norm_eps,
        };
        indexer.select_all(threads, &job)
    }

    pub fn delta_step(&self, threads: &Threads, kind: &DeltaKind, job: DeltaJob<'_>) {
        match *kind {
            DeltaKind::GatedDeltaNet { dims, conv, dt_bias, a_log } => {
                let weights = delta::GdnWeights {
                    conv: self.vector(conv),
                    dt_bias: self.vector(dt_bias),
                    a_log: self.vector(a_log),
                };
                delta::gated_delta_net(threads, self.isa, &dims, &weights, job);
            }
            DeltaKind::KimiDelta { dims, conv, dt_bias, a_log, gate_lower_bound } => {
                let weights = delta::GdnWeights {
                    conv: self.vector(conv),
                    dt_bias: self.vector(dt_bias),
                    a_log: self.vector(a_log),
                };
                delta::kimi_delta_attention(threads, self.isa, &dims, &weights, gate_lower_bound, job);
            }
        }
    }

    pub fn attend_latent(&self, threads: &Threads, shape: &LatentShape, job: LatentJob<'_>) -> Vec<f32> {
        latent::attend(threads, self.isa, shape, &self.matrix(shape.kv_b), &job)
    }

    pub fn index_select(&self, threads: &Threads, shape: IndexShape, job: IndexJob<'_>) -> Vec<Vec<usize>> {
        index::select(threads, self.isa, shape, &job)
    }

    pub fn pool_index_keys(&self, ape: VectorHandle, pool: usize, keys: &[f32], gates: &[f32]) -> Vec<f32> {
        index::pool_keys(self.vector(ape), pool, keys, gates)
    }

    pub fn route(&self, threads: &Threads, router: &RouterSpec, xs: &[f32], tokens: &[u32]) -> (Vec<Route>, Vec<f32>) {
        let num_experts = router.weight.rows;
        let mut logits = vec![0.0f32; xs.len() / router.weight.cols * num_experts];
        self.matmul(threads, router.weight, xs, &mut logits);
        let routes = match router.kind {
            RouteKind::SoftmaxTopK { renormalize } => {
                route::softmax_top_k(&logits, num_experts, router.top_k, renormalize)
            }
            RouteKind::GroupedSigmoid { n_group, topk_group, renormalize, scaling, correction_bias } => {
                let routing = route::GroupedSigmoid {
                    n_group,
                    topk_group,
                    top_k: router.top_k,
                    normalize: renormalize,
                    scaling,
                    bias: self.vector(correction_bias),
                };
                route::grouped_sigmoid_top_k(&logits, num_experts, &routing)
            }
            RouteKind::TopKThenSoftmax { bias } => {
                self.add_bias(&mut logits, bias);
                route::top_k_then_softmax(&logits, num_experts, router.top_k)
            }
            RouteKind::SqrtSoftplus { scaling, correction_bias } => {
                route::sqrt_softplus_top_k(&logits, num_experts, router.top_k, scaling, self.vector(correction_bias))
            }
            RouteKind::Hash { scaling, table } => {
                route::hash_routes(&logits, num_experts, router.top_k, scaling, self.vector(table), tokens)
            }
            RouteKind::SharedExpertSink { n_shared, route_scale, global_scale, correction_bias } => {
                let sink = inkling::Sink {
                    n_shared,
                    top_k: router.top_k,
                    scale: [route_scale, global_scale],
                    bias: self.vector(correction_bias),
                };
                return inkling::shared_expert_sink(&logits, num_experts, &sink);
            }
        };
        (routes, Vec::new())
    }

    pub fn run_moe_layer(
        &self,
        threads: &Threads,
        store: &ExpertStore,
        remote: Option<&dyn RemoteExperts>,
        vram: Option<VramExperts<'_>>,
        job: &MoeJob<'_>,
        out: &mut [f32],
        stats: &mut LayerStats,
    ) -> Result<()> {
        assert_eq!(job.experts.device, Device::Cpu, "a CPU operation reads host tensors");
        let experts = match job.ffn {
            ExpertFfnKind::SwiGlu => ExpertFfn::SwiGlu,
            ExpertFfnKind::LimitedSwiGlu { limit } => ExpertFfn::LimitedSwiGlu { limit },
            ExpertFfnKind::SituGlu { beta, linear_beta } => ExpertFfn::SituGlu { beta, linear_beta },
            ExpertFfnKind::Clamped { alpha, limit, gate_bias, up_bias, down_bias } => ExpertFfn::Clamped {
                alpha,
                limit,
                gate_bias: self.vector(gate_bias),
                up_bias: self.vector(up_bias),
                down_bias: self.vector(down_bias),
            },
        };
        let batch = MoeBatch {
            experts,
            layer: job.experts.layer,
            layout: self.container.expert_layout(job.experts.layer)?,
            xs: job.xs,
            hidden: job.hidden,
            routes: job.routes,
            top_k: job.top_k,
            prefetch: job.prefetch,
            remote,
            vram,
        };
        Ok(strata_sched::run_moe_layer(store, threads, &batch, out, stats)?)
    }
}

/// The kernels' activation of a dense SwiGLU MLP clamped as `swiglu` says
/// (the GPU backend's too, so that both compute one definition).
pub(super) fn swiglu_act(swiglu: SwiGlu) -> GatedAct<'static> {
    match swiglu {
        SwiGlu::Plain => GatedAct::SwiGlu,
        SwiGlu::Limited { limit } => GatedAct::LimitedSwiGlu { limit },
        SwiGlu::Situ { beta, linear_beta } => GatedAct::SituGlu { beta, linear_beta },
    }
}

/// The values of `testdata/{dir}/{name}.npy` and their shape (the reference
/// tensors of the tests against torch).
#[cfg(test)]
fn fixture(dir: &str, name: &str) -> (Vec<usize>, Vec<f32>) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(dir).join(format!("{name}.npy"));
    strata_format::npy::read_f32(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Agreement of `got` with torch's `want`, relative to `want`'s largest
/// magnitude.
#[cfg(test)]
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1.0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * scale, "{what}[{i}]: {g} vs torch's {w}");
    }
}

/// The rotary width of xtask/fixtures/deepseek_v4_blocks.py's config.
#[cfg(test)]
const COMPRESS_ROTARY_DIM: usize = 8;

/// The rotation of that config's compressed layers: θ 160000, YaRN x4 over
/// 16 positions with the attention factor forced to 1.
#[cfg(test)]
fn compress_rope() -> crate::rope::Rope {
    let scaling = strata_format::RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 16,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale: 0.0,
        mscale_all_dim: 0.0,
        attention_factor: Some(1.0),
        truncate: true,
    };
    let spec = strata_format::RopeSpec { theta: 160000.0, scaling, rotary_dim: COMPRESS_ROTARY_DIM };
    crate::rope::Rope::new(&spec, COMPRESS_ROTARY_DIM).expect("a rotation")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use strata_format::{ConvertOptions, QuantPreset};
    use strata_kernels::MatData;

    use super::*;
    use crate::backend::Backend;
    use crate::error::Error;

    const Q_PROJ: &str = "model.layers.0.self_attn.q_proj.weight";
    const NORM: &str = "model.layers.0.input_layernorm.weight";

    /// The OLMoE fixture at f32, opened, and the directory that holds it.
    fn olmoe() -> (tempfile::TempDir, Arc<Container>) {
        let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/olmoe/hf");
        let dir = tempfile::tempdir().expect("temporary directory");
        let model = dir.path().join("model");
        strata_format::convert(&hf, &model, &ConvertOptions::new(QuantPreset::F32)).expect("convert");
        let container = Arc::new(Container::open(&model).expect("open"));
        (dir, container)
    }

    fn rows_cols(c: &Container, name: &str) -> (usize, usize) {
        let m = c.dense(name).expect("stored");
        (m.rows, m.cols)
    }

    /// Two snapshots and the partial sum, `[tokens, hidden]` each, mixed
    /// token by token as Kimi K3's reference mixes them.
    #[test]
    fn an_attention_residuals_mix_of_every_token_matches_kimi_k3_s_reference() {
        let (_dir, c) = olmoe();
        let mut b = Backend::cpu(c);
        let load = |name: &str| fixture("kimi_k3", &format!("attn_res_{name}")).1;
        let (shape, sources) = fixture("kimi_k3", "attn_res_sources");
        let [_, tokens, hidden] = shape[..] else { panic!("sources shape {shape:?}") };
        let sources: Vec<Vec<f32>> = sources.chunks_exact(tokens * hidden).map(<[f32]>::to_vec).collect();
        let (partial, snapshots) = sources.split_last().expect("the partial sum");
        let mix = AttnResMix {
            norm: b.upload_vector(load("norm")),
            proj: b.upload_vector(load("proj")),
            norm_eps: load("eps")[0],
        };
        let mut input = vec![0.0f32; tokens * hidden];
        b.attn_res_mix(&mix, snapshots, partial, &mut input);
        assert_close(&input, &load("out"), "attention residuals mix");
    }

    #[test]
    fn a_registered_tensor_is_the_containers_bytes_in_place() {
        let (_dir, c) = olmoe();
        let (rows, cols) = rows_cols(&c, Q_PROJ);
        let norm_len = c.dense_vec(NORM).expect("stored").len();
        let mut b = Backend::cpu(Arc::clone(&c));
        let (m, v) = (b.matrix(Q_PROJ, rows, cols).expect("registered"), b.vector(NORM, norm_len).expect("registered"));
        assert_eq!((m.device, v.device), (Device::Cpu, Device::Cpu));
        let Backend::Cpu(cpu) = &b else { panic!("the CPU backend") };
        let (MatData::F32(held), MatData::F32(stored)) = (cpu.matrix(m).data, c.dense(Q_PROJ).expect("stored").data)
        else {
            panic!("an f32 container holds f32 matrices");
        };
        assert_eq!(held.as_ptr(), stored.as_ptr(), "no copy of the matrix");
        assert_eq!(cpu.vector(v).as_ptr(), c.dense_vec(NORM).expect("stored").as_ptr(), "no copy of the vector");
    }

    #[test]
    fn a_shape_other_than_the_stored_one_is_refused_at_registration() {
        let (_dir, c) = olmoe();
        let (rows, cols) = rows_cols(&c, Q_PROJ);
        let mut b = Backend::cpu(Arc::clone(&c));
        let refused = b.matrix(Q_PROJ, rows, cols + 1).expect_err("wrong shape");
        assert!(matches!(refused, Error::Shape { ref name, .. } if name == Q_PROJ), "{refused}");
        let refused = b.vector(NORM, 3).expect_err("wrong length");
        assert!(matches!(refused, Error::Shape { ref name, .. } if name == NORM), "{refused}");
        assert!(matches!(b.matrix("no.such.weight", 1, 1), Err(Error::Format(_))));
    }

    /// Without the `gpu` feature the GPU backend still has its name, and
    /// asking for it says how to build it.
    #[cfg(not(feature = "gpu"))]
    #[test]
    fn without_the_gpu_feature_the_gpu_backend_says_how_to_build_it() {
        let (_dir, c) = olmoe();
        let Err(missing) = Backend::gpu(c, None) else { panic!("a GPU backend without the feature") };
        assert!(matches!(missing, Error::Device(strata_kernels::Error::GpuNotBuilt)), "{missing}");
        assert!(missing.to_string().contains("--features gpu"), "{missing}");
    }

    #[test]
    fn values_made_at_load_are_held_by_the_backend() {
        let (_dir, c) = olmoe();
        let mut b = Backend::cpu(c);
        let v = b.upload_vector(vec![1.5, -2.0]);
        assert_eq!((v.device, v.len), (Device::Cpu, 2));
        assert_eq!(b.vector_values(v), &[1.5, -2.0]);
    }
}
