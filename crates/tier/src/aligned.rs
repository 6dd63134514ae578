//! Page-aligned byte buffers for expert records.
//!
//! Records are read straight into these buffers. The 4096-byte alignment is what
//! O_DIRECT demands, and it also makes every `f32`/`u16` view of the bytes valid.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of every buffer, in bytes: the page size and the O_DIRECT unit.
pub const ALIGN_BYTES: usize = 4096;

/// A heap buffer whose start is aligned to [`ALIGN_BYTES`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len_bytes` bytes (at least one page is allocated).
    pub fn zeroed(len_bytes: usize) -> Self {
        let layout = Self::layout(len_bytes);
        // SAFETY: the layout has a non-zero size (see `layout`).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        Self { ptr, len_bytes }
    }

    fn layout(len_bytes: usize) -> Layout {
        let size = len_bytes.max(1).next_multiple_of(ALIGN_BYTES);
        Layout::from_size_align(size, ALIGN_BYTES).expect("buffer size overflows isize")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len_bytes` initialised bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len_bytes)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len_bytes", &self.len_bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, 10_000] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.as_slice().as_ptr() as usize % ALIGN_BYTES, 0);
            assert_eq!(buf.len(), len);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
        }
    }
}
