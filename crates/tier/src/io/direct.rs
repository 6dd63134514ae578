//! `--io direct`: O_DIRECT positioned reads, one per record, straight from the
//! device into the caller's page-aligned buffer.
//!
//! Bypassing the page cache means a record is copied once (device → buffer)
//! and the cache budget is the only RAM experts use. The price: offsets,
//! lengths and buffer addresses must be multiples of [`ALIGN_BYTES`]. Records
//! are laid out on 4096-byte boundaries and [`AlignedBuf`] is page aligned, so
//! only the record size needs checking, once, at open.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::{IoBackend, ReadContext, check_regular_file, read_fully};
use crate::aligned::ALIGN_BYTES;
use crate::{AlignedBuf, Error, Result};

/// Opens `path` read-only with O_DIRECT for `backend` (`direct` or `uring`).
pub(super) fn open(backend: IoBackend, path: &Path, record_bytes: usize) -> Result<File> {
    if !record_bytes.is_multiple_of(ALIGN_BYTES) {
        return Err(Error::UnalignedRecords {
            path: path.to_owned(),
            backend: backend.name(),
            record_bytes,
            align_bytes: ALIGN_BYTES,
        });
    }
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|source| open_error(backend, path, source))?;
    check_regular_file(path, &file)?;
    Ok(file)
}

/// Names why `open(O_DIRECT)` failed. EINVAL means "this file cannot do
/// direct I/O": either its filesystem lacks O_DIRECT (tmpfs before Linux 6.6,
/// some FUSE and network filesystems) or the path is not a regular file.
fn open_error(backend: IoBackend, path: &Path, source: io::Error) -> Error {
    if source.raw_os_error() != Some(libc::EINVAL) {
        return Error::Open { path: path.to_owned(), source };
    }
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Error::NotAFile { path: path.to_owned() },
        _ => Error::DirectUnsupported { path: path.to_owned(), backend: backend.name(), source },
    }
}

/// Reads one record with O_DIRECT `pread`, resuming short reads on aligned
/// boundaries.
pub(super) fn read(ctx: &ReadContext<'_>, file: &File, buf: &mut AlignedBuf) -> Result<()> {
    read_fully(ctx, buf, ALIGN_BYTES, |buf, range, offset_bytes| {
        debug_assert!(offset_bytes.is_multiple_of(ALIGN_BYTES as u64) && range.start.is_multiple_of(ALIGN_BYTES));
        file.read_at(&mut buf.as_mut_slice()[range], offset_bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Filesystems that refuse O_DIRECT are hard to come by (tmpfs accepts it
    /// since Linux 6.6), so the classification of the refusal is tested alone.
    #[test]
    fn einval_at_open_names_the_missing_o_direct_support() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);

        let err = open_error(IoBackend::Uring, &path, einval());
        assert!(matches!(err, Error::DirectUnsupported { backend: "uring", .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("O_DIRECT") && text.contains("layer.bin") && text.contains("--io pread"), "{text}");

        let err = open_error(IoBackend::Direct, dir.path(), einval());
        assert!(matches!(err, Error::NotAFile { .. }), "{err}");
        let err = open_error(IoBackend::Direct, &path, io::Error::from_raw_os_error(libc::EACCES));
        assert!(matches!(err, Error::Open { .. }), "{err}");
    }
}
