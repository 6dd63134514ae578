//! Activations quantized to int16 (or, as an explicit lossy option, int8:
//! [`ActivationPrecision`]), the input side of the integer products of q8
//! and q4 weights ([`crate::int`]).
//!
//! # Why int16, not int8
//!
//! llama.cpp pairs Q4_0/Q8_0 weights with activations quantized to int8 in
//! blocks of 32 (`Q8_0` activations). That error is about
//! `max|x| / 127 / sqrt(12)` per element: measured on the oracle fixtures,
//! int8 inputs (even with the per-lane scales below) put the logits 4.6e-2 ×
//! std away from transformers', 46 times the tolerance of `1e-3 × std` that
//! Strata's q8/q4 containers are held to against transformers on their own
//! dequantized weights. int16 keeps the integer datapath (`vpmaddwd` /
//! `vpdpwssd`, with exact int32 sums) at 256 times less error: at most
//! 5.5e-4 × std on the fixtures (f32 inputs: 3e-6 × std).
//!
//! int8 stays available as an explicit, lossy choice
//! ([`ActivationPrecision::Int8`], `--activations q8`): half the multiplies
//! (`vpdpbusd`, `vpmaddubsw`), for 4.6e-2 to 2.9 × std on the fixtures
//! (about what q8 weights cost each of them) and +0.01% perplexity on the
//! demo model (docs/BENCHMARKS.md, "int8 activations").
//!
//! # Quantization
//!
//! The columns of every product lane (4 for q8, 8 for q4, see [`Layout`])
//! get their own scale `s = max|x| / M`, and
//! `q = round_ties_even(x * (M / max|x|))`, with `M` = 32767 for int16 and
//! 127 for int8 ([`ActElem::MAX`]): the finest grain the kernels
//! allow, which cut the fixtures' worst error by 1.6 times against blocks of
//! 32. An all-zero lane has scale 0; a lane holding a NaN or an infinity gets
//! a NaN scale, so the products that read it are NaN, as the f32 path's would
//! be.
//!
//! # Layout
//!
//! The int16 kernels multiply 16-bit weight words with 16-bit activation
//! words in pairs (`vpmaddwd`: `a0*b0 + a1*b1` per 32-bit lane). Unpacking
//! packed weights into words *in column order* needs cross-lane shuffles,
//! which run on one port only on most x86 cores; unpacking them *by shifts* within
//! each 16-bit word is cheap but yields the columns of each word in planes.
//! So the activations are stored in that plane order instead, once per
//! vector:
//!
//! * q8 ([`Layout::Q8`]): blocks of 64 columns; a weight word holds columns
//!   `2j, 2j+1`; plane `p` (0..2) holds `x[2j + p]` for `j` in 0..32.
//! * q4 ([`Layout::Q4`]): blocks of 128 columns; a weight word holds columns
//!   `4j..4j+4`; plane `p` (0..4) holds `x[4j + p]` for `j` in 0..32.
//!
//! The int8 kernels multiply weight *bytes* with activation bytes in
//! fours (`vpdpbusd`, or `vpmaddubsw` + `vpmaddwd`), so the planes follow
//! the columns of a weight byte instead: q8 has one plane (column order),
//! q4 two (`x[2j]` and `x[2j + 1]` for `j` in 0..64). A plane is 64 bytes
//! either way.
//!
//! Either way a 512-bit product lane `k` (0..16) sums exactly the columns
//! `k * lane_cols .. (k + 1) * lane_cols` of its block, so every lane lies
//! inside one weight group and has one activation scale. Columns past the
//! end are zero.

/// How finely the integer path quantizes activations: the engine's
/// `--activations` flag. f32 and bf16 weights, and groups the integer path
/// cannot take, are unaffected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationPrecision {
    /// int16 (`exact`): within the 1e-3 × std tolerance q8/q4 containers
    /// are held to against transformers (see the module docs).
    #[default]
    Int16,
    /// int8 (`q8`), as llama.cpp computes: half the multiplies, but about
    /// 256 times the quantization error of int16. Lossy, so never chosen
    /// unless asked for.
    Int8,
}

impl ActivationPrecision {
    pub const ALL: [ActivationPrecision; 2] = [Self::Int16, Self::Int8];

    /// The flag's name: `exact` or `q8`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Int16 => "exact",
            Self::Int8 => "q8",
        }
    }

    /// Whether this precision changes results beyond the exact tolerance.
    pub fn is_lossy(self) -> bool {
        self == Self::Int8
    }
}

impl std::fmt::Display for ActivationPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ActivationPrecision {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let wanted = text.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| format!("unknown activation precision {text:?} (expected exact or q8)"))
    }
}

/// An activation code: `i16` or `i8`.
pub(crate) trait ActElem: Copy + Default + Into<i32> + std::fmt::Debug + 'static {
    /// Largest magnitude used; the type's minimum is left out, so that no
    /// `vpmaddwd` pair (int16) or `vpmaddubsw` pair (int8, against weight
    /// magnitudes up to 128) can overflow.
    const MAX: i32;
    /// Bytes per code: the weight unit a plane follows (a 16-bit word or a
    /// byte).
    const BYTES: usize;

    /// `v`, which lies within `±MAX`.
    fn from_code(v: i32) -> Self;
}

impl ActElem for i16 {
    const MAX: i32 = 32767;
    const BYTES: usize = 2;

    #[inline(always)]
    fn from_code(v: i32) -> Self {
        v as i16
    }
}

impl ActElem for i8 {
    const MAX: i32 = 127;
    const BYTES: usize = 1;

    #[inline(always)]
    fn from_code(v: i32) -> Self {
        v as i8
    }
}

/// Product lanes per block (the 16 `i32` lanes of a 512-bit vector).
pub(crate) const LANES: usize = 16;

/// How the activations are ordered for one weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// 64-column blocks in 2 planes, for q8 weights.
    Q8,
    /// 128-column blocks in 4 planes, for q4 weights.
    Q4,
}

impl Layout {
    /// Columns per block.
    pub(crate) const fn block_cols(self) -> usize {
        match self {
            Self::Q8 => 64,
            Self::Q4 => 128,
        }
    }

    /// Planes per block for codes `E`: columns per weight unit of `E`'s
    /// size (a 16-bit word for int16, a byte for int8).
    pub(crate) fn planes<E: ActElem>(self) -> usize {
        let cols_per_byte = match self {
            Self::Q8 => 1,
            Self::Q4 => 2,
        };
        cols_per_byte * E::BYTES
    }

    /// Consecutive columns summed in one product lane.
    pub(crate) const fn lane_cols(self) -> usize {
        self.block_cols() / LANES
    }

    /// Whether weights with `group` columns per scale can use the integer
    /// path: each lane must lie in one group, and groups must be powers of
    /// two so that the lanes' group pattern repeats from block to block (one
    /// permutation expands the scales) and a block's first group is a shift
    /// away. Every preset (q8 group 32, q4 group 64) qualifies.
    pub(crate) const fn supports_group(self, group: usize) -> bool {
        group.is_power_of_two() && group >= self.lane_cols()
    }

    /// Where natural column `j` (0..block_cols) of a block of codes `E` is
    /// stored within it.
    pub(crate) fn position<E: ActElem>(self, j: usize) -> usize {
        let planes = self.planes::<E>();
        (j % planes) * (self.block_cols() / planes) + j / planes
    }
}

/// `n` activation vectors of `cols` columns, quantized to codes `E` in the
/// plane order of `layout` (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct QuantizedActs<E: ActElem> {
    layout: Layout,
    cols: usize,
    blocks: usize,
    n: usize,
    /// `n * blocks * block_cols` values.
    q: Vec<E>,
    /// `n * blocks * LANES` scales: the scale of each product lane.
    lane_scales: Vec<f32>,
    /// q4 only (else empty): `n * blocks * LANES` values `-8 * Σ q` over
    /// each lane's columns. The q4 kernels multiply the stored unsigned
    /// nibbles `q + 8` and add this to get `Σ q_w * q_x` exactly.
    lane_corr: Vec<i32>,
}

/// One vector of a [`QuantizedActs`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActRow<'a, E> {
    /// `blocks * block_cols` values in plane order.
    pub(crate) q: &'a [E],
    /// `blocks * LANES` lane scales.
    pub(crate) lane_scales: &'a [f32],
    /// `blocks * LANES` q4 offset corrections (empty for q8).
    pub(crate) lane_corr: &'a [i32],
}

impl<E: ActElem> QuantizedActs<E> {
    /// Quantizes the `n` rows of `xs` (`[n, cols]`).
    ///
    /// # Panics
    /// If `xs.len() != n * cols`.
    pub(crate) fn new(layout: Layout, xs: &[f32], n: usize, cols: usize) -> Self {
        assert_eq!(Some(xs.len()), n.checked_mul(cols), "activations must be [n, cols]");
        let block = layout.block_cols();
        let blocks = cols.div_ceil(block);
        let mut acts = QuantizedActs {
            layout,
            cols,
            blocks,
            n,
            q: vec![E::default(); n * blocks * block],
            lane_scales: vec![0.0; n * blocks * LANES],
            lane_corr: Vec::new(),
        };
        if layout == Layout::Q4 {
            acts.lane_corr = vec![0; n * blocks * LANES];
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present.
            unsafe { acts.fill_avx2(xs) };
            return acts;
        }
        acts.fill(xs);
        acts
    }

    /// [`QuantizedActs::fill`] compiled for AVX2, which vectorizes its loops
    /// far better than the SSE2 baseline; the operations (and so the
    /// results) are the same.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_avx2(&mut self, xs: &[f32]) {
        self.fill(xs);
    }

    /// Quantizes `xs` into the (zeroed, correctly sized) buffers.
    #[inline(always)]
    fn fill(&mut self, xs: &[f32]) {
        let (layout, cols, blocks, n) = (self.layout, self.cols, self.blocks, self.n);
        let block = layout.block_cols();
        let acts = self;
        for t in 0..n {
            let x = &xs[t * cols..(t + 1) * cols];
            for b in 0..blocks {
                let at = t * blocks + b;
                let start = (b * block).min(cols);
                let x_block = &x[start..(start + block).min(cols)];
                let q_block = &mut acts.q[at * block..][..block];
                let scales = &mut acts.lane_scales[at * LANES..][..LANES];
                let corr = acts.lane_corr.get_mut(at * LANES..(at + 1) * LANES);
                let planes = layout.planes::<E>();
                match layout {
                    Layout::Q8 => quantize_block::<E, 64>(x_block, q_block, planes, scales, corr),
                    Layout::Q4 => quantize_block::<E, 128>(x_block, q_block, planes, scales, corr),
                }
            }
        }
    }

    /// The layout these activations were quantized for.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// Columns per vector.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Number of vectors.
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Vector `t`.
    pub(crate) fn row(&self, t: usize) -> ActRow<'_, E> {
        let block = self.layout.block_cols();
        ActRow {
            q: &self.q[t * self.blocks * block..(t + 1) * self.blocks * block],
            lane_scales: &self.lane_scales[t * self.blocks * LANES..(t + 1) * self.blocks * LANES],
            lane_corr: if self.lane_corr.is_empty() {
                &[]
            } else {
                &self.lane_corr[t * self.blocks * LANES..(t + 1) * self.blocks * LANES]
            },
        }
    }
}

/// Quantizes one block of `BLOCK` columns (fewer at the end of a vector;
/// the rest are zero) into `q` in the order of `planes` planes, with its
/// lane scales and, for q4, its lane corrections. Fixed-size loops without
/// branches (`planes` is a constant where this is inlined), so that the
/// compiler vectorizes them: this runs once per input of every product.
#[inline(always)]
fn quantize_block<E: ActElem, const BLOCK: usize>(
    x: &[f32],
    q: &mut [E],
    planes: usize,
    lane_scales: &mut [f32],
    corr: Option<&mut [i32]>,
) {
    let mut padded = [0.0f32; BLOCK];
    padded[..x.len()].copy_from_slice(x);
    let mut natural = [E::default(); BLOCK];
    let lane_cols = BLOCK / LANES;
    // Every product lane gets its own scale: the finest grain the kernels
    // allow, and it keeps an outlier from coarsening its neighbours' steps.
    for (lane, (xs, qs)) in padded.chunks_exact(lane_cols).zip(natural.chunks_exact_mut(lane_cols)).enumerate() {
        lane_scales[lane] = match BLOCK / LANES {
            4 => quantize_lane::<E, 4>(xs.try_into().expect("4 columns"), qs.try_into().expect("4 columns")),
            8 => quantize_lane::<E, 8>(xs.try_into().expect("8 columns"), qs.try_into().expect("8 columns")),
            other => unreachable!("lanes of {other} columns"),
        };
    }
    let plane_len = BLOCK / planes;
    for p in 0..planes {
        for j in 0..plane_len {
            q[p * plane_len + j] = natural[j * planes + p];
        }
    }
    if let Some(corr) = corr {
        for (c, lane) in corr.iter_mut().zip(natural.chunks_exact(lane_cols)) {
            *c = -crate::quant::Q4_OFFSET * lane.iter().map(|&v| v.into()).sum::<i32>();
        }
    }
}

/// Quantizes the `N` values of one lane (see the module docs) and returns
/// their scale.
#[inline(always)]
fn quantize_lane<E: ActElem, const N: usize>(x: &[f32; N], q: &mut [E; N]) -> f32 {
    // max |x| as the largest magnitude bit pattern: integer max is
    // associative, so this vectorizes, and patterns at or above infinity's
    // are exactly the non-finite values.
    let amax_bits = x.iter().fold(0u32, |m, &v| m.max(v.to_bits() & 0x7FFF_FFFF));
    if amax_bits >= f32::INFINITY.to_bits() {
        *q = [E::default(); N];
        return f32::NAN;
    }
    let amax = f32::from_bits(amax_bits);
    let max = E::MAX as f32;
    let inv = max / amax;
    // All zeros, or all below `MAX / f32::MAX` (~1e-34 for int16, as the
    // SiLU of a very negative gate is): no finite step codes them, and their
    // products are lost beside any normal value. Zeros with a zero scale.
    if !inv.is_finite() {
        *q = [E::default(); N];
        return 0.0;
    }
    for (o, &v) in q.iter_mut().zip(x) {
        // SAFETY: |v| <= amax and `inv` is finite, so |v * inv| <= MAX plus
        // rounding: finite and far inside i32 (and inside
        // round_ties_even_small's range); the rounded value is already
        // integral, and within ±MAX.
        *o = E::from_code(unsafe { crate::quant::round_ties_even_small(v * inv).to_int_unchecked::<i32>() });
    }
    amax / max
}
