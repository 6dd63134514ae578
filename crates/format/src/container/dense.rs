//! `dense.bin` in the process's own memory.
//!
//! The dense weights are read once at open into an anonymous mapping instead
//! of being memory-mapped from the file: a mapped file that someone
//! truncates or rewrites in place (`cp`, `rsync --inplace`) while the model
//! runs kills the process with SIGBUS, with no message. A copy cannot be
//! changed from outside. It costs nothing in the memory budget, which counts
//! dense.bin as resident either way, and the read is at disk speed.
//!
//! Ranges a caller reads another way (the embedding table, `rows.rs`) are
//! left unread: their pages of the anonymous mapping are never touched, so
//! they take no memory.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use memmap2::{Mmap, MmapMut};

use crate::error::{Error, Result};

/// The bytes of `dense.bin`, owned and immutable; a page-aligned mapping, so
/// every 64-byte aligned offset of the file is 64-byte aligned in memory.
pub(super) struct DenseBytes {
    /// `None` for an empty file (a mapping cannot be empty).
    map: Option<Mmap>,
    /// Bytes read into memory: the file less the ranges left unread.
    resident_bytes: u64,
}

impl DenseBytes {
    /// Reads `file` (`path`), which the manifest says holds
    /// `expected_bytes`, except the `unread` ranges (inside the file, not
    /// overlapping), which read as zeros and occupy no memory.
    pub(super) fn read(path: &Path, file: &File, expected_bytes: u64, unread: &[Range<u64>]) -> Result<DenseBytes> {
        let actual_bytes = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let too_short = |actual_bytes| Error::FileSize { path: path.to_path_buf(), expected_bytes, actual_bytes };
        if actual_bytes != expected_bytes {
            return Err(too_short(actual_bytes));
        }
        let len = usize::try_from(expected_bytes).map_err(|_| too_short(actual_bytes))?;
        if len == 0 {
            return Ok(DenseBytes { map: None, resident_bytes: 0 });
        }
        // Anonymous pages are zero and take no memory until written.
        let mut map = MmapMut::map_anon(len).map_err(|e| Error::io(path, e))?;
        let mut unread: Vec<Range<u64>> = unread.iter().filter(|r| !r.is_empty()).cloned().collect();
        unread.sort_by_key(|r| r.start);
        let mut resident_bytes = 0;
        let mut at = 0u64;
        for gap in unread.iter().chain(std::iter::once(&(expected_bytes..expected_bytes))) {
            assert!(at <= gap.start && gap.end <= expected_bytes, "unread ranges inside the file, apart");
            let bytes = &mut map[at as usize..gap.start as usize];
            file.read_exact_at(bytes, at).map_err(|e| match e.kind() {
                // Truncated between the size check and the read.
                std::io::ErrorKind::UnexpectedEof => too_short(file.metadata().map_or(0, |m| m.len())),
                _ => Error::io(path, e),
            })?;
            resident_bytes += gap.start - at;
            at = gap.end;
        }
        let map = map.make_read_only().map_err(|e| Error::io(path, e))?;
        Ok(DenseBytes { map: Some(map), resident_bytes })
    }

    /// Bytes held in memory.
    pub(super) fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }
}

impl std::ops::Deref for DenseBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_file_and_outlives_changes_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dense.bin");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let dense = DenseBytes::read(&path, &File::open(&path).unwrap(), bytes.len() as u64, &[]).unwrap();
        assert_eq!(dense.as_ptr() as usize % 4096, 0);
        // Truncated and rewritten in place, as `cp` onto it does.
        std::fs::write(&path, b"other").unwrap();
        assert_eq!(&dense[..], &bytes[..]);
        assert_eq!(dense.len(), bytes.len());
    }

    #[test]
    fn a_file_of_another_size_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dense.bin");
        std::fs::write(&path, [0u8; 100]).unwrap();
        let read = |expected_bytes| DenseBytes::read(&path, &File::open(&path).unwrap(), expected_bytes, &[]);
        let err = read(128).err().unwrap().to_string();
        assert!(err.contains("dense.bin") && err.contains("128") && err.contains("100"), "{err}");
        assert_eq!(read(100).unwrap().len(), 100);
        std::fs::write(&path, []).unwrap();
        assert!(read(0).unwrap().is_empty());
    }

    #[test]
    fn ranges_left_unread_are_zeros_outside_the_resident_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dense.bin");
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &bytes).unwrap();
        let unread = [70_000..90_000, 100..8292, 5..5];
        let dense = DenseBytes::read(&path, &File::open(&path).unwrap(), bytes.len() as u64, &unread).unwrap();
        assert_eq!(dense.resident_bytes(), 100_000 - 20_000 - 8192);
        for (i, (&held, &written)) in dense.iter().zip(&bytes).enumerate() {
            let skipped = unread.iter().any(|r| r.contains(&(i as u64)));
            assert_eq!(held, if skipped { 0 } else { written }, "byte {i}");
        }
    }
}
