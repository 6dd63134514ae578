//! Page-aligned byte buffers for expert records.
//!
//! Records are read straight into these buffers. The 4096-byte alignment is what
//! O_DIRECT demands, and it also makes every `f32`/`u16` view of the bytes valid.
//!
//! Each buffer is its own anonymous mapping, returned to the system when it is
//! dropped. Through the allocator, glibc's dynamic mmap threshold rose to the
//! record size after the first free, records then came from its arenas, and
//! freed ones stayed in the process: streaming OLMoE-1B-7B shapes under a
//! 361 MiB budget peaked at 772 MiB of RSS after 16 tokens (354 MiB with the
//! threshold pinned), and a memory cgroup of the budget's size killed it.

use std::alloc::{self, Layout};

use memmap2::MmapMut;

/// Alignment of every buffer, in bytes: the page size and the O_DIRECT unit.
pub const ALIGN_BYTES: usize = 4096;

/// A buffer whose start is aligned to [`ALIGN_BYTES`].
pub struct AlignedBuf {
    map: MmapMut,
    len_bytes: usize,
}

impl AlignedBuf {
    /// A zero-filled buffer of `len_bytes` bytes (at least one page is mapped).
    pub fn zeroed(len_bytes: usize) -> Self {
        let size = len_bytes.max(1).next_multiple_of(ALIGN_BYTES);
        // Fresh anonymous pages are zero and page-aligned.
        match MmapMut::map_anon(size) {
            Ok(map) => {
                assert_eq!(map.as_ptr() as usize % ALIGN_BYTES, 0, "mappings are page-aligned");
                Self { map, len_bytes }
            }
            // As the allocator would: out of memory is not an error a caller
            // can act on.
            Err(_) => alloc::handle_alloc_error(
                Layout::from_size_align(size, ALIGN_BYTES).expect("buffer size overflows isize"),
            ),
        }
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
        &self.map[..self.len_bytes]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[..self.len_bytes]
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
