//! What the blocks' tests against torch share: the case directories a
//! reference script under `xtask/fixtures/` wrote into `testdata/`, their
//! `.npy` arrays, and agreement relative to each tensor's largest magnitude.

use std::path::{Path, PathBuf};

/// Agreement with torch, relative to the largest magnitude of each tensor.
pub(super) const TORCH_REL_TOL: f32 = 1e-5;

/// The case directories under `testdata/<under>`, sorted; at least
/// `at_least` of them, as `what` needs.
pub(super) fn case_dirs(under: &str, at_least: usize, what: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(under);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|entry| entry.expect("listed").path())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= at_least, "{what}: {dirs:?}");
    dirs
}

/// `case/NAME.npy`: (shape, values).
pub(super) fn load(case: &Path, name: &str) -> (Vec<usize>, Vec<f32>) {
    strata_format::npy::read_f32(case.join(format!("{name}.npy"))).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `got` within [`TORCH_REL_TOL`] of `want`'s largest magnitude, element by element.
pub(super) fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= TORCH_REL_TOL * scale, "{what}[{i}]: {g} vs torch {w} (scale {scale})");
    }
}
