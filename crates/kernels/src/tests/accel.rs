//! The GPU kernels of both backends against the CPU, on every device this
//! machine has: wgpu's adapter (CI: Mesa's lavapipe, a Vulkan device on the
//! CPU) and a CUDA device. Products bit for bit the integer path's
//! definition, and so the CPU's products and within the definition's stated
//! bound of the f32 reference (`int.rs`); the gated FFN bit for bit
//! [`crate::Threads::gated_ffn`]. Without a device each backend says why
//! and its tests pass, unless `STRATA_GPU_TESTS=require` (CI, for wgpu) or
//! `STRATA_CUDA_TESTS=require` (a machine with an NVIDIA GPU) asks for it,
//! where that fails them. Without a feature, its stand-in says what is
//! missing.

#[cfg(any(feature = "gpu", feature = "cuda"))]
mod on_device {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::super::int::{Owned, case};
    use crate::act::{ActElem, ActivationPrecision, Layout, QuantizedActs};
    use crate::int;
    use crate::quant::quantize_q8;
    use crate::simd::Isa;
    use crate::{Accelerator, Error, GatedAct, MatData, Matrix, Threads};

    /// Proptest cases per property: each is a few device submissions,
    /// slow on a software device.
    const DEVICE_CASES: u32 = 40;

    /// The devices every test shares: each backend built in whose device
    /// opens (each skipped, said once, where there is none and none is
    /// required).
    fn devices() -> &'static [Accelerator] {
        static DEVICES: OnceLock<Vec<Accelerator>> = OnceLock::new();
        DEVICES.get_or_init(|| {
            let opened = [
                (cfg!(feature = "gpu"), "GPU", "STRATA_GPU_TESTS", crate::gpu::Device::new().map(Accelerator::Wgpu)),
                (
                    cfg!(feature = "cuda"),
                    "CUDA",
                    "STRATA_CUDA_TESTS",
                    crate::cuda::CudaDevice::new(0).map(Accelerator::Cuda),
                ),
            ];
            let mut devices = Vec::new();
            for (built, kind, require_var, device) in opened {
                match device {
                    Ok(device) => {
                        eprintln!("{kind} tests on {}", device.name());
                        devices.push(device);
                    }
                    Err(why) if built => {
                        let required = std::env::var(require_var).is_ok_and(|v| v == "require");
                        assert!(!required, "{require_var}=require, but {why}");
                        eprintln!("{kind} test skipped: {why}");
                    }
                    Err(_) => {}
                }
            }
            devices
        })
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The definition's products of `owned` with `xs` at codes `E`.
    fn definition<E: ActElem>(owned: &Owned, xs: &[f32], n: usize, rows: usize, cols: usize) -> Vec<f32> {
        let w = owned.weights();
        let mut want = vec![f32::NAN; n * rows];
        int::products_ref(&w, &QuantizedActs::<E>::new(w.layout, xs, n, cols), 0..rows, &mut want, rows);
        want
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(DEVICE_CASES))]

        /// q8 and q4 products of every shape (empty rows, partial blocks
        /// and groups, several vectors) on the device, with int16 and int8
        /// codes: the definition bit for bit, and the CPU's own products
        /// where it takes the integer path.
        #[test]
        fn device_products_equal_the_integer_definition_bitwise(case in case()) {
            for device in devices() {
            let (layout, rows, cols, group, src, n, xs) = case.clone();
            let owned = Owned::new(layout, rows, cols, group, &src);
            let matrix = owned.matrix();
            let on_device = device.upload(&matrix).expect("q8/q4 with a supported group uploads");
            for precision in ActivationPrecision::ALL {
                let want = match precision {
                    ActivationPrecision::Int16 => definition::<i16>(&owned, &xs, n, rows, cols),
                    ActivationPrecision::Int8 => definition::<i8>(&owned, &xs, n, rows, cols),
                };
                let mut got = vec![f32::NAN; n * rows];
                device.matmul(&on_device, precision, &xs, n, &mut got);
                prop_assert_eq!(bits(&got), bits(&want), "{} {:?} {}", device.name(), layout, precision);
                let isa = Isa::detect();
                if matrix.uses_int_path(isa) {
                    let mut cpu = vec![f32::NAN; n * rows];
                    matrix.matmul_at(isa, precision, &xs, n, &mut cpu);
                    prop_assert_eq!(bits(&got), bits(&cpu), "the CPU's {:?}", isa);
                }
            }
            }
        }

        /// An expert's gated FFN (SwiGLU, SwiGLU with a limit, or gpt-oss's
        /// clamped form with biases) on the device equals the CPU's bit for
        /// bit.
        #[test]
        fn device_gated_ffn_equals_the_cpus_bitwise(
            (layout, hidden, inter, group, n) in
                (prop_oneof![Just(Layout::Q8), Just(Layout::Q4)], 1usize..=160, 1usize..=96, 2u32..=7, 1usize..=4)
                    .prop_map(|(layout, hidden, inter, log_group, n)| {
                        (layout, hidden, inter, (1usize << log_group).max(layout.lane_cols()), n)
                    }),
            seed in 0u32..1000,
            act_kind in 0usize..3,
        ) {
            let value = |i: usize, salt: u32| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed ^ salt) % 2001) as f32 / 500.0 - 2.0;
            let values = |len: usize, salt: u32| (0..len).map(|i| value(i, salt)).collect::<Vec<f32>>();
            let gate = Owned::new(layout, inter, hidden, group, &values(inter * hidden, 1));
            let up = Owned::new(layout, inter, hidden, group, &values(inter * hidden, 2));
            let down = Owned::new(layout, hidden, inter, group, &values(hidden * inter, 3));
            let xs = values(n * hidden, 4);
            let (gate_bias, up_bias, down_bias) = (values(inter, 5), values(inter, 6), values(hidden, 7));
            let act = match act_kind {
                0 => GatedAct::SwiGlu,
                1 => GatedAct::LimitedSwiGlu { limit: 1.5 },
                _ => GatedAct::Clamped { alpha: 1.702, limit: 1.5, gate_bias: &gate_bias, up_bias: &up_bias, down_bias: &down_bias },
            };
            let matrices = [gate.matrix(), up.matrix(), down.matrix()];
            if !matrices.iter().all(|m| m.uses_int_path(Isa::detect())) {
                eprintln!("skipped: this CPU has no integer path to equal");
                return Ok(());
            }
            for device in devices() {
                let on_device = matrices.map(|m| device.upload(&m).expect("uploads"));
                for precision in ActivationPrecision::ALL {
                    let threads = Threads::new(1).expect("one thread").with_activations(precision);
                    let mut want = vec![f32::NAN; n * hidden];
                    threads.gated_ffn(&matrices[0], &matrices[1], &matrices[2], act, &xs, n, &mut want);
                    let mut got = vec![f32::NAN; n * hidden];
                    device.gated_ffn([&on_device[0], &on_device[1], &on_device[2]], act, precision, &xs, n, &mut got);
                    prop_assert_eq!(bits(&got), bits(&want), "{} {:?} {} {:?}", device.name(), layout, precision, act);
                }
            }
        }
    }

    /// f32, bf16, mxfp4 and groups the integer path cannot lane-align stay
    /// on the host, each refused by name.
    #[test]
    fn matrices_without_a_device_kernel_are_refused_by_format_and_group() {
        for device in devices() {
            let values = vec![0.25f32; 2 * 64];
            let f32_matrix = Matrix::new(2, 64, MatData::F32(&values)).expect("f32");
            let refused = device.upload(&f32_matrix).expect_err("f32 has no device kernel");
            assert_eq!(refused, Error::GpuUnsupported { format: "f32", group: None });
            let (codes, scales) = ([0x21u8; 2 * 32], [127u8; 2 * 2]);
            let mxfp4_matrix = Matrix::new(2, 64, MatData::Mxfp4 { codes: &codes, scales: &scales }).expect("mxfp4");
            let refused = device.upload(&mxfp4_matrix).expect_err("mxfp4 has no device kernel");
            assert_eq!(refused, Error::GpuUnsupported { format: "mxfp4", group: None });
            let (qs, scales) = quantize_q8(&values, 2, 64, 48);
            let q8_matrix = Matrix::new(2, 64, MatData::Q8 { qs: &qs, scales: &scales, group: 48 }).expect("q8");
            let refused = device.upload(&q8_matrix).expect_err("group 48 is not a power of two");
            assert!(refused.to_string().contains("groups of 48 columns"), "{refused}");
        }
    }

    /// The inputs that poison a CPU product (a NaN or an infinity) poison
    /// the device's, and tiny and huge values beside each other match.
    #[test]
    fn extreme_activations_match_the_definition() {
        for device in devices() {
            let (rows, cols, group) = (5, 200, 32);
            let src: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            for layout in [Layout::Q8, Layout::Q4] {
                let owned = Owned::new(layout, rows, cols, group, &src);
                let on_device = device.upload(&owned.matrix()).expect("uploads");
                let mut x = vec![0.0f32; cols];
                x[40] = 1e30;
                x[41] = 1e-3;
                x[150] = -3.0;
                let mut got = vec![0.0; rows];
                device.matmul(&on_device, ActivationPrecision::Int16, &x, 1, &mut got);
                assert_eq!(bits(&got), bits(&definition::<i16>(&owned, &x, 1, rows, cols)), "{layout:?}");
                x[7] = f32::NAN;
                device.matmul(&on_device, ActivationPrecision::Int16, &x, 1, &mut got);
                assert!(got.iter().all(|v| v.is_nan()), "{layout:?}: {got:?}");
            }
        }
    }
}

/// Without the feature the names are there, and making a device says
/// what is missing.
#[cfg(not(feature = "gpu"))]
#[test]
fn without_the_gpu_feature_a_device_says_how_to_get_one() {
    let missing = crate::gpu::Device::new().expect_err("no GPU support built");
    assert_eq!(missing, crate::Error::GpuNotBuilt);
    assert!(missing.to_string().contains("--features gpu"), "{missing}");
}
