//! The embedding table read by rows ([`super::Embedding::ReadByRow`]).
//!
//! A token reads one row of the embedding table, so keeping all of it in RAM
//! (vocabulary × hidden: 109 MB for OLMoE at q8, 330 MB for Qwen3-30B-A3B,
//! about 1 GB for DeepSeek-V3) takes that much from the expert cache for
//! nothing when the model is bigger than RAM. Opened this way the table is
//! checked at open as every dense tensor is (its CRC32C and finite floats,
//! streamed through a small buffer, never kept), a CRC32C of each row is kept
//! (4 bytes a row), and each row a token asks for is read from dense.bin
//! (from the page cache, normally: the check at open read it) and checked
//! against it. A file changed after open gives an error naming the row,
//! never a wrong value; a truncated one, an error naming its size.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use strata_kernels::{Matrix, QuantFormat};

use super::finite;
use super::manifest::TensorEntry;
use crate::checksum::{self, Crc32c};
use crate::error::{Error, Result};

/// Rows checked per read at open: a few MiB, so the check streams.
const OPEN_CHUNK_BYTES: usize = 4 << 20;

/// A dense tensor kept on disk and read a row at a time.
pub(super) struct RowTable {
    name: String,
    path: PathBuf,
    file: File,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    group: usize,
    weight_offset_bytes: u64,
    scale_offset_bytes: u64,
    row_weight_bytes: usize,
    row_scale_bytes: usize,
    /// CRC32C of each row's weight bytes followed by its scale bytes.
    row_crcs: Vec<u32>,
    /// Rows read for tokens since open (the check at open not counted).
    rows_read: AtomicU64,
}

/// Rows read from tables kept on disk, and their bytes (weights and
/// scales).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowReads {
    pub rows: u64,
    pub bytes: u64,
}

impl std::ops::Add for RowReads {
    type Output = RowReads;

    fn add(self, other: RowReads) -> RowReads {
        RowReads { rows: self.rows + other.rows, bytes: self.bytes + other.bytes }
    }
}

impl RowTable {
    /// Checks `entry`'s bytes in `file` (dense.bin at `path`, whose size the
    /// caller validated) and keeps a CRC32C per row. `entry` was validated
    /// on open: a 2-D matrix whose ranges lie inside the file.
    pub(super) fn open(path: &Path, file: File, entry: &TensorEntry) -> Result<RowTable> {
        let (rows, cols) = super::matrix_dims(&entry.shape).unwrap_or((0, 0));
        let format = QuantFormat::from_ordinal(entry.format)
            .map_err(|e| Error::kernels(format!("tensor {:?}", entry.name), e))?;
        // Every format stores whole rows contiguously, weights and scales
        // alike (`Matrix::row_range`), so a row is a slice of each.
        let row_weight_bytes = (entry.length_bytes as usize).checked_div(rows).unwrap_or(0);
        let row_scale_bytes = (entry.scale_length_bytes as usize).checked_div(rows).unwrap_or(0);
        assert_eq!(row_weight_bytes * rows, entry.length_bytes as usize, "validated on open");
        assert_eq!(row_scale_bytes * rows, entry.scale_length_bytes as usize, "validated on open");
        let mut table = RowTable {
            name: entry.name.clone(),
            path: path.to_path_buf(),
            file,
            format,
            rows,
            cols,
            group: entry.group,
            weight_offset_bytes: entry.offset_bytes,
            scale_offset_bytes: entry.scale_offset_bytes,
            row_weight_bytes,
            row_scale_bytes,
            row_crcs: Vec::with_capacity(rows),
            rows_read: AtomicU64::new(0),
        };
        table.check(entry.crc32c)?;
        Ok(table)
    }

    /// The byte ranges of dense.bin the table holds (weights, scales), which
    /// the resident copy leaves unread.
    pub(super) fn byte_ranges(entry: &TensorEntry) -> [Range<u64>; 2] {
        [
            entry.offset_bytes..entry.offset_bytes + entry.length_bytes,
            entry.scale_offset_bytes..entry.scale_offset_bytes + entry.scale_length_bytes,
        ]
    }

    /// What the table keeps in memory: its row checksums.
    pub(super) fn resident_bytes(&self) -> u64 {
        (self.row_crcs.len() * size_of::<u32>()) as u64
    }

    /// Rows read for tokens since open, and their bytes.
    pub(super) fn reads(&self) -> RowReads {
        let rows = self.rows_read.load(Ordering::Relaxed);
        RowReads { rows, bytes: rows * (self.row_weight_bytes + self.row_scale_bytes) as u64 }
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Reads every row once, in chunks: the tensor's CRC32C (weights, then
    /// scales) against `expected`, finite floats, and each row's CRC32C.
    fn check(&mut self, expected: Option<u32>) -> Result<()> {
        let row_bytes = (self.row_weight_bytes + self.row_scale_bytes).max(1);
        let chunk_rows = (OPEN_CHUNK_BYTES / row_bytes).max(1);
        let (mut weight_crc, mut scale_crc) = (Crc32c::new(), Crc32c::new());
        let (mut weights, mut scales) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < self.rows {
            let count = chunk_rows.min(self.rows - start);
            self.read(start, count, &mut weights, &mut scales)?;
            let weight_bytes = bytes_of(&weights, count * self.row_weight_bytes);
            let scale_bytes = bytes_of(&scales, count * self.row_scale_bytes);
            weight_crc.update(weight_bytes);
            scale_crc.update(scale_bytes);
            if let Some((kind, index, value)) = finite::first_non_finite(self.format, weight_bytes, scale_bytes) {
                // Indices within the tensor, not the chunk.
                let per_row = if kind == "weight" { self.cols } else { self.row_scale_bytes / size_of::<f32>() };
                let index = start * per_row + index;
                return Err(Error::NonFiniteStored { path: self.path.clone(), what: self.what(), kind, index, value });
            }
            for row in 0..count {
                self.row_crcs.push(row_crc(
                    &weight_bytes[row * self.row_weight_bytes..][..self.row_weight_bytes],
                    &scale_bytes[row * self.row_scale_bytes..][..self.row_scale_bytes],
                ));
            }
            start += count;
        }
        let scale_length_bytes = self.rows * self.row_scale_bytes;
        let actual = checksum::combine(weight_crc.finish(), scale_crc.finish(), scale_length_bytes);
        match expected {
            Some(expected) if expected != actual => {
                Err(Error::Crc32c { path: self.path.clone(), what: self.what(), expected, actual })
            }
            _ => Ok(()),
        }
    }

    /// Rows `rows` as f32, one after another in `out` (`rows.len() × cols`).
    pub(super) fn rows_to_f32(&self, rows: &[usize], out: &mut [f32]) -> Result<()> {
        assert_eq!(out.len(), rows.len() * self.cols, "one output row per row asked for");
        let (mut weights, mut scales) = (Vec::new(), Vec::new());
        for (&row, out) in rows.iter().zip(out.chunks_exact_mut(self.cols.max(1))) {
            if row >= self.rows {
                return Err(Error::RowOutOfRange { name: self.name.clone(), row, rows: self.rows });
            }
            self.read(row, 1, &mut weights, &mut scales)?;
            self.rows_read.fetch_add(1, Ordering::Relaxed);
            let weight_bytes = bytes_of(&weights, self.row_weight_bytes);
            let scale_bytes = bytes_of(&scales, self.row_scale_bytes);
            let actual = row_crc(weight_bytes, scale_bytes);
            if actual != self.row_crcs[row] {
                return Err(Error::Crc32c {
                    path: self.path.clone(),
                    what: format!("{} row {row} (changed since the model was opened)", self.what()),
                    expected: self.row_crcs[row],
                    actual,
                });
            }
            Matrix::from_bytes(self.format, 1, self.cols, self.group, weight_bytes, scale_bytes)
                .map_err(|e| Error::kernels(self.what(), e))?
                .row_to_f32(0, out);
        }
        Ok(())
    }

    /// Reads `count` rows from `start` into `weights` and `scales`, buffers
    /// of u32 so every format's elements are aligned.
    fn read(&self, start: usize, count: usize, weights: &mut Vec<u32>, scales: &mut Vec<u32>) -> Result<()> {
        for (buf, offset_bytes, row_bytes) in [
            (&mut *weights, self.weight_offset_bytes, self.row_weight_bytes),
            (&mut *scales, self.scale_offset_bytes, self.row_scale_bytes),
        ] {
            let len_bytes = count * row_bytes;
            buf.clear();
            buf.resize(len_bytes.div_ceil(size_of::<u32>()), 0);
            let bytes = &mut bytemuck::cast_slice_mut::<u32, u8>(buf)[..len_bytes];
            let at = offset_bytes + (start * row_bytes) as u64;
            self.file.read_exact_at(bytes, at).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::FileSize {
                    path: self.path.clone(),
                    expected_bytes: at + len_bytes as u64,
                    actual_bytes: self.file.metadata().map_or(0, |m| m.len()),
                },
                _ => Error::io(&self.path, e),
            })?;
        }
        Ok(())
    }

    fn what(&self) -> String {
        format!("tensor {:?}", self.name)
    }
}

/// The first `len_bytes` of a buffer `RowTable::read` filled (it ends in
/// padding when they are not a multiple of 4).
fn bytes_of(buf: &[u32], len_bytes: usize) -> &[u8] {
    &bytemuck::cast_slice(buf)[..len_bytes]
}

fn row_crc(weights: &[u8], scales: &[u8]) -> u32 {
    let mut crc = Crc32c::new();
    crc.update(weights);
    crc.update(scales);
    crc.finish()
}
