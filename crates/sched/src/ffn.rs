//! The SwiGLU feed-forward block, `down(silu(gate(x)) * up(x))`, shared by
//! routed experts and the dense MLPs of the model graphs.

use strata_kernels::{GatedAct, Matrix, Threads};

/// Applies the block to `xs` (`[n, hidden]`), writing `ys` (`[n, hidden]`),
/// with the kernels' fused expert FFN: the inputs are prepared once for gate
/// and up, whose rows are computed in step, so a record streams through the
/// caches once. Bit-identical to the three products one after another.
pub fn swiglu(threads: &Threads, matrices: &[Matrix<'_>; 3], xs: &[f32], ys: &mut [f32]) {
    gated_ffn(threads, matrices, GatedAct::SwiGlu, xs, ys);
}

/// The block with the activation and biases `act` says (see
/// [`Threads::gated_ffn`]); [`GatedAct::SwiGlu`] is [`swiglu`].
pub fn gated_ffn(threads: &Threads, [gate, up, down]: &[Matrix<'_>; 3], act: GatedAct<'_>, xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / gate.cols;
    assert_eq!(xs.len(), n * gate.cols, "inputs are [n, hidden]");
    threads.gated_ffn(gate, up, down, act, xs, n, ys);
}
