//! DeepSeek V4's compressors: every `ratio` tokens close a window, which
//! becomes one entry, `Σ_slots softmax(gate + position_bias) · kv` per
//! channel, RMS-normalised and rotated at the window's first position.
//! With overlap (CSA) each token projects two halves, and entry `w` pools
//! window `w - 1`'s first halves with window `w`'s second halves (entry 0
//! its own alone), so the overlap crosses passes exactly.
//!
//! A sequence keeps, per compressor, its entries with the open window's
//! second-half kv as their pending rows (a strided part), and the rest of
//! the last `span` tokens' projections (a ring): each token's gates, and
//! with overlap its first-half kv. A pass writes its tokens' rows, then
//! closes the windows they complete reading back only what the parts hold.
//!
//! The lightning indexer ([`EntryIndexer`]) of a CSA layer has a compressor
//! of its own, narrower, and scores its entries per query as GLM-5's DSA
//! indexer scores positions (`Σ_h w_h · relu(q_h · k)`), a query at `p`
//! seeing the `(p + 1) / ratio` closed windows.

use strata_format::{CompressedIndexer, CompressorState};
use strata_kv::{SequenceState, StatePart};

use crate::backend::{Backend, CompressJob, IndexJob, IndexShape, Rotary, Runtime, VectorHandle, compressor_rows};
use crate::common::Linear;
use crate::error::Result;
use crate::rope::{Angles, Rope};

/// Rotation of the trailing `rotary_dim` values of `width`-wide heads, on
/// interleaved pairs (V4's layout: `[nope | rope]`).
pub const fn trailing_rotary(width: usize, rotary_dim: usize) -> Rotary {
    Rotary { head_width: width, offset: width - rotary_dim, interleaved: true }
}

/// One compressor's weights and the cache parts it keeps.
pub struct Compressor {
    state: CompressorState,
    kv: Linear,
    gate: Linear,
    /// `[ratio, projection]`: added to the gate of each slot of a window.
    position_bias: VectorHandle,
    norm: VectorHandle,
    eps: f32,
    rotary: Rotary,
    /// The strided part of the entries; the ring of the rest is the next.
    entries_part: usize,
}

/// A pass's projections through one compressor, `[n, projection]` each,
/// the gates with their slot's position bias.
pub struct Projected {
    kv: Vec<f32>,
    gate: Vec<f32>,
}

impl Compressor {
    /// The compressor whose tensors are `module.*` (names from `tensor`),
    /// keeping its parts from `entries_part` on.
    pub fn load(
        b: &mut Backend,
        tensor: &dyn Fn(&str) -> String,
        state: CompressorState,
        hidden: usize,
        eps: f32,
        rotary_dim: usize,
        entries_part: usize,
    ) -> Result<Self> {
        let p = state.projection_width();
        Ok(Self {
            state,
            kv: Linear::load(b, &tensor("kv_proj.weight"), None, p, hidden)?,
            gate: Linear::load(b, &tensor("gate_proj.weight"), None, p, hidden)?,
            position_bias: b.vector(&tensor("position_bias"), state.ratio * p)?,
            norm: b.vector(&tensor("kv_norm.weight"), state.width)?,
            eps,
            rotary: trailing_rotary(state.width, rotary_dim),
            entries_part,
        })
    }

    /// Its parts: the entries (the open window's current-half kv pending),
    /// then the ring of the rest of the last `span` tokens' projections.
    pub fn cache_parts(&self) -> [StatePart; 2] {
        let s = &self.state;
        [StatePart::Strided { dim: s.width, every: s.ratio }, StatePart::Ring { dim: s.rest_width(), window: s.span() }]
    }

    /// Tokens per entry.
    pub fn ratio(&self) -> usize {
        self.state.ratio
    }

    /// The kv and biased gate projections of `xs` (`[n, hidden]`), row `i`
    /// at position `positions[i]`.
    pub fn project(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], positions: &[usize]) -> Projected {
        let (kv, mut gate) = (self.kv.apply(rt, b, xs), self.gate.apply(rt, b, xs));
        let p = self.state.projection_width();
        let bias = b.vector_values(self.position_bias);
        for (row, &position) in gate.chunks_exact_mut(p).zip(positions) {
            let slot = &bias[position % self.state.ratio * p..][..p];
            row.iter_mut().zip(slot).for_each(|(g, add)| *g += add);
        }
        Projected { kv, gate }
    }

    /// Writes one sequence's rows `rows` of `projected` (its positions
    /// `start..`) into `cache`'s layer `layer`, then the entries of the
    /// windows they close, normalised and rotated by `rope`.
    pub fn advance(
        &self,
        b: &Backend,
        rope: &Rope,
        cache: &mut SequenceState,
        layer: usize,
        start: usize,
        projected: &Projected,
        rows: std::ops::Range<usize>,
    ) {
        let (s, p) = (&self.state, self.state.projection_width());
        let r = s.ratio;
        let kv = &projected.kv[rows.start * p..rows.end * p];
        let gate = &projected.gate[rows.start * p..rows.end * p];
        let end = start + rows.len();
        let pending = cache.pending(layer, self.entries_part, start).to_vec();
        let (new_current, new_rest) = compressor_rows(s, kv, gate);
        cache.write(layer, self.entries_part, &new_current);
        cache.write(layer, self.entries_part + 1, &new_rest);
        let windows = start / r..end / r;
        if windows.is_empty() {
            return;
        }
        // Positions from the first closing window's (or, with overlap, the
        // window before it) to the pass's end, as the parts hold them.
        let current_from = windows.start * r;
        let rest_from = if s.overlap { current_from.saturating_sub(r) } else { current_from };
        let job = CompressJob {
            state: *s,
            current: &[pending, new_current].concat(),
            current_from,
            rest: cache.rows_between(layer, self.entries_part + 1, rest_from, end),
            rest_from,
            windows: windows.clone(),
        };
        let mut entries = b.compress_windows(&job);
        b.rmsnorm_rows(self.norm, self.eps, &mut entries);
        let positions: Vec<usize> = windows.map(|window| window * r).collect();
        b.rotate(&mut entries, &Angles::new(rope, &positions), self.rotary);
        cache.write_groups(layer, self.entries_part, &entries);
    }

    /// The entries of the windows closed within the first `len` positions.
    pub fn entries<'c>(&self, cache: &'c SequenceState, layer: usize, len: usize) -> &'c [f32] {
        cache.groups(layer, self.entries_part, len)
    }
}

/// A CSA layer's lightning indexer: its compressor's entries are the keys,
/// its queries come from the q-LoRA residual.
pub struct EntryIndexer {
    compressor: Compressor,
    shape: IndexShape,
    q_b: Linear,
    weights_proj: Linear,
    rotary: Rotary,
}

/// A pass's indexer queries (rotated) and head weights (scaled), and its
/// compressor's projections.
pub struct IndexerPass {
    q: Vec<f32>,
    weights: Vec<f32>,
    projected: Projected,
}

impl EntryIndexer {
    /// The indexer's tensors under `compressor.indexer.`, keeping its
    /// compressor's parts from `first_part` on.
    pub fn load(
        b: &mut Backend,
        tensor: &dyn Fn(&str) -> String,
        spec: CompressedIndexer,
        state: CompressorState,
        hidden: usize,
        q_lora_rank: usize,
        eps: f32,
        rotary_dim: usize,
        first_part: usize,
    ) -> Result<Self> {
        let (n, d) = (spec.n_heads, spec.head_dim);
        Ok(Self {
            compressor: Compressor::load(b, tensor, state, hidden, eps, rotary_dim, first_part)?,
            shape: IndexShape { heads: n, head_dim: d, topk: spec.topk, pools: false },
            q_b: Linear::load(b, &tensor("q_b_proj.weight"), None, n * d, q_lora_rank)?,
            weights_proj: Linear::load(b, &tensor("scorer.weights_proj.weight"), None, n, hidden)?,
            rotary: trailing_rotary(d, rotary_dim),
        })
    }

    /// Its compressor's parts.
    pub fn cache_parts(&self) -> [StatePart; 2] {
        self.compressor.cache_parts()
    }

    /// The pass's queries from `residual` (the normalised q-LoRA
    /// residual), rotated at `angles`, head weights from `xs`, and the
    /// compressor's projections.
    pub fn project(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        xs: &[f32],
        residual: &[f32],
        angles: &Angles,
        positions: &[usize],
    ) -> IndexerPass {
        let mut q = self.q_b.apply(rt, b, residual);
        b.rotate(&mut q, angles, self.rotary);
        let mut weights = self.weights_proj.apply(rt, b, xs);
        let head_weight = (self.shape.heads as f32).powf(-0.5);
        weights.iter_mut().for_each(|w| *w *= head_weight);
        IndexerPass { q, weights, projected: self.compressor.project(rt, b, xs, positions) }
    }

    /// One sequence's rows `rows` of the pass (positions `start..`): their
    /// keys into `cache`, then for each query the entries it attends to,
    /// ascending.
    pub fn select(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        rope: &Rope,
        cache: &mut SequenceState,
        layer: usize,
        start: usize,
        pass: &IndexerPass,
        rows: std::ops::Range<usize>,
    ) -> Vec<Vec<usize>> {
        let end = start + rows.len();
        self.compressor.advance(b, rope, cache, layer, start, &pass.projected, rows.clone());
        let (q_width, heads) = (self.shape.heads * self.shape.head_dim, self.shape.heads);
        let job = IndexJob {
            q: &pass.q[rows.start * q_width..rows.end * q_width],
            weights: &pass.weights[rows.start * heads..rows.end * heads],
            keys: self.compressor.entries(cache, layer, end),
            start,
            every: self.compressor.ratio(),
        };
        b.index_select(rt, self.shape, job)
    }
}
