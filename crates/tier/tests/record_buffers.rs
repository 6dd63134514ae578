//! Record buffers give their memory back to the system when dropped, so a
//! stream of loads keeps the process inside its budget (see `aligned.rs`:
//! through glibc's allocator, freed records stayed in the process).

use strata_tier::AlignedBuf;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

fn touched(len_bytes: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len_bytes);
    buf.as_mut_slice().fill(0xa5);
    buf
}

#[test]
fn dropped_record_buffers_return_their_memory() {
    const RECORD_BYTES: usize = 2 << 20;
    // A larger record loaded and dropped first: with glibc's allocator this
    // raised its mmap threshold past the record size, so later records came
    // from the heap, where a freed one between live ones is never returned.
    drop(touched(2 * RECORD_BYTES));
    let mut held: Vec<Option<AlignedBuf>> = (0..16).map(|_| Some(touched(RECORD_BYTES))).collect();
    let peak = rss_bytes();
    for slot in held.iter_mut().step_by(2) {
        *slot = None;
    }
    let after = rss_bytes();
    let returned = peak.saturating_sub(after);
    assert!(
        returned >= 6 * RECORD_BYTES as u64,
        "8 dropped records of 2 MiB returned only {returned} bytes (RSS {peak} -> {after})"
    );
    assert_eq!(held.iter().flatten().count(), 8);
}
