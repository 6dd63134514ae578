//! Rotary position embeddings: the frequency table (plain, linear, YaRN)
//! and each pass's angles; the backend rotates (`Backend::rotate`).

use strata_format::{RopeScaling, RopeSpec};

use crate::error::{Error, Result};

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
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(Error::Unsupported(format!("rotary dimension {rotary_dim} must be even and non-zero")));
        }
        let base = spec.theta as f32;
        // base ** (arange(0, dim, 2).float() / dim), in f32.
        let pos_freqs: Vec<f32> = (0..rotary_dim / 2).map(|i| base.powf((2 * i) as f32 / rotary_dim as f32)).collect();
        let inv_freq = match spec.scaling {
            RopeScaling::None => pos_freqs.iter().map(|p| 1.0 / p).collect(),
            RopeScaling::Linear { factor } => {
                let factor = factor as f32;
                pos_freqs.iter().map(|p| 1.0 / p / factor).collect()
            }
            RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, truncate, .. } => {
                yarn_inv_freq(
                    &pos_freqs,
                    spec.theta,
                    factor,
                    original_max_position_embeddings,
                    beta_fast,
                    beta_slow,
                    truncate,
                )
            }
        };
        Ok(Self { inv_freq, attention_scaling: spec.scaling.attention_factor() as f32 })
    }

    /// Angles per position: `rotary_dim / 2`.
    pub fn half(&self) -> usize {
        self.inv_freq.len()
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
}

/// cos and sin of consecutive positions, computed once per forward pass and
/// shared by every layer.
#[derive(Debug, Clone)]
pub struct Angles {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Angles {
    /// The angles of `positions`, one row each (a batch's rows, whose
    /// sequences each start at their own position).
    pub fn new(rope: &Rope, positions: &[usize]) -> Self {
        let half = rope.half();
        let n = positions.len();
        let (mut cos, mut sin) = (vec![0.0f32; n * half], vec![0.0f32; n * half]);
        for ((c, s), &position) in cos.chunks_exact_mut(half).zip(sin.chunks_exact_mut(half)).zip(positions) {
            rope.angles(position, c, s);
        }
        Self { half, cos, sin }
    }

    /// The angles of rows `rows` (one sequence of a batch).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Self {
        let span = rows.start * self.half..rows.end * self.half;
        Self { half: self.half, cos: self.cos[span.clone()].to_vec(), sin: self.sin[span].to_vec() }
    }

    /// The rotation back: the same angles negated (cos kept, sin negated),
    /// as transformers undoes a rotation with `-sin`.
    pub fn inverse(&self) -> Self {
        Self { half: self.half, cos: self.cos.clone(), sin: self.sin.iter().map(|s| -s).collect() }
    }

    /// cos and sin of the `i`-th position.
    pub fn at(&self, i: usize) -> (&[f32], &[f32]) {
        let range = i * self.half..(i + 1) * self.half;
        (&self.cos[range.clone()], &self.sin[range])
    }

    /// cos and sin of every position, `[positions, dim / 2]` each.
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// How many positions' angles this holds.
    pub fn row_count(&self) -> usize {
        self.cos.len() / self.half
    }

    /// Rotated width: twice the number of angles.
    pub fn dim(&self) -> usize {
        2 * self.half
    }
}

/// `_compute_yarn_parameters`: frequencies below the correction range keep
/// their value (extrapolation), those above are divided by `factor`
/// (interpolation), with a linear ramp between. Scalars in f64 as Python
/// computes them, tensors in f32.
fn yarn_inv_freq(
    pos_freqs: &[f32],
    base: f64,
    factor: f64,
    original_max_position_embeddings: usize,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
) -> Vec<f32> {
    let dim = (2 * pos_freqs.len()) as f64;
    let correction_dim = |rotations: f64| {
        dim * (original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min(dim - 1.0);
    if low == high {
        high += 0.001; // transformers: "Prevent singularity"
    }
    let factor32 = factor as f32;
    let span = (high - low) as f32;
    pos_freqs
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let ramp = ((i as f32 - low as f32) / span).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            let interpolation = 1.0 / (factor32 * p);
            let extrapolation = 1.0 / p;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_keeps_fast_frequencies_and_scales_slow_ones() {
        let spec = RopeSpec {
            theta: 10000.0,
            scaling: RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 64,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 1.0,
                mscale_all_dim: 0.707,
                attention_factor: None,
                truncate: true,
            },
            rotary_dim: 16,
        };
        let rope = Rope::new(&spec, 16).unwrap();
        let plain = Rope::new(&RopeSpec { scaling: RopeScaling::None, ..spec }, 16).unwrap();
        // Correction range [0, ceil(16 ln(64/2pi) / (2 ln 1e4))] = [0, 3].
        assert_eq!(rope.inv_freq[0], plain.inv_freq[0]);
        assert_eq!(rope.inv_freq[7], 1.0 / (4.0 * 10000f32.powf(14.0 / 16.0)));
        let a = ((0.1 * 4f64.ln() + 1.0) / (0.1 * 0.707 * 4f64.ln() + 1.0)) as f32;
        assert_eq!(rope.attention_scaling, a);
    }
}
