//! What the store hands out for an expert: its record's bytes, read into a
//! buffer of the process's own.
//!
//! Never a view of the expert file's pages: a file truncated or rewritten
//! in place under a running model (`cp`, `truncate`, `rsync --inplace`)
//! would then kill the process with SIGBUS or change a checked record after
//! its check. A record read once stays as it was checked.

use crate::AlignedBuf;

/// One expert's complete record, immutable once handed out. Its start is
/// 4096-byte aligned, so every `f32`/`u16` view of it is valid.
#[derive(Debug)]
pub struct Record {
    /// Read from disk into a buffer the store owns (and reuses once evicted).
    buf: AlignedBuf,
}

impl Record {
    pub(crate) fn read(buf: AlignedBuf) -> Self {
        Self { buf }
    }

    /// The record's bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the record holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer, to read another record into.
    pub(crate) fn into_buffer(self) -> AlignedBuf {
        self.buf
    }
}
