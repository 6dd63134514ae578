//! Byte layout rules shared by the writer (convert) and the reader (open):
//! 64-byte alignment of every tensor and scale block, 4096-byte expert
//! records, and the [`ExpertLayout`] through which another crate reads
//! records with pread/O_DIRECT.

use std::path::PathBuf;

use strata_kernels::{Matrix, QuantFormat};

use super::finite::first_non_finite;
use crate::error::{Error, Result};
use crate::names::ExpertProj;

/// Alignment of every weight and scale block: a cache line, and enough for
/// any element type (f32/u16 views of an mmap or an aligned record buffer are
/// then valid casts) and for AVX-512 loads.
pub const TENSOR_ALIGN_BYTES: u64 = 64;
/// Record size granularity: the logical block size O_DIRECT requires on
/// every common filesystem and device (4 KiB pages and sectors).
pub const RECORD_ALIGN_BYTES: u64 = 4096;

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on
/// overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Bytes of weights and of scales for a `[rows, cols]` matrix in `format`.
pub fn matrix_bytes(format: QuantFormat, rows: usize, cols: usize, group: usize) -> (u64, u64) {
    let weights = format.weight_bytes(rows, cols) as u64;
    let scales = format.scale_bytes(rows, cols, group) as u64;
    (weights, scales)
}

/// Where one matrix of an expert record lives, relative to the record start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentLayout {
    pub proj: ExpertProj,
    pub format: QuantFormat,
    pub rows: usize,
    pub cols: usize,
    /// Columns per scale group; 0 for f32/bf16.
    pub group: usize,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub scale_offset_bytes: u64,
    pub scale_length_bytes: u64,
}

impl ComponentLayout {
    /// End of the last byte this component uses inside the record.
    pub fn end_bytes(&self) -> u64 {
        (self.offset_bytes + self.length_bytes).max(self.scale_offset_bytes + self.scale_length_bytes)
    }
}

/// How the experts of one MoE layer are laid out in their file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertLayout {
    pub layer: usize,
    /// Absolute path of `experts/layer_LLL.bin`.
    pub path: PathBuf,
    pub num_experts: usize,
    /// Size of one record, a multiple of [`RECORD_ALIGN_BYTES`].
    pub record_bytes: u64,
    /// Gate, up, down.
    pub components: [ComponentLayout; 3],
    /// The CRC32C of each record, by expert, where the manifest has them.
    pub record_crc32c: Option<Vec<u32>>,
}

impl ExpertLayout {
    /// The layout the writer uses: gate weights, gate scales, up weights, up
    /// scales, down weights, down scales, each block starting on a 64-byte
    /// boundary, the record padded with zeros to a multiple of 4096 bytes.
    pub fn compute(
        layer: usize,
        path: PathBuf,
        num_experts: usize,
        shapes: [[usize; 2]; 3],
        format: QuantFormat,
        group: usize,
    ) -> Result<ExpertLayout> {
        let overflow = || Error::InvalidOption {
            option: "expert layout".into(),
            reason: format!("layer {layer}: expert record size overflows"),
        };
        let mut cursor = 0u64;
        let mut components = Vec::with_capacity(3);
        for (proj, [rows, cols]) in ExpertProj::ALL.into_iter().zip(shapes) {
            let (length_bytes, scale_length_bytes) = matrix_bytes(format, rows, cols, group);
            let offset_bytes = align_up(cursor, TENSOR_ALIGN_BYTES).ok_or_else(overflow)?;
            cursor = offset_bytes.checked_add(length_bytes).ok_or_else(overflow)?;
            let scale_offset_bytes = align_up(cursor, TENSOR_ALIGN_BYTES).ok_or_else(overflow)?;
            cursor = scale_offset_bytes.checked_add(scale_length_bytes).ok_or_else(overflow)?;
            components.push(ComponentLayout {
                proj,
                format,
                rows,
                cols,
                group: if format.is_grouped() { group } else { 0 },
                offset_bytes,
                length_bytes,
                scale_offset_bytes,
                scale_length_bytes,
            });
        }
        let record_bytes = align_up(cursor.max(1), RECORD_ALIGN_BYTES).ok_or_else(overflow)?;
        let components: [ComponentLayout; 3] = components.try_into().map_err(|_| overflow())?;
        Ok(ExpertLayout { layer, path, num_experts, record_bytes, components, record_crc32c: None })
    }

    /// Byte offset of expert `expert`'s record in the file.
    pub fn record_offset(&self, expert: usize) -> Result<u64> {
        if expert >= self.num_experts {
            return Err(Error::ExpertOutOfRange { layer: self.layer, expert, num_experts: self.num_experts });
        }
        // Cannot overflow: open checked num_experts * record_bytes.
        Ok(expert as u64 * self.record_bytes)
    }

    /// Expected size of the whole expert file.
    pub fn file_bytes(&self) -> u64 {
        self.num_experts as u64 * self.record_bytes
    }

    /// Views one record (exactly `record_bytes` long, read from
    /// [`ExpertLayout::record_offset`]) as its gate, up and down matrices.
    ///
    /// No copy is made: f32/bf16 weights and the f32 scales are cast in
    /// place, so the buffer must start on a 64-byte (at least 4-byte)
    /// boundary, as any O_DIRECT buffer does.
    pub fn matrices<'a>(&self, record: &'a [u8]) -> Result<[Matrix<'a>; 3]> {
        if record.len() as u64 != self.record_bytes {
            return Err(Error::RecordSize {
                layer: self.layer,
                expected_bytes: self.record_bytes,
                actual_bytes: record.len() as u64,
            });
        }
        let view = |c: &ComponentLayout| -> Result<Matrix<'a>> {
            // In range: open validated end_bytes() <= record_bytes.
            let weights = &record[c.offset_bytes as usize..(c.offset_bytes + c.length_bytes) as usize];
            let scales = &record[c.scale_offset_bytes as usize..(c.scale_offset_bytes + c.scale_length_bytes) as usize];
            Matrix::from_bytes(c.format, c.rows, c.cols, c.group, weights, scales)
                .map_err(|e| Error::kernels(format!("layer {} expert record, {} matrix", self.layer, c.proj.name()), e))
        };
        let [g, u, d] = &self.components;
        Ok([view(g)?, view(u)?, view(d)?])
    }

    /// Checks expert `expert`'s record as read from disk: its CRC32C (where
    /// the manifest has one), and every float in it (scales, f32/bf16
    /// weights) finite. Run on each read, not on each use of a cached
    /// record, so its cost is paid once per disk read.
    pub fn check_record(&self, expert: usize, record: &[u8]) -> Result<()> {
        if record.len() as u64 != self.record_bytes {
            return Err(Error::RecordSize {
                layer: self.layer,
                expected_bytes: self.record_bytes,
                actual_bytes: record.len() as u64,
            });
        }
        if let Some(&expected) = self.record_crc32c.as_ref().and_then(|crcs| crcs.get(expert)) {
            let actual = crate::checksum::crc32c(record);
            if actual != expected {
                return Err(Error::Crc32c {
                    path: self.path.clone(),
                    what: format!("expert {expert} of layer {}", self.layer),
                    expected,
                    actual,
                });
            }
        }
        for c in &self.components {
            // In range: open validated end_bytes() <= record_bytes.
            let weights = &record[c.offset_bytes as usize..(c.offset_bytes + c.length_bytes) as usize];
            let scales = &record[c.scale_offset_bytes as usize..(c.scale_offset_bytes + c.scale_length_bytes) as usize];
            if let Some((kind, index, value)) = first_non_finite(c.format, weights, scales) {
                return Err(Error::NonFiniteStored {
                    path: self.path.clone(),
                    what: format!("expert {expert} of layer {}, {} matrix", self.layer, c.proj.name()),
                    kind,
                    index,
                    value,
                });
            }
        }
        Ok(())
    }
}
