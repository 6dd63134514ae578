//! The integer products of q8/q4 weights with int16 or int8 activations
//! ([`crate::int`]), written once over the lane width: AVX2 works on a
//! 512-bit block of the definition as two 256-bit chunks, AVX-512 as one.
//! What differs between the ISAs sits behind [`IntLanes`] (the vector
//! operations, the masked gather of a chunk's weight scales, the horizontal
//! sum) and [`PairDot`] (`vpdpwssd` or `vpmaddwd` + `vpaddd`; `vpdpbusd` or
//! `vpmaddubsw` + `vpmaddwd` + `vpaddd`). What differs between the
//! activation codes sits behind [`ChunkStep`].
//!
//! Chunk `h` of a block holds lanes `h N .. (h + 1) N` of the definition,
//! so every lane sees the same operations on every tier, and the results
//! agree bit for bit.
//!
//! Port budget: on Intel server cores 512-bit shifts and int->float
//! conversions issue on one port only and shuffles on another; AMD Zen 4
//! splits every 512-bit op in two 256-bit halves. Either way the decoders
//! below unpack codes with few shifts and no shuffles, which lets one core
//! outrun DRAM (in L2, about 25 GB/s of q4 and 36 GB/s of q8 on this
//! project's AMD EPYC VM, against about 20 GB/s of DRAM read).
//!
//! # Safety (all functions)
//! As in [`super::lanes`]: only to be run inside a function that enables
//! `L`'s target features, with `crate::int::check_rows` upheld.

use std::ops::{IndexMut, Range};

use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};

use super::lanes::Lanes;
use crate::act::{ActElem, ActRow, LANES, Layout};
use crate::int::weights::{BLOCK_BYTES, IntWeights, store_tile};

/// The integer side of a lane width: `N` `i32` lanes (`2 N` `i16` words) a
/// vector, and what the integer products need beyond [`Lanes`].
pub(crate) trait IntLanes: Lanes {
    /// The integer vector.
    type I: Copy;
    /// A block's lane accumulators: [`Self::CHUNKS`] float vectors.
    type Acc: Copy + IndexMut<usize, Output = Self::F>;
    /// How a chunk's lane scales are gathered from its groups' scales.
    type Pick: Copy;
    /// Vectors per 512-bit block of the definition.
    const CHUNKS: usize = LANES / Self::N;

    unsafe fn acc_zero() -> Self::Acc;
    /// The sum of a block's lanes in the tree of [`crate::int::reduce_lanes`].
    unsafe fn reduce(acc: Self::Acc) -> f32;
    /// Lane `k` of a chunk takes the `idx[k]`-th of the first `groups`
    /// scales from where [`IntLanes::pick_scales`] reads.
    unsafe fn pick(groups: usize, idx: &[i32; LANES]) -> Self::Pick;
    /// # Safety
    /// The `groups` scales of `pick` must be readable at `s`.
    unsafe fn pick_scales(pick: Self::Pick, s: *const f32) -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    /// Reads a vector at `p`, aligned or not.
    unsafe fn load_i<T>(p: *const T) -> Self::I;
    unsafe fn splat16(v: i16) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// Each 16-bit word shifted right by 8, zero-filled.
    unsafe fn shr16_8(a: Self::I) -> Self::I;
    /// Each 16-bit word shifted right by 4, zero-filled.
    unsafe fn shr16_4(a: Self::I) -> Self::I;
    /// Each 16-bit word shifted right by 8, sign-filled.
    unsafe fn sar16_8(a: Self::I) -> Self::I;
    /// Each 16-bit word shifted left by 8.
    unsafe fn shl16_8(a: Self::I) -> Self::I;
    /// Each 32-bit lane shifted right by 4, sign-filled.
    unsafe fn sar32_4(a: Self::I) -> Self::I;
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    /// `a0*b0 + a1*b1` per 32-bit lane of 16-bit pairs (`vpmaddwd`).
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    /// Each 32-bit lane converted to `f32`.
    unsafe fn to_f32(a: Self::I) -> Self::F;
    /// `|a|` per byte, as unsigned bytes (-128 gives 128).
    unsafe fn abs8(a: Self::I) -> Self::I;
    /// `a` per byte, negated where `sign` is negative.
    unsafe fn sign8(a: Self::I, sign: Self::I) -> Self::I;
    /// `u0*s0 + u1*s1` per 16-bit lane of unsigned `u` and signed `s` byte
    /// pairs, saturated (`vpmaddubsw`).
    unsafe fn maddubs(u: Self::I, s: Self::I) -> Self::I;
}

/// Implements the element-wise part of [`IntLanes`] for `$isa`, whose
/// integer vectors are `$int`, with the intrinsics named; `$own` are the
/// items that differ in more than a name.
macro_rules! impl_int_lanes {
    ($isa:ident, $int:ty, {
        splat: $splat:ident,
        load: $load:ident,
        splat16: $splat16:ident,
        and: $and:ident,
        srli16: $srli16:ident,
        srai16: $srai16:ident,
        slli16: $slli16:ident,
        srai32: $srai32:ident,
        add32: $add32:ident,
        madd16: $madd16:ident,
        to_f32: $to_f32:ident,
        abs8: $abs8:ident,
        maddubs: $maddubs:ident,
    }, { $($own:item)* }) => {
        impl $crate::simd::int_lanes::IntLanes for $isa {
            type I = $int;
            $($own)*

            #[inline(always)]
            unsafe fn splat(v: f32) -> Self::F {
                // SAFETY: the caller enables the ISA's features (see `int_lanes`).
                unsafe { $splat(v) }
            }

            #[inline(always)]
            unsafe fn load_i<T>(p: *const T) -> $int {
                // SAFETY: as in `splat`; the caller guarantees a readable vector.
                unsafe { $load(p.cast()) }
            }

            #[inline(always)]
            unsafe fn splat16(v: i16) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $splat16(v) }
            }

            #[inline(always)]
            unsafe fn and(a: $int, b: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $and(a, b) }
            }

            #[inline(always)]
            unsafe fn shr16_8(a: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $srli16::<8>(a) }
            }

            #[inline(always)]
            unsafe fn shr16_4(a: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $srli16::<4>(a) }
            }

            #[inline(always)]
            unsafe fn sar16_8(a: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $srai16::<8>(a) }
            }

            #[inline(always)]
            unsafe fn shl16_8(a: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $slli16::<8>(a) }
            }

            #[inline(always)]
            unsafe fn sar32_4(a: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $srai32::<4>(a) }
            }

            #[inline(always)]
            unsafe fn add32(a: $int, b: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $add32(a, b) }
            }

            #[inline(always)]
            unsafe fn madd16(a: $int, b: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $madd16(a, b) }
            }

            #[inline(always)]
            unsafe fn to_f32(a: $int) -> Self::F {
                // SAFETY: as in `splat`.
                unsafe { $to_f32(a) }
            }

            #[inline(always)]
            unsafe fn abs8(a: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $abs8(a) }
            }

            #[inline(always)]
            unsafe fn maddubs(u: $int, s: $int) -> $int {
                // SAFETY: as in `splat`.
                unsafe { $maddubs(u, s) }
            }
        }
    };
}
pub(super) use impl_int_lanes;

/// How products are accumulated into 32-bit lanes: pairs of int16, or
/// fours of unsigned × signed bytes. Every way gives the same exact int32
/// sums.
pub(crate) trait PairDot<L: IntLanes> {
    /// `acc + a0*b0 + a1*b1` per 32-bit lane.
    unsafe fn acc(acc: L::I, a: L::I, b: L::I) -> L::I;
    /// `acc + Σ u_i * s_i` over the 4 bytes of each 32-bit lane, `u`
    /// unsigned and `s` signed; exact where no pair `u0*s0 + u1*s1` leaves
    /// the int16 range (always with `u <= 128` and `|s| <= 127`).
    unsafe fn acc4(acc: L::I, u: L::I, s: L::I) -> L::I;
}

/// `vpmaddwd` + `vpaddd` (bytes: `vpmaddubsw` first), on every lane width.
pub(crate) struct Madd;

impl<L: IntLanes> PairDot<L> for Madd {
    #[inline(always)]
    unsafe fn acc(acc: L::I, a: L::I, b: L::I) -> L::I {
        // SAFETY: register-only operations of the caller's features.
        unsafe { L::add32(acc, L::madd16(a, b)) }
    }

    #[inline(always)]
    unsafe fn acc4(acc: L::I, u: L::I, s: L::I) -> L::I {
        // SAFETY: register-only operations of the caller's features.
        unsafe { L::add32(acc, L::madd16(L::maddubs(u, s), L::splat16(1))) }
    }
}

/// Expands a chunk's weight scales to its lanes. Groups are powers of two
/// ([`Layout::supports_group`]), so block-to-group indexing is a shift.
struct LaneScales<L: IntLanes> {
    /// A group spans `1 << shift` blocks (`wide`), or a chunk spans
    /// `1 << shift` groups.
    wide: bool,
    shift: u32,
    pick: L::Pick,
}

impl<L: IntLanes> Clone for LaneScales<L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L: IntLanes> Copy for LaneScales<L> {}

impl<L: IntLanes> LaneScales<L> {
    #[inline(always)]
    unsafe fn new(w: &IntWeights<'_>) -> Self {
        let (block, lane_cols) = (w.layout.block_cols(), w.layout.lane_cols());
        // SAFETY: register-only operations of the caller's features.
        unsafe {
            if w.group >= block {
                let shift = (w.group / block).trailing_zeros();
                return LaneScales { wide: true, shift, pick: L::pick(0, &[0; LANES]) };
            }
            // A power of two below the block size divides the chunk (half a
            // block or all of it).
            let groups_per_chunk = block / L::CHUNKS / w.group;
            let group_shift = w.group.trailing_zeros();
            let idx: [i32; LANES] = std::array::from_fn(|k| ((k * lane_cols) >> group_shift) as i32);
            LaneScales { wide: false, shift: groups_per_chunk.trailing_zeros(), pick: L::pick(groups_per_chunk, &idx) }
        }
    }

    /// The lane scales of chunk `h` of full block `b` of a row whose scales
    /// start at `s`.
    ///
    /// # Safety
    /// Block `b` must lie entirely inside the row.
    #[inline(always)]
    unsafe fn chunk(self, s: *const f32, b: usize, h: usize) -> L::F {
        // SAFETY: a full block's groups all exist in the row's scales; the
        // masked gather touches only those.
        unsafe {
            if self.wide {
                L::splat(*s.add(b >> self.shift))
            } else {
                L::pick_scales(self.pick, s.add((L::CHUNKS * b + h) << self.shift))
            }
        }
    }
}

/// One chunk (`h`) of one block (`b`) of one row against `T` activation
/// vectors of codes `Self`: accumulates each vector's lanes into
/// `facc[t][h]`.
pub(crate) trait ChunkStep: ActElem {
    /// # Safety
    /// The caller enables `L`'s features and upholds `check_rows`; `w` and
    /// `w_scales` are the chunk's weights and lane scales.
    unsafe fn step<L: IntLanes, D: PairDot<L>, const Q4: bool, const T: usize>(
        w: L::I,
        w_scales: L::F,
        acts: &[ActRow<'_, Self>; T],
        at: (usize, usize),
        facc: &mut [L::Acc; T],
    );
}

/// Where chunk `h` of block `b` starts in an activation vector of codes
/// `E`: its codes (a chunk covers `4 N` bytes of each 64-byte plane) and
/// its lanes.
#[inline(always)]
fn chunk_at<L: IntLanes, E: ActElem, const Q4: bool>((b, h): (usize, usize)) -> (usize, usize) {
    let block = if Q4 { Layout::Q4 } else { Layout::Q8 }.block_cols();
    (b * block + 4 * L::N / E::BYTES * h, b * LANES + L::N * h)
}

/// `acc + isum * (w_scales * x_scales)`, the float step of every lane.
///
/// # Safety
/// `N` lane scales must be readable at `x_scales`.
#[inline(always)]
unsafe fn scaled<L: IntLanes>(isum: L::I, w_scales: L::F, x_scales: *const f32, acc: L::F) -> L::F {
    // SAFETY: forwarded to the caller.
    unsafe { L::fmadd(L::to_f32(isum), L::mul(w_scales, L::load(x_scales)), acc) }
}

/// int16 codes.
///
/// q8: a 16-bit word of codes holds columns `2j` (low byte) and `2j + 1`;
/// shifts sign-extend each into a plane of words (no cross-lane shuffle).
///
/// q4: a word holds the nibbles `q + 8` of columns `4j..4j + 4`. Masks
/// alone give planes 0 and 2 as `n` and planes 1 and 3 as `16 n`, which
/// needs one shift for the pair instead of two per plane: the `16 n` sums
/// are shifted back once (exact: they are multiples of 16), and the
/// activations' `-8 Σ q_x` corrections seed the accumulator.
impl ChunkStep for i16 {
    #[inline(always)]
    unsafe fn step<L: IntLanes, D: PairDot<L>, const Q4: bool, const T: usize>(
        w: L::I,
        w_scales: L::F,
        acts: &[ActRow<'_, i16>; T],
        at: (usize, usize),
        facc: &mut [L::Acc; T],
    ) {
        let h = at.1;
        let (x_at, lane_at) = chunk_at::<L, i16, Q4>(at);
        // SAFETY: callers enable the features, and `check_rows` guarantees
        // every activation vector holds the block (planes of 32 words), its
        // 16 lane scales and, for q4, its 16 corrections.
        unsafe {
            let load = |p: *const i16| L::load_i(p);
            if Q4 {
                let (low, high) = (L::splat16(0x000F), L::splat16(0x00F0));
                let w_hi = L::shr16_8(w);
                let planes = [L::and(w, low), L::and(w, high), L::and(w_hi, low), L::and(w_hi, high)];
                for t in 0..T {
                    let x = acts[t].q.as_ptr().add(x_at);
                    let corr = L::load_i(acts[t].lane_corr.as_ptr().add(lane_at));
                    let even = D::acc(D::acc(corr, planes[0], load(x)), planes[2], load(x.add(64)));
                    let odd = D::acc(L::madd16(planes[1], load(x.add(32))), planes[3], load(x.add(96)));
                    let isum = L::add32(even, L::sar32_4(odd));
                    facc[t][h] = scaled::<L>(isum, w_scales, acts[t].lane_scales.as_ptr().add(lane_at), facc[t][h]);
                }
            } else {
                let planes = [L::sar16_8(L::shl16_8(w)), L::sar16_8(w)];
                for t in 0..T {
                    let x = acts[t].q.as_ptr().add(x_at);
                    let isum = D::acc(L::madd16(planes[0], load(x)), planes[1], load(x.add(32)));
                    facc[t][h] = scaled::<L>(isum, w_scales, acts[t].lane_scales.as_ptr().add(lane_at), facc[t][h]);
                }
            }
        }
    }
}

/// int8 codes (`|x_q| <= 127`), four bytes a 32-bit lane.
///
/// q8: the codes' magnitudes (at most 128) meet the activations with the
/// codes' signs, which keeps every `vpmaddubsw` pair inside int16 and needs
/// no correction.
///
/// q4: a byte holds the nibbles `q + 8` of columns `2j` (low) and `2j + 1`;
/// a mask and a shift give the two planes, and the activations' `-8 Σ q_x`
/// corrections seed the accumulator.
impl ChunkStep for i8 {
    #[inline(always)]
    unsafe fn step<L: IntLanes, D: PairDot<L>, const Q4: bool, const T: usize>(
        w: L::I,
        w_scales: L::F,
        acts: &[ActRow<'_, i8>; T],
        at: (usize, usize),
        facc: &mut [L::Acc; T],
    ) {
        let h = at.1;
        let (x_at, lane_at) = chunk_at::<L, i8, Q4>(at);
        // SAFETY: as for int16 codes, with planes of 64 bytes.
        unsafe {
            let load = |p: *const i8| L::load_i(p);
            if Q4 {
                let nibble = L::splat16(0x0F0F);
                let (even, odd) = (L::and(w, nibble), L::and(L::shr16_4(w), nibble));
                for t in 0..T {
                    let x = acts[t].q.as_ptr().add(x_at);
                    let corr = L::load_i(acts[t].lane_corr.as_ptr().add(lane_at));
                    let isum = D::acc4(D::acc4(corr, even, load(x)), odd, load(x.add(64)));
                    facc[t][h] = scaled::<L>(isum, w_scales, acts[t].lane_scales.as_ptr().add(lane_at), facc[t][h]);
                }
            } else {
                let magnitude = L::abs8(w);
                for t in 0..T {
                    let x = load(acts[t].q.as_ptr().add(x_at));
                    let isum = D::acc4(L::splat16(0), magnitude, L::sign8(x, w));
                    facc[t][h] = scaled::<L>(isum, w_scales, acts[t].lane_scales.as_ptr().add(lane_at), facc[t][h]);
                }
            }
        }
    }
}

/// Rows `rows` of `w` times `T` activation vectors, in tiles of `R` rows
/// (as many as the vector registers hold with their accumulators and
/// decoded planes): `out[t * out_stride + (r - rows.start)]`.
#[inline(always)]
pub(super) unsafe fn int_rows<L: IntLanes, D: PairDot<L>, E: ChunkStep, const R: usize, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: callers enable the features and uphold `check_rows`.
    unsafe {
        match w.layout {
            Layout::Q4 => rows_body::<L, D, E, true, R, T>(w, rows, acts, out, out_stride),
            Layout::Q8 => rows_body::<L, D, E, false, R, T>(w, rows, acts, out, out_stride),
        }
    }
}

#[inline(always)]
unsafe fn rows_body<L: IntLanes, D: PairDot<L>, E: ChunkStep, const Q4: bool, const R: usize, const T: usize>(
    w: &IntWeights<'_>,
    rows: Range<usize>,
    acts: &[ActRow<'_, E>; T],
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: callers enable the features and uphold `check_rows`.
    unsafe {
        let lane_scales = LaneScales::<L>::new(w);
        let mut r = rows.start;
        while r < rows.end {
            if r + R <= rows.end {
                let mut tile = [[0.0f32; T]; R];
                tile_body::<L, D, E, Q4, R, T>(w, lane_scales, r, acts, &mut tile);
                store_tile(&tile, r - rows.start, out, out_stride);
                r += R;
            } else {
                let mut tile = [[0.0f32; T]; 1];
                tile_body::<L, D, E, Q4, 1, T>(w, lane_scales, r, acts, &mut tile);
                store_tile(&tile, r - rows.start, out, out_stride);
                r += 1;
            }
        }
    }
}

/// An `R × T` tile of integer products (see `crate::int`).
#[inline(always)]
unsafe fn tile_body<L: IntLanes, D: PairDot<L>, E: ChunkStep, const Q4: bool, const R: usize, const T: usize>(
    w: &IntWeights<'_>,
    lane_scales: LaneScales<L>,
    row0: usize,
    acts: &[ActRow<'_, E>; T],
    out: &mut [[f32; T]; R],
) {
    let chunk_bytes = BLOCK_BYTES / L::CHUNKS;
    // SAFETY: callers enable the features and uphold `check_rows`; full
    // blocks lie inside their rows, and the tail block is a local copy.
    unsafe {
        let full = w.full_blocks();
        let qs: [*const u8; R] = std::array::from_fn(|i| w.row_qs(row0 + i).as_ptr());
        let scales: [*const f32; R] = std::array::from_fn(|i| w.row_scales(row0 + i).as_ptr());
        let next = w.next_tile_rows::<R>(row0);
        let mut facc = [[L::acc_zero(); T]; R];
        for b in 0..full {
            for i in 0..R {
                // One block is one cache line; prefetching never faults, and
                // `wrapping_add` keeps the address arithmetic defined. Into
                // L2, not L1: L1's few miss buffers cap the lines in flight
                // below what DRAM needs to stream (T0 measured about half
                // of T1's speed on a 1 GiB matvec).
                _mm_prefetch::<_MM_HINT_T1>(next[i].wrapping_add(b * BLOCK_BYTES).cast());
                for h in 0..L::CHUNKS {
                    let wv = L::load_i(qs[i].add(b * BLOCK_BYTES + chunk_bytes * h));
                    E::step::<L, D, Q4, T>(wv, lane_scales.chunk(scales[i], b, h), acts, (b, h), &mut facc[i]);
                }
            }
        }
        if full < w.blocks() {
            for i in 0..R {
                let tail = w.tail_block(row0 + i);
                let tail_scales = w.lane_scales(row0 + i, full);
                for h in 0..L::CHUNKS {
                    let wv = L::load_i(tail.as_ptr().add(chunk_bytes * h));
                    let ws = L::load(tail_scales.as_ptr().add(L::N * h));
                    E::step::<L, D, Q4, T>(wv, ws, acts, (full, h), &mut facc[i]);
                }
            }
        }
        for i in 0..R {
            for t in 0..T {
                out[i][t] = L::reduce(facc[i][t]);
            }
        }
    }
}
