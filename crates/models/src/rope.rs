//! Rotary position embeddings: the frequency table and its application.

use strata_format::{RopeScaling, RopeSpec};
use strata_kernels::ops;

use crate::{Error, Result};

/// Inverse frequencies of one rotary head, computed the way transformers does
/// (in f32), so angles match the reference to the last bit where possible.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (1 except for YaRN-style scalings).
    attention_scaling: f32,
}

impl Rope {
    /// The table for `rotary_dim`-wide heads.
    pub fn new(spec: &RopeSpec, rotary_dim: usize) -> Result<Self> {
        if rotary_dim == 0 || rotary_dim % 2 != 0 {
            return Err(Error::Unsupported(format!("rotary dimension {rotary_dim} must be even and non-zero")));
        }
        let base = spec.theta as f32;
        let mut inv_freq: Vec<f32> = (0..rotary_dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / rotary_dim as f32))
            .collect();
        match &spec.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                let factor = *factor as f32;
                inv_freq.iter_mut().for_each(|f| *f /= factor);
            }
            #[allow(unreachable_patterns)]
            other => return Err(Error::Unsupported(format!("rope scaling {other:?} is not supported yet"))),
        }
        Ok(Self { inv_freq, attention_scaling: 1.0 })
    }

    /// Fills `cos` and `sin` (each `rotary_dim / 2`) for `position`.
    pub fn angles(&self, position: usize, cos: &mut [f32], sin: &mut [f32]) {
        let p = position as f32;
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            let angle = p * f;
            *c = angle.cos() * self.attention_scaling;
            *s = angle.sin() * self.attention_scaling;
        }
    }

    /// Rotates every `head_dim`-wide head of `row` (rotate-half convention).
    pub fn apply_neox(&self, row: &mut [f32], head_dim: usize, position: usize) {
        let half = self.inv_freq.len();
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        self.angles(position, &mut cos, &mut sin);
        for head in row.chunks_exact_mut(head_dim) {
            ops::rope_neox(&mut head[..2 * half], &cos, &sin);
        }
    }
}
