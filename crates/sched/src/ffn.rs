//! The SwiGLU feed-forward block, `down(act(gate(x), up(x)))`, shared by
//! routed experts and the dense MLPs and shared experts of the model
//! graphs.

use strata_kernels::{GatedAct, Matrix, Threads};

/// Applies the block to `xs` (`[n, hidden]`), writing `ys` (`[n, hidden]`),
/// with the kernels' fused expert FFN: the inputs are prepared once for gate
/// and up, whose rows are computed in step, so a record streams through the
/// caches once, and the activation and biases are as `act` says (see
/// [`Threads::gated_ffn`]). Bit-identical to the three products one after
/// another.
pub fn gated_ffn(threads: &Threads, [gate, up, down]: &[Matrix<'_>; 3], act: GatedAct<'_>, xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / gate.cols;
    assert_eq!(xs.len(), n * gate.cols, "inputs are [n, hidden]");
    threads.gated_ffn(gate, up, down, act, xs, n, ys);
}
