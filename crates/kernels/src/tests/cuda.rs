//! The CUDA kernels' source through NVRTC, wherever an NVRTC library loads
//! (no GPU needed): it compiles, and to PTX whose float arithmetic is the
//! definition's as written (nothing contracted into a fused multiply-add
//! the source did not ask for, nothing flushed to zero). Where no NVRTC
//! loads, the test says why and passes. The kernels against the CPU on a
//! device are `accel.rs`'s.

use std::path::{Path, PathBuf};

use crate::cuda::nvrtc::{LIBRARY_VAR, Nvrtc};
use crate::cuda::{SOURCE, SOURCE_NAME};

/// The NVRTC libraries of the fixtures venv (`cargo xtask fixtures`,
/// `target/fixtures-venv`: torch's CUDA wheels bring NVRTC, CUDA 13's in
/// `nvidia/cu13/lib`, CUDA 12's in `nvidia/cuda_nvrtc/lib`), once the venv
/// is complete: CI installs it while the tests run, and its stamp, the
/// pinned requirements, is written after the last wheel is in.
fn fixtures_venv_nvrtc() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = root.join("target/fixtures-venv");
    let stamp = std::fs::read_to_string(venv.join(".strata-requirements"));
    let wanted = std::fs::read_to_string(root.join("xtask/fixtures/requirements.txt"));
    if !matches!((stamp, wanted), (Ok(stamp), Ok(wanted)) if stamp == wanted) {
        return Vec::new();
    }
    let Ok(pythons) = std::fs::read_dir(venv.join("lib")) else { return Vec::new() };
    let mut found = Vec::new();
    for python in pythons.flatten() {
        let nvidia = python.path().join("site-packages/nvidia");
        for (dir, name) in [("cu13/lib", "libnvrtc.so.13"), ("cuda_nvrtc/lib", "libnvrtc.so.12")] {
            let library = nvidia.join(dir).join(name);
            if library.exists() {
                found.push(library);
            }
        }
    }
    found
}

/// NVRTC, or `None` (said) where none loads.
fn nvrtc() -> Option<Nvrtc> {
    match Nvrtc::find(&fixtures_venv_nvrtc()) {
        Ok(nvrtc) => {
            eprintln!("NVRTC {:?} from {}", nvrtc.version(), nvrtc.found());
            Some(nvrtc)
        }
        Err(why) => {
            eprintln!("CUDA test skipped: {why} (set {LIBRARY_VAR}, or make the fixtures venv)");
            None
        }
    }
}

/// `products.cu` compiles for the oldest and the newest architecture this
/// NVRTC knows, to PTX with the `products` entry point whose every f32
/// multiply, add and fused multiply-add is explicitly rounded to nearest
/// (which the PTX assembler never contracts or reorders) and never flushes
/// subnormals: the arithmetic the bit-identity with the CPU rests on.
#[test]
fn the_cuda_kernels_compile_to_ptx_that_keeps_the_definitions_arithmetic() {
    let Some(nvrtc) = nvrtc() else { return };
    let archs = nvrtc.supported_archs().expect("NVRTC lists its architectures");
    let (Some(&oldest), Some(&newest)) = (archs.first(), archs.last()) else { panic!("NVRTC knows no architecture") };
    for arch in [oldest, newest] {
        let ptx = nvrtc.compile_ptx(SOURCE, SOURCE_NAME, arch).unwrap_or_else(|e| panic!("compute_{arch}: {e}"));
        assert!(ptx.contains(".entry products("), "compute_{arch}: no `products` entry point");
        assert!(ptx.contains(&format!(".target sm_{arch}")), "compute_{arch}: another target");
        let instructions: Vec<&str> = ptx.lines().map(str::trim).filter(|l| !l.starts_with("//")).collect();
        let float_ops: Vec<&str> = instructions
            .iter()
            .copied()
            .filter(|l| ["mul.", "add.", "fma.", "sub."].iter().any(|op| l.starts_with(op)) && l.contains(".f32"))
            .collect();
        assert!(float_ops.iter().any(|l| l.starts_with("fma.rn.f32")), "compute_{arch}: the lanes' fused multiply-add");
        for op in &float_ops {
            assert!(op.contains(".rn."), "compute_{arch}: `{op}` may be contracted or reordered by ptxas");
            assert!(!op.contains(".ftz"), "compute_{arch}: `{op}` flushes subnormals");
        }
        eprintln!("compute_{arch}: {} f32 operations, each rounded as written", float_ops.len());
    }
}

/// An architecture this NVRTC cannot compile for is refused with its log,
/// so a device it does not know is told why rather than given wrong code.
#[test]
fn nvrtc_refuses_an_unknown_architecture_with_its_log() {
    let Some(nvrtc) = nvrtc() else { return };
    let refused = nvrtc.compile_ptx(SOURCE, SOURCE_NAME, 1).expect_err("compute_1 does not exist");
    assert!(refused.to_string().contains(SOURCE_NAME) || refused.to_string().contains("compute_1"), "{refused}");
    assert_eq!(nvrtc.arch_for(1).map_err(|e| e.to_string().contains("none at most")), Err(true));
}
