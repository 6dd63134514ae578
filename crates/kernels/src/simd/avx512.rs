//! AVX-512 (F + BW + VL) kernel bodies: 16 `f32` lanes, masked loads for
//! every tail so no scalar clean-up loop is needed.
//!
//! # Safety (all functions)
//! The caller must ensure the CPU supports `avx512f`, `avx512bw` and
//! `avx512vl`, and the length invariants listed per function; the
//! dispatching methods of [`crate::simd::Isa`] do both.

use std::arch::x86_64::*;

use super::RowScale;
use super::lanes::{Lanes, axpy_vectors, dot_chains, fma4, impl_lanes, scale_vectors, sum4};
use crate::mxfp4::{self, BLOCK_VALUES};

/// `f32` lanes per vector.
const W: usize = Avx512::N;

/// 16 `f32` lanes in a `__m512`.
struct Avx512;

impl_lanes!(Avx512, __m512, 16, {
    zero: _mm512_setzero_ps,
    load: _mm512_loadu_ps,
    store: _mm512_storeu_ps,
    add: _mm512_add_ps,
    mul: _mm512_mul_ps,
    fmadd: _mm512_fmadd_ps,
});

/// Mask of the first `n <= 16` lanes.
#[inline]
fn first_lanes(n: usize) -> __mmask16 {
    debug_assert!(n <= W);
    ((1u32 << n) - 1) as __mmask16
}

/// Requires `a.len() == b.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let pa = a.as_ptr();
    // SAFETY: both slices have length n.
    unsafe { _mm512_reduce_add_ps(masked_dot(n, |m, i| _mm512_maskz_loadu_ps(m, pa.add(i)), b.as_ptr())) }
}

/// Lane-wise partial sums of `w(m, i) * x[i]` for `i < len`, where
/// `w(m, i)` gives the lanes of `m` of the 16 weights from column `i` as
/// `f32` (zero elsewhere): whole vectors in [`dot_chains`], then one masked
/// step for the tail.
///
/// # Safety
/// `w(m, i)` must be sound for the lanes of `m` below `len`, and `len`
/// values must be readable at `x`.
#[inline(always)]
unsafe fn masked_dot(len: usize, w: impl Fn(__mmask16, usize) -> __m512, x: *const f32) -> __m512 {
    let all = first_lanes(W);
    // SAFETY: the chains read whole vectors below `len`; the tail only the
    // lanes below `len`.
    unsafe {
        let (mut acc, i) = dot_chains::<Avx512>(len, |i| w(all, i), x);
        if i < len {
            let m = first_lanes(len - i);
            acc[1] = _mm512_fmadd_ps(w(m, i), _mm512_maskz_loadu_ps(m, x.add(i)), acc[1]);
        }
        sum4::<Avx512>(acc)
    }
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
    let pw = w.as_ptr();
    // SAFETY: both slices have length n.
    unsafe { _mm512_reduce_add_ps(masked_dot(n, |m, i| load_bf16(m, pw.add(i)), x.as_ptr())) }
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
    // SAFETY: every group's start + len <= n == qs.len() == x.len().
    unsafe {
        grouped_dot(scales.iter().copied(), group, x.len(), |start, len| {
            q8_group_sum(qs.as_ptr().add(start), x.as_ptr().add(start), len)
        })
    }
}

/// `sum_g scales[g] * (q . x over group g)` for a quantized row of `cols`
/// columns, `group_sum(start, len)` giving a group's lane-wise partial
/// sums. Scaling the vector partial sums (not a reduced scalar) keeps the
/// horizontal reduction out of the per-group loop.
///
/// # Safety
/// The caller enables the features, and `group_sum` must be sound for every
/// group of the row.
#[inline(always)]
unsafe fn grouped_dot(
    scales: impl IntoIterator<Item = f32>,
    group: usize,
    cols: usize,
    group_sum: impl Fn(usize, usize) -> __m512,
) -> f32 {
    // SAFETY: register-only operations of the caller's features, and
    // `group_sum` as the caller allows.
    unsafe {
        let mut total = _mm512_setzero_ps();
        for (g, scale) in scales.into_iter().enumerate() {
            let start = g * group;
            let len = group.min(cols - start);
            total = _mm512_fmadd_ps(group_sum(start, len), _mm512_set1_ps(scale), total);
        }
        _mm512_reduce_add_ps(total)
    }
}

/// Lane-wise partial sums of `q[i] * x[i]` for `i < len`.
///
/// # Safety
/// `len` values must be readable at both `q` and `x`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q8_group_sum(q: *const i8, x: *const f32, len: usize) -> __m512 {
    // SAFETY: every access stays below `len`, which the caller guarantees.
    unsafe { masked_dot(len, |m, i| load_q8(m, q.add(i)), x) }
}

/// Unpacks 16 q4 bytes (32 columns) into two vectors: columns 0..16 and
/// 16..32, already offset back to signed values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn decode_q4x32(bytes: __m128i) -> (__m512, __m512) {
    let (first, second) = super::avx2::unpack_q4x32(bytes);
    (_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second)))
}

/// Requires the invariants of [`crate::scalar::check_q4_row`] and an even
/// `group` (so every group starts on a byte).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_q4(qs: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(group % 2, 0);
    // SAFETY: every group's start is even, and its ceil(len / 2) bytes end
    // at or before ceil(n / 2) == qs.len(); start + len <= n == x.len().
    unsafe {
        grouped_dot(scales.iter().copied(), group, x.len(), |start, len| {
            q4_group_sum(qs.as_ptr().add(start / 2), x.as_ptr().add(start), len)
        })
    }
}

/// Lane-wise partial sums of `q4[i] * x[i]` for `i < len`, `q` pointing at
/// the byte of column 0.
///
/// # Safety
/// `ceil(len / 2)` bytes at `q` and `len` values at `x` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn q4_group_sum(q: *const u8, x: *const f32, len: usize) -> __m512 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: full steps read bytes i/2..i/2+16 and values i..i+32 with
    // i + 32 <= len; the tail masks both to what the caller guarantees.
    unsafe {
        while i + 4 * W <= len {
            let (a, b) = decode_q4x32(_mm_loadu_si128(q.add(i / 2).cast()));
            let (c, d) = decode_q4x32(_mm_loadu_si128(q.add(i / 2 + W).cast()));
            acc = fma4::<Avx512>(acc, [a, b, c, d], x.add(i));
            i += 4 * W;
        }
        if i + 2 * W <= len {
            let (a, b) = decode_q4x32(_mm_loadu_si128(q.add(i / 2).cast()));
            acc[0] = _mm512_fmadd_ps(a, _mm512_loadu_ps(x.add(i)), acc[0]);
            acc[1] = _mm512_fmadd_ps(b, _mm512_loadu_ps(x.add(i + W)), acc[1]);
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
            acc[2] = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m_first, x.add(i)), acc[2]);
            acc[3] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m_second, x.add(i + W)), acc[3]);
        }
        sum4::<Avx512>(acc)
    }
}

/// Requires the invariants of [`crate::mxfp4::check_row`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_mxfp4(codes: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    // The blocks' values are doubled: halving the power-of-two scale is exact.
    let halved_scales = scales.iter().map(|&scale| mxfp4::e8m0_to_f32(scale) * 0.5);
    // SAFETY: the row is whole blocks of 16 code bytes and 32 values.
    unsafe {
        grouped_dot(halved_scales, BLOCK_VALUES, x.len(), |start, _| {
            mxfp4_block_sum(codes.as_ptr().add(start / 2), x.as_ptr().add(start))
        })
    }
}

/// Lane-wise partial sums of one block's doubled values times `x`.
///
/// # Safety
/// 16 bytes at `q` and 32 values at `x` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn mxfp4_block_sum(q: *const u8, x: *const f32) -> __m512 {
    // SAFETY: forwarded to the caller.
    unsafe {
        let (first, second) = super::avx2::decode_e2m1x32(_mm_loadu_si128(q.cast()));
        let a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(first));
        let b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(second));
        _mm512_fmadd_ps(b, _mm512_loadu_ps(x.add(W)), _mm512_mul_ps(a, _mm512_loadu_ps(x)))
    }
}

/// Requires `x.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_mut_ptr());
    let alpha_v = _mm512_set1_ps(alpha);
    // SAFETY: accesses stay below n, the length of both slices; `x` and `y`
    // cannot alias (shared vs exclusive borrow).
    unsafe {
        let i = axpy_vectors::<Avx512>(alpha_v, px, py, n);
        if i < n {
            let m = first_lanes(n - i);
            let v = _mm512_fmadd_ps(alpha_v, _mm512_maskz_loadu_ps(m, px.add(i)), _mm512_maskz_loadu_ps(m, py.add(i)));
            _mm512_mask_storeu_ps(py.add(i), m, v);
        }
    }
}

/// `out[t] = q . rows[t * stride..][..q.len()]`: attention scores, one
/// key per row. Four rows at a time, so four FMA chains run side by side.
///
/// Requires `out.is_empty() || rows.len() >= (out.len() - 1) * stride + q.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn dot_rows_f32(q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
    let (len, count) = (q.len(), out.len());
    debug_assert!(count == 0 || rows.len() >= (count - 1) * stride + len);
    let full = len / W;
    let tail = first_lanes(len % W);
    let (pq, pr) = (q.as_ptr(), rows.as_ptr());
    let mut t = 0;
    // SAFETY: row `t` spans `pr + t * stride .. + len`, inside `rows` by the
    // requirement; `dot_tile` loads only below `len` in each row.
    unsafe {
        while t + 4 <= count {
            let acc = dot_tile::<4>(pq, pr.add(t * stride), stride, full, tail);
            for (r, a) in acc.iter().enumerate() {
                out[t + r] = _mm512_reduce_add_ps(*a);
            }
            t += 4;
        }
        while t < count {
            out[t] = _mm512_reduce_add_ps(dot_tile::<1>(pq, pr.add(t * stride), stride, full, tail)[0]);
            t += 1;
        }
    }
}

/// Per-lane partial dots of `q` with `R` rows starting at `rows`: `full`
/// whole vectors, then the lanes of `tail`.
///
/// # Safety
/// AVX-512 F must be enabled by the caller; `q` and each of the `R` rows
/// (`stride` apart) must hold `full * 16` values plus the lanes of `tail`.
#[inline(always)]
unsafe fn dot_tile<const R: usize>(
    q: *const f32,
    rows: *const f32,
    stride: usize,
    full: usize,
    tail: __mmask16,
) -> [__m512; R] {
    // SAFETY: forwarded to the caller.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); R];
        for c in 0..full {
            let qv = _mm512_loadu_ps(q.add(c * W));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows.add(r * stride + c * W)), *a);
            }
        }
        if tail != 0 {
            let qv = _mm512_maskz_loadu_ps(tail, q.add(full * W));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, rows.add(r * stride + full * W)), *a);
            }
        }
        acc
    }
}

/// `y += sum_t w[t] * rows[t * stride..][..y.len()]`: an attention head's
/// weighted sum of values. Up to 64 columns of `y` stay in registers while
/// every row goes by, so `y` is loaded and stored once per 64 columns.
///
/// Requires `w.is_empty() || rows.len() >= (w.len() - 1) * stride + y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn axpy_rows(w: &[f32], rows: &[f32], stride: usize, y: &mut [f32]) {
    const BLOCKS: usize = 4;
    let len = y.len();
    debug_assert!(w.is_empty() || rows.len() >= (w.len() - 1) * stride + len);
    let (pr, py) = (rows.as_ptr(), y.as_mut_ptr());
    let mut c0 = 0;
    // SAFETY: every access is masked to columns below `len`, in row `t`
    // (inside `rows` by the requirement) or in `y`; `rows` and `y` cannot
    // alias (shared vs exclusive borrow).
    unsafe {
        while c0 < len {
            let masks: [__mmask16; BLOCKS] =
                std::array::from_fn(|k| first_lanes((len - c0).saturating_sub(k * W).min(W)));
            // Pointers past a masked-off block are never dereferenced, so they
            // are formed with `wrapping_add`.
            let mut acc: [__m512; BLOCKS] =
                std::array::from_fn(|k| _mm512_maskz_loadu_ps(masks[k], py.wrapping_add(c0 + k * W)));
            for (t, &wt) in w.iter().enumerate() {
                let a = _mm512_set1_ps(wt);
                let row = pr.wrapping_add(t * stride + c0);
                for k in 0..BLOCKS {
                    acc[k] = _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(masks[k], row.wrapping_add(k * W)), acc[k]);
                }
            }
            for k in 0..BLOCKS {
                _mm512_mask_storeu_ps(py.wrapping_add(c0 + k * W), masks[k], acc[k]);
            }
            c0 += BLOCKS * W;
        }
    }
}

/// `row_t = alpha_t * row_t (+ c[t] * u)`, then `y += w[t] * row_t`, for the
/// `w.len()` rows of `y.len()` values `stride` apart in `rows`: one pass
/// that rewrites a matrix and reduces it by rows, as [`axpy_rows`] keeps 64
/// columns of `y` (and of `u`) in registers while every row goes by.
///
/// Requires `w.is_empty() || rows.len() >= (w.len() - 1) * stride + y.len()`,
/// with `RowScale::PerRow(a)` `a.len() == w.len()`, and with `rank1 = Some((c, u))`, `c.len() == w.len()` and
/// `u.len() == y.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn update_rows(
    scale: RowScale<'_>,
    rank1: Option<(&[f32], &[f32])>,
    rows: &mut [f32],
    stride: usize,
    w: &[f32],
    y: &mut [f32],
) {
    debug_assert!(w.is_empty() || rows.len() >= (w.len() - 1) * stride + y.len());
    // SAFETY: forwarded to the caller; the body is inlined here, with the
    // features enabled.
    unsafe {
        match rank1 {
            Some((c, u)) => update_rows_body::<true>(scale, c, u, rows, stride, w, y),
            None => update_rows_body::<false>(scale, &[], &[], rows, stride, w, y),
        }
    }
}

/// [`update_rows`] with the rank-1 term (`c`, `u`) or without it (both
/// empty), chosen at compile time so the plain scaling stays a single
/// multiply.
///
/// # Safety
/// AVX-512 F must be enabled by the caller, and the requirements of
/// [`update_rows`] hold.
#[inline(always)]
unsafe fn update_rows_body<const RANK1: bool>(
    scale: RowScale<'_>,
    c: &[f32],
    u: &[f32],
    rows: &mut [f32],
    stride: usize,
    w: &[f32],
    y: &mut [f32],
) {
    const BLOCKS: usize = 4;
    let len = y.len();
    let (pr, py, pu) = (rows.as_mut_ptr(), y.as_mut_ptr(), u.as_ptr());
    let mut c0 = 0;
    // SAFETY: every access is masked to columns below `len`, in row `t`
    // (inside `rows` by the requirement), in `y` or in `u` (as long as `y`
    // when RANK1); `rows` and `y` are distinct exclusive borrows and `u` a
    // shared one, so none alias.
    unsafe {
        while c0 < len {
            let masks: [__mmask16; BLOCKS] =
                std::array::from_fn(|k| first_lanes((len - c0).saturating_sub(k * W).min(W)));
            // Pointers past a masked-off block are never dereferenced, so they
            // are formed with `wrapping_add`.
            let mut acc: [__m512; BLOCKS] =
                std::array::from_fn(|k| _mm512_maskz_loadu_ps(masks[k], py.wrapping_add(c0 + k * W)));
            let uv: [__m512; BLOCKS] = if RANK1 {
                std::array::from_fn(|k| _mm512_maskz_loadu_ps(masks[k], pu.wrapping_add(c0 + k * W)))
            } else {
                [_mm512_setzero_ps(); BLOCKS]
            };
            for (t, &wt) in w.iter().enumerate() {
                let wv = _mm512_set1_ps(wt);
                let cv = if RANK1 { _mm512_set1_ps(c[t]) } else { _mm512_setzero_ps() };
                let alpha_v = _mm512_set1_ps(scale.row(t));
                let row = pr.wrapping_add(t * stride + c0);
                for k in 0..BLOCKS {
                    let p = row.wrapping_add(k * W);
                    let mut r = _mm512_mul_ps(alpha_v, _mm512_maskz_loadu_ps(masks[k], p));
                    if RANK1 {
                        r = _mm512_fmadd_ps(cv, uv[k], r);
                    }
                    _mm512_mask_storeu_ps(p, masks[k], r);
                    acc[k] = _mm512_fmadd_ps(wv, r, acc[k]);
                }
            }
            for k in 0..BLOCKS {
                _mm512_mask_storeu_ps(py.wrapping_add(c0 + k * W), masks[k], acc[k]);
            }
            c0 += BLOCKS * W;
        }
    }
}

/// No length invariant.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn scale(alpha: f32, x: &mut [f32]) {
    let n = x.len();
    let px = x.as_mut_ptr();
    let alpha_v = _mm512_set1_ps(alpha);
    // SAFETY: accesses stay below n == x.len().
    unsafe {
        let i = scale_vectors::<Avx512>(alpha_v, px, n);
        if i < n {
            let m = first_lanes(n - i);
            let v = _mm512_mul_ps(alpha_v, _mm512_maskz_loadu_ps(m, px.add(i)));
            _mm512_mask_storeu_ps(px.add(i), m, v);
        }
    }
}

// ---------------------------------------------------------------------------
// Integer products of q8/q4 weights with int16 or int8 activations
// (`crate::int`), written once in `int_lanes`: a 512-bit block of the
// definition is one vector here.
// ---------------------------------------------------------------------------

use std::arch::asm;
use std::ops::Range;

use super::int_lanes::{self, ChunkStep, Madd, PairDot, impl_int_lanes};
use crate::act::{ActRow, LANES};
use crate::int::weights::IntWeights;

impl_int_lanes!(Avx512, __m512i, {
    splat: _mm512_set1_ps,
    load: _mm512_loadu_si512,
    splat16: _mm512_set1_epi16,
    and: _mm512_and_si512,
    srli16: _mm512_srli_epi16,
    srai16: _mm512_srai_epi16,
    slli16: _mm512_slli_epi16,
    srai32: _mm512_srai_epi32,
    add32: _mm512_add_epi32,
    madd16: _mm512_madd_epi16,
    to_f32: _mm512_cvtepi32_ps,
    abs8: _mm512_abs_epi8,
    maddubs: _mm512_maddubs_epi16,
}, {
    /// All 16 lanes of a block.
    type Acc = [__m512; 1];
    /// The mask of the groups a block's masked load reads, and the group
    /// each lane takes.
    type Pick = (__mmask16, __m512i);

    #[inline(always)]
    unsafe fn acc_zero() -> [__m512; 1] {
        // SAFETY: the caller enables AVX-512 (see `int_lanes`).
        unsafe { [_mm512_setzero_ps()] }
    }

    #[inline(always)]
    unsafe fn reduce([v]: [__m512; 1]) -> f32 {
        // SAFETY: the caller enables AVX-512, whose features include AVX2's.
        unsafe {
            let lo = _mm512_castps512_ps256(v);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            super::avx2::hsum(_mm256_add_ps(lo, hi))
        }
    }

    #[inline(always)]
    unsafe fn pick(groups: usize, idx: &[i32; LANES]) -> (__mmask16, __m512i) {
        // SAFETY: reads the 16 values of `idx`, with AVX-512 enabled by the
        // caller.
        (first_lanes(groups), unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) })
    }

    #[inline(always)]
    unsafe fn pick_scales((mask, idx): (__mmask16, __m512i), s: *const f32) -> __m512 {
        // SAFETY: the masked load reads only the groups the caller allows.
        unsafe { _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(mask, s)) }
    }

    /// AVX-512 has no `vpsignb`: a masked subtract from zero.
    #[inline(always)]
    unsafe fn sign8(a: __m512i, sign: __m512i) -> __m512i {
        // SAFETY: the caller enables AVX-512 BW.
        unsafe { _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(sign), _mm512_setzero_si512(), a) }
    }
});

/// `vpdpwssd` and `vpdpbusd`: one instruction for [`Madd`]'s two (three).
struct Vnni;

impl PairDot<Avx512> for Vnni {
    #[inline(always)]
    unsafe fn acc(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: only reached from `int_rows_vnni`, which enables avx512vnni.
        unsafe { dpwssd(acc, a, b) }
    }

    #[inline(always)]
    unsafe fn acc4(acc: __m512i, u: __m512i, s: __m512i) -> __m512i {
        // SAFETY: as in `acc`; `vpdpbusd` never saturates.
        unsafe { dpbusd(acc, u, s) }
    }
}

/// Defines `$name(acc, a, b)`: `$insn acc, a, b`, written as assembly:
/// LLVM's generic tuning rewrites the VNNI intrinsics into their
/// multiply-add and add, which costs a uop per call on the ports this
/// kernel is bound by.
macro_rules! vnni_asm {
    ($name:ident, $insn:literal) => {
        #[inline]
        #[target_feature(enable = "avx512f,avx512vnni")]
        fn $name(mut acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: a register-only instruction of an enabled feature; no
            // memory, stack or flags are touched.
            unsafe {
                asm!(
                    concat!($insn, " {acc}, {a}, {b}"),
                    acc = inout(zmm_reg) acc,
                    a = in(zmm_reg) a,
                    b = in(zmm_reg) b,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            acc
        }
    };
}

vnni_asm!(dpwssd, "vpdpwssd");
// Unsigned bytes of `a` times signed bytes of `b`, in fours.
vnni_asm!(dpbusd, "vpdpbusd");

/// Integer rows with `vpdpwssd` (int8: `vpdpbusd`), in tiles of 4 rows.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, and `crate::int::check_rows`
/// must hold for these arguments.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn int_rows_vnni<E: ChunkStep, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: forwarded to the caller; the body is inlined here.
    unsafe { int_lanes::int_rows::<Avx512, Vnni, E, 4, T>(w, rows, acts, out, out_stride) }
}

/// Integer rows with `vpmaddwd` + `vpaddd` (int8: `vpmaddubsw` first;
/// AVX-512 without VNNI), in tiles of 4 rows.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, and `crate::int::check_rows` must
/// hold for these arguments.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn int_rows_madd<E: ChunkStep, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: forwarded to the caller; the body is inlined here.
    unsafe { int_lanes::int_rows::<Avx512, Madd, E, 4, T>(w, rows, acts, out, out_stride) }
}
