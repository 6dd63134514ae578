//! Projections with optional biases, as every block runs them.

use strata_format::Container;

use crate::{Result, Runtime};

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
    rt.ops().matmul(&m, xs, n, &mut out);
    if let Some(bias) = bias {
        add_bias(&mut out, c.dense_vec(bias)?);
    }
    Ok(out)
}
