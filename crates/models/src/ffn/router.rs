//! Routers: a layer's [`RouterKind`] as the backend's route of that kind,
//! over its registered tensors.

use strata_format::{CoreSpec, MoeBlock, RouterKind, names};
use strata_sched::Route;

use crate::backend::Runtime;
use crate::backend::{Backend, RouteKind, RouterSpec, VectorHandle};
use crate::error::{Error, Result};

/// One MoE layer's router: its weight, `[num_experts, hidden]`, and how its
/// logits become routes.
pub struct Router {
    spec: RouterSpec,
}

impl Router {
    /// Layer `layer`'s router tensors, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, block: &MoeBlock, layer: usize) -> Result<Self> {
        let weight = b.matrix(&names::router_name(spec, layer), block.router_rows(), spec.hidden_size)?;
        let kind = match block.router {
            RouterKind::SoftmaxTopK { renormalize } => RouteKind::SoftmaxTopK { renormalize },
            RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, scaling } => RouteKind::GroupedSigmoid {
                n_group,
                topk_group,
                renormalize,
                scaling: scaling as f32,
                correction_bias: b.vector(&names::correction_bias_name(spec, layer), block.num_experts)?,
            },
            RouterKind::SharedExpertSink { route_scale } => RouteKind::SharedExpertSink {
                n_shared: block.router_rows() - block.num_experts,
                route_scale: route_scale as f32,
                global_scale: super::load_scalar(b, &names::global_scale_name(spec, layer, "mlp.gate"))?,
                correction_bias: b.vector(&names::correction_bias_name(spec, layer), block.num_experts)?,
            },
            RouterKind::TopKThenSoftmax => {
                RouteKind::TopKThenSoftmax { bias: b.vector(&names::router_bias_name(spec, layer), block.num_experts)? }
            }
            RouterKind::SqrtSoftplus { scaling } => RouteKind::SqrtSoftplus {
                scaling: scaling as f32,
                correction_bias: b.vector(&names::correction_bias_name(spec, layer), block.num_experts)?,
            },
            RouterKind::Hash { scaling } => {
                RouteKind::Hash { scaling: scaling as f32, table: hash_table(b, spec, block, layer)? }
            }
        };
        Ok(Self { spec: RouterSpec { weight, kind, top_k: block.top_k } })
    }

    /// Each row of `xs`'s `top_k` routes, `[n][top_k]`; row `i` is token
    /// `tokens[i]`'s.
    pub fn route(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], tokens: &[u32]) -> Vec<Route> {
        b.route(rt, &self.spec, xs, tokens)
    }

    /// [`Self::route`], and a shared-expert sink's weights of the shared
    /// experts, `[n, n_shared]` (empty for other kinds).
    pub fn route_with_shares(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        xs: &[f32],
        tokens: &[u32],
    ) -> (Vec<Route>, Vec<f32>) {
        b.route_with_shares(rt, &self.spec, xs, tokens)
    }
}

/// A hash layer's table of expert ids, `[vocab, top_k]`, refused unless
/// every id is a whole number below the expert count: the table is data
/// from the checkpoint, and routing indexes experts by it.
fn hash_table(b: &mut Backend, spec: &CoreSpec, block: &MoeBlock, layer: usize) -> Result<VectorHandle> {
    let name = names::hash_table_name(spec, layer);
    let table = b.vector(&name, spec.vocab_size * block.top_k)?;
    let experts = block.num_experts as f32;
    if let Some(id) = b.vector_values(table).iter().find(|&&id| !(id >= 0.0 && id < experts && id.fract() == 0.0)) {
        return Err(Error::Unsupported(format!("{name}: {id} is not an expert id (0..{})", block.num_experts)));
    }
    Ok(table)
}
