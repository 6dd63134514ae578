//! Integer products of q8/q4 weights with int16 (or int8) activations
//! ([`crate::act`]): the fast path of [`crate::Matrix`] products on x86_64.
//!
//! # Definition
//!
//! A row is cut into blocks of [`Layout::block_cols`] columns and each block
//! into 16 lanes of [`Layout::lane_cols`] consecutive columns. Per lane `k`:
//!
//! ```text
//! isum      = Σ q[c] * xq[c]            over the lane's columns, exact in i32
//! facc[k]   = fma(isum as f32, w_scale * x_scale, facc[k])   block by block
//! ```
//!
//! where `w_scale` is the weight group's scale and `x_scale` the activation
//! block's (both constant over a lane). The 16 lane sums are then added in
//! the fixed tree of [`reduce_lanes`]. [`dot_ref`] is this definition
//! written out in scalar code; the AVX2 and AVX-512 kernels compute exactly
//! the same operations (integer sums are exact whatever their order, and
//! each lane's float operations are the same), so all three agree **bit for
//! bit**, and a product does not depend on which tile shape, thread or
//! batch computed it.
//!
//! Lane sums are exact in `f32` too: `|isum| <= 4 * 128 * 32767 < 2^24` for
//! q8 (4 columns a lane) and `8 * 8 * 32767` for q4 (int8 activations: far
//! less).
//!
//! Against the f32 reference ([`crate::scalar::dot_q8`]) the only
//! difference beyond rounding is the activation quantization, at most
//! `x_scale / 2` per element.

use std::ops::Range;

use crate::act::{ActElem, ActRow, LANES, Layout, QuantizedActs};
use crate::quant::Q4_OFFSET;
use crate::simd::{Isa, IsaLevel};

#[cfg(not(target_arch = "x86_64"))]
pub(crate) use crate::act::ActElem as IntElem;
/// The activation codes the integer kernels take: on x86_64 those the
/// vector bodies have a step for.
#[cfg(target_arch = "x86_64")]
pub(crate) use crate::simd::int_lanes::ChunkStep as IntElem;

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
    fn code(&self, r: usize, c: usize) -> i32 {
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

/// Adds 16 lane sums in a fixed tree: lane `i` with `i + 8`, then `i + 4`,
/// `i + 2`, `i + 1`, the order a 512-bit vector halves in.
#[inline]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn reduce_lanes(l: [f32; LANES]) -> f32 {
    let v8: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
    let v4: [f32; 4] = std::array::from_fn(|i| v8[i] + v8[i + 4]);
    let v2: [f32; 2] = std::array::from_fn(|i| v4[i] + v4[i + 2]);
    v2[0] + v2[1]
}

/// Row `r` of `w` times one activation vector: the definition (module docs)
/// in scalar code.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn dot_ref<E: ActElem>(w: &IntWeights<'_>, r: usize, act: ActRow<'_, E>) -> f32 {
    let layout = w.layout;
    let (block, lane_cols) = (layout.block_cols(), layout.lane_cols());
    let mut facc = [0.0f32; LANES];
    for b in 0..w.blocks() {
        let w_scales = w.lane_scales(r, b);
        for k in 0..LANES {
            let mut isum = 0i32;
            for j in k * lane_cols..(k + 1) * lane_cols {
                let c = b * block + j;
                if c < w.cols {
                    isum += w.code(r, c) * act.q[b * block + layout.position::<E>(j)].into();
                }
            }
            let s = w_scales[k] * act.lane_scales[b * LANES + k];
            facc[k] = (isum as f32).mul_add(s, facc[k]);
        }
    }
    reduce_lanes(facc)
}

/// Whether `isa` has integer kernels (the scalar tier keeps the f32
/// reference, which needs no FMA unit).
pub(crate) fn isa_has_int(isa: Isa) -> bool {
    isa.level() != IsaLevel::Scalar
}

/// `out[t * out_stride + (r - rows.start)] = W[r] · acts[t]` for every row in
/// `rows` and every activation vector, tiled so that each weight block is
/// decoded once per group of tokens.
///
/// # Panics
/// If the shapes disagree or `isa` has no integer kernels.
pub(crate) fn products<E: IntElem>(
    isa: Isa,
    w: &IntWeights<'_>,
    acts: &QuantizedActs<E>,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    assert_eq!(acts.layout(), w.layout, "activations quantized for another layout");
    assert_eq!(acts.cols(), w.cols, "activation length differs from cols");
    assert!(rows.end <= w.rows, "rows out of range");
    if acts.n() > 0 && !rows.is_empty() {
        assert!(out.len() >= (acts.n() - 1) * out_stride + rows.len(), "output too short");
    }
    #[cfg(target_arch = "x86_64")]
    if isa_has_int(isa) {
        return by_token_groups(isa, w, acts, rows, out, out_stride);
    }
    panic!("no integer kernels for {isa:?}");
}

/// Runs the tier's row kernel on groups of [`TOKENS_PER_TILE`] activation
/// vectors (the remainder one at a time).
#[cfg(target_arch = "x86_64")]
fn by_token_groups<E: IntElem>(
    isa: Isa,
    w: &IntWeights<'_>,
    acts: &QuantizedActs<E>,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    let n = acts.n();
    let mut t0 = 0;
    while t0 < n {
        let out = &mut out[t0 * out_stride..];
        if t0 + TOKENS_PER_TILE <= n {
            let a: [ActRow<'_, E>; TOKENS_PER_TILE] = std::array::from_fn(|i| acts.row(t0 + i));
            x86_rows(isa, w, rows.clone(), &a, out, out_stride);
            t0 += TOKENS_PER_TILE;
        } else {
            x86_rows(isa, w, rows.clone(), &[acts.row(t0)], out, out_stride);
            t0 += 1;
        }
    }
}

/// Activation vectors per tile: each decoded weight block is reused this
/// many times (prefill), within the vector registers the tiles fit in.
#[cfg(target_arch = "x86_64")]
const TOKENS_PER_TILE: usize = 4;

#[cfg(target_arch = "x86_64")]
fn x86_rows<E: IntElem, const T: usize>(
    isa: Isa,
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    use crate::simd::{avx2, avx512};
    check_rows(w, rows.clone(), acts, out, out_stride);
    // SAFETY: an `Isa` only exists for tiers the CPU supports, and
    // `check_rows` asserted every bound the kernels rely on.
    unsafe {
        match isa.level() {
            IsaLevel::Avx512Vnni => avx512::int_rows_vnni(w, rows, acts, out, out_stride),
            IsaLevel::Avx512 => avx512::int_rows_madd(w, rows, acts, out, out_stride),
            IsaLevel::Avx2 => avx2::int_rows(w, rows, acts, out, out_stride),
            IsaLevel::Scalar => unreachable!("scalar tier has no integer kernels"),
        }
    }
}

/// Asserts what the vector row kernels rely on for memory safety: the rows
/// exist, every activation vector has this matrix's blocks (and q4
/// corrections), and `out[t * out_stride + i]` exists for every vector `t`
/// and row offset `i`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn check_rows<E, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &[f32],
    out_stride: usize,
) {
    assert!(rows.start <= rows.end && rows.end <= w.rows, "rows out of range");
    for a in acts {
        assert_eq!(a.q.len(), w.blocks() * w.layout.block_cols(), "activation blocks differ from the matrix's");
        assert_eq!(a.lane_scales.len(), w.blocks() * LANES, "activation scales differ from the matrix's");
        if w.layout == Layout::Q4 {
            assert_eq!(a.lane_corr.len(), w.blocks() * LANES, "q4 activations lack their corrections");
        }
    }
    if T > 0 && !rows.is_empty() {
        assert!(out.len() >= (T - 1) * out_stride + rows.len(), "output too short");
        assert!(T == 1 || out_stride >= rows.len(), "output rows overlap");
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

/// The scalar definition over the same loops as [`products`], for tests.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn products_ref<E: ActElem>(
    w: &IntWeights<'_>,
    acts: &QuantizedActs<E>,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    for t in 0..acts.n() {
        for r in rows.clone() {
            out[t * out_stride + (r - rows.start)] = dot_ref(w, r, acts.row(t));
        }
    }
}
