//! Measurements behind `cargo xtask bench`, and the helpers of the criterion
//! benches in `benches/`.
//!
//! Every speed is meant to be read against the physical limit that bounds
//! it, measured in the same process right next to it:
//!
//! * [`read_bandwidth_gbs`]: a plain multi-accumulator read of a buffer (the
//!   DRAM limit of resident weights and of matvec over matrices far larger
//!   than the last-level cache);
//! * [`fma_peak_gflops`]: independent fused multiply-adds in registers (the
//!   compute limit of prefill);
//! * [`direct_read_gbs`]: O_DIRECT reads of whole expert records (the disk
//!   limit of streamed experts).
//!
//! This crate is built in release mode by `cargo xtask bench` (xtask itself
//! runs unoptimized), which runs its `strata-probe` binary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use strata_kernels::{Matrix, QuantFormat, Threads};
use strata_tier::{AlignedBuf, IoBackend, RecordFile};

/// The median of `values` (upper median for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Deterministic pseudo-random bytes (xorshift), fast enough to fill a GiB.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut s = seed | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        chunk.copy_from_slice(&s.to_le_bytes());
    }
    for b in chunks.into_remainder() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
}

/// Sums `bytes` as u64 lanes with 8 independent accumulators: the cheapest
/// loop that touches every byte, so its speed is the memory's.
fn sum_bytes(bytes: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present.
        return unsafe { sum_bytes_avx512(bytes) };
    }
    let mut acc = [0u64; 8];
    let mut chunks = bytes.chunks_exact(64);
    for chunk in &mut chunks {
        for (a, word) in acc.iter_mut().zip(chunk.chunks_exact(8)) {
            *a = a.wrapping_add(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
    }
    acc.iter().fold(chunks.remainder().iter().map(|&b| u64::from(b)).sum::<u64>(), |s, &a| s.wrapping_add(a))
}

/// [`sum_bytes`] with 512-bit loads.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_bytes_avx512(bytes: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 8];
    let mut chunks = bytes.chunks_exact(512);
    for chunk in &mut chunks {
        // Prefetch into L2 8 KiB ahead, as the kernels do, so that this
        // reference is the best read the kernels could hope for.
        for k in 0..8 {
            _mm_prefetch::<_MM_HINT_T1>(chunk.as_ptr().wrapping_add((8 << 10) + 64 * k).cast());
        }
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads 64 of the chunk's 512 bytes.
            *a = _mm512_add_epi64(*a, unsafe { _mm512_loadu_si512(chunk.as_ptr().add(64 * k).cast()) });
        }
    }
    let mut total = chunks.remainder().iter().map(|&b| u64::from(b)).sum::<u64>();
    for a in acc {
        total = total.wrapping_add(_mm512_reduce_add_epi64(a) as u64);
    }
    total
}

/// Reads all of `bytes` once with `threads` threads (one contiguous share
/// each) and returns GB/s (10^9 bytes per second).
pub fn read_bandwidth_once(bytes: &[u8], threads: usize) -> f64 {
    let share = bytes.len().div_ceil(threads.max(1));
    let started = Instant::now();
    let sums: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = bytes.chunks(share.max(1)).map(|part| scope.spawn(move || sum_bytes(part))).collect();
        handles.into_iter().map(|h| h.join().expect("reader thread")).collect()
    });
    std::hint::black_box(sums);
    bytes.len() as f64 / started.elapsed().as_secs_f64() / 1e9
}

/// Best GB/s of `reps` reads of `bytes` with `threads` threads. A limit is
/// the best the machine did: on a shared machine noise (another tenant on
/// the other vCPU, the OS) only ever lowers a read's speed, and a limit
/// measured low would flatter every ratio read against it.
pub fn read_bandwidth_gbs(bytes: &[u8], threads: usize, reps: usize) -> f64 {
    (0..reps.max(1)).map(|_| read_bandwidth_once(bytes, threads)).fold(0.0, f64::max)
}

/// Peak f32 GFLOP/s of `threads` threads issuing independent fused
/// multiply-adds with the widest vectors this CPU has (AVX-512, else AVX2),
/// each thread for about `seconds`. A multiply-add counts as 2 flops.
pub fn fma_peak_gflops(threads: usize, seconds: f64) -> f64 {
    let rates: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| scope.spawn(move || fma_peak_one(seconds))).collect();
        handles.into_iter().map(|h| h.join().expect("fma thread")).collect()
    });
    rates.iter().sum()
}

fn fma_peak_one(seconds: f64) -> f64 {
    let started = Instant::now();
    let mut flops = 0.0f64;
    while started.elapsed().as_secs_f64() < seconds {
        flops += fma_burst(5_000_000);
    }
    flops / started.elapsed().as_secs_f64() / 1e9
}

/// Runs `iters` rounds of 12 independent vector FMAs; returns the flops done.
fn fma_burst(iters: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F is present.
            return unsafe { fma_burst_avx512(iters) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present.
            return unsafe { fma_burst_avx2(iters) };
        }
    }
    let mut acc = [1.0f32; 12];
    for _ in 0..iters {
        for a in &mut acc {
            *a = a.mul_add(1.000_000_1, 1e-9);
        }
    }
    std::hint::black_box(acc);
    (iters * 12 * 2) as f64
}

/// 12 accumulators: FMA latency (4 cycles) times 2 ports plus slack.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_burst_avx512(iters: usize) -> f64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); 12];
    let (a, b) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(1e-9));
    for _ in 0..iters {
        for v in &mut acc {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    std::hint::black_box(acc);
    (iters * 12 * 16 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_burst_avx2(iters: usize) -> f64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(1.0); 12];
    let (a, b) = (_mm256_set1_ps(1.000_000_1), _mm256_set1_ps(1e-9));
    for _ in 0..iters {
        for v in &mut acc {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    std::hint::black_box(acc);
    (iters * 12 * 8 * 2) as f64
}

/// A q8 or q4 matrix with random codes and scales, owned.
pub struct RandomMatrix {
    pub format: QuantFormat,
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    /// Weight bytes followed by the scales' bytes, in one buffer, so that a
    /// plain read of it touches exactly the bytes a product reads.
    storage: Vec<u8>,
    weight_bytes: usize,
}

impl RandomMatrix {
    /// A `[rows, cols]` matrix in the preset's group size (q8: 32, q4: 64).
    ///
    /// # Panics
    /// For formats other than q8 and q4.
    pub fn new(format: QuantFormat, rows: usize, cols: usize, seed: u64) -> Self {
        let group = match format {
            QuantFormat::Q8 => 32,
            QuantFormat::Q4 => 64,
            other => panic!("RandomMatrix is for q8/q4, not {other}"),
        };
        let weight_bytes = format.weight_bytes(rows, cols).next_multiple_of(4);
        let scale_bytes = 4 * format.scale_count(rows, cols, group);
        let mut storage = vec![0u8; weight_bytes + scale_bytes];
        fill_random(&mut storage[..weight_bytes], seed);
        if format == QuantFormat::Q8 {
            // -128 is not a q8 code.
            for b in &mut storage[..weight_bytes] {
                if *b == 0x80 {
                    *b = 0x81;
                }
            }
        }
        let scales: &mut [f32] = bytemuck_cast_mut(&mut storage[weight_bytes..]);
        for (i, s) in scales.iter_mut().enumerate() {
            *s = 1e-3 * (1.0 + (i % 7) as f32);
        }
        RandomMatrix { format, rows, cols, group, storage, weight_bytes }
    }

    /// A matrix of about `bytes` bytes with `cols` columns.
    pub fn of_size(format: QuantFormat, bytes: usize, cols: usize, seed: u64) -> Self {
        let per_row = format.weight_bytes(1, cols) + 4 * format.scale_count(1, cols, 32);
        Self::new(format, (bytes / per_row).max(1), cols, seed)
    }

    pub fn matrix(&self) -> Matrix<'_> {
        let exact = self.format.weight_bytes(self.rows, self.cols);
        Matrix::from_bytes(
            self.format,
            self.rows,
            self.cols,
            self.group,
            &self.storage[..exact],
            &self.storage[self.weight_bytes..],
        )
        .expect("consistent random matrix")
    }

    /// Every byte a product reads (weights and scales).
    pub fn bytes(&self) -> &[u8] {
        &self.storage
    }
}

/// Reinterprets a 4-aligned, 4-multiple byte slice as `f32`s.
fn bytemuck_cast_mut(bytes: &mut [u8]) -> &mut [f32] {
    assert!(bytes.len().is_multiple_of(4) && (bytes.as_ptr() as usize).is_multiple_of(4), "f32 view of bytes");
    // SAFETY: length and alignment checked above; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / 4) }
}

/// Inputs of moderate size with both signs.
pub fn inputs(len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect()
}

/// One matvec measurement and the plain read of the same bytes on the same
/// number of threads, alternated `reps` times.
#[derive(Debug, Clone)]
pub struct MatvecRun {
    pub matvec_gbs: Vec<f64>,
    pub read_gbs: Vec<f64>,
}

/// Times `Threads::matvec` over `m` (bytes per second of weights and scales)
/// next to a plain read of those bytes, alternating the two.
pub fn matvec_vs_read(m: &RandomMatrix, threads: usize, reps: usize) -> Result<MatvecRun> {
    let pool = Threads::new(threads).context("thread pool")?;
    let matrix = m.matrix();
    let x = inputs(m.cols);
    let mut y = vec![0.0f32; m.rows];
    // One untimed pass of each, so that page faults and first touches are not timed.
    pool.matvec(&matrix, &x, &mut y);
    read_bandwidth_once(m.bytes(), threads);
    let mut run = MatvecRun { matvec_gbs: Vec::new(), read_gbs: Vec::new() };
    for _ in 0..reps.max(1) {
        let started = Instant::now();
        pool.matvec(&matrix, &x, &mut y);
        run.matvec_gbs.push(m.bytes().len() as f64 / started.elapsed().as_secs_f64() / 1e9);
        run.read_gbs.push(read_bandwidth_once(m.bytes(), threads));
    }
    std::hint::black_box(&y);
    Ok(run)
}

/// Times `Threads::matmul` of `m` with `n` inputs; GFLOP/s (2 per multiply-add).
pub fn matmul_gflops(m: &RandomMatrix, n: usize, threads: usize, reps: usize) -> Result<Vec<f64>> {
    let pool = Threads::new(threads).context("thread pool")?;
    let matrix = m.matrix();
    let xs = inputs(n * m.cols);
    let mut ys = vec![0.0f32; n * m.rows];
    pool.matmul(&matrix, &xs, n, &mut ys);
    let flops = 2.0 * (m.rows * m.cols * n) as f64;
    let mut rates = Vec::new();
    for _ in 0..reps.max(1) {
        let started = Instant::now();
        pool.matmul(&matrix, &xs, n, &mut ys);
        rates.push(flops / started.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&ys);
    Ok(rates)
}

/// One expert file: its path, record size and record count.
#[derive(Debug, Clone)]
pub struct RecordSource {
    pub path: PathBuf,
    pub record_bytes: usize,
    pub num_experts: usize,
}

/// O_DIRECT read bandwidth of whole records of `files` in a shuffled order,
/// with `readers` threads each reading one record at a time (the engine's
/// I/O workers do the same), up to `max_bytes`. Page caches are dropped
/// first. GB/s.
pub fn direct_read_gbs(files: &[RecordSource], readers: usize, max_bytes: u64) -> Result<f64> {
    let opened: Vec<RecordFile> = files
        .iter()
        .enumerate()
        .map(|(layer, f)| RecordFile::open(IoBackend::Direct, &f.path, layer, f.record_bytes, f.num_experts))
        .collect::<strata_tier::Result<_>>()
        .context("opening expert files with O_DIRECT")?;
    for f in &opened {
        f.evict_page_cache().context("evicting the page cache")?;
    }
    // Interleave layers and spread experts, as routing does.
    let mut order: Vec<(usize, usize)> = Vec::new();
    let most = files.iter().map(|f| f.num_experts).max().unwrap_or(0);
    for e in 0..most {
        let expert = (e * 37) % most.max(1);
        for (layer, f) in files.iter().enumerate() {
            if expert < f.num_experts {
                order.push((layer, expert));
            }
        }
    }
    let mut total = 0u64;
    order.retain(|&(layer, _)| {
        total += files[layer].record_bytes as u64;
        total <= max_bytes
    });
    let readers = readers.max(1);
    let started = Instant::now();
    let read: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let (opened, order) = (&opened, &order);
                scope.spawn(move || -> Result<u64> {
                    let mut bytes = 0u64;
                    let mut bufs: Vec<Option<AlignedBuf>> = (0..opened.len()).map(|_| None).collect();
                    for &(layer, expert) in order.iter().skip(r).step_by(readers) {
                        let f = &opened[layer];
                        let buf = bufs[layer].get_or_insert_with(|| AlignedBuf::zeroed(f.record_bytes()));
                        f.read_into(expert, buf)?;
                        bytes += f.record_bytes() as u64;
                    }
                    Ok(bytes)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("reader thread")).collect()
    });
    let mut bytes = 0u64;
    for r in read {
        bytes += r?;
    }
    Ok(bytes as f64 / started.elapsed().as_secs_f64() / 1e9)
}

/// Whether products with `m` take the integer path on this CPU.
pub fn uses_int_path(m: &RandomMatrix) -> bool {
    m.matrix().uses_int_path(strata_kernels::simd::Isa::detect())
}

/// Drops `path`'s pages from the page cache (`posix_fadvise` `DONTNEED`),
/// after writing back dirty pages, which `DONTNEED` would silently keep.
/// No root needed.
pub fn evict_page_cache(path: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.sync_data().with_context(|| format!("syncing {}", path.display()))?;
    // SAFETY: a plain syscall on a descriptor we own; offset 0 and length 0
    // mean the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc)).with_context(|| format!("evicting {}", path.display()));
    }
    Ok(())
}
