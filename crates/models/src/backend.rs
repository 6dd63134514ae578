//! The one seam between the blocks and the kernels: the matrix products,
//! norms, SwiGLUs, causal GQA attention, parallel splits and routed-expert
//! passes the blocks run go through [`Ops`] (`Runtime::ops`), so that
//! another device replaces the bodies here, behind the same methods, rather
//! than the blocks. Today they run `strata-kernels`' SIMD paths on the
//! runtime's rayon pool.
//!
//! Still CPU code inside their blocks, for a device to take over as whole
//! operations when it comes: the Gated DeltaNet's per-sequence
//! convolution, q/k normalisation and gated norm (`attention::delta`),
//! MLA's per-head attention loops (`mla`), the
//! DSA indexer's scoring (`dsa`), rope rotation (`rope`) and the routers'
//! top-k choice (`ffn::router`).

use rayon::prelude::*;

use strata_kernels::{Matrix, Threads, ops};
use strata_sched::{LayerStats, MoeBatch, run_moe_layer, swiglu};
use strata_tier::ExpertStore;

use crate::attention::grouped::{AttnShape, attend_from};
use crate::{Result, Runtime};

/// The kernels of the device a forward pass runs on (the CPU).
#[derive(Clone, Copy)]
pub struct Ops<'a> {
    threads: &'a Threads,
}

/// One sequence's causal attention: its queries at positions
/// `start..start + n`, the cached keys and values of positions
/// `first_key..start + n` (0 unless a window's ring holds fewer), and where
/// the output goes.
pub struct AttendJob<'a> {
    pub q: &'a [f32],
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub first_key: usize,
    pub start: usize,
    pub out: &'a mut [f32],
}

impl Runtime<'_> {
    /// The kernels blocks run on: the one seam between them and a device.
    pub(crate) fn ops(&self) -> Ops<'_> {
        Ops { threads: self.threads }
    }
}

impl Ops<'_> {
    /// `out = W xs` for the `n` rows of `xs`.
    pub fn matmul(self, weight: &Matrix<'_>, xs: &[f32], n: usize, out: &mut [f32]) {
        self.threads.matmul(weight, xs, n, out);
    }

    /// RMS-normalises each `weight.len()`-wide row of `xs` into `out`
    /// (`w · x̂`).
    pub fn rmsnorm_into(self, xs: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        for (x, o) in xs.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
            ops::rmsnorm(x, weight, eps, o);
        }
    }

    /// RMS-normalises every `width`-wide chunk of `rows` in place.
    pub fn rmsnorm_rows(self, rows: &mut [f32], weight: &[f32], eps: f32, width: usize) {
        assert_eq!(weight.len(), width, "norm weight matches its span");
        for chunk in rows.chunks_exact_mut(width) {
            ops::rmsnorm_inplace(chunk, weight, eps);
        }
    }

    /// `ys = down(silu(gate(xs)) * up(xs))`.
    pub fn swiglu(self, weights: &[Matrix<'_>; 3], xs: &[f32], ys: &mut [f32]) {
        swiglu(self.threads, weights, xs, ys);
    }

    /// Several sequences' causal grouped-query attention at once.
    pub fn attend(self, shape: AttnShape<'_>, jobs: Vec<AttendJob<'_>>) {
        let threads = self.threads;
        threads.pool().install(|| {
            jobs.into_par_iter().for_each(|job| {
                attend_from(threads, shape, job.q, job.keys, job.values, job.first_key, job.start, job.out)
            });
        });
    }

    /// `f(head, state)` for every `state_floats`-wide head state of
    /// `states` (a Gated DeltaNet layer's value heads), the heads shared
    /// out across the pool, results in head order. Each head is computed by
    /// the same code on any thread.
    pub fn delta_heads<T: Send>(
        self,
        states: &mut [f32],
        state_floats: usize,
        f: impl Fn(usize, &mut [f32]) -> T + Sync + Send,
    ) -> Vec<T> {
        self.threads.pool().install(|| {
            states.par_chunks_exact_mut(state_floats).enumerate().map(|(head, state)| f(head, state)).collect()
        })
    }

    /// `f(0..n)`, the calls shared out across the pool, results in order.
    /// Each call must compute its result the same way on any thread.
    pub fn par_map<T: Send>(self, n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
        self.threads.pool().install(|| (0..n).into_par_iter().map(f).collect())
    }

    /// Adds a MoE layer's routed experts' weighted outputs to `out`, through
    /// the expert pipeline (`strata_sched`).
    pub fn moe_layer(
        self,
        store: &ExpertStore,
        batch: &MoeBatch<'_>,
        out: &mut [f32],
        stats: &mut LayerStats,
    ) -> Result<()> {
        Ok(run_moe_layer(store, self.threads, batch, out, stats)?)
    }
}
