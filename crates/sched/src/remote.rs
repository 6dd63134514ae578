//! Experts computed elsewhere: the seam expert workers on other machines
//! plug into (`strata-dist`). A layer hands the share of its union that
//! workers hold out before it computes its own, and takes the outputs back
//! before it combines them, in the same fixed order, so where an expert ran
//! never changes the result.

/// One expert's share of a layer's union: the hidden states of the tokens
/// routed to it, `[tokens, hidden]`, in the union's order.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertCall {
    pub expert: usize,
    pub xs: Vec<f32>,
}

/// A share of a layer's union being computed elsewhere.
pub trait Pending: Send {
    /// Each call's output, `[tokens, hidden]`, in the order the calls were
    /// made; or why none came (a worker lost, late or refusing), and the
    /// layer then computes that expert itself.
    fn wait(self: Box<Self>) -> Vec<Result<Vec<f32>, String>>;
}

/// Where a layer's experts run, when some run on other machines.
pub trait RemoteExperts: Send + Sync + std::fmt::Debug {
    /// Whether `expert` of `layer` is computed by a worker.
    fn is_remote(&self, layer: usize, expert: usize) -> bool;

    /// Starts `calls` (each `hidden` wide) of `layer` on the workers that
    /// hold them, and returns without waiting.
    fn start(&self, layer: usize, hidden: usize, calls: Vec<ExpertCall>) -> Box<dyn Pending>;
}
