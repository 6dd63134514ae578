//! AVX2 + FMA kernel bodies: 8 `f32` lanes. AVX2 has no cheap masked byte
//! loads, so tails shorter than a vector are finished with scalar code.
//!
//! # Safety (all functions)
//! The caller must ensure the CPU supports `avx2` and `fma`, and the length
//! invariants listed per function; the dispatching methods of
//! [`crate::simd::Isa`] do both.

use std::arch::x86_64::*;

use super::lanes::{Lanes, axpy_vectors, dot_chains, fma4, impl_lanes, scale_vectors, sum4};
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
            scales,
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
    scales: &[f32],
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
        for (g, &scale) in scales.iter().enumerate() {
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

/// Unpacks 16 packed q4 bytes (32 columns) into the signed values of columns
/// 0..16 and 16..32, one byte per value.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn unpack_q4x32(bytes: __m128i) -> (__m128i, __m128i) {
    let low_nibble = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(bytes, low_nibble);
    // A 16-bit shift is fine: the mask drops the bits crossing byte borders.
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low_nibble);
    // Low nibble = even column, so interleaving lo/hi restores column order.
    let offset = _mm_set1_epi8(Q4_OFFSET as i8);
    (_mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), offset), _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), offset))
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
            scales,
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
// Integer products of q8/q4 weights with int16 activations (`crate::int`).
//
// A 512-bit block is handled as two 256-bit halves: half `h` holds lanes
// `8h..8h + 8` of the definition, so each lane sees the same operations as
// on AVX-512 and the results agree bit for bit.
// ---------------------------------------------------------------------------

use std::ops::Range;

use crate::act::{ActRow, LANES, Layout};
use crate::int::{BLOCK_BYTES, IntWeights, store_tile};

/// Sums the two halves' 8 lanes in the tree of [`crate::int::reduce_lanes`]
/// (`lo[i] + hi[i]` is lane `i` plus lane `i + 8`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce_halves(lo: __m256, hi: __m256) -> f32 {
    hsum(_mm256_add_ps(lo, hi))
}

/// Expands a half block's weight scales to its 8 lanes. Groups are powers
/// of two, so block-to-group indexing is a shift.
#[derive(Clone, Copy)]
struct LaneScales {
    /// A group spans `1 << shift` blocks (`wide`), or a half block spans
    /// `1 << shift` groups.
    wide: bool,
    shift: u32,
    mask: __m256i,
    idx: __m256i,
}

impl LaneScales {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn new(w: &IntWeights<'_>) -> Self {
        let (block, lane_cols) = (w.layout.block_cols(), w.layout.lane_cols());
        if w.group >= block {
            let zero = _mm256_setzero_si256();
            return LaneScales { wide: true, shift: (w.group / block).trailing_zeros(), mask: zero, idx: zero };
        }
        // A power of two below the block size divides the half block.
        let groups_per_half = block / 2 / w.group;
        let group_shift = w.group.trailing_zeros();
        let idx: [i32; 8] = std::array::from_fn(|k| ((k * lane_cols) >> group_shift) as i32);
        let mask: [i32; 8] = std::array::from_fn(|k| if k < groups_per_half { -1 } else { 0 });
        // SAFETY: reads the 8 values of local arrays.
        unsafe {
            LaneScales {
                wide: false,
                shift: groups_per_half.trailing_zeros(),
                mask: _mm256_loadu_si256(mask.as_ptr().cast()),
                idx: _mm256_loadu_si256(idx.as_ptr().cast()),
            }
        }
    }

    /// The lane scales of half `h` of full block `b` of a row whose scales
    /// start at `s`.
    ///
    /// # Safety
    /// Block `b` must lie entirely inside the row.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn half(self, s: *const f32, b: usize, h: usize) -> __m256 {
        // SAFETY: a full block's groups all exist in the row's scales; the
        // masked load touches only those.
        unsafe {
            if self.wide {
                _mm256_set1_ps(*s.add(b >> self.shift))
            } else {
                let first = (2 * b + h) << self.shift;
                _mm256_permutevar8x32_ps(_mm256_maskload_ps(s.add(first), self.mask), self.idx)
            }
        }
    }
}

/// One half block (32 bytes) of one row against `T` activation vectors.
#[inline(always)]
unsafe fn half_step<const Q4: bool, const T: usize>(
    w: __m256i,
    w_scales: __m256,
    acts: &[ActRow<'_>; T],
    b: usize,
    h: usize,
    facc: &mut [[__m256; 2]; T],
) {
    let block = if Q4 { Layout::Q4 } else { Layout::Q8 }.block_cols();
    // SAFETY: callers enable avx2/fma; `check_tile` guarantees each vector
    // holds block `b` (planes of 32 words, this half's 16 at `16h`) and its
    // lane scales.
    unsafe {
        let load = |p: *const i16| _mm256_loadu_si256(p.cast());
        let madd = |a, x| _mm256_madd_epi16(a, x);
        // The decoders of the AVX-512 path (see `avx512::block_step`).
        let planes: [__m256i; 4] = if Q4 {
            let low = _mm256_set1_epi16(0x000F);
            let high = _mm256_set1_epi16(0x00F0);
            let w_hi = _mm256_srli_epi16::<8>(w);
            [
                _mm256_and_si256(w, low),
                _mm256_and_si256(w, high),
                _mm256_and_si256(w_hi, low),
                _mm256_and_si256(w_hi, high),
            ]
        } else {
            let zero = _mm256_setzero_si256();
            [_mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w)), _mm256_srai_epi16::<8>(w), zero, zero]
        };
        for t in 0..T {
            let x = acts[t].q.as_ptr().add(b * block + 16 * h);
            let isum = if Q4 {
                let corr = _mm256_loadu_si256(acts[t].lane_corr.as_ptr().add(b * LANES + 8 * h).cast());
                let even = _mm256_add_epi32(
                    _mm256_add_epi32(corr, madd(planes[0], load(x))),
                    madd(planes[2], load(x.add(64))),
                );
                let odd = _mm256_add_epi32(madd(planes[1], load(x.add(32))), madd(planes[3], load(x.add(96))));
                _mm256_add_epi32(even, _mm256_srai_epi32::<4>(odd))
            } else {
                _mm256_add_epi32(madd(planes[0], load(x)), madd(planes[1], load(x.add(32))))
            };
            let xs = _mm256_loadu_ps(acts[t].lane_scales.as_ptr().add(b * LANES + 8 * h));
            let s = _mm256_mul_ps(w_scales, xs);
            facc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, facc[t][h]);
        }
    }
}

/// Rows `rows` of `w` times `T` activation vectors, in tiles of 2 rows
/// (16 vector registers hold a 2 × 2 tile's accumulators and the decoded
/// planes): `out[t * out_stride + (r - rows.start)]`.
#[inline(always)]
unsafe fn int_rows_body<const Q4: bool, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: callers enable the features and uphold `crate::int::check_rows`.
    unsafe {
        let lane_scales = LaneScales::new(w);
        let mut r = rows.start;
        while r < rows.end {
            if r + 2 <= rows.end {
                let mut tile = [[0.0f32; T]; 2];
                int_tile_body::<Q4, 2, T>(w, lane_scales, r, acts, &mut tile);
                store_tile(&tile, r - rows.start, out, out_stride);
                r += 2;
            } else {
                let mut tile = [[0.0f32; T]; 1];
                int_tile_body::<Q4, 1, T>(w, lane_scales, r, acts, &mut tile);
                store_tile(&tile, r - rows.start, out, out_stride);
                r += 1;
            }
        }
    }
}

#[inline(always)]
unsafe fn int_tile_body<const Q4: bool, const R: usize, const T: usize>(
    w: &IntWeights<'_>,
    lane_scales: LaneScales,
    row0: usize,
    acts: &[ActRow<'_>; T],
    out: &mut [[f32; T]; R],
) {
    // SAFETY: callers enable the features and uphold `check_rows`; full
    // blocks lie inside their rows, and the tail block is a local copy.
    unsafe {
        let full = w.full_blocks();
        let qs: [*const u8; R] = std::array::from_fn(|i| w.row_qs(row0 + i).as_ptr());
        let scales: [*const f32; R] = std::array::from_fn(|i| w.row_scales(row0 + i).as_ptr());
        let next = w.next_tile_rows::<R>(row0);
        let mut facc = [[[_mm256_setzero_ps(); 2]; T]; R];
        for b in 0..full {
            for i in 0..R {
                // As on AVX-512: fetch the next tile's rows while this one runs.
                _mm_prefetch::<_MM_HINT_T1>(next[i].wrapping_add(b * BLOCK_BYTES).cast());
                for h in 0..2 {
                    let wv = _mm256_loadu_si256(qs[i].add(b * BLOCK_BYTES + 32 * h).cast());
                    half_step::<Q4, T>(wv, lane_scales.half(scales[i], b, h), acts, b, h, &mut facc[i]);
                }
            }
        }
        if full < w.blocks() {
            for i in 0..R {
                let tail = w.tail_block(row0 + i);
                let tail_scales = w.lane_scales(row0 + i, full);
                for h in 0..2 {
                    let wv = _mm256_loadu_si256(tail.as_ptr().add(32 * h).cast());
                    let ws = _mm256_loadu_ps(tail_scales.as_ptr().add(8 * h));
                    half_step::<Q4, T>(wv, ws, acts, full, h, &mut facc[i]);
                }
            }
        }
        for i in 0..R {
            for t in 0..T {
                out[i][t] = reduce_halves(facc[i][t][0], facc[i][t][1]);
            }
        }
    }
}

/// Integer rows with `vpmaddwd` + `vpaddd`.
///
/// # Safety
/// The CPU must support AVX2 and FMA, and `crate::int::check_rows` must
/// hold for these arguments.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn int_rows<const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: forwarded to the caller.
    unsafe {
        match w.layout {
            Layout::Q4 => int_rows_body::<true, T>(w, rows, acts, out, out_stride),
            Layout::Q8 => int_rows_body::<false, T>(w, rows, acts, out, out_stride),
        }
    }
}
