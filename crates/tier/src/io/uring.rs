//! `--io uring`: io_uring `Read`s of whole records on an O_DIRECT descriptor.
//!
//! Each thread that reads gets its own small ring (thread-local, created on
//! its first read), so I/O pool workers never contend on a ring and a
//! [`RecordFile`](super::RecordFile) stays `Sync` without a lock. A thread has
//! at most one read in flight on its ring: `read_into` is synchronous, and
//! parallelism comes from the pool's workers. The win over `direct` is the
//! submission path (no per-read syscall argument copying, async O_DIRECT in
//! the kernel), not queue depth.
//!
//! The kernel writes into the caller's buffer until the completion is
//! reaped, so a read may never return while its request is still in flight.
//! Every path below either reaps the completion, or proves the kernel never
//! took the request (then the ring is dropped, discarding it), or, if waiting
//! itself fails, leaks the buffer so that late writes land in memory nobody
//! uses (`abandon`).

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::Path;

use io_uring::{IoUring, opcode, types};

use super::{ReadContext, read_fully};
use crate::aligned::ALIGN_BYTES;
use crate::{AlignedBuf, Error, Result};

/// Submission queue entries per ring: one read is in flight at a time, so
/// the smallest ring the kernel accepts would do; a few spare cost nothing.
const RING_ENTRIES: u32 = 4;

/// `user_data` of our reads, to recognise their completions.
const READ_TOKEN: u64 = u64::from_le_bytes(*b"strata\0\0");

thread_local! {
    /// This thread's ring; `None` until its first read, or after a ring was
    /// discarded because its state could no longer be trusted.
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

fn new_ring() -> io::Result<IoUring> {
    IoUring::new(RING_ENTRIES)
}

/// Sets up this thread's ring now, so that a kernel without io_uring (or with
/// it disabled or filtered by seccomp) fails at open with a clear error.
pub(super) fn probe(path: &Path) -> Result<()> {
    RING.with(|cell| ensure_ring(&mut cell.borrow_mut(), path))
}

fn ensure_ring(slot: &mut Option<IoUring>, path: &Path) -> Result<()> {
    if slot.is_none() {
        *slot = Some(new_ring().map_err(|source| Error::UringSetup { path: path.to_owned(), source })?);
    }
    Ok(())
}

/// What became of one submitted read.
enum Outcome {
    /// The completion was reaped: bytes read, or the error it carried.
    Completed(io::Result<usize>),
    /// The kernel never took the request; the ring still holds it and must
    /// be dropped so that it can never be submitted later.
    NotSubmitted(io::Error),
    /// The request was taken but its completion could not be waited for:
    /// the kernel may still write into the buffer.
    Lost(io::Error),
}

/// Reads one record through this thread's ring, resuming short completions
/// on aligned boundaries like `direct`.
pub(super) fn read(ctx: &ReadContext<'_>, file: &File, buf: &mut AlignedBuf) -> Result<()> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        ensure_ring(&mut slot, ctx.path)?;
        read_fully(ctx, buf, ALIGN_BYTES, |buf, range, offset_bytes| {
            // A ring discarded by an earlier attempt of this same record is
            // replaced; failing that is an ordinary read error.
            let ring = match slot.as_mut() {
                Some(ring) => ring,
                None => slot.insert(new_ring()?),
            };
            match read_once(ring, file, buf, range, offset_bytes) {
                Outcome::Completed(result) => result,
                Outcome::NotSubmitted(err) => {
                    *slot = None;
                    Err(err)
                }
                Outcome::Lost(err) => {
                    abandon(buf);
                    *slot = None;
                    Err(io::Error::new(err.kind(), format!("waiting for an io_uring read failed: {err}")))
                }
            }
        })
    })
}

/// Submits one `Read` of `buf[range]` from `offset_bytes` and waits for it.
fn read_once(ring: &mut IoUring, file: &File, buf: &mut AlignedBuf, range: Range<usize>, offset_bytes: u64) -> Outcome {
    // `read_fully` caps requests at `MAX_READ_BYTES`, which fits in a u32.
    let len_bytes = u32::try_from(range.len()).expect("read request longer than MAX_READ_BYTES");
    let ptr = buf.as_mut_slice()[range].as_mut_ptr();
    let entry = opcode::Read::new(types::Fd(file.as_raw_fd()), ptr, len_bytes)
        .offset(offset_bytes)
        .build()
        .user_data(READ_TOKEN);
    // SAFETY: `ptr..ptr + len_bytes` lies inside `buf`, which the caller
    // borrows mutably for this whole call, and `file` outlives it too. This
    // function returns only once the completion is reaped (`Completed`), the
    // kernel provably never took the request (`NotSubmitted`: the caller then
    // drops the ring), or the caller leaks the buffer (`Lost`), so the kernel
    // never writes to memory that is freed or reused.
    if unsafe { ring.submission().push(&entry) }.is_err() {
        // One read at a time leaves the queue empty here; a full queue means
        // the ring's state is not what we think.
        return Outcome::NotSubmitted(io::Error::other("io_uring submission queue unexpectedly full"));
    }
    loop {
        // One syscall submits the read and waits for it.
        let submitted = ring.submit_and_wait(1);
        // Whatever `submit` said, the queue's head tells whether the kernel
        // took the entry; that decides whether the buffer is in the kernel's hands.
        if ring.submission().is_empty() {
            break;
        }
        match submitted {
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Outcome::NotSubmitted(err),
            Ok(_) => return Outcome::NotSubmitted(io::Error::other("io_uring did not accept the read")),
        }
    }
    loop {
        if let Some(cqe) = ring.completion().next() {
            if cqe.user_data() != READ_TOKEN {
                // Not ours (cannot happen with one read per ring): keep waiting for ours.
                continue;
            }
            let result = cqe.result();
            return Outcome::Completed(if result < 0 {
                Err(io::Error::from_raw_os_error(-result))
            } else {
                Ok(result as usize)
            });
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            // A signal, or the kernel briefly short of completion space: wait again.
            Err(err)
                if err
                    .raw_os_error()
                    .is_some_and(|errno| [libc::EINTR, libc::EAGAIN, libc::EBUSY].contains(&errno)) => {}
            Err(err) => return Outcome::Lost(err),
        }
    }
}

/// Swaps the caller's buffer for a fresh one and leaks the original, which an
/// abandoned request may still write into. The caller gets an error, so the
/// fresh (zeroed) buffer is never taken for data.
fn abandon(buf: &mut AlignedBuf) {
    let in_flight = std::mem::replace(buf, AlignedBuf::zeroed(buf.len()));
    std::mem::forget(in_flight);
}
