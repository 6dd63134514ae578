//! `--io mmap`: records through a read-only shared mapping of the file.
//!
//! The whole file is mapped once at open. When the store's cache can hold
//! every record it serves each one in place ([`Mapped::record`]): the
//! computation reads the page cache's own pages, nothing is copied, and a
//! process started on a model already in the page cache has its experts at
//! once (what `--io auto` picks then). Otherwise each record is copied out
//! ([`Mapped::read`]) and its pages dropped from this process's mapping
//! (`MADV_DONTNEED`), so resident memory holds the cached copies only, not
//! every expert ever touched; the page cache may keep them, as with `pread`.
//!
//! Touching a mapped page past the end of the file raises SIGBUS, so every
//! read first checks the file's current length (`fstat`) and turns a record
//! that does not fit into [`Error::ShortRead`](crate::Error::ShortRead). A
//! file truncated by another process *between* that check and the copy can
//! still fault; expert files are written once and never shrink in place
//! (a new conversion writes new files and renames them over the old names,
//! which leaves a mapped file's pages as they were).

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Advice, Mmap, UncheckedAdvice};

use super::{ReadContext, check_regular_file};
use crate::{AlignedBuf, Error, Result};

/// An open file and its read-only mapping.
#[derive(Debug)]
pub(super) struct Mapped {
    file: File,
    /// Shared with every record served in place, which keeps it mapped.
    map: Arc<Mmap>,
}

/// One record's bytes inside a file's mapping.
pub(crate) struct MappedRecord {
    map: Arc<Mmap>,
    start: usize,
    len_bytes: usize,
}

impl MappedRecord {
    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len_bytes]
    }
}

impl std::fmt::Debug for MappedRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedRecord").field("start", &self.start).field("len_bytes", &self.len_bytes).finish()
    }
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
        Ok(Mapped { file, map: Arc::new(map) })
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

    /// One record in place: a view of the mapping, no byte copied.
    pub(super) fn record(&self, ctx: &ReadContext<'_>, record_bytes: usize) -> Result<MappedRecord> {
        let start = self.record_start(ctx, record_bytes)?;
        Ok(MappedRecord { map: Arc::clone(&self.map), start, len_bytes: record_bytes })
    }

    /// Asks the kernel to read a record's pages ahead (`MADV_WILLNEED`), so
    /// that on a cold page cache the records a layer is about to use are
    /// read side by side, each in one sweep, rather than faulted in page by
    /// page when first touched. A hint: without it a record is still
    /// complete, only read slower; a range past the end is left alone.
    pub(super) fn will_need(&self, offset_bytes: u64, record_bytes: usize) {
        let Ok(start) = usize::try_from(offset_bytes) else { return };
        if start.checked_add(record_bytes).is_some_and(|end| end <= self.map.len()) {
            let _ = self.map.advise_range(Advice::WillNeed, start, record_bytes);
        }
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
        // next access faults the same file contents back in; a record served
        // in place that is read meanwhile sees the same bytes.
        unsafe { self.map.unchecked_advise(UncheckedAdvice::DontNeed) }
    }
}
