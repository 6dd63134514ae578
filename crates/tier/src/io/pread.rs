//! `--io pread`: buffered positioned reads through the page cache.
//!
//! The reference backend: the kernel's readahead and page cache do the work,
//! so repeated misses on a hot expert cost a memory copy, not a device read.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{ReadContext, check_regular_file, read_fully};
use crate::{AlignedBuf, Error, Result};

/// Opens `path` read-only.
pub(super) fn open(path: &Path) -> Result<File> {
    let file = File::open(path).map_err(|source| Error::Open { path: path.to_owned(), source })?;
    check_regular_file(path, &file)?;
    Ok(file)
}

/// Reads one record with `pread`, resuming short reads.
pub(super) fn read(ctx: &ReadContext<'_>, file: &File, buf: &mut AlignedBuf) -> Result<()> {
    read_fully(ctx, buf, 1, |buf, range, offset_bytes| file.read_at(&mut buf.as_mut_slice()[range], offset_bytes))
}
