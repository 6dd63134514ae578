//! A borrowed, row-major `[rows, cols]` weight matrix in any
//! [`QuantFormat`], and its products with vectors.
//!
//! `Matrix` only borrows: the bytes usually live in a memory map owned by a
//! higher layer, and this crate knows no files.
//!
//! Every output element of [`Matrix::matvec`] / [`Matrix::matmul`] is computed
//! by the same sequence of operations on (row, input vector), whatever the
//! batch size, tile or thread split, so `matmul` equals `n` `matvec`s bit for
//! bit and [`crate::Threads`] results do not depend on the thread count.
//!
//! q8 and q4 matrices take the integer path of [`crate::int`] on x86_64
//! (inputs quantized to int16, or int8 when asked for, once per product, see
//! [`crate::act`]) when their group size allows it; f32, bf16, mxfp4 (kept
//! as checkpoints store it), other group sizes and the scalar tier use the
//! f32 row-dot kernels of [`crate::simd`].

use std::ops::Range;

use crate::act::{ActivationPrecision, Layout, QuantizedActs};
use crate::error::{Error, Result};
use crate::int::{self, IntWeights};
use crate::mxfp4;
use crate::quant::{QuantFormat, bf16_to_f32};
use crate::simd::Isa;

/// The inputs of a product, prepared once and shared by every row chunk.
pub(crate) enum Prepared<'x> {
    /// Row-dot kernels read the f32 inputs directly.
    F32(&'x [f32]),
    /// The integer path reads int16 inputs.
    Int16(QuantizedActs<i16>),
    /// The integer path reads int8 inputs ([`ActivationPrecision::Int8`]).
    Int8(QuantizedActs<i8>),
}

/// The storage of a [`Matrix`], one variant per [`QuantFormat`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MatData<'a> {
    /// `rows * cols` values.
    F32(&'a [f32]),
    /// `rows * cols` bf16 bit patterns.
    Bf16(&'a [u16]),
    /// `rows * cols` int8 values and `rows * ceil(cols / group)` scales.
    Q8 {
        qs: &'a [i8],
        scales: &'a [f32],
        /// Columns per scale group.
        group: usize,
    },
    /// `rows * ceil(cols / 2)` packed nibbles and `rows * ceil(cols / group)`
    /// scales.
    Q4 {
        qs: &'a [u8],
        scales: &'a [f32],
        /// Columns per scale group.
        group: usize,
    },
    /// MXFP4 as checkpoints store it ([`crate::mxfp4`]): `rows * cols / 2`
    /// bytes of E2M1 codes and `rows * cols / 32` E8M0 scales, `cols` whole
    /// blocks of 32.
    Mxfp4 { codes: &'a [u8], scales: &'a [u8] },
}

impl MatData<'_> {
    /// The format of this storage.
    pub fn format(&self) -> QuantFormat {
        match self {
            Self::F32(_) => QuantFormat::F32,
            Self::Bf16(_) => QuantFormat::Bf16,
            Self::Q8 { .. } => QuantFormat::Q8,
            Self::Q4 { .. } => QuantFormat::Q4,
            Self::Mxfp4 { .. } => QuantFormat::Mxfp4,
        }
    }

    /// Columns per scale group, for grouped formats.
    pub fn group(&self) -> Option<usize> {
        match *self {
            Self::F32(_) | Self::Bf16(_) | Self::Mxfp4 { .. } => None,
            Self::Q8 { group, .. } | Self::Q4 { group, .. } => Some(group),
        }
    }

    /// Length of the weight storage, in elements of its own type.
    fn weight_len(&self) -> usize {
        match self {
            Self::F32(w) => w.len(),
            Self::Bf16(w) => w.len(),
            Self::Q8 { qs, .. } => qs.len(),
            Self::Q4 { qs, .. } => qs.len(),
            Self::Mxfp4 { codes, .. } => codes.len(),
        }
    }

    fn scales_len(&self) -> usize {
        match self {
            Self::F32(_) | Self::Bf16(_) => 0,
            Self::Q8 { scales, .. } | Self::Q4 { scales, .. } => scales.len(),
            Self::Mxfp4 { scales, .. } => scales.len(),
        }
    }
}

/// A borrowed row-major `[rows, cols]` matrix.
///
/// Build it with [`Matrix::new`] or [`Matrix::from_bytes`], which validate
/// every length. The fields are public for reading; a hand-assembled
/// inconsistent matrix makes the products panic, never read out of bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Matrix<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: MatData<'a>,
}

/// Outcome of comparing one buffer length against the shape.
struct LenCheck {
    what: &'static str,
    unit: &'static str,
    expected: usize,
    actual: usize,
}

impl<'a> Matrix<'a> {
    /// Wraps `data` as a `[rows, cols]` matrix after checking every length
    /// (and, for grouped formats, that `group >= 1`; for mxfp4, that rows
    /// are whole blocks).
    pub fn new(rows: usize, cols: usize, data: MatData<'a>) -> Result<Self> {
        let format = data.format();
        if let Some(group) = data.group() {
            check_group(format, group)?;
        }
        check_blocks(format, cols)?;
        let overflow = || Error::ShapeOverflow { format: format.name(), rows, cols };
        let expected_weights = rows.checked_mul(format.row_elems(cols)).ok_or_else(overflow)?;
        let expected_scales = format.checked_scale_count(rows, cols, data.group().unwrap_or(1)).ok_or_else(overflow)?;
        for check in [
            LenCheck { what: "weights", unit: "elements", expected: expected_weights, actual: data.weight_len() },
            LenCheck { what: "scales", unit: "elements", expected: expected_scales, actual: data.scales_len() },
        ] {
            check_len(format, rows, cols, check)?;
        }
        Ok(Self { rows, cols, data })
    }

    /// Reinterprets raw little-endian bytes (typically from a memory map) as
    /// a `[rows, cols]` matrix without copying.
    ///
    /// `group` is ignored for f32/bf16, whose `scale_bytes` must be empty,
    /// and for mxfp4, whose blocks are 32 columns.
    /// Fails, never panics, on a wrong length or a start address that is not
    /// aligned for the element type (4 bytes for f32 and scales, 2 for bf16).
    pub fn from_bytes(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        group: usize,
        weight_bytes: &'a [u8],
        scale_bytes: &'a [u8],
    ) -> Result<Self> {
        if format.is_grouped() {
            check_group(format, group)?;
        }
        check_blocks(format, cols)?;
        let overflow = || Error::ShapeOverflow { format: format.name(), rows, cols };
        let expected_weight_bytes = format.checked_weight_bytes(rows, cols).ok_or_else(overflow)?;
        let expected_scale_bytes = format.checked_scale_bytes(rows, cols, group).ok_or_else(overflow)?;
        for check in [
            LenCheck { what: "weights", unit: "bytes", expected: expected_weight_bytes, actual: weight_bytes.len() },
            LenCheck { what: "scales", unit: "bytes", expected: expected_scale_bytes, actual: scale_bytes.len() },
        ] {
            check_len(format, rows, cols, check)?;
        }
        let data = match format {
            QuantFormat::F32 => MatData::F32(cast(format, "weights", weight_bytes)?),
            QuantFormat::Bf16 => MatData::Bf16(cast(format, "weights", weight_bytes)?),
            QuantFormat::Q8 => MatData::Q8 {
                qs: bytemuck::cast_slice(weight_bytes),
                scales: cast(format, "scales", scale_bytes)?,
                group,
            },
            QuantFormat::Q4 => MatData::Q4 { qs: weight_bytes, scales: cast(format, "scales", scale_bytes)?, group },
            QuantFormat::Mxfp4 => MatData::Mxfp4 { codes: weight_bytes, scales: scale_bytes },
        };
        Self::new(rows, cols, data)
    }

    /// The storage format.
    pub fn format(&self) -> QuantFormat {
        self.data.format()
    }

    /// The `count` rows starting at `start`, as a matrix borrowing the same
    /// storage (every format stores whole rows contiguously). Useful for
    /// fused projections and stacked experts.
    pub fn row_range(&self, start: usize, count: usize) -> Result<Matrix<'a>> {
        let end = start.checked_add(count).filter(|&end| end <= self.rows).ok_or(Error::RowRange {
            start,
            count,
            rows: self.rows,
        })?;
        let rows = start..end;
        let data = match self.data {
            MatData::F32(w) => MatData::F32(&w[self.elem_range(rows)]),
            MatData::Bf16(w) => MatData::Bf16(&w[self.elem_range(rows)]),
            MatData::Q8 { qs, scales, group } => MatData::Q8 {
                qs: &qs[self.elem_range(rows.clone())],
                scales: &scales[scale_range(self.cols, group, rows)],
                group,
            },
            MatData::Q4 { qs, scales, group } => MatData::Q4 {
                qs: &qs[self.elem_range(rows.clone())],
                scales: &scales[scale_range(self.cols, group, rows)],
                group,
            },
            MatData::Mxfp4 { codes, scales } => MatData::Mxfp4 {
                codes: &codes[self.elem_range(rows.clone())],
                scales: &scales[scale_range(self.cols, mxfp4::BLOCK_VALUES, rows)],
            },
        };
        Matrix::new(count, self.cols, data)
    }

    /// Storage element range of `rows`.
    fn elem_range(&self, rows: Range<usize>) -> Range<usize> {
        let stride = self.format().row_elems(self.cols);
        rows.start * stride..rows.end * stride
    }

    /// `y = W x` on the best instruction set of this CPU, single-threaded.
    /// See [`crate::Threads::matvec`] for the parallel version.
    ///
    /// # Panics
    /// If `x.len() != cols` or `y.len() != rows`.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matvec_with(Isa::detect(), x, y);
    }

    /// [`Matrix::matvec`] on a chosen instruction set.
    pub fn matvec_with(&self, isa: Isa, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "matvec: x length differs from cols");
        assert_eq!(y.len(), self.rows, "matvec: y length differs from rows");
        let prepared = self.prepare(isa, ActivationPrecision::Int16, x, 1);
        self.products(isa, &prepared, 1, 0..self.rows, y, self.rows);
    }

    /// Whether products with this matrix on `isa` take the integer path
    /// (int16 or int8 inputs, see [`crate::int`]) rather than f32 row dots.
    pub fn uses_int_path(&self, isa: Isa) -> bool {
        self.int_weights(isa).is_some()
    }

    /// The integer-path view of a q8/q4 matrix, when `isa` and the group
    /// size allow it.
    pub(crate) fn int_weights(&self, isa: Isa) -> Option<IntWeights<'a>> {
        if !int::isa_has_int(isa) {
            return None;
        }
        match self.data {
            MatData::Q8 { qs, scales, group } if Layout::Q8.supports_group(group) => {
                Some(IntWeights::new(Layout::Q8, self.rows, self.cols, group, bytemuck::cast_slice(qs), scales))
            }
            MatData::Q4 { qs, scales, group } if Layout::Q4.supports_group(group) => {
                Some(IntWeights::new(Layout::Q4, self.rows, self.cols, group, qs, scales))
            }
            _ => None,
        }
    }

    /// Prepares `n` inputs (`[n, cols]`) for [`Matrix::products`], at
    /// `precision` where they take the integer path.
    pub(crate) fn prepare<'x>(
        &self,
        isa: Isa,
        precision: ActivationPrecision,
        xs: &'x [f32],
        n: usize,
    ) -> Prepared<'x> {
        match (self.int_weights(isa), precision) {
            (Some(w), ActivationPrecision::Int16) => Prepared::Int16(QuantizedActs::new(w.layout, xs, n, self.cols)),
            (Some(w), ActivationPrecision::Int8) => Prepared::Int8(QuantizedActs::new(w.layout, xs, n, self.cols)),
            (None, _) => Prepared::F32(xs),
        }
    }

    /// Output rows `rows` for all `n` prepared inputs:
    /// `out[t * out_stride + (r - rows.start)] = W[r] . xs[t]`.
    pub(crate) fn products(
        &self,
        isa: Isa,
        prepared: &Prepared<'_>,
        n: usize,
        rows: Range<usize>,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let int_weights = || self.int_weights(isa).expect("prepared for the integer path on another tier");
        match prepared {
            Prepared::F32(xs) => self.matmul_rows(isa, xs, n, rows, out, out_stride),
            Prepared::Int16(acts) => int::products(isa, &int_weights(), acts, rows, out, out_stride),
            Prepared::Int8(acts) => int::products(isa, &int_weights(), acts, rows, out, out_stride),
        }
    }

    /// `ys[t] = W xs[t]` for `n` row-major input vectors: `xs` is `[n, cols]`,
    /// `ys` is `[n, rows]`. Single-threaded; see [`crate::Threads::matmul`].
    ///
    /// # Panics
    /// If `xs.len() != n * cols` or `ys.len() != n * rows`.
    pub fn matmul(&self, xs: &[f32], n: usize, ys: &mut [f32]) {
        self.matmul_with(Isa::detect(), xs, n, ys);
    }

    /// [`Matrix::matmul`] on a chosen instruction set.
    pub fn matmul_with(&self, isa: Isa, xs: &[f32], n: usize, ys: &mut [f32]) {
        self.matmul_at(isa, ActivationPrecision::Int16, xs, n, ys);
    }

    /// [`Matrix::matmul_with`] with the inputs of the integer path quantized
    /// at `precision` (int8 is lossy: see [`ActivationPrecision`]).
    pub fn matmul_at(&self, isa: Isa, precision: ActivationPrecision, xs: &[f32], n: usize, ys: &mut [f32]) {
        self.check_matmul(xs, n, ys);
        let prepared = self.prepare(isa, precision, xs, n);
        self.products(isa, &prepared, n, 0..self.rows, ys, self.rows);
    }

    pub(crate) fn check_matmul(&self, xs: &[f32], n: usize, ys: &[f32]) {
        assert_eq!(Some(xs.len()), n.checked_mul(self.cols), "matmul: xs must be [n, cols]");
        assert_eq!(Some(ys.len()), n.checked_mul(self.rows), "matmul: ys must be [n, rows]");
    }

    /// The f32 row-dot path of [`Matrix::products`].
    ///
    /// The loop runs over weight rows outside and inputs inside, so a row is
    /// read from memory once and reused from cache for every input.
    fn matmul_rows(&self, isa: Isa, xs: &[f32], n: usize, rows: Range<usize>, out: &mut [f32], out_stride: usize) {
        let cols = self.cols;
        let row0 = rows.start;
        // One `match` per call, then a tight loop per format.
        macro_rules! for_each_output {
            (|$r:ident, $x:ident| $dot:expr) => {
                for $r in rows.clone() {
                    for t in 0..n {
                        let $x = &xs[t * cols..(t + 1) * cols];
                        out[t * out_stride + ($r - row0)] = $dot;
                    }
                }
            };
        }
        match self.data {
            MatData::F32(w) => {
                for_each_output!(|r, x| isa.dot_f32(&w[r * cols..(r + 1) * cols], x))
            }
            MatData::Bf16(w) => {
                for_each_output!(|r, x| isa.dot_bf16(&w[r * cols..(r + 1) * cols], x))
            }
            MatData::Q8 { qs, scales, group } => {
                let groups = cols.div_ceil(group);
                for_each_output!(|r, x| isa.dot_q8(
                    &qs[r * cols..(r + 1) * cols],
                    &scales[r * groups..(r + 1) * groups],
                    group,
                    x
                ))
            }
            MatData::Q4 { qs, scales, group } => {
                let groups = cols.div_ceil(group);
                let stride = cols.div_ceil(2);
                for_each_output!(|r, x| isa.dot_q4(
                    &qs[r * stride..(r + 1) * stride],
                    &scales[r * groups..(r + 1) * groups],
                    group,
                    x
                ))
            }
            MatData::Mxfp4 { codes, scales } => {
                let (stride, blocks) = (cols / 2, cols / mxfp4::BLOCK_VALUES);
                for_each_output!(|r, x| isa.dot_mxfp4(
                    &codes[r * stride..(r + 1) * stride],
                    &scales[r * blocks..(r + 1) * blocks],
                    x
                ))
            }
        }
    }

    /// Dequantizes row `r` into `out` (embedding lookup): `q * scale` for
    /// grouped formats, exact widening for bf16, `code * 2^(e - 127)` for
    /// mxfp4.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row_to_f32: row {r} of {}", self.rows);
        assert_eq!(out.len(), self.cols, "row_to_f32: out length differs from cols");
        let cols = self.cols;
        match self.data {
            MatData::F32(w) => out.copy_from_slice(&w[r * cols..(r + 1) * cols]),
            MatData::Bf16(w) => {
                for (o, &bits) in out.iter_mut().zip(&w[r * cols..(r + 1) * cols]) {
                    *o = bf16_to_f32(bits);
                }
            }
            MatData::Q8 { qs, scales, group } => {
                let groups = cols.div_ceil(group);
                let row_qs = &qs[r * cols..(r + 1) * cols];
                let row_scales = &scales[r * groups..(r + 1) * groups];
                for ((o_group, q_group), &scale) in out.chunks_mut(group).zip(row_qs.chunks(group)).zip(row_scales) {
                    for (o, &q) in o_group.iter_mut().zip(q_group) {
                        *o = f32::from(q) * scale;
                    }
                }
            }
            MatData::Q4 { qs, scales, group } => {
                let groups = cols.div_ceil(group);
                let stride = cols.div_ceil(2);
                let row_qs = &qs[r * stride..(r + 1) * stride];
                let row_scales = &scales[r * groups..(r + 1) * groups];
                for (g, (o_group, &scale)) in out.chunks_mut(group).zip(row_scales).enumerate() {
                    crate::scalar::decode_q4(row_qs, g * group, o_group);
                    for o in o_group {
                        *o *= scale;
                    }
                }
            }
            MatData::Mxfp4 { codes, scales } => {
                let (stride, blocks) = (cols / 2, cols / mxfp4::BLOCK_VALUES);
                mxfp4::dequantize_mxfp4(
                    &codes[r * stride..(r + 1) * stride],
                    &scales[r * blocks..(r + 1) * blocks],
                    out,
                );
            }
        }
    }

    /// The whole matrix dequantized, row-major `[rows, cols]`.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.row_to_f32(r, row);
        }
        out
    }
}

fn check_group(format: QuantFormat, group: usize) -> Result<()> {
    if group == 0 {
        return Err(Error::InvalidGroup { format: format.name(), group });
    }
    Ok(())
}

/// MXFP4 rows must be whole blocks; other formats take any width.
fn check_blocks(format: QuantFormat, cols: usize) -> Result<()> {
    if format == QuantFormat::Mxfp4 && !cols.is_multiple_of(mxfp4::BLOCK_VALUES) {
        return Err(Error::PartialMxfp4Block { cols });
    }
    Ok(())
}

fn check_len(format: QuantFormat, rows: usize, cols: usize, check: LenCheck) -> Result<()> {
    if check.expected == check.actual {
        return Ok(());
    }
    Err(Error::Length {
        format: format.name(),
        what: check.what,
        unit: check.unit,
        rows,
        cols,
        expected: check.expected,
        actual: check.actual,
    })
}

/// Scale index range of `rows` in a grouped matrix.
fn scale_range(cols: usize, group: usize, rows: Range<usize>) -> Range<usize> {
    let groups = cols.div_ceil(group);
    rows.start * groups..rows.end * groups
}

/// Reinterprets `bytes` as `T`s in place; the length is already checked, so
/// only misalignment can fail.
fn cast<'a, T: bytemuck::Pod>(format: QuantFormat, what: &'static str, bytes: &'a [u8]) -> Result<&'a [T]> {
    // An empty buffer holds no element to misalign (and empty `Vec`s have
    // dangling, arbitrarily aligned pointers).
    if bytes.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| Error::Misaligned {
        format: format.name(),
        what,
        addr: bytes.as_ptr() as usize,
        align: align_of::<T>(),
    })
}
