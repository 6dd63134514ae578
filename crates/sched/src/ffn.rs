//! The SwiGLU feed-forward block, `down(silu(gate(x)) * up(x))`, shared by
//! routed experts and the dense MLPs of the model graphs.

use strata_kernels::{Matrix, Threads, ops};

/// Applies the block to `xs` (`[n, hidden]`), writing `ys` (`[n, hidden]`).
pub fn swiglu(threads: &Threads, [gate, up, down]: &[Matrix<'_>; 3], xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / gate.cols;
    assert_eq!(xs.len(), n * gate.cols, "inputs are [n, hidden]");
    assert_eq!(ys.len(), n * down.rows, "outputs are [n, hidden]");
    assert!(up.rows == gate.rows && down.cols == gate.rows, "gate, up and down agree");
    let mut g = vec![0.0f32; n * gate.rows];
    let mut u = vec![0.0f32; n * up.rows];
    threads.matmul(gate, xs, n, &mut g);
    threads.matmul(up, xs, n, &mut u);
    ops::silu_mul(&mut g, &u);
    threads.matmul(down, &g, n, ys);
}
