//! Weight storage formats and the quantizers that produce them.
//!
//! Layouts (all row-major `[rows, cols]`, host byte order, which is
//! little-endian on every supported target):
//!
//! * **f32**: `rows * cols` `f32`.
//! * **bf16**: `rows * cols` `u16` holding the upper half of an `f32`.
//! * **q8**: `rows * cols` `i8`, symmetric per group of `group` columns along
//!   each row: `scale = max|x| / 127`, `q = round(x / scale)` clamped to
//!   `[-127, 127]`. One `f32` scale per (row, group), `ceil(cols / group)`
//!   groups per row; the last group of a row may be partial.
//! * **q4**: symmetric per group: `scale = max|x| / 7`, `q = round(x / scale)`
//!   clamped to `[-8, 7]`, stored as the nibble `q + 8`, two per byte, the low
//!   nibble holding the even column. Every row starts on a fresh byte, so the
//!   row stride is `ceil(cols / 2)` bytes; the unused high nibble of an
//!   odd-length row is written as 8 (i.e. `q = 0`). Scales as for q8.
//!
//! * **mxfp4**: kept as MXFP4 checkpoints store it, never produced by a
//!   quantizer here: per row, `cols / 2` bytes of E2M1 codes and `cols / 32`
//!   E8M0 scale bytes, one per block of 32 columns; `cols` is whole blocks
//!   (see [`crate::mxfp4`]).
//!
//! In both grouped formats an all-zero group has scale 0 and dequantizes to 0;
//! a dequantized weight is exactly `q as f32 * scale`. Rounding is
//! round-half-to-even, the convention of `torch.round` / `numpy.round`, so
//! Python tooling reproduces our bytes exactly. Inputs must be finite.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Weight storage format. The discriminant is written to disk: never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QuantFormat {
    F32 = 0,
    Bf16 = 1,
    Q8 = 2,
    Q4 = 3,
    Mxfp4 = 4,
}

impl QuantFormat {
    /// Every format, in ordinal order.
    pub const ALL: [QuantFormat; 5] = [Self::F32, Self::Bf16, Self::Q8, Self::Q4, Self::Mxfp4];

    /// The stable on-disk number of this format.
    pub fn ordinal(self) -> u8 {
        self as u8
    }

    /// Inverse of [`QuantFormat::ordinal`].
    pub fn from_ordinal(ordinal: u8) -> Result<Self> {
        Self::ALL.get(usize::from(ordinal)).copied().ok_or(Error::UnknownFormatOrdinal { ordinal })
    }

    /// Lower-case name, as accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Q8 => "q8",
            Self::Q4 => "q4",
            Self::Mxfp4 => "mxfp4",
        }
    }

    /// Whether the format carries per-group `f32` scales with a group size
    /// of the caller's choice (MXFP4's blocks are fixed, its scales bytes).
    pub fn is_grouped(self) -> bool {
        matches!(self, Self::Q8 | Self::Q4)
    }

    /// Bytes of weight storage for a `[rows, cols]` matrix.
    ///
    /// Saturates at `usize::MAX` instead of overflowing, so validating an
    /// untrusted header never panics: no real buffer has that length.
    pub fn weight_bytes(self, rows: usize, cols: usize) -> usize {
        self.checked_weight_bytes(rows, cols).unwrap_or(usize::MAX)
    }

    /// Number of scales for a `[rows, cols]` matrix with `group` columns per
    /// group: `rows * ceil(cols / group)` for q8/q4 (`f32` each),
    /// `rows * ceil(cols / 32)` for mxfp4 (a byte each, `group` ignored),
    /// else 0.
    ///
    /// `group == 0` is invalid for grouped formats; it yields `usize::MAX`
    /// (and overflow saturates) rather than panicking, for the same reason as
    /// [`QuantFormat::weight_bytes`].
    pub fn scale_count(self, rows: usize, cols: usize, group: usize) -> usize {
        self.checked_scale_count(rows, cols, group).unwrap_or(usize::MAX)
    }

    /// Storage elements (`f32`, `u16`, `i8` or `u8`) per row.
    pub(crate) fn row_elems(self, cols: usize) -> usize {
        match self {
            Self::Q4 | Self::Mxfp4 => cols.div_ceil(2),
            Self::F32 | Self::Bf16 | Self::Q8 => cols,
        }
    }

    /// Size in bytes of one storage element.
    pub(crate) fn elem_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
            Self::Q8 | Self::Q4 | Self::Mxfp4 => 1,
        }
    }

    /// Size in bytes of one scale.
    pub(crate) fn scale_elem_bytes(self) -> usize {
        match self {
            Self::Mxfp4 => 1,
            Self::F32 | Self::Bf16 | Self::Q8 | Self::Q4 => size_of::<f32>(),
        }
    }

    /// Bytes of scales for a `[rows, cols]` matrix with `group` columns per
    /// group ([`QuantFormat::scale_count`] scales of their own size);
    /// saturates as [`QuantFormat::weight_bytes`] does.
    pub fn scale_bytes(self, rows: usize, cols: usize, group: usize) -> usize {
        self.checked_scale_bytes(rows, cols, group).unwrap_or(usize::MAX)
    }

    pub(crate) fn checked_scale_bytes(self, rows: usize, cols: usize, group: usize) -> Option<usize> {
        self.checked_scale_count(rows, cols, group)?.checked_mul(self.scale_elem_bytes())
    }

    pub(crate) fn checked_weight_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        rows.checked_mul(self.row_elems(cols))?.checked_mul(self.elem_bytes())
    }

    pub(crate) fn checked_scale_count(self, rows: usize, cols: usize, group: usize) -> Option<usize> {
        if self == Self::Mxfp4 {
            return rows.checked_mul(cols.div_ceil(crate::mxfp4::BLOCK_VALUES));
        }
        if !self.is_grouped() {
            return Some(0);
        }
        if group == 0 {
            return None;
        }
        rows.checked_mul(cols.div_ceil(group))
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuantFormat {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|format| format.name() == name)
            .ok_or_else(|| Error::UnknownFormatName { name: name.to_owned() })
    }
}

/// Quantizes a row-major `[rows, cols]` matrix to q8 (see the module docs).
///
/// Returns `(qs, scales)`: `rows * cols` values and `rows * ceil(cols/group)`
/// scales.
///
/// # Panics
/// If `src.len() != rows * cols` or `group == 0`: quantization runs in
/// trusted conversion tooling, where a mismatch is a bug.
pub fn quantize_q8(src: &[f32], rows: usize, cols: usize, group: usize) -> (Vec<i8>, Vec<f32>) {
    check_quant_args(src, rows, cols, group);
    let mut qs = Vec::with_capacity(src.len());
    let mut scales = Vec::with_capacity(rows * cols.div_ceil(group));
    for row in src.chunks_exact(cols.max(1)).take(rows) {
        for chunk in row.chunks(group) {
            let scale = group_scale(chunk, Q8_MAX);
            scales.push(scale);
            // The clamp is only a guard: `max|x| / scale` can land an ulp
            // above 127 after rounding of the division, which still rounds
            // to 127.
            qs.extend(chunk.iter().map(|&x| quantize_value(x, scale, -Q8_MAX, Q8_MAX) as i8));
        }
    }
    (qs, scales)
}

/// Quantizes a row-major `[rows, cols]` matrix to q4 (see the module docs).
///
/// Returns `(qs, scales)`: `rows * ceil(cols/2)` packed bytes and
/// `rows * ceil(cols/group)` scales.
///
/// # Panics
/// If `src.len() != rows * cols` or `group == 0`, as [`quantize_q8`].
pub fn quantize_q4(src: &[f32], rows: usize, cols: usize, group: usize) -> (Vec<u8>, Vec<f32>) {
    check_quant_args(src, rows, cols, group);
    let row_bytes = cols.div_ceil(2);
    let mut qs = Vec::with_capacity(rows * row_bytes);
    let mut scales = Vec::with_capacity(rows * cols.div_ceil(group));
    let mut nibbles = vec![0u8; cols];
    for row in src.chunks_exact(cols.max(1)).take(rows) {
        for (chunk, out) in row.chunks(group).zip(nibbles.chunks_mut(group)) {
            let scale = group_scale(chunk, Q4_MAX);
            scales.push(scale);
            for (&x, nib) in chunk.iter().zip(out) {
                *nib = (quantize_value(x, scale, Q4_MIN, Q4_MAX) + Q4_OFFSET) as u8;
            }
        }
        // An odd row's last byte gets 8 (q = 0) in its unused high nibble.
        qs.extend(nibbles.chunks(2).map(|pair| {
            let lo = pair[0];
            let hi = pair.get(1).copied().unwrap_or(Q4_OFFSET as u8);
            lo | (hi << 4)
        }));
    }
    (qs, scales)
}

/// Converts `f32` to bf16 bits with round-to-nearest-even, exactly like
/// PyTorch's `c10::BFloat16` (every NaN becomes the quiet NaN `0x7FC0`).
pub fn f32_to_bf16_bits(src: &[f32]) -> Vec<u16> {
    src.iter().map(|&x| f32_to_bf16(x)).collect()
}

/// One value of [`f32_to_bf16_bits`].
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    // Adding 0x7FFF plus the lowest kept bit rounds the dropped 16 bits to
    // nearest, ties to even, with the carry propagating into the exponent.
    let rounding_bias = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding_bias) >> 16) as u16
}

/// Widens bf16 bits to `f32` (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Largest q8 magnitude; -128 is unused so the format is symmetric.
pub(crate) const Q8_MAX: i32 = 127;
/// q4 value range; 7 sets the scale, -8 only appears through clamping.
pub(crate) const Q4_MAX: i32 = 7;
pub(crate) const Q4_MIN: i32 = -8;
/// Stored nibble = q + 8, so nibbles are unsigned.
pub(crate) const Q4_OFFSET: i32 = 8;

/// Decodes the q4 value of column `col` of one packed row.
#[inline]
pub(crate) fn q4_at(row_qs: &[u8], col: usize) -> i32 {
    let byte = row_qs[col / 2];
    let nibble = if col.is_multiple_of(2) { byte & 0x0F } else { byte >> 4 };
    i32::from(nibble) - Q4_OFFSET
}

fn check_quant_args(src: &[f32], rows: usize, cols: usize, group: usize) {
    assert!(group > 0, "quantization group must be at least 1 column");
    assert_eq!(
        Some(src.len()),
        rows.checked_mul(cols),
        "quantize: source has {} values, shape is [{rows}, {cols}]",
        src.len()
    );
}

/// `max|x| / q_max`, computed in f32 as the format defines it.
fn group_scale(chunk: &[f32], q_max: i32) -> f32 {
    let abs_max = chunk.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    abs_max / q_max as f32
}

fn quantize_value(x: f32, scale: f32, q_min: i32, q_max: i32) -> i32 {
    if scale == 0.0 {
        return 0;
    }
    // Clamping before rounding gives what clamping after would (rounding is
    // monotonic and the bounds are integers), and keeps the value in
    // `round_ties_even_small`'s range.
    round_ties_even_small((x / scale).clamp(q_min as f32, q_max as f32)) as i32
}

/// `v.round_ties_even()` for `|v| <= 2^22`, without a libm call (x86_64's
/// baseline has no SSE4.1 `roundss`; `rintf` was half of converting a
/// model): adding and subtracting `1.5 * 2^23` drops the fraction in the
/// current rounding mode, IEEE's round half to even.
#[inline(always)]
pub(crate) fn round_ties_even_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    debug_assert!(v.is_nan() || v.abs() <= 4_194_304.0, "{v} outside round_ties_even_small's range");
    (v + MAGIC) - MAGIC
}
