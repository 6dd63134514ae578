//! The SwiGLU feed-forward block, `down(silu(gate(x)) * up(x))`, shared by
//! routed experts and the dense MLPs of the model graphs.

use strata_kernels::{Matrix, Threads};

/// Applies the block to `xs` (`[n, hidden]`), writing `ys` (`[n, hidden]`),
/// with the kernels' fused expert FFN: the inputs are prepared once for gate
/// and up, whose rows are computed in step, so a record streams through the
/// caches once. Bit-identical to the three products one after another.
pub fn swiglu(threads: &Threads, [gate, up, down]: &[Matrix<'_>; 3], xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / gate.cols;
    assert_eq!(xs.len(), n * gate.cols, "inputs are [n, hidden]");
    threads.expert_ffn(gate, up, down, xs, n, ys);
}
