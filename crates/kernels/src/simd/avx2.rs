//! AVX2 + FMA kernel bodies: 8 `f32` lanes. AVX2 has no cheap masked byte
//! loads, so tails shorter than a vector are finished with scalar code.
//!
//! # Safety (all functions)
//! The caller must ensure the CPU supports `avx2` and `fma`, and the length
//! invariants listed per function; the dispatching methods of
//! [`crate::simd::Isa`] do both.

use std::arch::x86_64::*;

use super::lanes::{Lanes, axpy_vectors, dot_chains, fma4, impl_lanes, scale_vectors, sum4};
use crate::mxfp4::{self, BLOCK_VALUES, E2M1_SIGNED_HALF_UNITS};
use crate::quant::Q4_OFFSET;

/// `f32` lanes per vector.
const W: usize = Avx2::N;

/// 8 `f32` lanes in a `__m256`.
struct Avx2;

impl_lanes!(Avx2, __m256, 8, {
    zero: _mm256_setzero_ps,
    load: _mm256_loadu_ps,
    store: _mm256_storeu_ps,
    add: _mm256_add_ps,
    mul: _mm256_mul_ps,
    fmadd: _mm256_fmadd_ps,
});

/// Sums the 8 lanes in the tree of [`crate::int::reduce_lanes`]'s last
/// three levels (the AVX-512 reduction ends with it).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    let single = _mm_add_ss(pairs, _mm_shuffle_ps::<1>(pairs, pairs));
    _mm_cvtss_f32(single)
}

/// Requires `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let pa = a.as_ptr();
    // SAFETY: both slices have length n.
    unsafe { tailed_dot(b, |i| Avx2::load(pa.add(i)), |j| a[j]) }
}

/// `sum w[i] * x[i]`: whole vectors in [`dot_chains`], where `w(i)` gives
/// the 8 weights from column `i` as `f32` lanes, then the columns left over
/// in scalar, from `value(j)`.
///
/// # Safety
/// The caller enables avx2 and fma, and `w(i)` must be sound for every `i`
/// with `i + 8 <= x.len()`.
#[inline(always)]
unsafe fn tailed_dot(x: &[f32], w: impl Fn(usize) -> __m256, value: impl Fn(usize) -> f32) -> f32 {
    let n = x.len();
    // SAFETY: the chains read whole vectors below n == x.len(), as the
    // caller allows.
    let (mut sum, i) = unsafe {
        let (acc, i) = dot_chains::<Avx2>(n, w, x.as_ptr());
        (hsum(sum4::<Avx2>(acc)), i)
    };
    for j in i..n {
        sum += value(j) * x[j];
    }
    sum
}

/// Widens 8 bf16 values at `p`.
///
/// # Safety
/// 8 values must be readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_bf16(p: *const u16) -> __m256 {
    // SAFETY: forwarded to the caller.
    let bits = unsafe { _mm_loadu_si128(p.cast()) };
    // bf16 is the upper half of an f32: zero-extend and shift into place.
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
}

/// Requires `w.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let pw = w.as_ptr();
    // SAFETY: both slices have length n.
    unsafe { tailed_dot(x, |i| load_bf16(pw.add(i)), |j| crate::quant::bf16_to_f32(w[j])) }
}

/// Widens 8 int8 values at `q`.
///
/// # Safety
/// 8 bytes must be readable at `q`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_q8(q: *const i8) -> __m256 {
    // SAFETY: forwarded to the caller; `loadl` reads exactly 8 bytes.
    let bytes = unsafe { _mm_loadl_epi64(q.cast()) };
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes))
}

/// Requires the invariants of [`crate::scalar::check_q8_row`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q8(qs: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    // SAFETY: every group's start + len <= n == qs.len() == x.len().
    unsafe {
        grouped_dot(
            scales.iter().copied(),
            group,
            x,
            |start, len| q8_group_sum(qs.as_ptr().add(start), x.as_ptr().add(start), len),
            |c| f32::from(qs[c]),
        )
    }
}

/// `sum_g scales[g] * (q . x over group g)` for a quantized row of
/// `x.len()` columns: `group_sum(start, len)` gives a group's lane-wise
/// partial sums over its whole vectors and the first column they leave
/// over; the columns left over are summed in scalar from `value(c)` and
/// scaled separately, so the vector total never needs a per-group
/// reduction.
///
/// # Safety
/// The caller enables avx2 and fma, and `group_sum` must be sound for
/// every group of the row.
#[inline(always)]
unsafe fn grouped_dot(
    scales: impl IntoIterator<Item = f32>,
    group: usize,
    x: &[f32],
    group_sum: impl Fn(usize, usize) -> (__m256, usize),
    value: impl Fn(usize) -> f32,
) -> f32 {
    let n = x.len();
    // SAFETY: register-only operations of the caller's features, and
    // `group_sum` as the caller allows.
    unsafe {
        let mut total = _mm256_setzero_ps();
        let mut total_tail = 0.0f32;
        for (g, scale) in scales.into_iter().enumerate() {
            let start = g * group;
            let len = group.min(n - start);
            let (sum, tail_start) = group_sum(start, len);
            total = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total);
            let mut tail = 0.0f32;
            for c in start + tail_start..start + len {
                tail += value(c) * x[c];
            }
            total_tail += tail * scale;
        }
        hsum(total) + total_tail
    }
}

/// Lane-wise partial sums of `q[i] * x[i]` over the longest prefix of
/// `0..len` that is a multiple of 8, and that prefix's length.
///
/// # Safety
/// `len` values must be readable at both `q` and `x`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_group_sum(q: *const i8, x: *const f32, len: usize) -> (__m256, usize) {
    // SAFETY: every access stays below `len`.
    unsafe {
        let (acc, i) = dot_chains::<Avx2>(len, |i| load_q8(q.add(i)), x);
        (sum4::<Avx2>(acc), i)
    }
}

/// Unpacks 16 packed bytes (32 columns, the low nibble the even column, as
/// q4 and MXFP4 pack them) into the nibbles of columns 0..16 and 16..32, one
/// byte per nibble.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn nibbles_x32(bytes: __m128i) -> (__m128i, __m128i) {
    let low_nibble = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(bytes, low_nibble);
    // A 16-bit shift is fine: the mask drops the bits crossing byte borders.
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low_nibble);
    // Low nibble = even column, so interleaving lo/hi restores column order.
    (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi))
}

/// Unpacks 16 packed q4 bytes (32 columns) into the signed values of columns
/// 0..16 and 16..32, one byte per value.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn unpack_q4x32(bytes: __m128i) -> (__m128i, __m128i) {
    let (first, second) = nibbles_x32(bytes);
    let offset = _mm_set1_epi8(Q4_OFFSET as i8);
    (_mm_sub_epi8(first, offset), _mm_sub_epi8(second, offset))
}

/// Decodes 16 MXFP4 code bytes (one block, 32 columns) into the doubled
/// values of columns 0..16 and 16..32 ([`E2M1_SIGNED_HALF_UNITS`]), one
/// signed byte per value, by a byte shuffle through the code table.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn decode_e2m1x32(bytes: __m128i) -> (__m128i, __m128i) {
    let (first, second) = nibbles_x32(bytes);
    // SAFETY: the table is 16 bytes.
    let table = unsafe { _mm_loadu_si128(E2M1_SIGNED_HALF_UNITS.as_ptr().cast()) };
    (_mm_shuffle_epi8(table, first), _mm_shuffle_epi8(table, second))
}

/// Converts 16 signed bytes into two `f32` vectors (values 0..8, 8..16).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn widen_i8x16(v: __m128i) -> (__m256, __m256) {
    (_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))))
}

/// Requires the invariants of [`crate::scalar::check_q4_row`] and an even
/// `group` (so every group starts on a byte).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_q4(qs: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(group % 2, 0);
    // SAFETY: every group's start is even and its ceil(len / 2) bytes end at
    // or before ceil(n / 2) == qs.len(); start + len <= n == x.len().
    unsafe {
        grouped_dot(
            scales.iter().copied(),
            group,
            x,
            |start, len| q4_group_sum(qs.as_ptr().add(start / 2), x.as_ptr().add(start), len),
            |c| crate::quant::q4_at(qs, c) as f32,
        )
    }
}

/// Lane-wise partial sums of `q4[i] * x[i]` over the longest prefix of
/// `0..len` that is a multiple of 16, and that prefix's length; `q` points
/// at the byte of column 0.
///
/// # Safety
/// `ceil(len / 2)` bytes at `q` and `len` values at `x` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q4_group_sum(q: *const u8, x: *const f32, len: usize) -> (__m256, usize) {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: a 32-column step reads bytes i/2..i/2+16 and values i..i+32
    // with i + 32 <= len; a 16-column step reads 8 bytes and 16 values with
    // i + 16 <= len.
    unsafe {
        while i + 4 * W <= len {
            let (first, second) = unpack_q4x32(_mm_loadu_si128(q.add(i / 2).cast()));
            let (a, b) = widen_i8x16(first);
            let (c, d) = widen_i8x16(second);
            acc = fma4::<Avx2>(acc, [a, b, c, d], x.add(i));
            i += 4 * W;
        }
        if i + 2 * W <= len {
            // Only the low 8 bytes are loaded, so only `first` is meaningful.
            let (first, _) = unpack_q4x32(_mm_loadl_epi64(q.add(i / 2).cast()));
            let (a, b) = widen_i8x16(first);
            acc[0] = _mm256_fmadd_ps(a, _mm256_loadu_ps(x.add(i)), acc[0]);
            acc[1] = _mm256_fmadd_ps(b, _mm256_loadu_ps(x.add(i + W)), acc[1]);
            i += 2 * W;
        }
        (sum4::<Avx2>(acc), i)
    }
}

/// Requires the invariants of [`crate::mxfp4::check_row`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_mxfp4(codes: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    // The blocks' values are doubled: halving the power-of-two scale is exact.
    let halved_scales = scales.iter().map(|&scale| mxfp4::e8m0_to_f32(scale) * 0.5);
    // SAFETY: the row is whole blocks of 16 code bytes and 32 values.
    unsafe {
        grouped_dot(
            halved_scales,
            BLOCK_VALUES,
            x,
            |start, _| (mxfp4_block_sum(codes.as_ptr().add(start / 2), x.as_ptr().add(start)), BLOCK_VALUES),
            |c| mxfp4::signed_half_units_at(codes, c),
        )
    }
}

/// Lane-wise partial sums of one block's doubled values times `x`.
///
/// # Safety
/// 16 bytes at `q` and 32 values at `x` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn mxfp4_block_sum(q: *const u8, x: *const f32) -> __m256 {
    // SAFETY: forwarded to the caller.
    unsafe {
        let (first, second) = decode_e2m1x32(_mm_loadu_si128(q.cast()));
        let (a, b) = widen_i8x16(first);
        let (c, d) = widen_i8x16(second);
        sum4::<Avx2>(fma4::<Avx2>([_mm256_setzero_ps(); 4], [a, b, c, d], x))
    }
}

/// Requires `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len();
    // SAFETY: n is the length of both slices; `x` and `y` cannot alias
    // (shared vs exclusive borrow).
    let i = unsafe { axpy_vectors::<Avx2>(_mm256_set1_ps(alpha), x.as_ptr(), y.as_mut_ptr(), n) };
    for j in i..n {
        y[j] = alpha.mul_add(x[j], y[j]);
    }
}

/// No length invariant.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scale(alpha: f32, x: &mut [f32]) {
    // SAFETY: the vectors stay inside `x`.
    let i = unsafe { scale_vectors::<Avx2>(_mm256_set1_ps(alpha), x.as_mut_ptr(), x.len()) };
    for v in &mut x[i..] {
        *v *= alpha;
    }
}

// ---------------------------------------------------------------------------
// Integer products of q8/q4 weights with int16 or int8 activations
// (`crate::int`), written once in `int_lanes`: a 512-bit block of the
// definition is two 256-bit chunks here.
// ---------------------------------------------------------------------------

use std::ops::Range;

use super::int_lanes::{self, ChunkStep, Madd, impl_int_lanes};
use crate::act::{ActRow, LANES};
use crate::int::weights::IntWeights;

impl_int_lanes!(Avx2, __m256i, {
    splat: _mm256_set1_ps,
    load: _mm256_loadu_si256,
    splat16: _mm256_set1_epi16,
    and: _mm256_and_si256,
    srli16: _mm256_srli_epi16,
    srai16: _mm256_srai_epi16,
    slli16: _mm256_slli_epi16,
    srai32: _mm256_srai_epi32,
    add32: _mm256_add_epi32,
    madd16: _mm256_madd_epi16,
    to_f32: _mm256_cvtepi32_ps,
    abs8: _mm256_abs_epi8,
    maddubs: _mm256_maddubs_epi16,
}, {
    /// Lanes `0..8` and `8..16` of a block.
    type Acc = [__m256; 2];
    /// The mask of the groups a chunk's masked load reads, and the group
    /// each lane takes.
    type Pick = (__m256i, __m256i);

    #[inline(always)]
    unsafe fn acc_zero() -> [__m256; 2] {
        // SAFETY: the caller enables AVX2 (see `int_lanes`).
        unsafe { [_mm256_setzero_ps(); 2] }
    }

    /// `lo[i] + hi[i]` is lane `i` plus lane `i + 8`, the first level of
    /// the tree.
    #[inline(always)]
    unsafe fn reduce([lo, hi]: [__m256; 2]) -> f32 {
        // SAFETY: the caller enables AVX2 and FMA.
        unsafe { hsum(_mm256_add_ps(lo, hi)) }
    }

    #[inline(always)]
    unsafe fn pick(groups: usize, idx: &[i32; LANES]) -> (__m256i, __m256i) {
        let mask: [i32; 8] = std::array::from_fn(|k| if k < groups { -1 } else { 0 });
        // SAFETY: reads 8 values of local arrays.
        unsafe { (_mm256_loadu_si256(mask.as_ptr().cast()), _mm256_loadu_si256(idx.as_ptr().cast())) }
    }

    #[inline(always)]
    unsafe fn pick_scales((mask, idx): (__m256i, __m256i), s: *const f32) -> __m256 {
        // SAFETY: the masked load reads only the groups the caller allows.
        unsafe { _mm256_permutevar8x32_ps(_mm256_maskload_ps(s, mask), idx) }
    }

    #[inline(always)]
    unsafe fn sign8(a: __m256i, sign: __m256i) -> __m256i {
        // SAFETY: the caller enables AVX2. `vpsignb` zeroes `a` where `sign`
        // is zero, which only meets zero magnitudes here.
        unsafe { _mm256_sign_epi8(a, sign) }
    }
});

/// Integer rows with `vpmaddwd` + `vpaddd` (int8: `vpmaddubsw` first), in
/// tiles of 2 rows (16 vector registers hold a 2 × 2 tile's accumulators
/// and the decoded planes).
///
/// # Safety
/// The CPU must support AVX2 and FMA, and `crate::int::check_rows` must
/// hold for these arguments.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn int_rows<E: ChunkStep, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: forwarded to the caller; the body is inlined here.
    unsafe { int_lanes::int_rows::<Avx2, Madd, E, 2, T>(w, rows, acts, out, out_stride) }
}
