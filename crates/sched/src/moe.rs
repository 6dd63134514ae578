//! One MoE layer over a batch of tokens: union → place → overlap → learn.

use std::time::Instant;

use rayon::prelude::*;

use strata_format::ExpertLayout;
use strata_kernels::{GatedAct, Threads};
use strata_tier::{ExpertKey, ExpertStore, Record};

use crate::ffn::gated_ffn;
use crate::remote::{ExpertCall, RemoteExperts};
use crate::vram::{ExpertOnDevice, VramExperts};
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
    /// Workers computing some of this layer's experts on other machines
    /// (`None`: every expert runs here).
    pub remote: Option<&'a dyn RemoteExperts>,
    /// A GPU holding experts in VRAM (`None`: every expert runs on the
    /// CPU from its record).
    pub vram: Option<VramExperts<'a>>,
}

/// The feed-forward each routed expert of a layer computes.
#[derive(Debug, Clone, Copy)]
pub enum ExpertFfn<'a> {
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu,
    /// `down(silu(min(gate(x), limit)) * clamp(up(x), -limit, limit))`
    /// ([`strata_kernels::GatedAct::LimitedSwiGlu`]).
    LimitedSwiGlu { limit: f32 },
    /// Kimi K3's `down(b1·tanh(g/b1)·σ(g) · b2·tanh(u/b2))`
    /// ([`strata_kernels::GatedAct::SituGlu`]).
    SituGlu { beta: f32, linear_beta: f32 },
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
            ExpertFfn::SituGlu { beta, linear_beta } => GatedAct::SituGlu { beta, linear_beta },
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
/// With `batch.remote`, the share of the union workers hold is sent out
/// first and its outputs land in the same slots; what a worker fails to
/// compute is computed here, so where an expert ran changes nothing.
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
    // remote: the share of the union that workers hold goes out first, so
    // they compute it while this machine computes its own.
    // gpt-oss's biased experts are not served by workers (their biases are
    // the coordinator's): they stay here rather than be refused and cost
    // the worker.
    let remote = batch.remote.filter(|_| !matches!(batch.experts, ExpertFfn::Clamped { .. }));
    let remote_experts: Vec<usize> = match remote {
        Some(remote) => groups.keys().copied().filter(|&expert| remote.is_remote(batch.layer, expert)).collect(),
        None => Vec::new(),
    };
    let pending = match remote {
        Some(remote) if !remote_experts.is_empty() => {
            let calls = remote_experts
                .iter()
                .map(|&expert| ExpertCall { expert, xs: gather(batch, &groups[&expert]) })
                .collect();
            Some(remote.start(batch.layer, hidden, calls))
        }
        _ => None,
    };
    // place: look every distinct expert of this machine's share up once,
    // leasing the resident ones: in VRAM first, then in RAM.
    let mut on_device = Vec::new();
    let mut resident = Vec::new();
    let mut missing = Vec::new();
    for &expert in groups.keys().filter(|expert| remote_experts.binary_search(expert).is_err()) {
        if let Some(copy) = batch.vram.and_then(|vram| vram.lookup(key(expert))) {
            on_device.push((expert, copy));
            continue;
        }
        match store.lookup(key(expert))? {
            Some(buf) => resident.push((expert, buf)),
            None => missing.push(key(expert)),
        }
    }
    // overlap: the loads run while the resident experts are computed, and
    // the next layer's guessed records are read behind them.
    let (resident_experts, loaded_experts) = (on_device.len() + resident.len(), missing.len());
    let stall_before_ns = stats.stall_ns;
    let mut bytes_loaded = 0usize;
    let mut loads = store.fetch(missing)?;
    if let Some(guess) = batch.prefetch {
        store.prefetch(guess.layer, guess.experts)?;
    }
    // fill: experts in RAM but not in VRAM go up while the disk reads run.
    if let Some(vram) = batch.vram {
        let mut on_host = Vec::with_capacity(resident.len());
        for (expert, buf) in resident {
            match vram.upload(key(expert), batch.layout, &buf)? {
                Some(copy) => on_device.push((expert, copy)),
                None => on_host.push((expert, buf)),
            }
        }
        resident = on_host;
    }
    let mut slot_out = vec![0.0f32; batch.routes.len() * hidden];
    // Resident experts are independent: the host's run side by side across
    // the pool (a decode step's experts are each too small to split by
    // rows) while the device runs its own.
    let started = Instant::now();
    let (device_outputs, outputs) = threads.pool().install(|| {
        rayon::join(
            || {
                on_device
                    .iter()
                    .map(|(expert, copy)| on_the_device(threads, batch, *expert, copy, &groups[expert]))
                    .collect::<Vec<_>>()
            },
            || {
                resident
                    .par_iter()
                    .map(|(expert, buf)| apply_expert(threads, batch, *expert, buf, &groups[expert]))
                    .collect::<Result<Vec<_>>>()
            },
        )
    });
    let host_experts = resident.iter().map(|(expert, _)| expert);
    for (expert, ys) in
        on_device.iter().map(|(expert, _)| expert).chain(host_experts).zip(device_outputs.iter().chain(&outputs?))
    {
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
        let copy = match batch.vram {
            Some(vram) => vram.upload(loaded, batch.layout, &buf)?,
            None => None,
        };
        let ys = match copy {
            Some(copy) => on_the_device(threads, batch, loaded.expert, &copy, members),
            None => apply_expert(threads, batch, loaded.expert, &buf, members)?,
        };
        scatter(members, &ys, hidden, &mut slot_out);
        stats.compute_ns += started.elapsed().as_nanos() as u64;
    }
    drop(loads);
    if let Some(pending) = pending {
        let waiting = Instant::now();
        let outputs = pending.wait();
        stats.stall_ns += waiting.elapsed().as_nanos() as u64;
        assert_eq!(outputs.len(), remote_experts.len(), "one output per call");
        let mut failed = Vec::new();
        for (&expert, output) in remote_experts.iter().zip(outputs) {
            let members = &groups[&expert];
            match output {
                Ok(ys) if ys.len() == members.len() * hidden => scatter(members, &ys, hidden, &mut slot_out),
                Ok(_) => failed.push((expert, "an output of the wrong size".to_owned())),
                Err(why) => failed.push((expert, why)),
            }
        }
        if let Some((_, why)) = failed.first() {
            let experts = failed.len();
            tracing::warn!(layer = batch.layer, experts, %why, "experts not computed by their worker: computed here");
        }
        // A worker's share it did not compute is this machine's, from its
        // own store: the same record, the same kernels.
        for (expert, _) in failed {
            let record = fetch_one(store, key(expert))?;
            bytes_loaded += record.len();
            let members = &groups[&expert];
            let ys = apply_expert(threads, batch, expert, &record, members)?;
            scatter(members, &ys, hidden, &mut slot_out);
        }
    }
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
    compute_expert(threads, batch.layer, batch.layout, batch.experts, expert, record, &gather(batch, members))
}

/// Runs one expert over the tokens routed to it from its copy on the
/// device: `[members, hidden]`, bit for bit [`apply_expert`]'s.
fn on_the_device(
    threads: &Threads,
    batch: &MoeBatch<'_>,
    expert: usize,
    copy: &ExpertOnDevice,
    members: &[(usize, usize)],
) -> Vec<f32> {
    let vram = batch.vram.expect("a copy on the device comes from the batch's VRAM tier");
    let act = batch.experts.of_expert(expert, copy[0].rows(), copy[0].cols());
    vram.compute(threads, copy, act, &gather(batch, members))
}

/// The hidden states of the tokens routed to an expert, `[members, hidden]`.
fn gather(batch: &MoeBatch<'_>, members: &[(usize, usize)]) -> Vec<f32> {
    let hidden = batch.hidden;
    let mut xs_sub = Vec::with_capacity(members.len() * hidden);
    for &(token, _) in members {
        xs_sub.extend_from_slice(&batch.xs[token * hidden..(token + 1) * hidden]);
    }
    xs_sub
}

/// Runs expert `expert` of `layer`, whose record is `record`, over `xs`
/// (`[tokens, hidden]`): the one computation of an expert, here or on a
/// worker.
fn compute_expert(
    threads: &Threads,
    layer: usize,
    layout: &ExpertLayout,
    experts: ExpertFfn<'_>,
    expert: usize,
    record: &Record,
    xs: &[f32],
) -> Result<Vec<f32>> {
    let matrices = layout.matrices(record.as_slice()).map_err(|source| Error::Record {
        layer,
        expert,
        source: Box::new(source),
    })?;
    let hidden = matrices[0].cols;
    let mut ys = vec![0.0f32; xs.len()];
    let act = experts.of_expert(expert, matrices[0].rows, hidden);
    gated_ffn(threads, &matrices, act, xs, &mut ys);
    Ok(ys)
}

/// One record, from the cache or read now.
fn fetch_one(store: &ExpertStore, key: ExpertKey) -> Result<std::sync::Arc<Record>> {
    if let Some(record) = store.lookup(key)? {
        return Ok(record);
    }
    let (_, record) = store.fetch(vec![key])?.next().expect("a fetch yields every key it was given");
    Ok(record?)
}

/// What a worker does with a coordinator's share of a layer's union:
/// computes each call's expert here, reading records through `store`, and
/// returns each call's output in the calls' order.
pub fn run_expert_calls(
    store: &ExpertStore,
    threads: &Threads,
    layer: usize,
    layout: &ExpertLayout,
    experts: ExpertFfn<'_>,
    calls: &[ExpertCall],
) -> Result<Vec<Vec<f32>>> {
    calls
        .iter()
        .map(|call| {
            let hidden = layout.components[0].cols;
            if call.expert >= layout.num_experts || !call.xs.len().is_multiple_of(hidden) {
                let floats = call.xs.len();
                return Err(Error::Call {
                    layer,
                    expert: call.expert,
                    floats,
                    hidden,
                    num_experts: layout.num_experts,
                });
            }
            let record = fetch_one(store, ExpertKey { layer, expert: call.expert })?;
            compute_expert(threads, layer, layout, experts, call.expert, &record, &call.xs)
        })
        .collect()
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
