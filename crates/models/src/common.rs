//! Projections with optional biases, as every block runs them.

use crate::backend::Runtime;
use crate::backend::{Backend, MatrixHandle, VectorHandle};
use crate::error::Result;

/// A registered weight `[rows, cols]` and its optional bias `[rows]`.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub weight: MatrixHandle,
    pub bias: Option<VectorHandle>,
}

impl Linear {
    /// Registers `weight`, checked to be `[rows, cols]`, and `bias`, if
    /// named, checked to hold `rows` values.
    pub fn load(b: &mut Backend, weight: &str, bias: Option<&str>, rows: usize, cols: usize) -> Result<Self> {
        let weight = b.matrix(weight, rows, cols)?;
        let bias = bias.map(|bias| b.vector(bias, rows)).transpose()?;
        Ok(Self { weight, bias })
    }

    /// `y = W x` for every row of `xs` (`[n, cols]`), plus the bias.
    pub fn apply(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32]) -> Vec<f32> {
        let n = xs.len() / self.weight.cols;
        let mut out = vec![0.0f32; n * self.weight.rows];
        b.matmul(rt, self.weight, xs, &mut out);
        if let Some(bias) = self.bias {
            b.add_bias(&mut out, bias);
        }
        out
    }
}
