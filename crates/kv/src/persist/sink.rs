//! Where appended records go. A trait rather than `File` directly so that
//! tests can make the disk fill up (ENOSPC) at any byte: a loop-mounted tiny
//! file system is not available everywhere tests run.

use std::fs::File;
use std::io::{self, Write};

/// An append-only byte sink with durable commits.
pub trait Sink: Send + std::fmt::Debug {
    /// Appends `bytes` at the end. On error, any prefix of them may have
    /// been written.
    fn append(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Makes everything appended so far durable (fdatasync for a file).
    fn sync(&mut self) -> io::Result<()>;
    /// Cuts the sink back to `len_bytes`; later appends go after them.
    fn truncate(&mut self, len_bytes: u64) -> io::Result<()>;
}

/// A file opened in append mode (`O_APPEND`), so every write lands at the
/// current end, including after a truncation.
impl Sink for File {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.write_all(bytes)
    }

    fn sync(&mut self) -> io::Result<()> {
        // fdatasync also flushes the size change an append makes, which is
        // all the metadata needed to read the data back.
        self.sync_data()
    }

    fn truncate(&mut self, len_bytes: u64) -> io::Result<()> {
        self.set_len(len_bytes)?;
        self.sync_data()
    }
}
