//! Row operations every block shares: RMSNorm over rows and projections
//! with optional biases.

use strata_format::Container;
use strata_kernels::ops;

use crate::{Result, Runtime};

/// RMS-normalises each `weight.len()`-wide row of `xs` into `out`.
pub fn rmsnorm_into(xs: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    for (x, o) in xs.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
        ops::rmsnorm(x, weight, eps, o);
    }
}

/// RMS-normalises every `width`-wide chunk of `rows` in place.
pub fn rmsnorm_rows(rows: &mut [f32], weight: &[f32], eps: f32, width: usize) {
    assert_eq!(weight.len(), width, "norm weight matches its span");
    for chunk in rows.chunks_exact_mut(width) {
        ops::rmsnorm_inplace(chunk, weight, eps);
    }
}

/// Adds `bias` to every row of `rows`.
pub fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    }
}

/// `y = W x` for every row of `xs` (`[n, cols]`), plus an optional bias.
pub fn project(rt: &Runtime<'_>, c: &Container, weight: &str, bias: Option<&str>, xs: &[f32]) -> Result<Vec<f32>> {
    let m = c.dense(weight)?;
    let n = xs.len() / m.cols;
    let mut out = vec![0.0f32; n * m.rows];
    rt.threads.matmul(&m, xs, n, &mut out);
    if let Some(bias) = bias {
        add_bias(&mut out, c.dense_vec(bias)?);
    }
    Ok(out)
}
