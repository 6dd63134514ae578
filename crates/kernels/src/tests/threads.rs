//! `Threads`: results independent of the thread count, bit for bit.

use super::values;
use crate::act::ActivationPrecision;
use crate::quant::{QuantFormat, f32_to_bf16_bits, quantize_q4, quantize_q8};
use crate::simd::Isa;
use crate::{Error, GatedAct, MatData, Matrix, Threads};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Deterministic pseudo-random values.
fn sample(len: usize) -> Vec<f32> {
    let mut runner = TestRunner::deterministic();
    values(len).new_tree(&mut runner).unwrap().current()
}

/// Runs `check` on one big (parallel-path) matrix of every format. The
/// shapes are odd and exceed the serial threshold.
fn for_each_format(check: impl Fn(QuantFormat, &Matrix<'_>)) {
    let (rows, cols, group) = (263, 301, 64);
    let src = sample(rows * cols);
    let bf16 = f32_to_bf16_bits(&src);
    let (q8, s8) = quantize_q8(&src, rows, cols, group);
    let (q4, s4) = quantize_q4(&src, rows, cols, group);
    let datas = [
        MatData::F32(&src),
        MatData::Bf16(&bf16),
        MatData::Q8 { qs: &q8, scales: &s8, group },
        MatData::Q4 { qs: &q4, scales: &s4, group },
    ];
    for data in datas {
        let m = Matrix::new(rows, cols, data).unwrap();
        check(m.format(), &m);
    }
}

#[test]
fn matvec_is_bit_identical_for_any_thread_count() {
    let pools: Vec<Threads> = [1, 2, 3, 5].map(|n| Threads::new(n).unwrap()).into();
    for_each_format(|format, m| {
        let x = sample(m.cols);
        let mut serial = vec![0.0; m.rows];
        m.matvec(&x, &mut serial);
        for pool in &pools {
            let mut y = vec![f32::NAN; m.rows];
            pool.matvec(m, &x, &mut y);
            assert_eq!(bits(&y), bits(&serial), "{format}, {} threads", pool.n_threads());
        }
    });
}

#[test]
fn matmul_is_bit_identical_for_any_thread_count() {
    let pools: Vec<Threads> = [1, 2, 4].map(|n| Threads::new(n).unwrap()).into();
    for_each_format(|format, m| {
        for n in [0, 1, 3, 5, 9] {
            let xs = sample(n * m.cols);
            let mut serial = vec![0.0; n * m.rows];
            m.matmul(&xs, n, &mut serial);
            for pool in &pools {
                let mut ys = vec![f32::NAN; n * m.rows];
                pool.matmul(m, &xs, n, &mut ys);
                assert_eq!(bits(&ys), bits(&serial), "{format}, n {n}, {} threads", pool.n_threads());
            }
        }
    });
}

#[test]
fn small_products_run_serially_and_agree() {
    let pool = Threads::new(3).unwrap();
    let w = sample(12);
    let m = Matrix::new(4, 3, MatData::F32(&w)).unwrap();
    let x = [1.0, -2.0, 0.5];
    let (mut a, mut b) = ([0.0; 4], [0.0; 4]);
    pool.matvec(&m, &x, &mut a);
    m.matvec(&x, &mut b);
    assert_eq!(a, b);
}

#[test]
fn pool_has_the_requested_size() {
    let pool = Threads::new(3).unwrap();
    assert_eq!(pool.n_threads(), 3);
    assert_eq!(pool.pool().current_num_threads(), 3);
    assert_eq!(pool.isa(), crate::simd::Isa::detect());
    assert_eq!(Threads::new(0).unwrap_err(), Error::ZeroThreads);
}

/// One source matrix in every format: f32, bf16, q8 and q4 (codes, scales).
type Storage = (Vec<f32>, Vec<u16>, (Vec<i8>, Vec<f32>), (Vec<u8>, Vec<f32>), (Vec<u8>, Vec<u8>));

/// Expert shapes (hidden 192, intermediate 160): odd enough to split in
/// uneven chunks, whole MXFP4 blocks.
const EXPERT_HIDDEN: usize = 192;
const EXPERT_INTER: usize = 160;

/// MXFP4 storage of `[rows, cols]` made from `src`'s bits: every code, and
/// scales from 2^-4 to 2^3.
fn mxfp4_from_bits(src: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let codes = src.iter().step_by(2).map(|v| (v.to_bits() >> 12) as u8).take(rows * cols / 2).collect();
    let scales = (0..rows * cols / crate::mxfp4::BLOCK_VALUES).map(|i| 123 + (i % 8) as u8).collect();
    (codes, scales)
}

/// Runs `check` on one expert's gate, up and down in every format (q8/q4
/// on the integer path, f32/bf16/mxfp4 on row dots).
fn for_each_expert_format(check: impl Fn(QuantFormat, &[Matrix<'_>; 3])) {
    let (hidden, inter, group) = (EXPERT_HIDDEN, EXPERT_INTER, 32);
    let srcs =
        [sample(inter * hidden), sample(inter * hidden + 7)[7..].to_vec(), sample(hidden * inter + 3)[3..].to_vec()];
    let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
    for format in QuantFormat::ALL {
        let owned: Vec<Storage> = srcs
            .iter()
            .zip(shapes)
            .map(|(src, (rows, cols))| {
                (
                    src.clone(),
                    f32_to_bf16_bits(src),
                    quantize_q8(src, rows, cols, group),
                    quantize_q4(src, rows, cols, group),
                    mxfp4_from_bits(src, rows, cols),
                )
            })
            .collect();
        let m: Vec<Matrix<'_>> = owned
            .iter()
            .zip(shapes)
            .map(|((f, b, q8, q4, mx), (rows, cols))| {
                let data = match format {
                    QuantFormat::F32 => MatData::F32(f),
                    QuantFormat::Bf16 => MatData::Bf16(b),
                    QuantFormat::Q8 => MatData::Q8 { qs: &q8.0, scales: &q8.1, group },
                    QuantFormat::Q4 => MatData::Q4 { qs: &q4.0, scales: &q4.1, group },
                    QuantFormat::Mxfp4 => MatData::Mxfp4 { codes: &mx.0, scales: &mx.1 },
                };
                Matrix::new(rows, cols, data).unwrap()
            })
            .collect();
        check(format, &[m[0], m[1], m[2]]);
    }
}

/// The fused expert FFN equals gate, up, SwiGLU and down run one after the
/// other, bit for bit, for every thread count and batch size, in every
/// format.
#[test]
fn expert_ffn_equals_unfused_swiglu_for_any_thread_count() {
    let pools: Vec<Threads> = [1, 2, 3].map(|n| Threads::new(n).unwrap()).into();
    for_each_expert_format(|format, m| {
        for n in [1, 2, 5] {
            let xs = sample(n * EXPERT_HIDDEN);
            let serial = Threads::new(1).unwrap();
            let mut g = vec![0.0; n * EXPERT_INTER];
            let mut u = vec![0.0; n * EXPERT_INTER];
            serial.matmul(&m[0], &xs, n, &mut g);
            serial.matmul(&m[1], &xs, n, &mut u);
            crate::ops::silu_mul(&mut g, &u);
            let mut want = vec![0.0; n * EXPERT_HIDDEN];
            serial.matmul(&m[2], &g, n, &mut want);
            for pool in &pools {
                let mut got = vec![f32::NAN; n * EXPERT_HIDDEN];
                pool.expert_ffn(&m[0], &m[1], &m[2], &xs, n, &mut got);
                assert_eq!(bits(&got), bits(&want), "{format}, n {n}, {} threads", pool.n_threads());
            }
        }
    });
}

/// gpt-oss's experts through the fused path equal the unfused products
/// with their biases, the interleaved scalar reference of the clamped
/// SwiGLU and the down bias, bit for bit, for every thread count.
#[test]
fn gated_ffn_clamped_equals_the_interleaved_scalar_reference_for_any_thread_count() {
    let pools: Vec<Threads> = [1, 2, 3].map(|n| Threads::new(n).unwrap()).into();
    let (gate_bias, up_bias, down_bias) = (sample(EXPERT_INTER), sample(EXPERT_INTER + 1), sample(EXPERT_HIDDEN));
    // A limit the products cross in both directions.
    let (alpha, limit) = (1.702, 0.5);
    let act = GatedAct::Clamped { alpha, limit, gate_bias: &gate_bias, up_bias: &up_bias[1..], down_bias: &down_bias };
    for_each_expert_format(|format, m| {
        for n in [1, 2, 5] {
            let xs = sample(n * EXPERT_HIDDEN);
            let serial = Threads::new(1).unwrap();
            let mut g = vec![0.0; n * EXPERT_INTER];
            let mut u = vec![0.0; n * EXPERT_INTER];
            serial.matmul(&m[0], &xs, n, &mut g);
            serial.matmul(&m[1], &xs, n, &mut u);
            let mut gate_up = Vec::with_capacity(2 * g.len());
            for (i, (g, u)) in g.iter().zip(&u).enumerate() {
                gate_up.extend([g + gate_bias[i % EXPERT_INTER], u + up_bias[1 + i % EXPERT_INTER]]);
            }
            let mut h = vec![0.0; n * EXPERT_INTER];
            crate::scalar::clamped_swiglu_interleaved(&gate_up, alpha, limit, &mut h);
            let mut want = vec![0.0; n * EXPERT_HIDDEN];
            serial.matmul(&m[2], &h, n, &mut want);
            for (i, y) in want.iter_mut().enumerate() {
                *y += down_bias[i % EXPERT_HIDDEN];
            }
            for pool in &pools {
                let mut got = vec![f32::NAN; n * EXPERT_HIDDEN];
                pool.gated_ffn(&m[0], &m[1], &m[2], act, &xs, n, &mut got);
                assert_eq!(bits(&got), bits(&want), "{format}, n {n}, {} threads", pool.n_threads());
            }
        }
    });
}

/// `act` through the fused path, on every instruction set this CPU has
/// (the integer path for q8/q4 where the tier has one), equals that tier's
/// unfused products with `reference`, the scalar reference of the
/// activation, between them, bit for bit, for every thread count.
fn assert_fused_equals_unfused(act: GatedAct<'_>, reference: impl Fn(&mut [f32], &[f32])) {
    for_each_expert_format(|format, m| {
        for n in [1, 2, 5] {
            let xs = sample(n * EXPERT_HIDDEN);
            for isa in Isa::all_supported() {
                let products = |m: &Matrix<'_>, xs: &[f32], rows: usize| {
                    let mut ys = vec![0.0; n * rows];
                    m.matmul_at(isa, ActivationPrecision::default(), xs, n, &mut ys);
                    ys
                };
                let mut h = products(&m[0], &xs, EXPERT_INTER);
                reference(&mut h, &products(&m[1], &xs, EXPERT_INTER));
                let want = products(&m[2], &h, EXPERT_HIDDEN);
                for threads in [1, 2, 3] {
                    let pool = Threads::new(threads).unwrap().with_isa(isa);
                    let mut got = vec![f32::NAN; n * EXPERT_HIDDEN];
                    pool.gated_ffn(&m[0], &m[1], &m[2], act, &xs, n, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{act:?}: {format}, n {n}, {isa:?}, {threads} threads");
                }
            }
        }
    });
}

#[test]
fn gated_ffn_limited_equals_the_scalar_reference_on_every_tier_for_any_thread_count() {
    // A limit the products cross in both directions.
    let limit = 0.5;
    assert_fused_equals_unfused(GatedAct::LimitedSwiGlu { limit }, |g, u| crate::scalar::silu_mul_limited(g, u, limit));
}

#[test]
fn gated_ffn_situ_equals_the_scalar_reference_on_every_tier_for_any_thread_count() {
    // Betas the products reach, so both tanh bend.
    let (beta, linear_beta) = (0.4, 0.6);
    assert_fused_equals_unfused(GatedAct::SituGlu { beta, linear_beta }, |g, u| {
        crate::scalar::situ_mul(g, u, beta, linear_beta)
    });
}

#[test]
#[should_panic(expected = "down must be")]
fn expert_ffn_checks_shapes() {
    let w = sample(12);
    let gate = Matrix::new(3, 4, MatData::F32(&w)).unwrap();
    Threads::new(1).unwrap().expert_ffn(&gate, &gate, &gate, &[0.0; 4], 1, &mut [0.0; 4]);
}
