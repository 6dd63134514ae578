//! The lane width as a type: the loops the AVX2 and AVX-512 bodies share,
//! written once over [`Lanes`] (8 or 16 `f32` lanes a vector).
//!
//! Everything here is `#[inline(always)]` and has no `#[target_feature]` of
//! its own: it is inlined into an ISA's `#[target_feature]` entry point,
//! whose features its intrinsics then compile with, so the code generated
//! is the code the entry point would hold written out. What differs between
//! the ISAs stays in their files: the tails (scalar on AVX2, masked on
//! AVX-512), the horizontal sums and the decoders of packed weights. The
//! integer products are written once too, over [`super::int_lanes`]'s
//! `IntLanes`, which extends this trait. AVX-512 calls AVX2's 8-lane sum
//! and 128-bit q4 unpacking directly: its features include AVX2's.
//!
//! Every loop keeps the order of operations per lane that the bodies had
//! when written out, so results are the same bit for bit.
//!
//! # Safety (all functions)
//! Only to be run inside a function that enables `L`'s target features,
//! with the pointer requirements listed per function.

/// A vector of `N` `f32` lanes and the operations the shared loops need.
pub(crate) trait Lanes {
    /// The vector type.
    type F: Copy;
    /// `f32` lanes per vector.
    const N: usize;

    unsafe fn zero() -> Self::F;
    /// Reads `N` values at `p`, aligned or not.
    unsafe fn load(p: *const f32) -> Self::F;
    /// Writes `N` values at `p`, aligned or not.
    unsafe fn store(p: *mut f32, v: Self::F);
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c`, rounded once.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
}

/// Implements [`Lanes`] for `$isa`, whose vectors `$vector` hold `$n`
/// lanes, with the intrinsics named; each is inlined into the entry point
/// that enables its features.
macro_rules! impl_lanes {
    ($isa:ident, $vector:ty, $n:literal, {
        zero: $zero:ident,
        load: $load:ident,
        store: $store:ident,
        add: $add:ident,
        mul: $mul:ident,
        fmadd: $fmadd:ident,
    }) => {
        impl $crate::simd::lanes::Lanes for $isa {
            type F = $vector;
            const N: usize = $n;

            #[inline(always)]
            unsafe fn zero() -> $vector {
                // SAFETY: the caller enables the ISA's features (see `lanes`).
                unsafe { $zero() }
            }

            #[inline(always)]
            unsafe fn load(p: *const f32) -> $vector {
                // SAFETY: as in `zero`; the caller guarantees `N` readable values.
                unsafe { $load(p) }
            }

            #[inline(always)]
            unsafe fn store(p: *mut f32, v: $vector) {
                // SAFETY: as in `zero`; the caller guarantees `N` writable values.
                unsafe { $store(p, v) }
            }

            #[inline(always)]
            unsafe fn add(a: $vector, b: $vector) -> $vector {
                // SAFETY: as in `zero`.
                unsafe { $add(a, b) }
            }

            #[inline(always)]
            unsafe fn mul(a: $vector, b: $vector) -> $vector {
                // SAFETY: as in `zero`.
                unsafe { $mul(a, b) }
            }

            #[inline(always)]
            unsafe fn fmadd(a: $vector, b: $vector, c: $vector) -> $vector {
                // SAFETY: as in `zero`.
                unsafe { $fmadd(a, b, c) }
            }
        }
    };
}
pub(super) use impl_lanes;

/// `(a + b) + (c + d)`: the four chains of [`dot_chains`] summed.
#[inline(always)]
pub(super) unsafe fn sum4<L: Lanes>([a, b, c, d]: [L::F; 4]) -> L::F {
    // SAFETY: register-only operations of the caller's features.
    unsafe { L::add(L::add(a, b), L::add(c, d)) }
}

/// `acc[k] + w[k] * x[k N..(k + 1) N]` for each of four chains.
///
/// # Safety
/// `4 N` values must be readable at `x`.
#[inline(always)]
pub(super) unsafe fn fma4<L: Lanes>(acc: [L::F; 4], w: [L::F; 4], x: *const f32) -> [L::F; 4] {
    let n = L::N;
    // SAFETY: the loads stay inside the `4 N` values the caller guarantees.
    unsafe {
        [
            L::fmadd(w[0], L::load(x), acc[0]),
            L::fmadd(w[1], L::load(x.add(n)), acc[1]),
            L::fmadd(w[2], L::load(x.add(2 * n)), acc[2]),
            L::fmadd(w[3], L::load(x.add(3 * n)), acc[3]),
        ]
    }
}

/// Lane-wise partial sums of `w(i) * x[i]` over the whole vectors below
/// `len`, in four FMA chains (together they hide the FMA latency), and the
/// first column they leave over. `w(i)` gives the `N` weights from column
/// `i` as `f32` lanes.
///
/// # Safety
/// `w(i)` must be sound for every `i` with `i + N <= len`, and `len` values
/// must be readable at `x`.
#[inline(always)]
pub(super) unsafe fn dot_chains<L: Lanes>(len: usize, w: impl Fn(usize) -> L::F, x: *const f32) -> ([L::F; 4], usize) {
    let n = L::N;
    let mut i = 0;
    // SAFETY: every step reads columns i..i + 4N (or i..i + N) with that end
    // at most `len`, as the caller allows.
    unsafe {
        let mut acc = [L::zero(); 4];
        while i + 4 * n <= len {
            acc = fma4::<L>(acc, [w(i), w(i + n), w(i + 2 * n), w(i + 3 * n)], x.add(i));
            i += 4 * n;
        }
        while i + n <= len {
            acc[0] = L::fmadd(w(i), L::load(x.add(i)), acc[0]);
            i += n;
        }
        (acc, i)
    }
}

/// `y[i] = alpha * x[i] + y[i]` over the whole vectors below `len`;
/// returns the first column left over.
///
/// # Safety
/// `len` values must be readable at `x` and writable at `y`, and the two
/// must not overlap.
#[inline(always)]
pub(super) unsafe fn axpy_vectors<L: Lanes>(alpha: L::F, x: *const f32, y: *mut f32, len: usize) -> usize {
    let mut i = 0;
    // SAFETY: accesses stay below `len`, as the caller allows.
    unsafe {
        while i + L::N <= len {
            let v = L::fmadd(alpha, L::load(x.add(i)), L::load(y.add(i)));
            L::store(y.add(i), v);
            i += L::N;
        }
    }
    i
}

/// `x[i] *= alpha` over the whole vectors below `len`; returns the first
/// column left over.
///
/// # Safety
/// `len` values must be readable and writable at `x`.
#[inline(always)]
pub(super) unsafe fn scale_vectors<L: Lanes>(alpha: L::F, x: *mut f32, len: usize) -> usize {
    let mut i = 0;
    // SAFETY: accesses stay below `len`, as the caller allows.
    unsafe {
        while i + L::N <= len {
            L::store(x.add(i), L::mul(alpha, L::load(x.add(i))));
            i += L::N;
        }
    }
    i
}
