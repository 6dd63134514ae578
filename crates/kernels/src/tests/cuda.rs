//! The CUDA kernels' source with no GPU: through NVRTC, wherever an NVRTC
//! library loads, it compiles, and to PTX whose float arithmetic is the
//! definition's as written (nothing contracted into a fused multiply-add
//! the source did not ask for, nothing flushed to zero); built for the host
//! by a C++ compiler, its arithmetic equals the integer path's definition
//! bit for bit. Where either tool is missing, its test says why and passes.
//! The kernels against the CPU on a device are `accel.rs`'s.

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

/// The host build of the kernel's arithmetic (`cuda_host.cpp`) in `dir`, or
/// `None` (said) where there is no C++ compiler.
fn build_host_kernel(dir: &Path) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tests/cuda_host.cpp");
    let exe = dir.join("products_host");
    let built = std::process::Command::new("c++")
        .args(["-std=c++17", "-O2", "-ffp-contract=off", "-o"])
        .arg(&exe)
        .arg(&source)
        .output();
    match built {
        Ok(out) if out.status.success() => Some(exe),
        Ok(out) => panic!("the host build of products.cu failed:\n{}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => {
            eprintln!("CUDA test skipped: no C++ compiler to build products.cu's arithmetic on the host (c++: {e})");
            None
        }
    }
}

/// `products.cu`'s own `lane_sum` and `reduce_lanes`, built for the host
/// (CUDA's correctly rounded intrinsics as the host's IEEE operations),
/// over q8 and q4 matrices of every shape (partial blocks, lanes and groups,
/// several vectors) with int16 and int8 codes laid out by the shared host
/// side: the integer path's definition bit for bit. What it leaves to a
/// device test (`accel.rs`) is the kernel's map of threads to lanes, rows
/// and vectors, and the device's arithmetic itself.
#[test]
fn the_cuda_kernels_arithmetic_equals_the_integer_definition_on_the_host() {
    use proptest::test_runner::{Config, TestRunner};

    use super::int::{Owned, case};
    use crate::accel::products::{Uploadable, column_acts};
    use crate::act::{ActivationPrecision, QuantizedActs};
    use crate::int;

    let dir = tempfile::tempdir().expect("a temporary directory");
    let Some(host_kernel) = build_host_kernel(dir.path()) else { return };
    let (input, output) = (dir.path().join("input"), dir.path().join("output"));
    // No failure file: this runner is not a `proptest!` and knows no source.
    let mut runner = TestRunner::new(Config { failure_persistence: None, ..Config::with_cases(64) });
    runner
        .run(&case(), |(layout, rows, cols, group, src, n, xs)| {
            let owned = Owned::new(layout, rows, cols, group, &src);
            let matrix = owned.matrix();
            let uploadable = Uploadable::of(&matrix).expect("q8/q4 with a supported group");
            for precision in ActivationPrecision::ALL {
                let (codes, lane_scales) = column_acts(layout, precision, &xs, n, cols);
                let mut bytes = bytemuck::bytes_of(&uploadable.params).to_vec();
                bytes.extend_from_slice(&u32::try_from(n).expect("a few vectors").to_le_bytes());
                let mut section = |data: &[u8], count: usize| {
                    bytes.extend_from_slice(&u32::try_from(count).expect("a small case").to_le_bytes());
                    bytes.extend_from_slice(data);
                };
                section(uploadable.qs, uploadable.qs.len());
                section(bytemuck::cast_slice(uploadable.scales), uploadable.scales.len());
                section(bytemuck::cast_slice(&codes), codes.len());
                section(bytemuck::cast_slice(&lane_scales), lane_scales.len());
                std::fs::write(&input, &bytes).expect("the input file");
                let status = std::process::Command::new(&host_kernel).arg(&input).arg(&output).status();
                assert!(status.as_ref().is_ok_and(|s| s.success()), "the host kernel: {status:?}");
                let got: Vec<u32> = std::fs::read(&output)
                    .expect("the host kernel's output")
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect();
                let w = owned.weights();
                let mut want = vec![f32::NAN; n * rows];
                match precision {
                    ActivationPrecision::Int16 => {
                        let acts = QuantizedActs::<i16>::new(layout, &xs, n, cols);
                        int::products_ref(&w, &acts, 0..rows, &mut want, rows)
                    }
                    ActivationPrecision::Int8 => {
                        let acts = QuantizedActs::<i8>::new(layout, &xs, n, cols);
                        int::products_ref(&w, &acts, 0..rows, &mut want, rows)
                    }
                }
                let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                proptest::prop_assert_eq!(got, want, "{:?} {}", layout, precision);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
