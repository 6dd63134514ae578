//! The mixture-of-experts block: a router picks each token's experts, the
//! routed experts run through the one expert pipeline ([`strata_sched`]),
//! and shared experts, if any, run resident beside them.

use strata_format::{CoreSpec, ExpertKind, LatentMoe, MoeBlock, SharedExperts, SwiGlu, names};
use strata_sched::{Guess, LayerStats, Route};
use strata_tier::TraceWriter;

use super::load_swiglu;
use super::router::Router;
use crate::backend::Runtime;
use crate::backend::{Backend, ExpertFfnKind, ExpertsHandle, MatrixHandle, MoeJob, VectorHandle};
use crate::common::Linear;
use crate::error::Result;

/// One layer's MoE block.
pub struct Moe {
    router: Router,
    experts: ExpertsHandle,
    /// What each routed expert computes, with its biases' handles (boxed:
    /// `Ffn` stays small).
    ffn: Box<ExpertFfnKind>,
    top_k: usize,
    hidden: usize,
    /// The shared experts' gate, up, down (a sink's stacked, one block of
    /// rows per shared expert).
    shared: Option<[MatrixHandle; 3]>,
    /// Whether the router weighs each shared expert (a shared-expert sink).
    shared_weighed: bool,
    /// What the shared experts' SwiGLU clamps.
    shared_swiglu: SwiGlu,
    /// The shared expert's sigmoid gate, `[1, hidden]`, if it has one.
    shared_gate: Option<Linear>,
    /// Kimi K3's latent, where the routed experts run (boxed: `Ffn` stays
    /// small).
    latent: Option<Box<Latent>>,
}

/// A latent MoE's shared projections and norm ([`strata_format::LatentMoe`]).
struct Latent {
    /// `routed_expert_down_proj`, `[width, hidden]`.
    down: Linear,
    /// `routed_expert_up_proj`, `[hidden, width]`.
    up: Linear,
    /// `routed_expert_norm`, `[width]`, on the routed sum.
    norm: VectorHandle,
    norm_eps: f32,
    width: usize,
}

impl Latent {
    fn load(b: &mut Backend, spec: &CoreSpec, latent: LatentMoe, layer: usize) -> Result<Self> {
        let (h, width) = (spec.hidden_size, latent.width);
        let [down, up, norm] = names::latent_moe_names(spec, layer);
        Ok(Self {
            down: Linear::load(b, &down, None, width, h)?,
            up: Linear::load(b, &up, None, h, width)?,
            norm: b.vector(&norm, width)?,
            norm_eps: latent.norm_eps,
            width,
        })
    }
}

impl Moe {
    /// Layer `layer`'s router and shared experts, shape-checked, and its
    /// expert layout checked present.
    pub fn load(b: &mut Backend, spec: &CoreSpec, block: &MoeBlock, layer: usize) -> Result<Self> {
        let h = spec.hidden_size;
        let router = Router::load(b, spec, block, layer)?;
        let experts = b.experts(layer)?;
        let ffn = match block.experts {
            ExpertKind::SwiGlu => match block.swiglu {
                SwiGlu::Plain => ExpertFfnKind::SwiGlu,
                SwiGlu::Limited { limit } => ExpertFfnKind::LimitedSwiGlu { limit },
                SwiGlu::Situ { beta, linear_beta } => ExpertFfnKind::SituGlu { beta, linear_beta },
            },
            ExpertKind::ClampedSwiGlu { alpha, limit } => {
                // A row per expert (bounded sizes: MAX_EXPERTS x MAX_INTERMEDIATE).
                let [gate, up, down] = names::expert_bias_names(spec, layer);
                let (e, i) = (block.num_experts, block.intermediate_size);
                ExpertFfnKind::Clamped {
                    alpha,
                    limit,
                    gate_bias: b.vector(&gate, e * i)?,
                    up_bias: b.vector(&up, e * i)?,
                    down_bias: b.vector(&down, e * h)?,
                }
            }
        };
        let (shared, shared_gate) = match block.shared {
            SharedExperts::None => (None, None),
            SharedExperts::Plain { intermediate_size } => (
                Some(load_swiglu(b, names::shared_expert_names(spec, layer, block.shared), h, intermediate_size)?),
                None,
            ),
            SharedExperts::Sink { count, intermediate_size } => {
                let [gate, up, down] = names::sink_shared_expert_names(spec, layer);
                let stacked = count * intermediate_size;
                let mlp = [
                    b.matrix(&gate, stacked, h)?,
                    b.matrix(&up, stacked, h)?,
                    b.matrix(&down, count * h, intermediate_size)?,
                ];
                (Some(mlp), None)
            }
            SharedExperts::Gated { intermediate_size } => {
                let gate = Linear::load(b, &names::shared_expert_gate_name(spec, layer), None, 1, h)?;
                let mlp = load_swiglu(b, names::shared_expert_names(spec, layer, block.shared), h, intermediate_size)?;
                (Some(mlp), Some(gate))
            }
        };
        Ok(Self {
            router,
            experts,
            ffn: Box::new(ffn),
            top_k: block.top_k,
            hidden: h,
            shared,
            shared_weighed: matches!(block.shared, SharedExperts::Sink { .. }),
            shared_swiglu: block.swiglu,
            shared_gate,
            latent: block.latent.map(|latent| Latent::load(b, spec, latent, layer).map(Box::new)).transpose()?,
        })
    }

    /// The distinct experts the router picks for the rows of `xs`, in
    /// route order (each row's heaviest first); row `i` is token `tokens[i]`'s.
    pub fn predict(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], tokens: &[u32]) -> Vec<usize> {
        let mut experts = Vec::new();
        for route in self.router.route(rt, b, xs, tokens) {
            if !experts.contains(&route.expert) {
                experts.push(route.expert);
            }
        }
        experts
    }

    /// Adds the block's output for `xs` to the residual stream `out`,
    /// prefetching `guess` once this layer's resident experts are leased.
    #[allow(clippy::too_many_arguments)]
    pub fn add_to(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        positions: &[usize],
        tokens: &[u32],
        xs: &[f32],
        out: &mut [f32],
        guess: Option<Guess<'_>>,
    ) -> Result<()> {
        let (routes, shares) = self.router.route_with_shares(rt, b, xs, tokens);
        if let Some(latent) = &self.latent {
            // The router reads x; the experts, z = down(x); the routed sum is
            // normed and brought back before the shared experts join it.
            let z = latent.down.apply(rt, b, xs);
            let mut sum = vec![0.0f32; z.len()];
            self.run_routed(rt, b, layer, positions, (&z, latent.width), &routes, &mut sum, guess)?;
            b.rmsnorm_rows(latent.norm, latent.norm_eps, &mut sum);
            let mut ys = latent.up.apply(rt, b, &sum);
            self.add_shared(rt, b, xs, &shares, &mut ys);
            out.iter_mut().zip(&ys).for_each(|(o, y)| *o += y);
            return Ok(());
        }
        if self.shared.is_none() {
            // Without shared experts the routed outputs go straight into the
            // residual stream.
            return self.run_routed(rt, b, layer, positions, (xs, self.hidden), &routes, out, guess);
        }
        // transformers adds the shared experts to the routed sum before the
        // residual; keep that order.
        let mut ys = vec![0.0f32; out.len()];
        self.run_routed(rt, b, layer, positions, (xs, self.hidden), &routes, &mut ys, guess)?;
        self.add_shared(rt, b, xs, &shares, &mut ys);
        out.iter_mut().zip(&ys).for_each(|(o, y)| *o += y);
        Ok(())
    }

    /// Adds the shared experts' output for `xs` to the routed output `ys`.
    fn add_shared(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], shares: &[f32], ys: &mut [f32]) {
        let Some(shared) = &self.shared else { return };
        let mut shared_out = vec![0.0f32; ys.len()];
        if self.shared_weighed {
            b.weighted_shared_experts(rt, shared, xs, shares, &mut shared_out);
        } else {
            b.swiglu(rt, shared, self.shared_swiglu, xs, &mut shared_out);
        }
        if let Some(gate) = &self.shared_gate {
            // sigmoid(w · x) per row scales that row's shared output.
            let logits = gate.apply(rt, b, xs);
            b.sigmoid_gate(&mut shared_out, &logits);
        }
        ys.iter_mut().zip(&shared_out).for_each(|(y, v)| *y += v);
    }

    /// Adds the routed experts' weighted outputs for the rows `xs` (each
    /// `width` wide: the hidden states, or a latent MoE's `z`) to `out`,
    /// recording the routes in the trace and the time in the run statistics.
    #[allow(clippy::too_many_arguments)]
    fn run_routed(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        positions: &[usize],
        (xs, width): (&[f32], usize),
        routes: &[Route],
        out: &mut [f32],
        guess: Option<Guess<'_>>,
    ) -> Result<()> {
        if let Some(trace) = rt.trace {
            record_routes(&mut trace.lock().unwrap_or_else(|p| p.into_inner()), layer, positions, routes, self.top_k)?;
        }
        assert_eq!(self.experts.layer, layer, "a block runs its own layer's experts");
        let job = MoeJob {
            experts: self.experts,
            ffn: *self.ffn,
            xs,
            hidden: width,
            routes,
            top_k: self.top_k,
            prefetch: guess,
        };
        let mut layer_stats = LayerStats::default();
        let result = b.run_moe_layer(rt, &job, out, &mut layer_stats);
        rt.stats.lock().unwrap_or_else(|p| p.into_inner()).add(layer_stats);
        result
    }
}

fn record_routes(
    trace: &mut TraceWriter,
    layer: usize,
    positions: &[usize],
    routes: &[Route],
    top_k: usize,
) -> Result<()> {
    for (&position, token_routes) in positions.iter().zip(routes.chunks_exact(top_k)) {
        let experts: Vec<usize> = token_routes.iter().map(|r| r.expert).collect();
        trace.write(layer, position as u64, &experts)?;
    }
    Ok(())
}
