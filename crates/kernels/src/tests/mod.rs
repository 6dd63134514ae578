//! In-crate tests: every vector path against the scalar reference, the
//! quantizers' error bounds, buffer validation and thread-count invariance.
//!
//! Proptest case counts are kept modest so the suite runs in seconds on a
//! two-core machine.

mod gdn;
mod gdn_torch;
mod gpu;
mod int;
mod matrix;
mod mxfp4;
mod ops;
mod quant;
mod simd;
mod threads;

use proptest::prelude::*;

/// Proptest cases per property.
pub(crate) const CASES: u32 = 96;

/// Relative tolerance of a reordered `f32` sum, against `sum |a||b|`.
pub(crate) const REL_TOL: f32 = 1e-5;

/// Asserts that a reordered dot product agrees with the reference, within
/// `REL_TOL * magnitude` (`magnitude = sum |a_i b_i|`) plus a tiny absolute
/// slack for sums that cancel to zero.
pub(crate) fn assert_close(got: f32, want: f32, magnitude: f32, what: &str) {
    let tol = REL_TOL * magnitude + 1e-6;
    assert!((got - want).abs() <= tol, "{what}: got {got}, want {want} (diff {}, tol {tol})", (got - want).abs());
}

/// `sum |a_i| |b_i|`, the scale of the rounding error of `a . b`.
pub(crate) fn magnitude(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
}

/// Values of moderate size with both signs.
pub(crate) fn values(len: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-2.0f32..2.0, len)
}

/// Column counts 0..=300: covers empty rows, sub-vector lengths and every
/// residue modulo the vector widths (8, 16, 32, 64).
pub(crate) fn cols() -> impl Strategy<Value = usize> {
    0usize..=300
}

/// Group sizes, including odd ones and ones that do not divide typical
/// column counts (so partial last groups appear).
pub(crate) fn group() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=9, Just(16usize), Just(32usize), Just(33usize), Just(64usize), Just(128usize),]
}
