//! In-crate tests: every vector path against the scalar reference, the
//! quantizers' error bounds, buffer validation and thread-count invariance.
//!
//! Proptest case counts are kept modest so the suite runs in seconds on a
//! two-core machine.

mod accel;
#[cfg(feature = "cuda")]
mod cuda;
mod gdn;
mod gdn_torch;
mod inkling_torch;
mod int;
mod kimi_k3_torch;
mod matrix;
mod mxfp4;
mod ops;
mod quant;
mod simd;
mod threads;

use std::path::PathBuf;

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

/// `testdata/DIR/NAME.npy`, a C-order little-endian f32 `.npy` file written
/// by a reference script: (shape, values). Only what `np.save` writes for
/// such arrays (format 1.0) is accepted.
pub(crate) fn load_npy(dir: &str, name: &str) -> (Vec<usize>, Vec<f32>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(dir).join(format!("{name}.npy"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "{name}: not an .npy 1.0 file");
    let header_len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).expect("ascii header");
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{name}: {header}");
    let dims = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).expect("shape");
    let shape: Vec<usize> =
        dims.split(',').filter(|d| !d.trim().is_empty()).map(|d| d.trim().parse().unwrap()).collect();
    let values: Vec<f32> =
        bytes[10 + header_len..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(values.len(), shape.iter().product::<usize>(), "{name}: {shape:?} vs {} values", values.len());
    (shape, values)
}
