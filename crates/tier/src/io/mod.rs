//! Disk I/O for expert records: four interchangeable backends behind one
//! [`RecordFile`], and a bounded pool of worker threads ([`IoPool`]).
//!
//! | `--io`   | how a record is read |
//! |----------|----------------------|
//! | `pread`  | buffered positioned reads (`read_at`), through the page cache |
//! | `direct` | one O_DIRECT positioned read per record, straight into the aligned buffer |
//! | `uring`  | one io_uring `Read` per record on an O_DIRECT descriptor, a ring per thread |
//! | `mmap`   | a read-only mapping: records copied out, then `MADV_DONTNEED` |
//! | `auto`   | the default: `pread` |
//!
//! Every backend shares one completion loop (`read_fully`): short reads are
//! resumed until the record is complete, `EINTR` is retried, the end of the
//! file before the end of the record is [`Error::ShortRead`], and any other
//! failure is [`Error::Read`] naming the file, layer and expert. A record is
//! only ever handed out complete; on error the caller gets `Err`, never the
//! partly filled buffer as data. (What the bytes must say is checked by the
//! store, on the thread that takes the record: see [`RecordCheck`].)

mod direct;
mod mmap;
mod pool;
mod pread;
mod uring;

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

pub use pool::{Gate, GateHold, IoPool};

use crate::{AlignedBuf, Error, Result};

/// The most bytes Linux moves in one read call (`MAX_RW_COUNT`); longer
/// requests come back short anyway, so each call asks for at most this. A
/// multiple of [`ALIGN_BYTES`](crate::aligned::ALIGN_BYTES), so O_DIRECT
/// chunks stay aligned.
const MAX_READ_BYTES: usize = 0x7fff_f000;

/// The longest request of a read that may be stopped
/// ([`RecordSource::read_record_until`]): whether to stop is asked between
/// requests, so a stopped read holds the drive for at most one of these
/// (0.3 ms at 2 GB/s, under 1 ms at 0.6). Aligned for O_DIRECT.
const STOPPABLE_REQUEST_BYTES: usize = 512 << 10;

/// How expert records are read from disk (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum IoBackend {
    /// The store chooses ([`IoBackend::resolve`]); a file opened alone with
    /// it reads with `pread`.
    #[default]
    Auto,
    /// Buffered positioned reads through the page cache.
    Pread,
    /// O_DIRECT reads into aligned buffers, one per record.
    Direct,
    /// io_uring reads on an O_DIRECT descriptor.
    Uring,
    /// A read-only memory map, records copied out.
    Mmap,
}

impl IoBackend {
    /// Every backend that reads (`auto` picks one of them), in the order
    /// `--help` lists them.
    pub const ALL: [IoBackend; 4] = [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap];

    /// The backend `auto` stands for: `pread`, whose reads of a file
    /// changed under a running model fail or come back short, where a
    /// mapping's pages would fault (SIGBUS). Any other backend is itself.
    pub fn resolve(self) -> IoBackend {
        match self {
            IoBackend::Auto => IoBackend::Pread,
            backend => backend,
        }
    }

    /// The `--io` spelling.
    pub fn name(self) -> &'static str {
        match self {
            IoBackend::Auto => "auto",
            IoBackend::Pread => "pread",
            IoBackend::Direct => "direct",
            IoBackend::Uring => "uring",
            IoBackend::Mmap => "mmap",
        }
    }

    /// Whether this backend bypasses the page cache with O_DIRECT, and so
    /// needs records that are whole multiples of 4096 bytes.
    pub fn is_direct(self) -> bool {
        matches!(self, IoBackend::Direct | IoBackend::Uring)
    }
}

impl fmt::Display for IoBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IoBackend {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        std::iter::once(IoBackend::Auto)
            .chain(IoBackend::ALL)
            .find(|backend| backend.name() == text)
            .ok_or_else(|| Error::UnknownIoBackend { text: text.to_owned() })
    }
}

/// A check of each record as it is read from disk (never of a cached one),
/// given the expert index and the complete record: the layers above know
/// what the bytes mean. `Err` holds the reason, naming the file, layer and
/// expert, and the record is not handed out. The store runs it on the
/// thread that takes the record from the I/O pool, not on an I/O worker, so
/// that a worker goes straight on to its next read.
pub type RecordCheck = Arc<dyn Fn(usize, &[u8]) -> std::result::Result<(), String> + Send + Sync>;

/// Anything the I/O pool can read a record from: an expert file, or one
/// with copies on other drives (`mirror`).
pub trait RecordSource: Send + Sync {
    /// Reads record `expert` completely into `buf` (exactly one record
    /// long); on error the contents of `buf` must not be used.
    fn read_record(&self, expert: usize, buf: &mut AlignedBuf) -> Result<()>;

    /// [`read_record`](Self::read_record) in requests of at most
    /// `STOPPABLE_REQUEST_BYTES`, asking `stop` before each: once it says
    /// true the read ends with [`Error::ReadStopped`] (a guess its demand
    /// overtook), which says nothing about the source's health.
    fn read_record_until(&self, expert: usize, buf: &mut AlignedBuf, stop: &dyn Fn() -> bool) -> Result<()>;
}

impl RecordSource for RecordFile {
    fn read_record(&self, expert: usize, buf: &mut AlignedBuf) -> Result<()> {
        self.read_into(expert, buf)
    }

    fn read_record_until(&self, expert: usize, buf: &mut AlignedBuf, stop: &dyn Fn() -> bool) -> Result<()> {
        self.read_into_until(expert, buf, stop)
    }
}

/// The open file and whatever the backend keeps with it.
#[derive(Debug)]
enum Handle {
    /// Pread: a plain descriptor.
    Buffered(File),
    /// Direct and Uring: a descriptor opened with O_DIRECT.
    Direct(File),
    /// Mmap: the descriptor (for `fstat` and `posix_fadvise`) and its mapping.
    Mapped(mmap::Mapped),
}

/// One open expert file: `num_experts` fixed-size records, record `e` at byte
/// offset `e * record_bytes`.
///
/// `RecordFile` is `Send + Sync`: any number of threads may read records
/// concurrently (the io_uring backend keeps one ring per thread, so readers
/// never contend on a ring).
pub struct RecordFile {
    backend: IoBackend,
    path: PathBuf,
    layer: usize,
    record_bytes: usize,
    num_experts: usize,
    handle: Handle,
}

impl fmt::Debug for RecordFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordFile")
            .field("backend", &self.backend)
            .field("path", &self.path)
            .field("layer", &self.layer)
            .field("record_bytes", &self.record_bytes)
            .field("num_experts", &self.num_experts)
            .field("handle", &self.handle)
            .finish()
    }
}

impl RecordFile {
    /// Opens `path`, the routed experts of `layer`, for reading with `backend`.
    ///
    /// Fails with [`Error::Open`] naming the path when the file cannot be
    /// opened, [`Error::NotAFile`] for a directory or device, and for the
    /// O_DIRECT backends (`direct`, `uring`) with [`Error::UnalignedRecords`]
    /// when `record_bytes` is not a multiple of 4096 and
    /// [`Error::DirectUnsupported`] when the filesystem refuses O_DIRECT.
    /// `uring` also fails with [`Error::UringSetup`] when io_uring is
    /// unavailable. No backend ever falls back to another silently.
    pub fn open(
        backend: IoBackend,
        path: &Path,
        layer: usize,
        record_bytes: usize,
        num_experts: usize,
    ) -> Result<RecordFile> {
        let backend = backend.resolve();
        let handle = match backend {
            IoBackend::Auto => unreachable!("resolved above"),
            IoBackend::Pread => Handle::Buffered(pread::open(path)?),
            IoBackend::Direct => Handle::Direct(direct::open(backend, path, record_bytes)?),
            IoBackend::Uring => {
                let file = direct::open(backend, path, record_bytes)?;
                // Probe now, so a kernel without io_uring fails at open with a
                // clear message rather than at the first expert miss.
                uring::probe(path)?;
                Handle::Direct(file)
            }
            IoBackend::Mmap => Handle::Mapped(mmap::Mapped::open(path)?),
        };
        Ok(RecordFile { backend, path: path.to_owned(), layer, record_bytes, num_experts, handle })
    }

    /// Reads record `expert` completely into `buf`, which must be exactly
    /// `record_bytes` long.
    ///
    /// Short reads and `EINTR` are retried until the record is complete. The
    /// end of the file before the end of the record is [`Error::ShortRead`];
    /// any other failure is [`Error::Read`] naming the path, layer and
    /// expert. On error the contents of `buf` are unspecified and must not be
    /// used.
    pub fn read_into(&self, expert: usize, buf: &mut AlignedBuf) -> Result<()> {
        self.read(expert, buf, None)
    }

    /// [`read_into`](Self::read_into), stopped with [`Error::ReadStopped`]
    /// once `stop` says so (asked between requests of at most
    /// `STOPPABLE_REQUEST_BYTES`; a mapped file copies whole records).
    pub fn read_into_until(&self, expert: usize, buf: &mut AlignedBuf, stop: &dyn Fn() -> bool) -> Result<()> {
        self.read(expert, buf, Some(stop))
    }

    fn read(&self, expert: usize, buf: &mut AlignedBuf, stop: Option<&dyn Fn() -> bool>) -> Result<()> {
        if expert >= self.num_experts {
            return Err(Error::NoSuchExpert { layer: self.layer, expert });
        }
        if buf.len() != self.record_bytes {
            return Err(Error::BufferSize {
                path: self.path.clone(),
                layer: self.layer,
                expert,
                wanted_bytes: self.record_bytes,
                got_bytes: buf.len(),
            });
        }
        let ctx = ReadContext { stop, ..self.context(expert) };
        match (&self.handle, self.backend) {
            (Handle::Buffered(file), _) => pread::read(&ctx, file, buf),
            (Handle::Direct(file), IoBackend::Uring) => uring::read(&ctx, file, buf),
            (Handle::Direct(file), _) => direct::read(&ctx, file, buf),
            (Handle::Mapped(mapped), _) => mapped.read(&ctx, buf),
        }
    }

    /// Byte offset of record `expert` in the file.
    fn offset_bytes(&self, expert: usize) -> u64 {
        expert as u64 * self.record_bytes as u64
    }

    fn context(&self, expert: usize) -> ReadContext<'_> {
        ReadContext { path: &self.path, layer: self.layer, expert, offset_bytes: self.offset_bytes(expert), stop: None }
    }

    /// Bytes per record.
    pub fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    /// Records in the file.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// The MoE layer whose experts this file holds.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// The backend reading this file.
    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drops this file's pages from the page cache (`posix_fadvise`
    /// `DONTNEED`), so that the next reads come from the device: for cold
    /// benchmarks. Dirty pages are written back first, because `DONTNEED`
    /// silently keeps them.
    pub fn evict_page_cache(&self) -> Result<()> {
        let evict_err = |source| Error::EvictPageCache { path: self.path.clone(), source };
        let file = match &self.handle {
            Handle::Buffered(file) | Handle::Direct(file) => file,
            Handle::Mapped(mapped) => {
                // Pages still mapped into this process cannot be dropped.
                mapped.unmap_all_pages().map_err(evict_err)?;
                mapped.file()
            }
        };
        file.sync_data().map_err(evict_err)?;
        // SAFETY: plain syscall on a descriptor we own; offset 0 and length 0
        // mean "the whole file".
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            // posix_fadvise returns the error number instead of setting errno.
            return Err(evict_err(io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }
}

/// What a read is for: the context every error names.
struct ReadContext<'a> {
    path: &'a Path,
    layer: usize,
    expert: usize,
    offset_bytes: u64,
    /// Asked between requests: true ends the read ([`Error::ReadStopped`]).
    stop: Option<&'a dyn Fn() -> bool>,
}

impl ReadContext<'_> {
    fn stopped(&self, done_bytes: usize) -> Error {
        Error::ReadStopped { path: self.path.to_owned(), layer: self.layer, expert: self.expert, done_bytes }
    }

    fn read_error(&self, source: io::Error) -> Error {
        Error::Read { path: self.path.to_owned(), layer: self.layer, expert: self.expert, source }
    }

    fn short_read(&self, wanted_bytes: usize, got_bytes: usize) -> Error {
        Error::ShortRead {
            path: self.path.to_owned(),
            layer: self.layer,
            expert: self.expert,
            offset_bytes: self.offset_bytes,
            wanted_bytes,
            got_bytes,
        }
    }
}

/// Fills `buf` with the record at `ctx.offset_bytes` by calling `read_at`
/// until every byte has arrived: the one retry loop all backends share.
///
/// `read_at(buf, range, file_offset)` reads into `buf[range]` from
/// `file_offset` and returns how many bytes arrived (0 at the end of the
/// file), like `pread`. It gets the whole buffer, not a slice, so that a
/// backend which cannot reclaim a buffer the kernel still writes to can swap
/// it out (see `uring`).
///
/// With `align_bytes > 1` (O_DIRECT), every request starts on a multiple of
/// `align_bytes`: after a short read that ended mid-block, the partial block
/// is read again from its start. Such a read ends mid-block only at the end
/// of the file, so when the re-read brings nothing new the file has ended.
fn read_fully(
    ctx: &ReadContext<'_>,
    buf: &mut AlignedBuf,
    align_bytes: usize,
    mut read_at: impl FnMut(&mut AlignedBuf, Range<usize>, u64) -> io::Result<usize>,
) -> Result<()> {
    debug_assert!(align_bytes.is_power_of_two());
    let record_bytes = buf.len();
    let max_request_bytes = if ctx.stop.is_some() { STOPPABLE_REQUEST_BYTES } else { MAX_READ_BYTES };
    let mut done_bytes = 0;
    while done_bytes < record_bytes {
        if ctx.stop.is_some_and(|stop| stop()) {
            return Err(ctx.stopped(done_bytes));
        }
        let start = done_bytes & !(align_bytes - 1);
        let end = record_bytes.min(start + max_request_bytes);
        match read_at(buf, start..end, ctx.offset_bytes + start as u64) {
            Ok(0) => return Err(ctx.short_read(record_bytes, done_bytes)),
            Ok(got_bytes) => {
                let reached = start + got_bytes.min(end - start);
                if reached <= done_bytes {
                    return Err(ctx.short_read(record_bytes, done_bytes));
                }
                done_bytes = reached;
            }
            // A signal or a momentarily busy queue: nothing went wrong, ask again.
            Err(err) if matches!(err.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
            Err(err) => return Err(ctx.read_error(err)),
        }
    }
    Ok(())
}

/// Checks that an opened path is a regular file: a directory opens fine
/// read-only on Linux and only fails at the first read, far from the cause.
fn check_regular_file(path: &Path, file: &File) -> Result<()> {
    let meta = file.metadata().map_err(|source| Error::Open { path: path.to_owned(), source })?;
    if meta.is_file() { Ok(()) } else { Err(Error::NotAFile { path: path.to_owned() }) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// Records of `record_bytes`, each byte a function of its expert and position,
    /// so a record read from the wrong offset or partly zero is caught.
    pub(crate) fn record_pattern(expert: usize, record_bytes: usize) -> Vec<u8> {
        (0..record_bytes).map(|i| ((i * 7 + expert * 131 + (i >> 12) * 3) % 251) as u8 + 1).collect()
    }

    pub(crate) fn write_records(path: &Path, num_experts: usize, record_bytes: usize) {
        let mut file = File::create(path).unwrap();
        for expert in 0..num_experts {
            file.write_all(&record_pattern(expert, record_bytes)).unwrap();
        }
        file.sync_all().unwrap();
    }

    const RECORD_BYTES: usize = 3 * 4096;
    const NUM_EXPERTS: usize = 5;

    #[test]
    fn backend_names_round_trip() {
        for backend in IoBackend::ALL {
            assert_eq!(backend.to_string().parse::<IoBackend>().unwrap(), backend);
        }
        assert_eq!(IoBackend::default(), IoBackend::Auto);
        assert_eq!("auto".parse::<IoBackend>().unwrap(), IoBackend::Auto);
        let err = "aio".parse::<IoBackend>().unwrap_err().to_string();
        for name in ["aio", "auto", "pread", "direct", "uring", "mmap"] {
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn every_backend_reads_every_record_bit_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_003.bin");
        write_records(&path, NUM_EXPERTS, RECORD_BYTES);
        for backend in IoBackend::ALL {
            let file = RecordFile::open(backend, &path, 3, RECORD_BYTES, NUM_EXPERTS).unwrap();
            assert_eq!((file.record_bytes(), file.path()), (RECORD_BYTES, path.as_path()));
            // Out of order, and each record twice, to catch stale state between reads.
            for expert in [4, 0, 2, 1, 3, 3, 0] {
                let mut buf = AlignedBuf::zeroed(RECORD_BYTES);
                file.read_into(expert, &mut buf).unwrap();
                assert!(buf.as_slice() == record_pattern(expert, RECORD_BYTES), "{backend}: expert {expert} differs");
            }
            file.evict_page_cache().unwrap();
            let mut buf = AlignedBuf::zeroed(RECORD_BYTES);
            file.read_into(2, &mut buf).unwrap();
            assert!(buf.as_slice() == record_pattern(2, RECORD_BYTES), "{backend}: after eviction");
        }
    }

    #[test]
    fn buffered_backends_read_records_of_any_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        let record_bytes = 5000;
        write_records(&path, 3, record_bytes);
        for backend in [IoBackend::Pread, IoBackend::Mmap] {
            let file = RecordFile::open(backend, &path, 0, record_bytes, 3).unwrap();
            for expert in 0..3 {
                let mut buf = AlignedBuf::zeroed(record_bytes);
                file.read_into(expert, &mut buf).unwrap();
                assert!(buf.as_slice() == record_pattern(expert, record_bytes), "{backend}: expert {expert}");
            }
        }
    }

    #[test]
    fn direct_backends_reject_unaligned_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        write_records(&path, 3, 5000);
        for backend in [IoBackend::Direct, IoBackend::Uring] {
            let err = RecordFile::open(backend, &path, 0, 5000, 3).unwrap_err();
            assert!(matches!(err, Error::UnalignedRecords { record_bytes: 5000, .. }), "{err}");
            assert!(err.to_string().contains("4096"), "{err}");
        }
    }

    /// Truncated inside the last record (mid-block, so O_DIRECT sees an
    /// unaligned end) and exactly at a record boundary.
    #[test]
    fn truncated_file_is_a_short_read_naming_the_expert_for_every_backend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_007.bin");
        for (len_bytes, expert, got_bytes) in [
            (4 * RECORD_BYTES as u64 + 4096 + 10, 4, 4096 + 10),
            (4 * RECORD_BYTES as u64 + 10, 4, 10),
            (3 * RECORD_BYTES as u64, 3, 0),
        ] {
            write_records(&path, NUM_EXPERTS, RECORD_BYTES);
            File::options().write(true).open(&path).unwrap().set_len(len_bytes).unwrap();
            for backend in IoBackend::ALL {
                let file = RecordFile::open(backend, &path, 7, RECORD_BYTES, NUM_EXPERTS).unwrap();
                let mut buf = AlignedBuf::zeroed(RECORD_BYTES);
                file.read_into(0, &mut buf).unwrap();
                let err = file.read_into(expert, &mut buf).unwrap_err();
                match &err {
                    Error::ShortRead { layer: 7, expert: e, got_bytes: got, wanted_bytes, .. } => {
                        assert_eq!((*e, *got, *wanted_bytes), (expert, got_bytes, RECORD_BYTES), "{backend}: {err}")
                    }
                    other => panic!("{backend}: expected a short read, got {other}"),
                }
                let text = err.to_string();
                assert!(text.contains(&format!("expert {expert} of layer 7")) && text.contains("truncated"), "{text}");
                assert!(text.contains("layer_007.bin"), "{text}");
            }
        }
    }

    /// The store opens files once and reads for a long time: a file cut
    /// short after opening must still be a short read, for mmap too (where
    /// touching the mapping past the end would be SIGBUS).
    #[test]
    fn file_truncated_after_open_is_a_short_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        write_records(&path, NUM_EXPERTS, RECORD_BYTES);
        let files: Vec<_> = IoBackend::ALL
            .into_iter()
            .map(|backend| RecordFile::open(backend, &path, 0, RECORD_BYTES, NUM_EXPERTS).unwrap())
            .collect();
        File::options().write(true).open(&path).unwrap().set_len(2 * RECORD_BYTES as u64 + 100).unwrap();
        for file in &files {
            let mut buf = AlignedBuf::zeroed(RECORD_BYTES);
            let err = file.read_into(2, &mut buf).unwrap_err();
            assert!(matches!(err, Error::ShortRead { expert: 2, got_bytes: 100, .. }), "{}: {err}", file.backend());
            let err = file.read_into(4, &mut buf).unwrap_err();
            assert!(matches!(err, Error::ShortRead { expert: 4, got_bytes: 0, .. }), "{}: {err}", file.backend());
        }
    }

    #[test]
    fn missing_file_is_an_open_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no_such_layer.bin");
        for backend in IoBackend::ALL {
            let err = RecordFile::open(backend, &path, 0, 4096, 1).unwrap_err();
            assert!(matches!(err, Error::Open { .. }), "{backend}: {err}");
            assert!(err.to_string().contains("no_such_layer.bin"), "{backend}: {err}");
        }
    }

    /// Root reads through `chmod 000`, so unreadability is made with a
    /// directory where the file should be.
    #[test]
    fn directory_instead_of_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        for backend in IoBackend::ALL {
            let err = RecordFile::open(backend, dir.path(), 0, 4096, 1).unwrap_err();
            assert!(matches!(err, Error::NotAFile { .. }), "{backend}: {err}");
            assert!(err.to_string().contains(&dir.path().display().to_string()), "{backend}: {err}");
        }
    }

    #[test]
    fn wrong_expert_or_buffer_size_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        write_records(&path, NUM_EXPERTS, RECORD_BYTES);
        for backend in IoBackend::ALL {
            let file = RecordFile::open(backend, &path, 1, RECORD_BYTES, NUM_EXPERTS).unwrap();
            let err = file.read_into(NUM_EXPERTS, &mut AlignedBuf::zeroed(RECORD_BYTES)).unwrap_err();
            assert!(matches!(err, Error::NoSuchExpert { layer: 1, expert: NUM_EXPERTS }), "{err}");
            let err = file.read_into(0, &mut AlignedBuf::zeroed(4096)).unwrap_err();
            assert!(matches!(err, Error::BufferSize { wanted_bytes: RECORD_BYTES, got_bytes: 4096, .. }), "{err}");
        }
    }

    fn ctx() -> ReadContext<'static> {
        ReadContext {
            path: Path::new("/models/m/experts/layer_002.bin"),
            layer: 2,
            expert: 5,
            offset_bytes: 5 * 8192,
            stop: None,
        }
    }

    /// A read that may be stopped asks before every request, and requests
    /// are short enough that a stop takes effect within one of them.
    #[test]
    fn a_stoppable_read_ends_at_the_request_its_stop_is_asked_before() {
        let record_bytes = 3 * STOPPABLE_REQUEST_BYTES;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        write_records(&path, 2, record_bytes);
        for backend in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring] {
            let file = RecordFile::open(backend, &path, 4, record_bytes, 2).unwrap();
            let mut buf = AlignedBuf::zeroed(record_bytes);
            let asked = std::cell::Cell::new(0);
            let stop_after_one = || {
                asked.set(asked.get() + 1);
                asked.get() > 1
            };
            let err = file.read_into_until(1, &mut buf, &stop_after_one).unwrap_err();
            let stopped_at = STOPPABLE_REQUEST_BYTES;
            assert!(
                matches!(err, Error::ReadStopped { layer: 4, expert: 1, done_bytes, .. } if done_bytes == stopped_at),
                "{backend}: {err}"
            );
            assert_eq!(asked.get(), 2, "{backend}");
            // Never stopped: the whole record, in three requests.
            asked.set(0);
            file.read_into_until(1, &mut buf, &|| {
                asked.set(asked.get() + 1);
                false
            })
            .unwrap();
            assert!(buf.as_slice() == record_pattern(1, record_bytes), "{backend}");
            assert_eq!(asked.get(), 3, "{backend}");
        }
    }

    /// A fake device that hands out the record in dribbles, interleaved with
    /// `EINTR` and `EAGAIN`: the loop must still deliver every byte in place.
    #[test]
    fn read_loop_resumes_short_reads_and_retries_interrupts() {
        let record_bytes = 8192;
        let file_bytes: Vec<u8> = (0..6 * record_bytes).map(|i| (i % 253) as u8).collect();
        let mut calls = 0;
        let mut buf = AlignedBuf::zeroed(record_bytes);
        read_fully(&ctx(), &mut buf, 1, |buf, range, offset| {
            calls += 1;
            match calls % 3 {
                0 => return Err(io::ErrorKind::Interrupted.into()),
                1 if calls % 2 == 0 => return Err(io::ErrorKind::WouldBlock.into()),
                _ => {}
            }
            let n = range.len().min(1000);
            let at = offset as usize;
            buf.as_mut_slice()[range.start..range.start + n].copy_from_slice(&file_bytes[at..at + n]);
            Ok(n)
        })
        .unwrap();
        assert!(buf.as_slice() == &file_bytes[5 * record_bytes..6 * record_bytes]);
    }

    /// O_DIRECT requests must stay aligned: after a short read ending
    /// mid-block the loop re-reads that block from its start.
    #[test]
    fn direct_read_loop_realigns_after_a_partial_block() {
        let record_bytes = 8192;
        let file_bytes: Vec<u8> = (0..6 * record_bytes).map(|i| (i % 241) as u8).collect();
        let mut starts = Vec::new();
        let mut buf = AlignedBuf::zeroed(record_bytes);
        read_fully(&ctx(), &mut buf, 4096, |buf, range, offset| {
            assert_eq!((range.start % 4096, offset % 4096), (0, 0));
            starts.push(range.start);
            // First call stops 100 bytes into the second block.
            let n = if starts.len() == 1 { 4196 } else { range.len() };
            let at = offset as usize;
            buf.as_mut_slice()[range.start..range.start + n].copy_from_slice(&file_bytes[at..at + n]);
            Ok(n)
        })
        .unwrap();
        assert_eq!(starts, [0, 4096]);
        assert!(buf.as_slice() == &file_bytes[5 * record_bytes..6 * record_bytes]);
    }

    #[test]
    fn read_loop_reports_errors_with_file_layer_and_expert() {
        let mut buf = AlignedBuf::zeroed(8192);
        let err = read_fully(&ctx(), &mut buf, 1, |_, _, _| Err(io::Error::from_raw_os_error(libc::EIO))).unwrap_err();
        assert!(matches!(err, Error::Read { layer: 2, expert: 5, .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("expert 5 of layer 2") && text.contains("layer_002.bin"), "{text}");

        // A partial block that never grows is the end of the file, not a hang.
        let err = read_fully(&ctx(), &mut buf, 4096, |_, range, _| Ok(if range.start == 0 { 4096 + 10 } else { 10 }))
            .unwrap_err();
        assert!(matches!(err, Error::ShortRead { got_bytes: 4106, offset_bytes: 40960, .. }), "{err}");
    }
}
