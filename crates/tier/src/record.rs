//! What the store hands out for an expert: its record's bytes, either read
//! into a buffer of their own or mapped in place from the expert file.

use crate::AlignedBuf;
use crate::io::MappedRecord;

/// One expert's complete record, immutable once handed out. Its start is
/// 4096-byte aligned either way, so every `f32`/`u16` view of it is valid.
#[derive(Debug)]
pub struct Record {
    bytes: Bytes,
}

#[derive(Debug)]
enum Bytes {
    /// Read from disk into a buffer the store owns (and reuses once evicted).
    Read(AlignedBuf),
    /// The file's own pages, through a read-only shared mapping: nothing copied.
    Mapped(MappedRecord),
}

impl Record {
    pub(crate) fn read(buf: AlignedBuf) -> Self {
        Self { bytes: Bytes::Read(buf) }
    }

    pub(crate) fn mapped(record: MappedRecord) -> Self {
        Self { bytes: Bytes::Mapped(record) }
    }

    /// The record's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Read(buf) => buf.as_slice(),
            Bytes::Mapped(record) => record.as_slice(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether the record holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes are the file's pages, mapped in place.
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(_))
    }

    /// The buffer of a record that was read, to read another into.
    pub(crate) fn into_buffer(self) -> Option<AlignedBuf> {
        match self.bytes {
            Bytes::Read(buf) => Some(buf),
            Bytes::Mapped(_) => None,
        }
    }
}
