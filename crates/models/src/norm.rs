//! RMSNorms, of either kind a [`NormKind`] names: `w · x̂` reads the stored
//! weight; `(1 + w) · x̂` adds the one once, at load, as transformers does
//! before its multiply (`x̂ * (1.0 + w.float())`), so both kinds then run the
//! same kernel and the result is the same bits.

use strata_format::NormKind;

use crate::backend::{Backend, VectorHandle};
use crate::error::Result;

/// One RMSNorm: its weight (as stored or shifted by one) and epsilon.
pub struct Norm {
    weight: VectorHandle,
    eps: f32,
}

impl Norm {
    /// The norm whose weight is the `len`-long tensor `name`.
    pub fn load(b: &mut Backend, name: &str, kind: NormKind, len: usize) -> Result<Self> {
        let stored = b.vector(name, len)?;
        Ok(match kind {
            NormKind::Weight { eps } => Self { weight: stored, eps },
            NormKind::OnePlusWeight { eps } => {
                let shifted = b.vector_values(stored).iter().map(|w| 1.0 + w).collect();
                Self { weight: b.upload_vector(shifted), eps }
            }
        })
    }

    /// Its weight as the kernel reads it (`1 + w` for that kind), for an
    /// operation that norms inside itself.
    pub fn into_weight(self) -> VectorHandle {
        self.weight
    }

    /// Normalises each row of `xs` into `out`.
    pub fn apply(&self, b: &Backend, xs: &[f32], out: &mut [f32]) {
        b.rmsnorm(self.weight, self.eps, xs, out);
    }

    /// Normalises every weight-wide chunk of `rows` in place.
    pub fn apply_rows(&self, b: &Backend, rows: &mut [f32]) {
        b.rmsnorm_rows(self.weight, self.eps, rows);
    }
}
