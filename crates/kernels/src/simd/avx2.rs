//! AVX2 + FMA kernel bodies: 8 `f32` lanes. AVX2 has no cheap masked byte
//! loads, so tails shorter than a vector are finished with scalar code.
//!
//! # Safety (all functions)
//! The caller must ensure the CPU supports `avx2` and `fma`, and the length
//! invariants listed per function; the dispatching methods of
//! [`crate::simd::Isa`] do both.

use std::arch::x86_64::*;

use crate::quant::Q4_OFFSET;

/// `f32` lanes per vector.
const W: usize = 8;

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    let single = _mm_add_ss(pairs, _mm_shuffle_ps::<1>(pairs, pairs));
    _mm_cvtss_f32(single)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn sum4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m256 {
    _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d))
}

/// Requires `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // Four independent accumulators hide the FMA latency.
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads lanes i..i+W with i + W <= n, the length of
    // both slices.
    unsafe {
        while i + 4 * W <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + W)), _mm256_loadu_ps(pb.add(i + W)), acc1);
            acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 2 * W)), _mm256_loadu_ps(pb.add(i + 2 * W)), acc2);
            acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 3 * W)), _mm256_loadu_ps(pb.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        while i + W <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += W;
        }
    }
    let mut sum = hsum(sum4(acc0, acc1, acc2, acc3));
    for j in i..n {
        sum += a[j] * b[j];
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
    let n = x.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: as in `dot_f32`; both slices have length n.
    unsafe {
        while i + 4 * W <= n {
            acc0 = _mm256_fmadd_ps(load_bf16(pw.add(i)), _mm256_loadu_ps(px.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(load_bf16(pw.add(i + W)), _mm256_loadu_ps(px.add(i + W)), acc1);
            acc2 = _mm256_fmadd_ps(load_bf16(pw.add(i + 2 * W)), _mm256_loadu_ps(px.add(i + 2 * W)), acc2);
            acc3 = _mm256_fmadd_ps(load_bf16(pw.add(i + 3 * W)), _mm256_loadu_ps(px.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        while i + W <= n {
            acc0 = _mm256_fmadd_ps(load_bf16(pw.add(i)), _mm256_loadu_ps(px.add(i)), acc0);
            i += W;
        }
    }
    let mut sum = hsum(sum4(acc0, acc1, acc2, acc3));
    for j in i..n {
        sum += crate::quant::bf16_to_f32(w[j]) * x[j];
    }
    sum
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
    let n = x.len();
    let mut total = _mm256_setzero_ps();
    // Group tails shorter than a vector are summed in scalar and scaled
    // separately, so the vector total never needs a per-group reduction.
    let mut total_tail = 0.0f32;
    for (g, &scale) in scales.iter().enumerate() {
        let start = g * group;
        let len = group.min(n - start);
        // SAFETY: start + len <= n == qs.len() == x.len().
        let (sum, tail_start) = unsafe { q8_group_sum(qs.as_ptr().add(start), x.as_ptr().add(start), len) };
        total = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total);
        let mut tail = 0.0f32;
        for c in start + tail_start..start + len {
            tail += f32::from(qs[c]) * x[c];
        }
        total_tail += tail * scale;
    }
    hsum(total) + total_tail
}

/// Lane-wise partial sums of `q[i] * x[i]` over the longest prefix of
/// `0..len` that is a multiple of 8, and that prefix's length.
///
/// # Safety
/// `len` values must be readable at both `q` and `x`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_group_sum(q: *const i8, x: *const f32, len: usize) -> (__m256, usize) {
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every access stays below `len`.
    unsafe {
        while i + 4 * W <= len {
            acc0 = _mm256_fmadd_ps(load_q8(q.add(i)), _mm256_loadu_ps(x.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(load_q8(q.add(i + W)), _mm256_loadu_ps(x.add(i + W)), acc1);
            acc2 = _mm256_fmadd_ps(load_q8(q.add(i + 2 * W)), _mm256_loadu_ps(x.add(i + 2 * W)), acc2);
            acc3 = _mm256_fmadd_ps(load_q8(q.add(i + 3 * W)), _mm256_loadu_ps(x.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        while i + W <= len {
            acc0 = _mm256_fmadd_ps(load_q8(q.add(i)), _mm256_loadu_ps(x.add(i)), acc0);
            i += W;
        }
    }
    (sum4(acc0, acc1, acc2, acc3), i)
}

/// Unpacks 16 packed q4 bytes (32 columns) into the signed values of columns
/// 0..16 and 16..32, one byte per value.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn unpack_q4x32(bytes: __m128i) -> (__m128i, __m128i) {
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
    let n = x.len();
    let mut total = _mm256_setzero_ps();
    let mut total_tail = 0.0f32;
    for (g, &scale) in scales.iter().enumerate() {
        let start = g * group;
        let len = group.min(n - start);
        // SAFETY: start is even and the group's ceil(len / 2) bytes end at or
        // before ceil(n / 2) == qs.len(); start + len <= n == x.len().
        let (sum, tail_start) = unsafe { q4_group_sum(qs.as_ptr().add(start / 2), x.as_ptr().add(start), len) };
        total = _mm256_fmadd_ps(sum, _mm256_set1_ps(scale), total);
        let mut tail = 0.0f32;
        for c in start + tail_start..start + len {
            tail += crate::quant::q4_at(qs, c) as f32 * x[c];
        }
        total_tail += tail * scale;
    }
    hsum(total) + total_tail
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
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: a 32-column step reads bytes i/2..i/2+16 and values i..i+32
    // with i + 32 <= len; a 16-column step reads 8 bytes and 16 values with
    // i + 16 <= len.
    unsafe {
        while i + 4 * W <= len {
            let (first, second) = unpack_q4x32(_mm_loadu_si128(q.add(i / 2).cast()));
            let (a, b) = widen_i8x16(first);
            let (c, d) = widen_i8x16(second);
            acc0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(x.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(x.add(i + W)), acc1);
            acc2 = _mm256_fmadd_ps(c, _mm256_loadu_ps(x.add(i + 2 * W)), acc2);
            acc3 = _mm256_fmadd_ps(d, _mm256_loadu_ps(x.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        if i + 2 * W <= len {
            // Only the low 8 bytes are loaded, so only `first` is meaningful.
            let (first, _) = unpack_q4x32(_mm_loadl_epi64(q.add(i / 2).cast()));
            let (a, b) = widen_i8x16(first);
            acc0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(x.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(x.add(i + W)), acc1);
            i += 2 * W;
        }
    }
    (sum4(acc0, acc1, acc2, acc3), i)
}

/// Requires `x.len() == y.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_mut_ptr());
    let alpha_v = _mm256_set1_ps(alpha);
    let mut i = 0;
    // SAFETY: accesses stay below n, the length of both slices; `x` and `y`
    // cannot alias (shared vs exclusive borrow).
    unsafe {
        while i + W <= n {
            let v = _mm256_fmadd_ps(alpha_v, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
            _mm256_storeu_ps(py.add(i), v);
            i += W;
        }
    }
    for j in i..n {
        y[j] = alpha.mul_add(x[j], y[j]);
    }
}

/// No length invariant.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scale(alpha: f32, x: &mut [f32]) {
    let n = x.len();
    let px = x.as_mut_ptr();
    let alpha_v = _mm256_set1_ps(alpha);
    let mut i = 0;
    // SAFETY: accesses stay below n == x.len().
    unsafe {
        while i + W <= n {
            _mm256_storeu_ps(px.add(i), _mm256_mul_ps(alpha_v, _mm256_loadu_ps(px.add(i))));
            i += W;
        }
    }
    for v in &mut x[i..] {
        *v *= alpha;
    }
}
