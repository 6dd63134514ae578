//! Running one MoE layer's routed experts over a batch of tokens.

use strata_format::ExpertLayout;
use strata_kernels::Threads;
use strata_tier::{ExpertKey, ExpertStore};

use crate::{Error, Result, Route, swiglu, union};

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
}

/// Adds the weighted routed-expert outputs of every token to `out`
/// (`[n_tokens, hidden]`).
pub fn run_moe_layer(
    store: &ExpertStore,
    threads: &Threads,
    batch: &MoeBatch<'_>,
    out: &mut [f32],
) -> Result<()> {
    let hidden = batch.hidden;
    let n_tokens = batch.xs.len() / hidden;
    assert_eq!(batch.routes.len(), n_tokens * batch.top_k, "routes are [n_tokens][top_k]");
    assert_eq!(out.len(), n_tokens * hidden, "output is [n_tokens, hidden]");

    // Per-slot expert outputs, combined at the end in a fixed order.
    let mut slot_out = vec![0.0f32; batch.routes.len() * hidden];
    for (expert, members) in union(batch.routes, batch.top_k) {
        let key = ExpertKey { layer: batch.layer, expert };
        let record = store.get(key)?;
        let matrices = batch
            .layout
            .matrices(record.as_slice())
            .map_err(|source| Error::Record { layer: batch.layer, expert, source })?;
        let m = members.len();
        let mut xs_sub = Vec::with_capacity(m * hidden);
        for &(token, _) in &members {
            xs_sub.extend_from_slice(&batch.xs[token * hidden..(token + 1) * hidden]);
        }
        let mut ys = vec![0.0f32; m * hidden];
        swiglu(threads, &matrices, &xs_sub, &mut ys);
        for (row, &(_, slot)) in members.iter().enumerate() {
            slot_out[slot * hidden..(slot + 1) * hidden].copy_from_slice(&ys[row * hidden..(row + 1) * hidden]);
        }
    }
    combine(batch, &slot_out, out);
    Ok(())
}

/// Adds each token's weighted expert outputs in ascending expert order, the
/// order transformers' loop over experts uses.
fn combine(batch: &MoeBatch<'_>, slot_out: &[f32], out: &mut [f32]) {
    let hidden = batch.hidden;
    let top_k = batch.top_k;
    let mut order: Vec<usize> = Vec::with_capacity(top_k);
    for (token, out_row) in out.chunks_exact_mut(hidden).enumerate() {
        let slots = token * top_k..(token + 1) * top_k;
        order.clear();
        order.extend(slots);
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
