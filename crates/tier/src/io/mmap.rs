//! `--io mmap`: records copied out of a read-only shared mapping of the
//! file.
//!
//! The whole file is mapped once at open. Each record is copied out
//! ([`Mapped::read`]) and its pages dropped from this process's mapping
//! (`MADV_DONTNEED`), so resident memory holds the cached copies only, not
//! every expert ever touched; the page cache may keep them, as with `pread`.
//! Records are never served as views of the mapping: a file truncated or
//! rewritten in place under a running model would fault (SIGBUS) in the
//! middle of a computation, or change a record after its check.
//!
//! Touching a mapped page past the end of the file raises SIGBUS, so every
//! read first checks the file's current length (`fstat`) and turns a record
//! that does not fit into [`Error::ShortRead`](crate::Error::ShortRead). A
//! file truncated by another process *between* that check and the copy can
//! still fault, which is why `auto` never means `mmap` (a new conversion
//! writes new files and renames them over the old names, which leaves a
//! mapped file's pages as they were).

use std::fs::File;
use std::io;
use std::path::Path;

use memmap2::{Mmap, UncheckedAdvice};

use super::{ReadContext, check_regular_file};
use crate::{AlignedBuf, Error, Result};

/// An open file and its read-only mapping.
#[derive(Debug)]
pub(super) struct Mapped {
    file: File,
    map: Mmap,
}

impl Mapped {
    /// Opens and maps `path`.
    pub(super) fn open(path: &Path) -> Result<Mapped> {
        let open_err = |source| Error::Open { path: path.to_owned(), source };
        let file = File::open(path).map_err(open_err)?;
        check_regular_file(path, &file)?;
        // SAFETY: the map is only read, and only within the file's current
        // length (checked before every copy, see the module docs); expert
        // files are not modified while a model runs.
        let map = unsafe { Mmap::map(&file) }.map_err(open_err)?;
        Ok(Mapped { file, map })
    }

    /// The mapped file.
    pub(super) fn file(&self) -> &File {
        &self.file
    }

    /// The start of a record of `record_bytes` at `ctx.offset_bytes`, once
    /// it is known to lie inside both the file as it is now and the mapping
    /// made at open (a file grown since is not remapped).
    fn record_start(&self, ctx: &ReadContext<'_>, record_bytes: usize) -> Result<usize> {
        let file_bytes = self.file.metadata().map_err(|err| ctx.read_error(err))?.len();
        let end_bytes = file_bytes.min(self.map.len() as u64);
        let available_bytes = end_bytes.saturating_sub(ctx.offset_bytes).min(record_bytes as u64) as usize;
        if available_bytes < record_bytes {
            return Err(ctx.short_read(record_bytes, available_bytes));
        }
        Ok(ctx.offset_bytes as usize)
    }

    /// Copies one record into `buf`, then drops its pages from the mapping.
    pub(super) fn read(&self, ctx: &ReadContext<'_>, buf: &mut AlignedBuf) -> Result<()> {
        let record_bytes = buf.len();
        let start = self.record_start(ctx, record_bytes)?;
        buf.as_mut_slice().copy_from_slice(&self.map[start..start + record_bytes]);
        // SAFETY: no reference into this range outlives the copy above.
        // DONTNEED on a shared read-only file mapping only unmaps the pages;
        // the next access faults the same file contents back in, so a
        // concurrent reader of a neighbouring record sharing a boundary page
        // sees the same bytes. memmap2 rounds the start down to a page.
        let advised = unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, record_bytes) };
        // Failing to drop the pages costs memory, not correctness; the record is complete.
        debug_assert!(advised.is_ok(), "madvise(MADV_DONTNEED): {advised:?}");
        Ok(())
    }

    /// Drops every page of the mapping, so that the page cache can evict them.
    pub(super) fn unmap_all_pages(&self) -> io::Result<()> {
        if self.map.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `read`: the mapping is shared and read-only, so the
        // next access faults the same file contents back in.
        unsafe { self.map.unchecked_advise(UncheckedAdvice::DontNeed) }
    }
}
