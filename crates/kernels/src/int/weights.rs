//! The weight side of the integer products: rows of q8 or q4 codes and
//! their scales as the kernels read them, and where a tile of products goes.
//! The vector bodies in `simd/` read these; `super` dispatches to them.

use crate::act::{LANES, Layout};
use crate::quant::Q4_OFFSET;

/// Bytes of weights per block: 64 q8 columns or 128 q4 columns.
pub(crate) const BLOCK_BYTES: usize = 64;

/// How far ahead of the tile being computed its rows are prefetched: about
/// DRAM bandwidth × latency (20 GB/s × 300 ns in a VM) with room to spare.
/// Expert matrices have short rows (a Qwen3-30B-A3B `down` row is 384 bytes
/// in q4), so "the next tile" alone can be too close.
pub(crate) const PREFETCH_LEAD_BYTES: usize = 8 << 10;

/// Rows of q8 or q4 weights in the form the integer kernels read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntWeights<'a> {
    pub(crate) layout: Layout,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Columns per weight scale; [`Layout::supports_group`] holds.
    pub(crate) group: usize,
    /// `rows * row_bytes` bytes (q8 codes as `u8` bit patterns).
    pub(crate) qs: &'a [u8],
    /// `rows * groups_per_row` scales.
    pub(crate) scales: &'a [f32],
    /// Rows that span at least [`PREFETCH_LEAD_BYTES`]: worked out once per
    /// product, not by a division per tile (`next_tile_rows`).
    lead_rows: usize,
}

impl<'a> IntWeights<'a> {
    /// Checks every length the kernels rely on.
    ///
    /// # Panics
    /// On a length mismatch or an unsupported group.
    pub(crate) fn new(layout: Layout, rows: usize, cols: usize, group: usize, qs: &'a [u8], scales: &'a [f32]) -> Self {
        assert!(layout.supports_group(group), "integer path does not support group {group} for {layout:?}");
        let mut w = IntWeights { layout, rows, cols, group, qs, scales, lead_rows: 0 };
        w.lead_rows = PREFETCH_LEAD_BYTES.div_ceil(w.row_bytes().max(1));
        assert_eq!(qs.len(), rows * w.row_bytes(), "integer path: weight bytes do not match the shape");
        assert_eq!(scales.len(), rows * w.groups_per_row(), "integer path: scale count does not match the shape");
        w
    }

    /// Bytes per row: `cols` for q8, `ceil(cols / 2)` for q4.
    pub(crate) fn row_bytes(&self) -> usize {
        match self.layout {
            Layout::Q8 => self.cols,
            Layout::Q4 => self.cols.div_ceil(2),
        }
    }

    pub(crate) fn groups_per_row(&self) -> usize {
        self.cols.div_ceil(self.group)
    }

    /// Blocks that lie entirely inside a row.
    pub(crate) fn full_blocks(&self) -> usize {
        self.cols / self.layout.block_cols()
    }

    /// Blocks per row, the partial last one included.
    pub(crate) fn blocks(&self) -> usize {
        self.cols.div_ceil(self.layout.block_cols())
    }

    pub(crate) fn row_qs(&self, r: usize) -> &'a [u8] {
        let stride = self.row_bytes();
        &self.qs[r * stride..(r + 1) * stride]
    }

    pub(crate) fn row_scales(&self, r: usize) -> &'a [f32] {
        let groups = self.groups_per_row();
        &self.scales[r * groups..(r + 1) * groups]
    }

    /// Where the rows of a tile at least [`PREFETCH_LEAD_BYTES`] after the
    /// `R` rows from `row0` start (a row of this tile where there is no such
    /// tile): the kernels prefetch them into L2, line by line in step with
    /// this tile's. Hardware prefetchers stop at 4 KiB pages, and a tile of a
    /// few rows of a few KiB each crosses pages too often for them to keep
    /// DRAM busy: without this a 1 GiB q4 matvec ran at about the harmonic
    /// mean of compute and read speed, with it close to the read speed.
    pub(crate) fn next_tile_rows<const R: usize>(&self, row0: usize) -> [*const u8; R] {
        // Whole tiles ahead: the first tile start at least `lead_rows` on.
        let ahead = self.lead_rows.next_multiple_of(R);
        std::array::from_fn(|i| {
            let next = row0 + ahead + i;
            self.row_qs(if next < self.rows { next } else { row0 + i }).as_ptr()
        })
    }

    /// The weight scale of each lane of block `b` of row `r`; 0 for lanes
    /// past the end of the row.
    pub(crate) fn lane_scales(&self, r: usize, b: usize) -> [f32; LANES] {
        let scales = self.row_scales(r);
        let lane_cols = self.layout.lane_cols();
        std::array::from_fn(|k| {
            let col = b * self.layout.block_cols() + k * lane_cols;
            if col < self.cols { scales[col / self.group] } else { 0.0 }
        })
    }

    /// The bytes of the partial last block of row `r`, zero-padded to a full
    /// block. Padding meets zero activations, so its value never matters.
    pub(crate) fn tail_block(&self, r: usize) -> [u8; BLOCK_BYTES] {
        let qs = self.row_qs(r);
        let start = self.full_blocks() * BLOCK_BYTES;
        let mut block = [0u8; BLOCK_BYTES];
        block[..qs.len() - start].copy_from_slice(&qs[start..]);
        block
    }

    /// The signed code of column `c` of row `r`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) fn code(&self, r: usize, c: usize) -> i32 {
        let qs = self.row_qs(r);
        match self.layout {
            Layout::Q8 => i32::from(qs[c] as i8),
            Layout::Q4 => {
                let byte = qs[c / 2];
                let nibble = if c.is_multiple_of(2) { byte & 0x0F } else { byte >> 4 };
                i32::from(nibble) - Q4_OFFSET
            }
        }
    }
}

/// Writes an `R × T` tile whose first row is row offset `i0`:
/// `out[t * out_stride + i0 + i] = tile[i][t]`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn store_tile<const R: usize, const T: usize>(
    tile: &[[f32; T]; R],
    i0: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    for (i, row) in tile.iter().enumerate() {
        for (t, &v) in row.iter().enumerate() {
            out[t * out_stride + i0 + i] = v;
        }
    }
}
