//! A thread pool owned by the engine (never rayon's global pool) and the
//! parallel matrix products that run on it.
//!
//! Work is split by output rows only. Each output element is still one
//! row-dot call on the same instruction set, so results are bit-identical
//! for every thread count — the engine can change `n_threads` without
//! changing a single generated token.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::matrix::Matrix;
use crate::simd::Isa;

/// Below this many multiply-adds a product runs on the calling thread:
/// waking the pool would cost more than the arithmetic.
const SERIAL_MAX_MACS: usize = 64 * 1024;

/// Chunks per thread; more than one lets rayon balance uneven progress
/// (e.g. a thread descheduled by the OS).
const CHUNKS_PER_THREAD: usize = 4;

/// Smallest chunk worth a task, in multiply-adds.
const MIN_CHUNK_MACS: usize = 16 * 1024;

/// A fixed-size worker pool plus the instruction set detected once for it.
#[derive(Debug)]
pub struct Threads {
    pool: rayon::ThreadPool,
    n_threads: usize,
    isa: Isa,
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
        Ok(Self { pool, n_threads, isa: Isa::detect() })
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
        let Some(chunk_rows) = self.chunk_rows(m, 1) else {
            m.matvec_with(self.isa, x, y);
            return;
        };
        let isa = self.isa;
        self.pool.install(|| {
            y.par_chunks_mut(chunk_rows).enumerate().for_each(|(chunk, y_chunk)| {
                let row0 = chunk * chunk_rows;
                let rows = row0..row0 + y_chunk.len();
                m.matmul_rows(isa, x, 1, rows, y_chunk, 0);
            });
        });
    }

    /// `ys[t] = W xs[t]` for `n` inputs (`xs` `[n, cols]`, `ys` `[n, rows]`),
    /// split across the pool by output rows.
    ///
    /// # Panics
    /// If `xs.len() != n * m.cols` or `ys.len() != n * m.rows`.
    pub fn matmul(&self, m: &Matrix<'_>, xs: &[f32], n: usize, ys: &mut [f32]) {
        m.check_matmul(xs, n, ys);
        if n == 1 {
            return self.matvec(m, xs, ys);
        }
        let Some(chunk_rows) = self.chunk_rows(m, n) else {
            m.matmul_with(self.isa, xs, n, ys);
            return;
        };
        let isa = self.isa;
        let rows = m.rows;
        // A chunk's outputs are strided across `ys` (one run per input), so
        // each task fills a private [n, chunk] block that is copied out
        // afterwards; the copy is tiny next to the products.
        let blocks: Vec<Vec<f32>> = self.pool.install(|| {
            (0..rows.div_ceil(chunk_rows))
                .into_par_iter()
                .map(|chunk| {
                    let row0 = chunk * chunk_rows;
                    let chunk_len = chunk_rows.min(rows - row0);
                    let mut block = vec![0.0f32; n * chunk_len];
                    m.matmul_rows(isa, xs, n, row0..row0 + chunk_len, &mut block, chunk_len);
                    block
                })
                .collect()
        });
        for (chunk, block) in blocks.iter().enumerate() {
            let row0 = chunk * chunk_rows;
            let chunk_len = block.len() / n;
            for (t, block_row) in block.chunks_exact(chunk_len).enumerate() {
                ys[t * rows + row0..t * rows + row0 + chunk_len].copy_from_slice(block_row);
            }
        }
    }

    /// Rows per parallel task, or `None` when the product should run
    /// serially (one thread, or too little work to share).
    fn chunk_rows(&self, m: &Matrix<'_>, n: usize) -> Option<usize> {
        let macs_per_row = m.cols.saturating_mul(n).max(1);
        let total_macs = m.rows.saturating_mul(macs_per_row);
        if self.n_threads == 1 || total_macs < SERIAL_MAX_MACS || m.rows < 2 {
            return None;
        }
        let balanced = m.rows.div_ceil(self.n_threads * CHUNKS_PER_THREAD);
        let worthwhile = MIN_CHUNK_MACS.div_ceil(macs_per_row);
        Some(balanced.max(worthwhile).max(1))
    }
}
