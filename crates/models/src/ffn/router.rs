//! Routers: a layer's [`RouterKind`] as the backend's route of that kind,
//! over its registered tensors.

use strata_format::{CoreSpec, MoeBlock, RouterKind, names};
use strata_sched::Route;

use crate::backend::Runtime;
use crate::backend::{Backend, RouteKind, RouterSpec};
use crate::error::{Error, Result};

/// One MoE layer's router: its weight, `[num_experts, hidden]`, and how its
/// logits become routes.
pub struct Router {
    spec: RouterSpec,
}

impl Router {
    /// Layer `layer`'s router tensors, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, block: &MoeBlock, layer: usize) -> Result<Self> {
        let weight = b.matrix(&names::router_name(spec, layer), block.num_experts, spec.hidden_size)?;
        let kind = match block.router {
            RouterKind::SoftmaxTopK { renormalize } => RouteKind::SoftmaxTopK { renormalize },
            RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, scaling } => RouteKind::GroupedSigmoid {
                n_group,
                topk_group,
                renormalize,
                scaling: scaling as f32,
                correction_bias: b.vector(&names::correction_bias_name(spec, layer), block.num_experts)?,
            },
            RouterKind::SharedExpertSink { .. } => return Err(Error::uncomposed("the shared-expert sink router")),
            RouterKind::TopKThenSoftmax => {
                RouteKind::TopKThenSoftmax { bias: b.vector(&names::router_bias_name(spec, layer), block.num_experts)? }
            }
        };
        Ok(Self { spec: RouterSpec { weight, kind, top_k: block.top_k } })
    }

    /// Each row of `xs`'s `top_k` routes, `[n][top_k]`.
    pub fn route(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32]) -> Vec<Route> {
        b.route(rt, &self.spec, xs)
    }
}
