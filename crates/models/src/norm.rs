//! RMSNorms, of either kind a [`NormKind`] names: `w · x̂` reads the stored
//! weight; `(1 + w) · x̂` adds the one once, at load, as transformers does
//! before its multiply (`x̂ * (1.0 + w.float())`), so both kinds then run the
//! same kernel and the result is the same bits.

use strata_format::{Container, NormKind};

use crate::weights::vector;
use crate::{Result, Runtime};

/// One RMSNorm: its weight (as stored or shifted by one) and epsilon.
pub struct Norm {
    weight: Weight,
    eps: f32,
}

enum Weight {
    /// The container's tensor, read in place.
    Stored(String),
    /// `1 + w`, computed at load.
    Shifted(Vec<f32>),
}

impl Norm {
    /// The norm whose weight is the `len`-long tensor `name`.
    pub fn load(c: &Container, name: String, kind: NormKind, len: usize) -> Result<Self> {
        let stored = vector(c, &name, len)?;
        Ok(match kind {
            NormKind::Weight { eps } => Self { weight: Weight::Stored(name), eps },
            NormKind::OnePlusWeight { eps } => {
                Self { weight: Weight::Shifted(stored.iter().map(|w| 1.0 + w).collect()), eps }
            }
        })
    }

    fn weight<'a>(&'a self, c: &'a Container) -> Result<&'a [f32]> {
        match &self.weight {
            Weight::Stored(name) => Ok(c.dense_vec(name)?),
            Weight::Shifted(weight) => Ok(weight),
        }
    }

    /// Normalises each row of `xs` into `out`.
    pub fn apply(&self, rt: &Runtime<'_>, c: &Container, xs: &[f32], out: &mut [f32]) -> Result<()> {
        rt.ops().rmsnorm_into(xs, self.weight(c)?, self.eps, out);
        Ok(())
    }

    /// Normalises every weight-wide chunk of `rows` in place.
    pub fn apply_rows(&self, rt: &Runtime<'_>, c: &Container, rows: &mut [f32]) -> Result<()> {
        let weight = self.weight(c)?;
        rt.ops().rmsnorm_rows(rows, weight, self.eps, weight.len());
        Ok(())
    }
}
