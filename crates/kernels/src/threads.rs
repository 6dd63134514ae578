//! A thread pool owned by the engine (never rayon's global pool) and the
//! parallel matrix products that run on it.
//!
//! Work is split by output rows only. Each output element is still one
//! row-dot call on the same instruction set, so results are bit-identical
//! for every thread count — the engine can change `n_threads` without
//! changing a single generated token.

use rayon::prelude::*;

use crate::error::{Error, Result};
use std::ops::Range;

use crate::act::ActivationPrecision;
use crate::matrix::{Matrix, Prepared};

/// The activation between a gated feed-forward block's gate/up products and
/// its down product.
#[derive(Debug, Clone, Copy)]
pub enum GatedAct<'a> {
    /// `silu(gate) * up`, no biases.
    SwiGlu,
    /// `silu(min(gate, limit)) * clamp(up, -limit, limit)`, no biases
    /// ([`crate::ops::silu_mul_limited`]: GLM-5.3-Flash, DeepSeek V4).
    LimitedSwiGlu { limit: f32 },
    /// Kimi K3's SiTU-GLU, `b1·tanh(g/b1)·σ(g) · b2·tanh(u/b2)`, no biases
    /// ([`crate::ops::situ_mul`]; `beta` is b1, `linear_beta` b2).
    SituGlu { beta: f32, linear_beta: f32 },
    /// gpt-oss's experts: `gate + gate_bias` and `up + up_bias` through
    /// [`crate::ops::clamped_swiglu`] (`alpha`, `limit`), and `down_bias`
    /// added to the down product.
    Clamped { alpha: f32, limit: f32, gate_bias: &'a [f32], up_bias: &'a [f32], down_bias: &'a [f32] },
}

/// `row += bias`, element by element.
fn add_bias(row: &mut [f32], bias: &[f32]) {
    row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
}
use crate::simd::Isa;

/// Below this many multiply-adds a product runs on the calling thread:
/// waking the pool would cost more than the arithmetic.
const SERIAL_MAX_MACS: usize = 256 * 1024;

/// Rows of one integer-kernel tile; chunks are multiples of it.
const TILE_ROWS: usize = 4;

/// Chunks per thread; more than one lets rayon balance uneven progress
/// (e.g. a thread descheduled by the OS).
const CHUNKS_PER_THREAD: usize = 4;

/// Smallest chunk worth a task, in multiply-adds.
const MIN_CHUNK_MACS: usize = 64 * 1024;

/// A fixed-size worker pool plus the instruction set detected once for it
/// and the precision its integer products quantize inputs to.
#[derive(Debug)]
pub struct Threads {
    pool: rayon::ThreadPool,
    n_threads: usize,
    isa: Isa,
    activations: ActivationPrecision,
}

impl Threads {
    /// Builds a pool of exactly `n_threads` workers (at least 1).
    pub fn new(n_threads: usize) -> Result<Self> {
        if n_threads == 0 {
            return Err(Error::ZeroThreads);
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("strata-kernel-{i}"))
            .build()
            .map_err(|e| Error::ThreadPool { n_threads, reason: e.to_string() })?;
        Ok(Self { pool, n_threads, isa: Isa::detect(), activations: ActivationPrecision::default() })
    }

    /// This pool with the inputs of every integer product quantized at
    /// `activations` (default int16; int8 is lossy, an explicit opt-in).
    pub fn with_activations(self, activations: ActivationPrecision) -> Self {
        Self { activations, ..self }
    }

    /// This pool on `isa` rather than the detected one, so that the tests
    /// run every tier's fused path.
    #[cfg(test)]
    pub(crate) fn with_isa(self, isa: Isa) -> Self {
        assert!(isa.level().is_supported(), "{isa:?} runs on this CPU");
        Self { isa, ..self }
    }

    /// The precision integer products quantize their inputs to.
    pub fn activations(&self) -> ActivationPrecision {
        self.activations
    }

    /// Number of worker threads.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// The instruction set every product on this pool uses.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The underlying pool, for callers that parallelize their own work
    /// (e.g. attention heads) on the same threads.
    pub fn pool(&self) -> &rayon::ThreadPool {
        &self.pool
    }

    /// `y = W x`, split across the pool by output rows.
    ///
    /// # Panics
    /// If `x.len() != m.cols` or `y.len() != m.rows`.
    pub fn matvec(&self, m: &Matrix<'_>, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), m.cols, "matvec: x length differs from cols");
        assert_eq!(y.len(), m.rows, "matvec: y length differs from rows");
        let prepared = m.prepare(self.isa, self.activations, x, 1);
        self.products(m, &prepared, 1, y);
    }

    /// `ys[t] = W xs[t]` for `n` inputs (`xs` `[n, cols]`, `ys` `[n, rows]`),
    /// split across the pool by output rows.
    ///
    /// # Panics
    /// If `xs.len() != n * m.cols` or `ys.len() != n * m.rows`.
    pub fn matmul(&self, m: &Matrix<'_>, xs: &[f32], n: usize, ys: &mut [f32]) {
        m.check_matmul(xs, n, ys);
        let prepared = m.prepare(self.isa, self.activations, xs, n);
        self.products(m, &prepared, n, ys);
    }

    /// The SwiGLU feed-forward block of one expert (or a dense MLP),
    /// `ys[t] = down(silu(gate(xs[t])) * up(xs[t]))`, fused: the inputs are
    /// prepared once for gate and up; each task computes the same rows of
    /// gate and up together (so the expert's record is streamed once, both
    /// matrices in step) and applies SwiGLU to them at once; then the
    /// intermediate is prepared once for down.
    ///
    /// Bit-identical to `matmul(gate)`, `matmul(up)`, [`crate::ops::silu_mul`],
    /// `matmul(down)` in sequence, for any thread count.
    ///
    /// # Panics
    /// If `gate` and `up` are not both `[inter, hidden]`, `down` is not
    /// `[hidden, inter]`, or `xs`/`ys` are not `[n, hidden]`.
    pub fn expert_ffn(
        &self,
        gate: &Matrix<'_>,
        up: &Matrix<'_>,
        down: &Matrix<'_>,
        xs: &[f32],
        n: usize,
        ys: &mut [f32],
    ) {
        self.gated_ffn(gate, up, down, GatedAct::SwiGlu, xs, n, ys);
    }

    /// [`Threads::expert_ffn`] with the gate's activation and biases as
    /// `act` says: [`GatedAct::SwiGlu`] is `expert_ffn` itself, bit for bit;
    /// [`GatedAct::LimitedSwiGlu`] clamps gate and up before it;
    /// [`GatedAct::SituGlu`] is K3's SiTU-GLU in its place;
    /// [`GatedAct::Clamped`] adds the biases to gate, up and down and applies
    /// gpt-oss's clamped SwiGLU ([`crate::ops::clamped_swiglu`]).
    ///
    /// # Panics
    /// As [`Threads::expert_ffn`], and if a bias is not as long as the rows
    /// it is added to.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_ffn(
        &self,
        gate: &Matrix<'_>,
        up: &Matrix<'_>,
        down: &Matrix<'_>,
        act: GatedAct<'_>,
        xs: &[f32],
        n: usize,
        ys: &mut [f32],
    ) {
        let (inter, hidden) = (gate.rows, gate.cols);
        if let GatedAct::Clamped { gate_bias, up_bias, down_bias, .. } = act {
            assert_eq!(gate_bias.len(), inter, "gated_ffn: one gate bias per intermediate row");
            assert_eq!(up_bias.len(), inter, "gated_ffn: one up bias per intermediate row");
            assert_eq!(down_bias.len(), hidden, "gated_ffn: one down bias per output");
        }
        assert!(up.rows == inter && up.cols == hidden, "expert_ffn: up must be shaped like gate");
        assert!(down.rows == hidden && down.cols == inter, "expert_ffn: down must be [hidden, inter]");
        assert_eq!(Some(xs.len()), n.checked_mul(hidden), "expert_ffn: xs must be [n, hidden]");
        assert_eq!(Some(ys.len()), n.checked_mul(hidden), "expert_ffn: ys must be [n, hidden]");
        let isa = self.isa;
        let x_gate = gate.prepare(isa, self.activations, xs, n);
        // gate and up of one record share a format, so usually one
        // quantization of the inputs serves both.
        let same_inputs = match (gate.int_weights(isa), up.int_weights(isa)) {
            (Some(g), Some(u)) => g.layout == u.layout,
            (None, None) => true,
            _ => false,
        };
        let x_up_own = (!same_inputs).then(|| up.prepare(isa, self.activations, xs, n));
        let x_up = x_up_own.as_ref().unwrap_or(&x_gate);

        // gate and up, rows chunk by chunk, with SwiGLU applied per chunk.
        let mut h = vec![0.0f32; n * inter];
        let gate_up_rows = |rows: Range<usize>, out: &mut [f32], out_stride: usize, u: &mut [f32]| {
            gate.products(isa, &x_gate, n, rows.clone(), out, out_stride);
            up.products(isa, x_up, n, rows.clone(), u, out_stride);
            match act {
                GatedAct::SwiGlu => crate::ops::silu_mul(out, u),
                GatedAct::LimitedSwiGlu { limit } => crate::ops::silu_mul_limited(out, u, limit),
                GatedAct::SituGlu { beta, linear_beta } => crate::ops::situ_mul(out, u, beta, linear_beta),
                GatedAct::Clamped { alpha, limit, gate_bias, up_bias, .. } => {
                    for (g_row, u_row) in out.chunks_exact_mut(out_stride).zip(u.chunks_exact_mut(out_stride)) {
                        add_bias(g_row, &gate_bias[rows.clone()]);
                        add_bias(u_row, &up_bias[rows.clone()]);
                    }
                    crate::ops::clamped_swiglu(out, u, alpha, limit);
                }
            }
        };
        match self.chunk_rows_for(inter, 2 * hidden, n) {
            None => {
                let mut u = vec![0.0f32; n * inter];
                gate_up_rows(0..inter, &mut h, inter, &mut u);
            }
            Some(chunk_rows) => {
                let blocks: Vec<Vec<f32>> = self.pool.install(|| {
                    (0..inter.div_ceil(chunk_rows))
                        .into_par_iter()
                        .map(|chunk| {
                            let row0 = chunk * chunk_rows;
                            let len = chunk_rows.min(inter - row0);
                            let mut g = vec![0.0f32; n * len];
                            let mut u = vec![0.0f32; n * len];
                            gate_up_rows(row0..row0 + len, &mut g, len, &mut u);
                            g
                        })
                        .collect()
                });
                scatter(&blocks, chunk_rows, n, inter, &mut h);
            }
        }
        let h_prepared = down.prepare(isa, self.activations, &h, n);
        self.products(down, &h_prepared, n, ys);
        if let GatedAct::Clamped { down_bias, .. } = act {
            ys.chunks_exact_mut(hidden).for_each(|row| add_bias(row, down_bias));
        }
    }

    /// Rows of `m` for all `n` prepared inputs, split across the pool.
    fn products(&self, m: &Matrix<'_>, prepared: &Prepared<'_>, n: usize, ys: &mut [f32]) {
        let rows = m.rows;
        let Some(chunk_rows) = self.chunk_rows_for(rows, m.cols, n) else {
            m.products(self.isa, prepared, n, 0..rows, ys, rows);
            return;
        };
        let isa = self.isa;
        if n == 1 {
            self.pool.install(|| {
                ys.par_chunks_mut(chunk_rows).enumerate().for_each(|(chunk, y_chunk)| {
                    let row0 = chunk * chunk_rows;
                    m.products(isa, prepared, 1, row0..row0 + y_chunk.len(), y_chunk, 0);
                });
            });
            return;
        }
        // A chunk's outputs are strided across `ys` (one run per input), so
        // each task fills a private [n, chunk] block that is copied out
        // afterwards; the copy is tiny next to the products.
        let blocks: Vec<Vec<f32>> = self.pool.install(|| {
            (0..rows.div_ceil(chunk_rows))
                .into_par_iter()
                .map(|chunk| {
                    let row0 = chunk * chunk_rows;
                    let len = chunk_rows.min(rows - row0);
                    let mut block = vec![0.0f32; n * len];
                    m.products(isa, prepared, n, row0..row0 + len, &mut block, len);
                    block
                })
                .collect()
        });
        scatter(&blocks, chunk_rows, n, rows, ys);
    }

    /// Rows per parallel task for a product of `rows` rows of `cols`
    /// columns with `n` inputs, or `None` when it should run serially (one
    /// thread, or too little work to share). Chunks are whole tiles of the
    /// integer kernels (4 rows), so no tile is split between tasks.
    fn chunk_rows_for(&self, rows: usize, cols: usize, n: usize) -> Option<usize> {
        let macs_per_row = cols.saturating_mul(n).max(1);
        let total_macs = rows.saturating_mul(macs_per_row);
        if self.n_threads == 1 || total_macs < SERIAL_MAX_MACS || rows < 2 {
            return None;
        }
        let balanced = rows.div_ceil(self.n_threads * CHUNKS_PER_THREAD);
        let worthwhile = MIN_CHUNK_MACS.div_ceil(macs_per_row);
        Some(balanced.max(worthwhile).max(1).next_multiple_of(TILE_ROWS))
    }
}

/// Copies per-chunk `[n, chunk]` blocks into a `[n, rows]` output.
fn scatter(blocks: &[Vec<f32>], chunk_rows: usize, n: usize, rows: usize, ys: &mut [f32]) {
    for (chunk, block) in blocks.iter().enumerate() {
        let row0 = chunk * chunk_rows;
        let len = block.len() / n.max(1);
        if len == 0 {
            continue;
        }
        for (t, block_row) in block.chunks_exact(len).enumerate() {
            ys[t * rows + row0..t * rows + row0 + len].copy_from_slice(block_row);
        }
    }
}
