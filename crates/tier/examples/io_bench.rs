//! Throughput of the expert I/O backends on one file of expert-sized records.
//!
//! ```sh
//! cargo run --example io_bench -p strata-tier --release -- [FILE] [FILE_MIB] [RECORD_KIB]
//! ```
//!
//! Writes (once; reused while its size matches) FILE, by default
//! `target/tmp-io-bench/experts.bin`, of FILE_MIB MiB (default 1024) in
//! records of RECORD_KIB KiB (default 2664, i.e. 2.6 MiB rounded up to
//! 4 KiB, an OLMoE-sized q4 expert). Then, for every backend and for 1 and
//! 2 workers, reads every record once in a shuffled order through an
//! [`IoPool`], cold (page cache dropped first) and then warm, checking
//! sample words of each record, and prints the median MiB/s of 3 passes
//! (with the slowest and fastest), this process's RSS, and how much of the
//! file was still in the page cache when a cold pass started.
//!
//! The file must live on a real disk: on tmpfs the O_DIRECT backends refuse
//! to open, and "cold" would mean nothing.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use strata_tier::{AlignedBuf, IoBackend, IoPool, RecordFile};

/// Bytes between the sampled words that each record read is checked on.
const CHECK_STRIDE_BYTES: usize = 64 * 1024;
/// Timed passes per configuration; the median is reported.
const PASSES: usize = 3;
/// Loads each worker keeps queued, so a worker never idles waiting for the next submit.
const IN_FLIGHT_PER_WORKER: usize = 2;

/// The word at byte `at` (a multiple of 8) of record `expert`.
fn word(expert: usize, at: usize) -> u64 {
    ((expert as u64) << 40) ^ (at as u64) ^ 0x5bd1_e995_0000_0000
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // crates/tier → the workspace root.
    let workspace =
        Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("crates/tier lives two levels down");
    let default_path = workspace.join("target/tmp-io-bench/experts.bin");
    let path = args.first().map(PathBuf::from).unwrap_or(default_path);
    let file_mib: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let record_kib: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(2664);
    let record_bytes = record_kib * 1024;
    assert!(record_bytes.is_multiple_of(4096), "records must be whole 4 KiB pages for O_DIRECT");
    let num_records = (file_mib << 20).div_ceil(record_bytes);
    let total_bytes = num_records * record_bytes;

    ensure_file(&path, num_records, record_bytes)?;
    println!(
        "file {} : {num_records} records of {record_bytes} bytes ({:.1} MiB), {:.0} MiB in all",
        path.display(),
        record_bytes as f64 / (1 << 20) as f64,
        total_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "{:<7} {:>7} {:>5} {:>9} {:>14} {:>10} {:>8} {:>9}",
        "backend", "workers", "cache", "MiB/s", "(min..max)", "ms/record", "RSS MiB", "cached %"
    );

    let order = shuffled(num_records, 0x5eed);
    for backend in IoBackend::ALL {
        for workers in [1, 2] {
            let file = Arc::new(RecordFile::open(backend, &path, 0, record_bytes, num_records)?);
            for cold in [true, false] {
                // Median of a few passes: the machine may be shared.
                let mut seconds: Vec<f64> = Vec::with_capacity(PASSES);
                let mut cached_percent = 0.0;
                for _ in 0..PASSES {
                    if cold {
                        file.evict_page_cache()?;
                        cached_percent = f64::max(cached_percent, page_cache_percent(&path)?);
                    }
                    seconds.push(read_all(&file, &order, workers)?);
                }
                seconds.sort_by(f64::total_cmp);
                let median_s = seconds[PASSES / 2];
                let mib_per_s = |s: f64| total_bytes as f64 / (1 << 20) as f64 / s;
                let ms_per_record = median_s * 1e3 / num_records as f64;
                let cache = if cold { "cold" } else { "warm" };
                let rss_mib = rss_bytes() as f64 / (1 << 20) as f64;
                println!(
                    "{backend:<7} {workers:>7} {cache:>5} {:>9.0} {:>6.0}..{:<6.0} {ms_per_record:>10.2} {rss_mib:>8.0} {cached_percent:>9.1}",
                    mib_per_s(median_s),
                    mib_per_s(seconds[PASSES - 1]),
                    mib_per_s(seconds[0]),
                );
            }
        }
    }
    Ok(())
}

/// Reads every record in `order` through a pool of `workers`, checking each;
/// returns the seconds from the first submit to the last completion.
fn read_all(file: &Arc<RecordFile>, order: &[usize], workers: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let max_in_flight = workers * IN_FLIGHT_PER_WORKER;
    let pool = IoPool::new(workers, max_in_flight)?;
    // Buffers are recycled: allocating and faulting in a fresh record-sized
    // buffer per load would be measured along with the disk.
    let mut free: VecDeque<AlignedBuf> = (0..max_in_flight)
        .map(|_| {
            let mut buf = AlignedBuf::zeroed(file.record_bytes());
            buf.as_mut_slice().fill(1);
            buf
        })
        .collect();
    let start = Instant::now();
    let mut next = 0;
    let mut done = 0;
    while done < order.len() {
        while next < order.len() && pool.in_flight() < max_in_flight {
            let buf = free.pop_front().expect("one buffer per load in flight");
            pool.submit(Arc::<RecordFile>::clone(file), order[next], buf, next as u64);
            next += 1;
        }
        let (tag, result) = pool.recv();
        let buf = result?;
        check(&buf, order[tag as usize])?;
        free.push_back(buf);
        done += 1;
    }
    Ok(start.elapsed().as_secs_f64())
}

fn check(buf: &AlignedBuf, expert: usize) -> Result<(), String> {
    let bytes = buf.as_slice();
    let last = bytes.len() - 8;
    for at in (0..bytes.len()).step_by(CHECK_STRIDE_BYTES).chain([last]) {
        let got = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if got != word(expert, at) {
            return Err(format!("record {expert} differs at byte {at}"));
        }
    }
    Ok(())
}

/// Writes the bench file unless one of the right size is already there.
fn ensure_file(path: &Path, num_records: usize, record_bytes: usize) -> std::io::Result<()> {
    let want_bytes = (num_records * record_bytes) as u64;
    if std::fs::metadata(path).is_ok_and(|meta| meta.len() == want_bytes) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    eprintln!("writing {} ...", path.display());
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let mut record = vec![0u8; record_bytes];
    for expert in 0..num_records {
        for (i, chunk) in record.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&word(expert, i * 8).to_le_bytes());
        }
        out.write_all(&record)?;
    }
    out.into_inner().map_err(|err| err.into_error())?.sync_all()
}

/// 0..n in a fixed pseudo-random order (xorshift Fisher–Yates): experts are
/// fetched in router order, not file order, so readahead should not help.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// How much of the file is in the page cache (`mincore` over a fresh map),
/// to show that a "cold" pass starts cold.
fn page_cache_percent(path: &Path) -> std::io::Result<f64> {
    let file = File::open(path)?;
    // SAFETY: the map is only inspected with mincore, never dereferenced.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let pages = map.len().div_ceil(4096);
    let mut resident = vec![0u8; pages];
    // SAFETY: `map` covers `map.len()` bytes from a page-aligned address and
    // `resident` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), resident.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let cached = resident.iter().filter(|&&page| page & 1 != 0).count();
    Ok(100.0 * cached as f64 / pages as f64)
}

/// Resident memory of this process, from `/proc/self/statm`.
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    pages * 4096
}
