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
use crate::simd::{Isa, IsaLevel};

pub(crate) mod weights;

pub(crate) use weights::IntWeights;

#[cfg(not(target_arch = "x86_64"))]
pub(crate) use crate::act::ActElem as IntElem;
/// The activation codes the integer kernels take: on x86_64 those the
/// vector bodies have a step for.
#[cfg(target_arch = "x86_64")]
pub(crate) use crate::simd::int_lanes::ChunkStep as IntElem;

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
