//! Run-time selection of the fastest instruction set, and the dispatching
//! entry points of every vectorized kernel.
//!
//! [`Isa`] is detected once per call site (or once per [`crate::Threads`])
//! and then passed by value: a tiny `Copy` token instead of global state, so
//! tests can force the scalar path next to the vector ones in one process.
//!
//! The `#[target_feature]` bodies live in `avx512` and `avx2` (x86_64 only),
//! and the loops they share, written once over the lane width, in `lanes`
//! (f32, bf16, q8, q4 and MXFP4 row dots) and `int_lanes` (the integer products).
//! Every dispatching method asserts the length invariants those bodies rely
//! on before entering them, which is what makes the `unsafe` calls sound.
//! On other architectures everything runs the [`crate::scalar`] reference.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod int_lanes;
#[cfg(target_arch = "x86_64")]
mod lanes;

use crate::scalar;

/// Instruction-set tiers, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsaLevel {
    /// Portable code from [`crate::scalar`].
    Scalar,
    /// x86_64 AVX2 + FMA (256-bit).
    Avx2,
    /// x86_64 AVX-512 F + BW + VL (512-bit with masked loads for tails).
    Avx512,
    /// AVX-512 plus VNNI: the integer products of q8/q4 weights accumulate
    /// with `vpdpwssd` instead of `vpmaddwd` + `vpaddd` (same results).
    Avx512Vnni,
}

impl IsaLevel {
    /// All tiers, worst first.
    pub const ALL: [IsaLevel; 4] = [Self::Scalar, Self::Avx2, Self::Avx512, Self::Avx512Vnni];

    /// Whether this CPU can run the tier.
    pub fn is_supported(self) -> bool {
        match self {
            Self::Scalar => true,
            Self::Avx2 => avx2_supported(),
            Self::Avx512 => avx512_supported(),
            Self::Avx512Vnni => avx512_supported() && vnni_supported(),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
fn avx512_supported() -> bool {
    // The masked byte/word loads of the tails need BW and VL on top of F.
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

#[cfg(target_arch = "x86_64")]
fn vnni_supported() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni_supported() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_supported() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_supported() -> bool {
    false
}

/// A proof that the CPU supports [`IsaLevel`] `level`, and the dispatcher of
/// the kernels for it. It can only be built for supported tiers, so the
/// methods are safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Isa {
    level: IsaLevel,
}

impl Default for Isa {
    fn default() -> Self {
        Self::detect()
    }
}

impl Isa {
    /// The best tier this CPU supports.
    pub fn detect() -> Self {
        let level = IsaLevel::ALL.into_iter().rev().find(|level| level.is_supported()).unwrap_or(IsaLevel::Scalar);
        Self { level }
    }

    /// The portable reference path, always available.
    pub fn scalar() -> Self {
        Self { level: IsaLevel::Scalar }
    }

    /// `level` if this CPU supports it.
    pub fn with_level(level: IsaLevel) -> Option<Self> {
        level.is_supported().then_some(Self { level })
    }

    /// Every tier this CPU supports, worst first (for tests and benchmarks).
    pub fn all_supported() -> Vec<Self> {
        IsaLevel::ALL.into_iter().filter_map(Self::with_level).collect()
    }

    /// The selected tier.
    pub fn level(self) -> IsaLevel {
        self.level
    }

    /// `sum a[i] * b[i]`.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn dot_f32(self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot: operand lengths differ");
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: `Isa` is only built for supported tiers; lengths are
            // asserted equal above.
            IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::dot_f32(a, b) },
            IsaLevel::Avx2 => return unsafe { avx2::dot_f32(a, b) },
            IsaLevel::Scalar => {}
        }
        scalar::dot_f32(a, b)
    }

    /// Dot product of a bf16 row (raw `u16` bits) with `x`.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn dot_bf16(self, w: &[u16], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len(), "dot_bf16: operand lengths differ");
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: supported tier; lengths asserted equal above.
            IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::dot_bf16(w, x) },
            IsaLevel::Avx2 => return unsafe { avx2::dot_bf16(w, x) },
            IsaLevel::Scalar => {}
        }
        scalar::dot_bf16(w, x)
    }

    /// Dot product of one q8 row (`x.len()` columns) with `x`.
    ///
    /// # Panics
    /// If `qs.len() != x.len()`, `group == 0` or
    /// `scales.len() != ceil(x.len() / group)`.
    pub fn dot_q8(self, qs: &[i8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
        scalar::check_q8_row(qs, scales, group, x);
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: supported tier; row invariants asserted above.
            IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::dot_q8(qs, scales, group, x) },
            IsaLevel::Avx2 => return unsafe { avx2::dot_q8(qs, scales, group, x) },
            IsaLevel::Scalar => {}
        }
        scalar::dot_q8(qs, scales, group, x)
    }

    /// Dot product of one packed q4 row (`ceil(x.len() / 2)` bytes) with `x`.
    ///
    /// Odd group sizes put group starts mid-byte; those (unusual) layouts
    /// take the scalar path.
    ///
    /// # Panics
    /// If `qs.len() != ceil(x.len() / 2)`, `group == 0` or
    /// `scales.len() != ceil(x.len() / group)`.
    pub fn dot_q4(self, qs: &[u8], scales: &[f32], group: usize, x: &[f32]) -> f32 {
        scalar::check_q4_row(qs, scales, group, x);
        #[cfg(target_arch = "x86_64")]
        if group.is_multiple_of(2) {
            match self.level {
                // SAFETY: supported tier; row invariants asserted above and
                // the group is even, as the vector bodies require.
                IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::dot_q4(qs, scales, group, x) },
                IsaLevel::Avx2 => return unsafe { avx2::dot_q4(qs, scales, group, x) },
                IsaLevel::Scalar => {}
            }
        }
        scalar::dot_q4(qs, scales, group, x)
    }

    /// Dot product of one MXFP4 row (whole blocks of 32 columns: 16 code
    /// bytes and one E8M0 scale each, see [`crate::mxfp4`]) with `x`.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 32, `codes.len() != x.len() / 2` or
    /// `scales.len() != x.len() / 32`.
    pub fn dot_mxfp4(self, codes: &[u8], scales: &[u8], x: &[f32]) -> f32 {
        crate::mxfp4::check_row(codes, scales, x);
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: supported tier; row invariants asserted above.
            IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::dot_mxfp4(codes, scales, x) },
            IsaLevel::Avx2 => return unsafe { avx2::dot_mxfp4(codes, scales, x) },
            IsaLevel::Scalar => {}
        }
        scalar::dot_mxfp4(codes, scales, x)
    }

    /// `y[i] += alpha * x[i]` (fused multiply-add on the vector paths).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn axpy(self, alpha: f32, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), y.len(), "axpy: operand lengths differ");
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: supported tier; lengths asserted equal above.
            IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::axpy(alpha, x, y) },
            IsaLevel::Avx2 => return unsafe { avx2::axpy(alpha, x, y) },
            IsaLevel::Scalar => {}
        }
        scalar::axpy(alpha, x, y);
    }

    /// `out[t] = q . rows[t * stride..][..q.len()]` for every `t`: one
    /// attention score per key row of a strided cache.
    ///
    /// # Panics
    /// If `rows` is too short for `out.len()` rows `stride` apart.
    pub fn dot_rows_f32(self, q: &[f32], rows: &[f32], stride: usize, out: &mut [f32]) {
        check_rows_len("dot_rows_f32", out.len(), rows.len(), stride, q.len());
        #[cfg(target_arch = "x86_64")]
        if matches!(self.level, IsaLevel::Avx512 | IsaLevel::Avx512Vnni) {
            // SAFETY: supported tier; the rows' extent is checked above.
            return unsafe { avx512::dot_rows_f32(q, rows, stride, out) };
        }
        for (t, o) in out.iter_mut().enumerate() {
            *o = self.dot_f32(q, &rows[t * stride..t * stride + q.len()]);
        }
    }

    /// `y += sum_t w[t] * rows[t * stride..][..y.len()]`: the weighted sum
    /// of an attention head's value rows.
    ///
    /// # Panics
    /// If `rows` is too short for `w.len()` rows `stride` apart.
    pub fn axpy_rows(self, w: &[f32], rows: &[f32], stride: usize, y: &mut [f32]) {
        check_rows_len("axpy_rows", w.len(), rows.len(), stride, y.len());
        #[cfg(target_arch = "x86_64")]
        if matches!(self.level, IsaLevel::Avx512 | IsaLevel::Avx512Vnni) {
            // SAFETY: supported tier; the rows' extent is checked above.
            return unsafe { avx512::axpy_rows(w, rows, stride, y) };
        }
        for (t, &wt) in w.iter().enumerate() {
            self.axpy(wt, &rows[t * stride..t * stride + y.len()], y);
        }
    }

    /// For each row `t` of `rows` (`w.len()` rows of `y.len()` values,
    /// `stride` apart): `row_t = alpha_t * row_t` (`alpha_t` from `scale`),
    /// plus `c[t] * u` with `rank1 = Some((c, u))`, then
    /// `y += w[t] * row_t`. One pass that rewrites a matrix and reduces it
    /// by rows on the way: the delta rule state's decay (one factor per head
    /// in Gated DeltaNet, one per key channel in Kimi Delta Attention) with
    /// its `k^T S` read, and its rank-1 update with its `q^T S` read. Tiers
    /// without their own body run [`Isa::scale`] and [`Isa::axpy`] row by
    /// row (the scalar tier in the order of
    /// [`crate::scalar::gdn::delta_rule_step`]).
    ///
    /// # Panics
    /// If `rows` is too short for `w.len()` rows `stride` apart, with
    /// `RowScale::PerRow(a)` if `a.len() != w.len()`, or with
    /// `rank1 = Some((c, u))` if `c.len() != w.len()` or
    /// `u.len() != y.len()`.
    pub fn update_rows(
        self,
        scale: RowScale<'_>,
        rank1: Option<(&[f32], &[f32])>,
        rows: &mut [f32],
        stride: usize,
        w: &[f32],
        y: &mut [f32],
    ) {
        check_rows_len("update_rows", w.len(), rows.len(), stride, y.len());
        if let RowScale::PerRow(a) = scale {
            assert_eq!(a.len(), w.len(), "update_rows: one scale factor per row");
        }
        if let Some((c, u)) = rank1 {
            assert_eq!(c.len(), w.len(), "update_rows: one rank-1 coefficient per row");
            assert_eq!(u.len(), y.len(), "update_rows: rank-1 vector and y lengths differ");
        }
        #[cfg(target_arch = "x86_64")]
        if matches!(self.level, IsaLevel::Avx512 | IsaLevel::Avx512Vnni) {
            // SAFETY: supported tier; the rows' extent and the rank-1
            // lengths are checked above.
            return unsafe { avx512::update_rows(scale, rank1, rows, stride, w, y) };
        }
        // Rewrite the rows, then sum them: with whole-row calls this beats
        // both calls row by row (measured on AVX2).
        let len = y.len();
        match scale {
            // A multiply by one is exact: the rank-1 pass skips it.
            RowScale::Uniform(1.0) => {}
            RowScale::Uniform(alpha) if stride == len => self.scale(alpha, &mut rows[..w.len() * len]),
            _ => {
                for t in 0..w.len() {
                    self.scale(scale.row(t), &mut rows[t * stride..t * stride + len]);
                }
            }
        }
        if let Some((c, u)) = rank1 {
            for (t, &ct) in c.iter().enumerate() {
                self.axpy(ct, u, &mut rows[t * stride..t * stride + len]);
            }
        }
        self.axpy_rows(w, rows, stride, y);
    }

    /// `x[i] *= alpha`.
    pub fn scale(self, alpha: f32, x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        match self.level {
            // SAFETY: supported tier; a single slice has no length invariant.
            IsaLevel::Avx512 | IsaLevel::Avx512Vnni => return unsafe { avx512::scale(alpha, x) },
            IsaLevel::Avx2 => return unsafe { avx2::scale(alpha, x) },
            IsaLevel::Scalar => {}
        }
        scalar::scale(alpha, x);
    }
}

/// The factor on each row of [`Isa::update_rows`].
#[derive(Debug, Clone, Copy)]
pub enum RowScale<'a> {
    /// One factor for every row (Gated DeltaNet's per-head decay, or 1).
    Uniform(f32),
    /// One factor per row (Kimi Delta Attention's per-channel decay).
    PerRow(&'a [f32]),
}

impl RowScale<'_> {
    /// The factor on row `t`.
    #[inline(always)]
    pub(crate) fn row(self, t: usize) -> f32 {
        match self {
            RowScale::Uniform(alpha) => alpha,
            RowScale::PerRow(a) => a[t],
        }
    }
}

/// Asserts that `count` rows of `len` values, `stride` apart, fit in
/// `rows_len` values.
fn check_rows_len(what: &str, count: usize, rows_len: usize, stride: usize, len: usize) {
    if count > 0 {
        let needed = (count - 1).checked_mul(stride).and_then(|n| n.checked_add(len));
        assert!(
            needed.is_some_and(|n| n <= rows_len),
            "{what}: {count} rows of {len} with stride {stride} exceed {rows_len} values"
        );
    }
}
