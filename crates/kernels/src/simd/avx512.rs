//! AVX-512 (F + BW + VL) kernel bodies: 16 `f32` lanes, masked loads for
//! every tail so no scalar clean-up loop is needed.
//!
//! # Safety (all functions)
//! The caller must ensure the CPU supports `avx512f`, `avx512bw` and
//! `avx512vl`, and the length invariants listed per function; the
//! dispatching methods of [`crate::simd::Isa`] do both.

use std::arch::x86_64::*;

use crate::quant::Q4_OFFSET;

/// `f32` lanes per vector.
const W: usize = 16;

/// Mask of the first `n <= 16` lanes.
#[inline]
fn first_lanes(n: usize) -> __mmask16 {
    debug_assert!(n <= W);
    ((1u32 << n) - 1) as __mmask16
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn sum4(a: __m512, b: __m512, c: __m512, d: __m512) -> __m512 {
    _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d))
}

/// Requires `a.len() == b.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // Four independent accumulators hide the FMA latency.
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: full loads read lanes i..i+W with i + W <= n; the masked tail
    // only touches lanes below n. Both slices have length n.
    unsafe {
        while i + 4 * W <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + W)), _mm512_loadu_ps(pb.add(i + W)), acc1);
            acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 2 * W)), _mm512_loadu_ps(pb.add(i + 2 * W)), acc2);
            acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 3 * W)), _mm512_loadu_ps(pb.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        while i + W <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            i += W;
        }
        if i < n {
            let m = first_lanes(n - i);
            acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, pa.add(i)), _mm512_maskz_loadu_ps(m, pb.add(i)), acc1);
        }
    }
    _mm512_reduce_add_ps(sum4(acc0, acc1, acc2, acc3))
}

/// Widens 16 bf16 values at `p` (masked to the first lanes of `m`).
///
/// # Safety
/// The lanes selected by `m` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_bf16(m: __mmask16, p: *const u16) -> __m512 {
    // SAFETY: forwarded to the caller.
    let bits = unsafe { _mm256_maskz_loadu_epi16(m, p.cast()) };
    // bf16 is the upper half of an f32: zero-extend and shift into place.
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
}

/// Requires `w.len() == x.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let n = x.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let all = first_lanes(W);
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: as in `dot_f32`; both slices have length n.
    unsafe {
        while i + 4 * W <= n {
            acc0 = _mm512_fmadd_ps(load_bf16(all, pw.add(i)), _mm512_loadu_ps(px.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(load_bf16(all, pw.add(i + W)), _mm512_loadu_ps(px.add(i + W)), acc1);
            acc2 = _mm512_fmadd_ps(load_bf16(all, pw.add(i + 2 * W)), _mm512_loadu_ps(px.add(i + 2 * W)), acc2);
            acc3 = _mm512_fmadd_ps(load_bf16(all, pw.add(i + 3 * W)), _mm512_loadu_ps(px.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        while i + W <= n {
            acc0 = _mm512_fmadd_ps(load_bf16(all, pw.add(i)), _mm512_loadu_ps(px.add(i)), acc0);
            i += W;
        }
        if i < n {
            let m = first_lanes(n - i);
            acc1 = _mm512_fmadd_ps(load_bf16(m, pw.add(i)), _mm512_maskz_loadu_ps(m, px.add(i)), acc1);
        }
    }
    _mm512_reduce_add_ps(sum4(acc0, acc1, acc2, acc3))
}

/// Widens 16 int8 values at `q` (masked to the first lanes of `m`).
///
/// # Safety
/// The lanes selected by `m` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_q8(m: __mmask16, q: *const i8) -> __m512 {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { _mm_maskz_loadu_epi8(m, q) };
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))
}

/// Requires the invariants of [`crate::scalar::check_q8_row`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_q8(qs: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    let n = x.len();
    let mut total = _mm512_setzero_ps();
    for (g, &scale) in scales.iter().enumerate() {
        let start = g * group;
        let len = group.min(n - start);
        // SAFETY: start + len <= n == qs.len() == x.len().
        let sum = unsafe { q8_group_sum(qs.as_ptr().add(start), x.as_ptr().add(start), len) };
        // Scaling the vector partial sums (not a reduced scalar) keeps the
        // horizontal reduction out of the per-group loop.
        total = _mm512_fmadd_ps(sum, _mm512_set1_ps(scale), total);
    }
    _mm512_reduce_add_ps(total)
}

/// Lane-wise partial sums of `q[i] * x[i]` for `i < len`.
///
/// # Safety
/// `len` values must be readable at both `q` and `x`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q8_group_sum(q: *const i8, x: *const f32, len: usize) -> __m512 {
    let all = first_lanes(W);
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every access stays below `len`, which the caller guarantees.
    unsafe {
        while i + 4 * W <= len {
            acc0 = _mm512_fmadd_ps(load_q8(all, q.add(i)), _mm512_loadu_ps(x.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(load_q8(all, q.add(i + W)), _mm512_loadu_ps(x.add(i + W)), acc1);
            acc2 = _mm512_fmadd_ps(load_q8(all, q.add(i + 2 * W)), _mm512_loadu_ps(x.add(i + 2 * W)), acc2);
            acc3 = _mm512_fmadd_ps(load_q8(all, q.add(i + 3 * W)), _mm512_loadu_ps(x.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        while i + W <= len {
            acc0 = _mm512_fmadd_ps(load_q8(all, q.add(i)), _mm512_loadu_ps(x.add(i)), acc0);
            i += W;
        }
        if i < len {
            let m = first_lanes(len - i);
            acc1 = _mm512_fmadd_ps(load_q8(m, q.add(i)), _mm512_maskz_loadu_ps(m, x.add(i)), acc1);
        }
    }
    sum4(acc0, acc1, acc2, acc3)
}

/// Unpacks 16 q4 bytes (32 columns) into two vectors: columns 0..16 and
/// 16..32, already offset back to signed values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn decode_q4x32(bytes: __m128i) -> (__m512, __m512) {
    let low_nibble = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(bytes, low_nibble);
    // A 16-bit shift is fine: the mask drops the bits crossing byte borders.
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), low_nibble);
    // Low nibble = even column, so interleaving lo/hi restores column order.
    let offset = _mm_set1_epi8(Q4_OFFSET as i8);
    let first = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), offset);
    let second = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), offset);
    (_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)))
}

/// Requires the invariants of [`crate::scalar::check_q4_row`] and an even
/// `group` (so every group starts on a byte).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_q4(qs: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(group % 2, 0);
    let n = x.len();
    let mut total = _mm512_setzero_ps();
    for (g, &scale) in scales.iter().enumerate() {
        let start = g * group;
        let len = group.min(n - start);
        // SAFETY: start is even, and the group's ceil(len / 2) bytes end at
        // or before ceil(n / 2) == qs.len(); start + len <= n == x.len().
        let sum = unsafe { q4_group_sum(qs.as_ptr().add(start / 2), x.as_ptr().add(start), len) };
        total = _mm512_fmadd_ps(sum, _mm512_set1_ps(scale), total);
    }
    _mm512_reduce_add_ps(total)
}

/// Lane-wise partial sums of `q4[i] * x[i]` for `i < len`, `q` pointing at
/// the byte of column 0.
///
/// # Safety
/// `ceil(len / 2)` bytes at `q` and `len` values at `x` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q4_group_sum(q: *const u8, x: *const f32, len: usize) -> __m512 {
    let [mut acc0, mut acc1, mut acc2, mut acc3] = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: full steps read bytes i/2..i/2+16 and values i..i+32 with
    // i + 32 <= len; the tail masks both to what the caller guarantees.
    unsafe {
        while i + 4 * W <= len {
            let (a, b) = decode_q4x32(_mm_loadu_si128(q.add(i / 2).cast()));
            let (c, d) = decode_q4x32(_mm_loadu_si128(q.add(i / 2 + W).cast()));
            acc0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(x.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(b, _mm512_loadu_ps(x.add(i + W)), acc1);
            acc2 = _mm512_fmadd_ps(c, _mm512_loadu_ps(x.add(i + 2 * W)), acc2);
            acc3 = _mm512_fmadd_ps(d, _mm512_loadu_ps(x.add(i + 3 * W)), acc3);
            i += 4 * W;
        }
        if i + 2 * W <= len {
            let (a, b) = decode_q4x32(_mm_loadu_si128(q.add(i / 2).cast()));
            acc0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(x.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(b, _mm512_loadu_ps(x.add(i + W)), acc1);
            i += 2 * W;
        }
        if i < len {
            let rem = len - i;
            let bytes = _mm_maskz_loadu_epi8(first_lanes(rem.div_ceil(2)), q.add(i / 2).cast());
            let (a, b) = decode_q4x32(bytes);
            // Columns past `rem` decode to junk but meet x = 0 from the
            // masked loads, contributing exactly zero.
            let m_first = first_lanes(rem.min(W));
            let m_second = first_lanes(rem.saturating_sub(W));
            acc2 = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m_first, x.add(i)), acc2);
            acc3 = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m_second, x.add(i + W)), acc3);
        }
    }
    sum4(acc0, acc1, acc2, acc3)
}

/// Requires `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_mut_ptr());
    let alpha_v = _mm512_set1_ps(alpha);
    let mut i = 0;
    // SAFETY: accesses stay below n, the length of both slices; `x` and `y`
    // cannot alias (shared vs exclusive borrow).
    unsafe {
        while i + W <= n {
            let v = _mm512_fmadd_ps(alpha_v, _mm512_loadu_ps(px.add(i)), _mm512_loadu_ps(py.add(i)));
            _mm512_storeu_ps(py.add(i), v);
            i += W;
        }
        if i < n {
            let m = first_lanes(n - i);
            let v = _mm512_fmadd_ps(alpha_v, _mm512_maskz_loadu_ps(m, px.add(i)), _mm512_maskz_loadu_ps(m, py.add(i)));
            _mm512_mask_storeu_ps(py.add(i), m, v);
        }
    }
}

/// No length invariant.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn scale(alpha: f32, x: &mut [f32]) {
    let n = x.len();
    let px = x.as_mut_ptr();
    let alpha_v = _mm512_set1_ps(alpha);
    let mut i = 0;
    // SAFETY: accesses stay below n == x.len().
    unsafe {
        while i + W <= n {
            _mm512_storeu_ps(px.add(i), _mm512_mul_ps(alpha_v, _mm512_loadu_ps(px.add(i))));
            i += W;
        }
        if i < n {
            let m = first_lanes(n - i);
            let v = _mm512_mul_ps(alpha_v, _mm512_maskz_loadu_ps(m, px.add(i)));
            _mm512_mask_storeu_ps(px.add(i), m, v);
        }
    }
}
