//! Criterion benches of the kernels: `cargo bench -p strata-benches`.
//!
//! Shapes are those of the models Strata runs: a Qwen3-30B-A3B expert
//! (`[768, 2048]` gate/up, `[2048, 768]` down) and an attention projection
//! (`[4096, 2048]`), in the presets' formats (q4 group 64 for experts, q8
//! group 32 for dense matrices). Each product runs on every instruction-set
//! tier this CPU has, so the tiers can be compared; throughput is in bytes
//! of weights for matvec and in elements (multiply-adds) for matmul.

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use strata_benches::{RandomMatrix, inputs};
use strata_kernels::simd::Isa;
use strata_kernels::{QuantFormat, Threads, ops};

fn matvec(c: &mut Criterion) {
    let mut group = c.benchmark_group("matvec");
    for (format, rows, cols) in
        [(QuantFormat::Q4, 768, 2048), (QuantFormat::Q8, 4096, 2048), (QuantFormat::Q4, 4096, 2048)]
    {
        let m = RandomMatrix::new(format, rows, cols, 1);
        let matrix = m.matrix();
        let x = inputs(cols);
        let mut y = vec![0.0f32; rows];
        group.throughput(Throughput::Bytes(m.bytes().len() as u64));
        for isa in Isa::all_supported() {
            let id = BenchmarkId::new(format!("{format} {rows}x{cols}"), format!("{:?}", isa.level()));
            group.bench_function(id, |b| b.iter(|| matrix.matvec_with(isa, &x, &mut y)));
        }
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul");
    group.sample_size(20);
    for (format, rows, cols, n) in [(QuantFormat::Q8, 4096, 2048, 64), (QuantFormat::Q4, 768, 2048, 64)] {
        let m = RandomMatrix::new(format, rows, cols, 2);
        let matrix = m.matrix();
        let xs = inputs(n * cols);
        let mut ys = vec![0.0f32; n * rows];
        group.throughput(Throughput::Elements((rows * cols * n) as u64));
        for isa in Isa::all_supported() {
            let id = BenchmarkId::new(format!("{format} {rows}x{cols} x{n}"), format!("{:?}", isa.level()));
            group.bench_function(id, |b| b.iter(|| matrix.matmul_with(isa, &xs, n, &mut ys)));
        }
    }
    group.finish();
}

/// One routed expert of Qwen3-30B-A3B shapes, fused, for 1 and 8 tokens, on
/// one and two threads.
fn expert_ffn(c: &mut Criterion) {
    let mut group = c.benchmark_group("expert_ffn");
    let (hidden, inter) = (2048, 768);
    let gate = RandomMatrix::new(QuantFormat::Q4, inter, hidden, 3);
    let up = RandomMatrix::new(QuantFormat::Q4, inter, hidden, 4);
    let down = RandomMatrix::new(QuantFormat::Q4, hidden, inter, 5);
    let bytes = gate.bytes().len() + up.bytes().len() + down.bytes().len();
    for threads in [1, 2] {
        let pool = Threads::new(threads).expect("pool");
        for n in [1, 8] {
            let xs = inputs(n * hidden);
            let mut ys = vec![0.0f32; n * hidden];
            group.throughput(Throughput::Bytes(bytes as u64));
            let id = BenchmarkId::new(format!("q4 {n} token(s)"), format!("{threads} thread(s)"));
            group.bench_function(id, |b| {
                b.iter(|| pool.expert_ffn(&gate.matrix(), &up.matrix(), &down.matrix(), &xs, n, &mut ys))
            });
        }
    }
    group.finish();
}

fn elementwise(c: &mut Criterion) {
    let mut group = c.benchmark_group("ops");
    let x = inputs(2048);
    let weight = vec![1.0f32; 2048];
    let mut out = vec![0.0f32; 2048];
    group.throughput(Throughput::Elements(2048));
    group.bench_function("rmsnorm 2048", |b| b.iter(|| ops::rmsnorm(&x, &weight, 1e-6, &mut out)));
    let gate = inputs(768);
    let up = inputs(768);
    // A fresh gate each time: applied over and over it would overflow.
    group.bench_function("silu_mul 768", |b| {
        b.iter_batched_ref(|| gate.clone(), |g| ops::silu_mul(g, &up), BatchSize::SmallInput)
    });
    group.finish();
}

criterion_group!(benches, matvec, matmul, expert_ffn, elementwise);
criterion_main!(benches);
