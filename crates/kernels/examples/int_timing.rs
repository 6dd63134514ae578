//! Wall-clock timings of the integer products of q8 and q4 matrices on every
//! instruction-set tier of this CPU: `cargo run -p strata-kernels --example
//! int_timing` (the dev profile is optimised). One thread, best of many
//! runs, so that a short burst of load from other processes drops out; on a
//! busy machine run it twice and trust only figures that repeat.
//!
//! The matrix (256 × 2048, 256 KiB in q4, 512 KiB in q8) stays in L2, so
//! this measures the kernels' own speed, not DRAM's: a product of one input
//! (decode) and of four (a prefill tile), with int16 activations (`exact`,
//! the default) and int8 ones (`q8`, lossy). The input quantization is
//! timed with the product, as a model pays it.

use std::hint::black_box;
use std::time::Instant;

use strata_kernels::quant::{quantize_q4, quantize_q8};
use strata_kernels::simd::Isa;
use strata_kernels::{ActivationPrecision, MatData, Matrix};

const ROWS: usize = 256;
const COLS: usize = 2048;

/// Deterministic values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Best of `reps` timings of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Prints the products of `m` with 1 and 4 inputs on every tier, at each
/// activation precision (the scalar tier has no integer path).
fn time(name: &str, m: &Matrix<'_>, weight_bytes: usize) {
    let calls = 200;
    for isa in Isa::all_supported() {
        for precision in ActivationPrecision::ALL {
            let mut line = format!("{name} {:>10} {:>5}:", format!("{:?}", isa.level()), precision.name());
            for n in [1, 4] {
                let xs = values(n * COLS, 7);
                let mut ys = vec![0.0f32; n * ROWS];
                let secs = best(30, || {
                    for _ in 0..calls {
                        m.matmul_at(isa, precision, black_box(&xs), n, &mut ys);
                    }
                }) / calls as f64;
                let gbs = weight_bytes as f64 / secs / 1e9;
                line += &format!("  n={n}: {:7.1} us ({gbs:5.1} GB/s of weights)", secs * 1e6);
            }
            println!("{line}");
        }
    }
}

fn main() {
    let src = values(ROWS * COLS, 1);
    let (q8, q8_scales) = quantize_q8(&src, ROWS, COLS, 32);
    let q8_matrix = Matrix::new(ROWS, COLS, MatData::Q8 { qs: &q8, scales: &q8_scales, group: 32 }).expect("q8 shape");
    let (q4, q4_scales) = quantize_q4(&src, ROWS, COLS, 64);
    let q4_matrix = Matrix::new(ROWS, COLS, MatData::Q4 { qs: &q4, scales: &q4_scales, group: 64 }).expect("q4 shape");
    println!("{ROWS} x {COLS}, one thread; the scalar tier runs the f32 reference");
    time("q8", &q8_matrix, q8.len());
    time("q4", &q4_matrix, q4.len());
}
