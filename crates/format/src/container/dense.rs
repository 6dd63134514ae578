//! `dense.bin` in the process's own memory.
//!
//! The dense weights are read once at open into an anonymous, page-aligned
//! allocation instead of being memory-mapped: a mapped file that someone
//! truncates or rewrites in place (`cp`, `rsync --inplace`) while the model
//! runs kills the process with SIGBUS, with no message. A copy cannot be
//! changed from outside. It costs nothing in the memory budget, which counts
//! dense.bin as resident either way, and the read is at disk speed.

use std::alloc::{self, Layout};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of the copy: a page, as the mapping had, so every 64-byte
/// aligned offset of the file is 64-byte aligned in memory too.
const DENSE_ALIGN_BYTES: usize = 4096;

/// The bytes of `dense.bin`, owned and immutable.
pub(super) struct DenseBytes {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value alone and never written after
// `read` returns, so sharing `&[u8]` views across threads is sound.
unsafe impl Send for DenseBytes {}
// SAFETY: as above: immutable after construction.
unsafe impl Sync for DenseBytes {}

impl DenseBytes {
    /// Reads all of `path`, which the manifest says holds `expected_bytes`.
    pub(super) fn read(path: &Path, expected_bytes: u64) -> Result<DenseBytes> {
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let actual_bytes = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let too_short = |actual_bytes| Error::FileSize { path: path.to_path_buf(), expected_bytes, actual_bytes };
        if actual_bytes != expected_bytes {
            return Err(too_short(actual_bytes));
        }
        let len = usize::try_from(expected_bytes).map_err(|_| too_short(actual_bytes))?;
        // A zero-sized allocation is not allowed; one byte stands in.
        let layout = Layout::from_size_align(len.max(1), DENSE_ALIGN_BYTES)
            .map_err(|e| Error::io(path, std::io::Error::other(format!("{len} bytes cannot be allocated: {e}"))))?;
        // SAFETY: `layout` has a non-zero size. Zeroed memory from the
        // allocator is untouched anonymous pages for large sizes, so the
        // zeroing costs no pass over the bytes.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::io(path, std::io::Error::from(std::io::ErrorKind::OutOfMemory)))?;
        let dense = DenseBytes { ptr, len, layout };
        // SAFETY: `ptr` is valid for `len` initialised (zeroed) bytes and
        // nothing else refers to it yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(dense.ptr.as_ptr(), len) };
        file.read_exact(buf).map_err(|e| match e.kind() {
            // Truncated between the size check and the read.
            std::io::ErrorKind::UnexpectedEof => too_short(file.metadata().map_or(0, |m| m.len())),
            _ => Error::io(path, e),
        })?;
        Ok(dense)
    }
}

impl std::ops::Deref for DenseBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes, initialised by `read`, for
        // as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for DenseBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `read` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
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
        let dense = DenseBytes::read(&path, bytes.len() as u64).unwrap();
        assert_eq!(dense.as_ptr() as usize % DENSE_ALIGN_BYTES, 0);
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
        let err = DenseBytes::read(&path, 128).err().unwrap().to_string();
        assert!(err.contains("dense.bin") && err.contains("128") && err.contains("100"), "{err}");
        assert_eq!(DenseBytes::read(&path, 100).unwrap().len(), 100);
        std::fs::write(&path, []).unwrap();
        assert!(DenseBytes::read(&path, 0).unwrap().is_empty());
    }
}
