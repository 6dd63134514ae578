//! One MoE layer over a batch of tokens: union → place → overlap → learn.

use std::time::Instant;

use rayon::prelude::*;

use strata_format::ExpertLayout;
use strata_kernels::{GatedAct, Threads};
use strata_tier::{ExpertKey, ExpertStore, Record};

use crate::ffn::gated_ffn;
use crate::{Error, LayerStats, Result, Route, union};

/// The inputs of one MoE layer for a batch of tokens.
pub struct MoeBatch<'a> {
    /// Decoder layer index.
    pub layer: usize,
    /// How the layer's expert records are laid out.
    pub layout: &'a ExpertLayout,
    /// Hidden states, `[n_tokens, hidden]`.
    pub xs: &'a [f32],
    /// Width of a hidden state.
    pub hidden: usize,
    /// Routes, `[n_tokens][top_k]`.
    pub routes: &'a [Route],
    /// Experts per token.
    pub top_k: usize,
    /// What each expert computes.
    pub experts: ExpertFfn<'a>,
    /// A later layer's predicted experts, prefetched once this layer's
    /// resident experts are leased, so that a guess never evicts a record
    /// this layer is about to use. A guess moves bytes only: it never
    /// changes which records this or any layer computes with.
    pub prefetch: Option<Guess<'a>>,
}

/// The feed-forward each routed expert of a layer computes.
#[derive(Debug, Clone, Copy)]
pub enum ExpertFfn<'a> {
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu,
    /// `down(silu(min(gate(x), limit)) * clamp(up(x), -limit, limit))`
    /// ([`strata_kernels::GatedAct::LimitedSwiGlu`]).
    LimitedSwiGlu { limit: f32 },
    /// gpt-oss's biased experts with the clamped SwiGLU
    /// ([`strata_kernels::GatedAct::Clamped`]); the biases are the layer's,
    /// one row per expert: gate and up `[num_experts, intermediate]`, down
    /// `[num_experts, hidden]`.
    Clamped { alpha: f32, limit: f32, gate_bias: &'a [f32], up_bias: &'a [f32], down_bias: &'a [f32] },
}

impl<'a> ExpertFfn<'a> {
    /// The activation of expert `expert`, its own bias rows picked out.
    fn of_expert(self, expert: usize, intermediate: usize, hidden: usize) -> GatedAct<'a> {
        match self {
            ExpertFfn::SwiGlu => GatedAct::SwiGlu,
            ExpertFfn::LimitedSwiGlu { limit } => GatedAct::LimitedSwiGlu { limit },
            ExpertFfn::Clamped { alpha, limit, gate_bias, up_bias, down_bias } => {
                let row = |bias: &'a [f32], width: usize| &bias[expert * width..(expert + 1) * width];
                GatedAct::Clamped {
                    alpha,
                    limit,
                    gate_bias: row(gate_bias, intermediate),
                    up_bias: row(up_bias, intermediate),
                    down_bias: row(down_bias, hidden),
                }
            }
        }
    }
}

/// Experts predicted for a layer not yet run.
#[derive(Debug, Clone, Copy)]
pub struct Guess<'a> {
    pub layer: usize,
    /// Distinct experts, most likely first where the predictor knows.
    pub experts: &'a [usize],
}

/// Adds the weighted routed-expert outputs of every token to `out`
/// (`[n_tokens, hidden]`), and accounts the time spent in `stats`.
///
/// Missing experts are requested first; resident ones are computed while
/// those loads are in flight; each loaded expert is computed as it arrives.
/// Every expert's output lands in its own slot, and slots are summed in a
/// fixed order at the end, so the result does not depend on residency.
pub fn run_moe_layer(
    store: &ExpertStore,
    threads: &Threads,
    batch: &MoeBatch<'_>,
    out: &mut [f32],
    stats: &mut LayerStats,
) -> Result<()> {
    let hidden = batch.hidden;
    let n_tokens = batch.xs.len() / hidden;
    assert_eq!(batch.routes.len(), n_tokens * batch.top_k, "routes are [n_tokens][top_k]");
    assert_eq!(out.len(), n_tokens * hidden, "output is [n_tokens, hidden]");

    let _span = tracing::debug_span!("moe_layer", layer = batch.layer).entered();
    let groups = union(batch.routes, batch.top_k);
    let key = |expert| ExpertKey { layer: batch.layer, expert };
    // place: look every distinct expert up once, leasing the resident ones.
    let mut resident = Vec::new();
    let mut missing = Vec::new();
    for &expert in groups.keys() {
        match store.lookup(key(expert))? {
            Some(buf) => resident.push((expert, buf)),
            None => missing.push(key(expert)),
        }
    }
    // overlap: the loads run while the resident experts are computed, and
    // the next layer's guessed records are read behind them.
    let (resident_experts, loaded_experts) = (resident.len(), missing.len());
    let stall_before_ns = stats.stall_ns;
    let mut bytes_loaded = 0usize;
    let mut loads = store.fetch(missing)?;
    if let Some(guess) = batch.prefetch {
        store.prefetch(guess.layer, guess.experts)?;
    }
    let mut slot_out = vec![0.0f32; batch.routes.len() * hidden];
    // Resident experts are independent: they run side by side across the
    // pool (a decode step's experts are each too small to split by rows).
    let started = Instant::now();
    let outputs: Vec<Vec<f32>> = threads.pool().install(|| {
        resident
            .par_iter()
            .map(|(expert, buf)| apply_expert(threads, batch, *expert, buf, &groups[expert]))
            .collect::<Result<_>>()
    })?;
    for ((expert, _), ys) in resident.iter().zip(&outputs) {
        scatter(&groups[expert], ys, hidden, &mut slot_out);
    }
    stats.compute_ns += started.elapsed().as_nanos() as u64;
    loop {
        let waiting = Instant::now();
        let Some((loaded, buf)) = loads.next() else { break };
        stats.stall_ns += waiting.elapsed().as_nanos() as u64;
        let buf = buf?;
        bytes_loaded += buf.len();
        let started = Instant::now();
        let members = &groups[&loaded.expert];
        let ys = apply_expert(threads, batch, loaded.expert, &buf, members)?;
        scatter(members, &ys, hidden, &mut slot_out);
        stats.compute_ns += started.elapsed().as_nanos() as u64;
    }
    drop(loads);
    tracing::debug!(
        resident_experts,
        loaded_experts,
        bytes_loaded,
        stall_ms = (stats.stall_ns - stall_before_ns) as f64 / 1e6,
        "experts loaded"
    );
    // learn: what this batch used, token by token.
    let token_experts: Vec<Vec<usize>> =
        batch.routes.chunks(batch.top_k.max(1)).map(|token| token.iter().map(|route| route.expert).collect()).collect();
    store.learn(batch.layer, token_experts.iter().map(Vec::as_slice));
    combine(batch, &slot_out, out);
    Ok(())
}

/// Runs one expert over the tokens routed to it: `[members, hidden]`.
fn apply_expert(
    threads: &Threads,
    batch: &MoeBatch<'_>,
    expert: usize,
    record: &Record,
    members: &[(usize, usize)],
) -> Result<Vec<f32>> {
    let hidden = batch.hidden;
    let matrices = batch.layout.matrices(record.as_slice()).map_err(|source| Error::Record {
        layer: batch.layer,
        expert,
        source: Box::new(source),
    })?;
    let m = members.len();
    let mut xs_sub = Vec::with_capacity(m * hidden);
    for &(token, _) in members {
        xs_sub.extend_from_slice(&batch.xs[token * hidden..(token + 1) * hidden]);
    }
    let mut ys = vec![0.0f32; m * hidden];
    let act = batch.experts.of_expert(expert, matrices[0].rows, hidden);
    gated_ffn(threads, &matrices, act, &xs_sub, &mut ys);
    Ok(ys)
}

/// Writes each member token's output row into its route's slot.
fn scatter(members: &[(usize, usize)], ys: &[f32], hidden: usize, slot_out: &mut [f32]) {
    for (row, &(_, slot)) in members.iter().enumerate() {
        slot_out[slot * hidden..(slot + 1) * hidden].copy_from_slice(&ys[row * hidden..(row + 1) * hidden]);
    }
}

/// Adds each token's weighted expert outputs in ascending expert order, the
/// order transformers' loop over experts uses.
fn combine(batch: &MoeBatch<'_>, slot_out: &[f32], out: &mut [f32]) {
    let hidden = batch.hidden;
    let top_k = batch.top_k;
    let mut order: Vec<usize> = Vec::with_capacity(top_k);
    for (token, out_row) in out.chunks_exact_mut(hidden).enumerate() {
        order.clear();
        order.extend(token * top_k..(token + 1) * top_k);
        order.sort_by_key(|&slot| batch.routes[slot].expert);
        for &slot in &order {
            let weight = batch.routes[slot].weight;
            let y = &slot_out[slot * hidden..(slot + 1) * hidden];
            for (o, &v) in out_row.iter_mut().zip(y) {
                *o += v * weight;
            }
        }
    }
}
