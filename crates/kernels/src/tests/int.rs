//! The integer path (int16 or int8 activations × q8/q4 codes): every vector
//! tier against the scalar definition bit for bit, the definition against
//! the f32 reference within the activation quantization error, and the
//! quantizer; each for both activation codes.

use proptest::prelude::*;

use super::{CASES, REL_TOL, cols, values};
use crate::act::{ActElem, ActivationPrecision, Layout, QuantizedActs};
use crate::int::{self, IntElem, IntWeights};
use crate::quant::{quantize_q4, quantize_q8};
use crate::scalar;
use crate::simd::{Isa, IsaLevel};

fn vector_isas() -> Vec<Isa> {
    Isa::all_supported().into_iter().filter(|isa| isa.level() != IsaLevel::Scalar).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Weights of one layout, owned.
pub(super) struct Owned {
    layout: Layout,
    rows: usize,
    cols: usize,
    group: usize,
    qs: Vec<u8>,
    scales: Vec<f32>,
}

impl Owned {
    pub(super) fn new(layout: Layout, rows: usize, cols: usize, group: usize, src: &[f32]) -> Self {
        let (qs, scales) = match layout {
            Layout::Q8 => {
                let (qs, scales) = quantize_q8(src, rows, cols, group);
                (qs.iter().map(|&q| q as u8).collect(), scales)
            }
            Layout::Q4 => quantize_q4(src, rows, cols, group),
        };
        Owned { layout, rows, cols, group, qs, scales }
    }

    pub(super) fn weights(&self) -> IntWeights<'_> {
        IntWeights::new(self.layout, self.rows, self.cols, self.group, &self.qs, &self.scales)
    }

    /// These weights as a [`crate::Matrix`].
    #[cfg(any(feature = "gpu", feature = "cuda"))]
    pub(super) fn matrix(&self) -> crate::Matrix<'_> {
        let (scales, group) = (&self.scales[..], self.group);
        let data = match self.layout {
            Layout::Q8 => crate::MatData::Q8 { qs: bytemuck::cast_slice(&self.qs), scales, group },
            Layout::Q4 => crate::MatData::Q4 { qs: &self.qs, scales, group },
        };
        crate::Matrix::new(self.rows, self.cols, data).expect("a well-formed matrix")
    }

    /// The f32 reference dot of row `r` with `x`.
    fn f32_dot(&self, r: usize, x: &[f32]) -> f32 {
        let w = self.weights();
        match self.layout {
            Layout::Q8 => {
                let qs: Vec<i8> = w.row_qs(r).iter().map(|&b| b as i8).collect();
                scalar::dot_q8(&qs, w.row_scales(r), self.group, x)
            }
            Layout::Q4 => scalar::dot_q4(w.row_qs(r), w.row_scales(r), self.group, x),
        }
    }

    /// `|w[r][c]|`, dequantized.
    fn abs_weight(&self, r: usize, c: usize) -> f32 {
        let w = self.weights();
        let code = match self.layout {
            Layout::Q8 => f32::from(w.row_qs(r)[c] as i8),
            Layout::Q4 => crate::quant::q4_at(w.row_qs(r), c) as f32,
        };
        (code * w.row_scales(r)[c / self.group]).abs()
    }
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Q8), Just(Layout::Q4)]
}

/// (layout, rows, cols, group, weights source, n, xs): rows and n cover
/// whole tiles (4 rows, 4 vectors) and remainders; groups every supported
/// power of two, below, at and above the block size.
#[allow(clippy::type_complexity)]
pub(super) fn case() -> impl Strategy<Value = (Layout, usize, usize, usize, Vec<f32>, usize, Vec<f32>)> {
    (layout(), 1usize..=9, cols(), 2u32..=8, 1usize..=6).prop_flat_map(|(layout, rows, cols, log_group, n)| {
        let group = (1usize << log_group).max(layout.lane_cols());
        (Just(layout), Just(rows), Just(cols), Just(group), values(rows * cols), Just(n), values(n * cols))
    })
}

/// Every vector tier against the definition, for activation codes `E`.
fn tiers_equal_definition<E: IntElem>(
    (layout, rows, cols, group, src, n, xs): &(Layout, usize, usize, usize, Vec<f32>, usize, Vec<f32>),
) -> Result<(), TestCaseError> {
    let (layout, rows, cols, group, n) = (*layout, *rows, *cols, *group, *n);
    let owned = Owned::new(layout, rows, cols, group, src);
    let w = owned.weights();
    let acts = QuantizedActs::<E>::new(layout, xs, n, cols);
    let mut want = vec![f32::NAN; n * rows];
    int::products_ref(&w, &acts, 0..rows, &mut want, rows);
    for isa in vector_isas() {
        let mut got = vec![f32::NAN; n * rows];
        int::products(isa, &w, &acts, 0..rows, &mut got, rows);
        prop_assert_eq!(bits(&got), bits(&want), "{:?} {:?} {}", isa, layout, E::MAX);
        // A sub-range of rows into a wider output.
        if rows > 2 {
            let stride = rows + 3;
            let mut part = vec![f32::NAN; n * stride];
            int::products(isa, &w, &acts, 1..rows - 1, &mut part, stride);
            for t in 0..n {
                prop_assert_eq!(
                    bits(&part[t * stride..t * stride + rows - 2]),
                    bits(&want[t * rows + 1..t * rows + rows - 1])
                );
            }
        }
    }
    Ok(())
}

/// The definition differs from the f32 reference by the activation
/// quantization (at most half a step, `scale / 2`, per column, plus the
/// step's own rounding) plus f32 rounding, for activation codes `E`.
fn definition_within_quantization<E: ActElem>(
    (layout, rows, cols, group, src, n, xs): &(Layout, usize, usize, usize, Vec<f32>, usize, Vec<f32>),
) -> Result<(), TestCaseError> {
    let (layout, rows, cols, group, n) = (*layout, *rows, *cols, *group, *n);
    let owned = Owned::new(layout, rows, cols, group, src);
    let w = owned.weights();
    let acts = QuantizedActs::<E>::new(layout, xs, n, cols);
    for t in 0..n {
        let x = &xs[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let got = int::dot_ref(&w, r, acts.row(t));
            let want = owned.f32_dot(r, x);
            let mut bound = 0.0f32;
            let mut mag = 0.0f32;
            for (c, &xc) in x.iter().enumerate() {
                let lc = layout.lane_cols();
                let block = &x[c / lc * lc..((c / lc + 1) * lc).min(cols)];
                let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let wc = owned.abs_weight(r, c);
                bound += wc * amax / E::MAX as f32 / 2.0;
                mag += wc * xc.abs();
            }
            let tol = bound * 1.03 + 2.0 * REL_TOL * mag + 1e-6;
            prop_assert!((got - want).abs() <= tol, "{layout:?} {} row {r}: {got} vs {want} (tol {tol})", E::MAX);
        }
    }
    Ok(())
}

/// Dequantized activations are within half a step of the inputs (plus
/// the f32 rounding of `x * (MAX / max)`, about 0.002 of a step).
fn activations_round_trip<E: ActElem>(layout: Layout, x: &[f32]) -> Result<(), TestCaseError> {
    let acts = QuantizedActs::<E>::new(layout, x, 1, x.len());
    let row = acts.row(0);
    let block = layout.block_cols();
    for (c, &v) in x.iter().enumerate() {
        let (b, j) = (c / block, c % block);
        let q: i32 = row.q[b * block + layout.position::<E>(j)].into();
        prop_assert!(q.abs() <= E::MAX, "col {c}: code {q} beyond {}", E::MAX);
        let scale = row.lane_scales[b * 16 + j / layout.lane_cols()];
        prop_assert!((q as f32 * scale - v).abs() <= scale * 0.51 + 1e-12, "col {c}: {q} * {scale} vs {v}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// AVX2, AVX-512 and AVX-512 VNNI compute exactly the definition, with
    /// int16 and with int8 activations.
    #[test]
    fn every_tier_equals_the_scalar_definition_bitwise(case in case()) {
        tiers_equal_definition::<i16>(&case)?;
        tiers_equal_definition::<i8>(&case)?;
    }

    #[test]
    fn definition_matches_f32_reference_within_quantization(case in case()) {
        definition_within_quantization::<i16>(&case)?;
        definition_within_quantization::<i8>(&case)?;
    }

    #[test]
    fn quantized_activations_round_trip(layout in layout(), x in cols().prop_flat_map(values)) {
        activations_round_trip::<i16>(layout, &x)?;
        activations_round_trip::<i8>(layout, &x)?;
    }
}

/// The worst q8 weight magnitude, 128 (a code of -128, which Strata's
/// quantizer never writes but a container may hold), against the widest
/// int8 activations of both signs: the int8 kernels' pairs must not
/// saturate (`vpmaddubsw`), nor the int16 kernels' (`vpmaddwd`).
#[test]
fn q8_codes_of_minus_128_meet_full_scale_activations_exactly() {
    let (rows, cols) = (3, 256);
    let qs: Vec<u8> = (0..rows * cols).map(|i| if i % 3 == 2 { 127 } else { 128 }).collect();
    let scales = vec![1.0f32; rows * cols / 32];
    let w = IntWeights::new(Layout::Q8, rows, cols, 32, &qs, &scales);
    let xs: Vec<f32> = (0..cols).map(|c| if c % 2 == 0 { 1.0 } else { -1.0 }).collect();
    fn check<E: IntElem>(w: &IntWeights<'_>, xs: &[f32]) {
        let acts = QuantizedActs::<E>::new(Layout::Q8, xs, 1, xs.len());
        let mut want = vec![0.0; w.rows];
        int::products_ref(w, &acts, 0..w.rows, &mut want, w.rows);
        for isa in vector_isas() {
            let mut got = vec![0.0; w.rows];
            int::products(isa, w, &acts, 0..w.rows, &mut got, w.rows);
            assert_eq!(bits(&got), bits(&want), "{isa:?} {}", E::MAX);
        }
    }
    check::<i16>(&w, &xs);
    check::<i8>(&w, &xs);
}

/// Activations too small for any finite step (below `MAX / f32::MAX`, as
/// the SiLU of a very negative gate is) quantize to zeros with a zero
/// scale, as zeros do, rather than to the codes of an infinite step.
#[test]
fn activations_too_small_for_a_finite_step_quantize_to_zeros() {
    let xs: Vec<f32> = (0..256).map(|i| if i % 2 == 0 { 1e-38 } else { -3e-40 }).collect();
    fn check<E: ActElem>(layout: Layout, xs: &[f32]) {
        let acts = QuantizedActs::<E>::new(layout, xs, 1, xs.len());
        let row = acts.row(0);
        assert!(row.q.iter().all(|&code| code.into() == 0), "{layout:?} {}: codes", E::MAX);
        assert!(row.lane_scales.iter().all(|&scale| scale == 0.0), "{layout:?} {}: scales", E::MAX);
    }
    for layout in [Layout::Q8, Layout::Q4] {
        check::<i16>(layout, &xs);
        check::<i8>(layout, &xs);
    }
}

/// int8 activations are reached through `Matrix` only when asked for, and
/// then compute their own definition on every tier; int16 stays the
/// default of `matmul_with` and of a new `Threads`.
#[test]
fn int8_activations_are_an_explicit_choice() {
    let (rows, cols, n) = (6, 160, 2);
    let src: Vec<f32> = (0..rows * cols).map(|i| ((i * 29 % 97) as f32 - 48.0) / 31.0).collect();
    let xs: Vec<f32> = (0..n * cols).map(|i| ((i * 13 % 61) as f32 - 30.0) / 17.0).collect();
    let owned = Owned::new(Layout::Q4, rows, cols, 64, &src);
    let (qs, scales) = (owned.qs.clone(), owned.scales.clone());
    let m = crate::Matrix::new(rows, cols, crate::MatData::Q4 { qs: &qs, scales: &scales, group: 64 }).unwrap();
    let w = owned.weights();
    let reference = |precision| {
        let mut want = vec![0.0; n * rows];
        match precision {
            ActivationPrecision::Int16 => {
                int::products_ref(&w, &QuantizedActs::<i16>::new(Layout::Q4, &xs, n, cols), 0..rows, &mut want, rows)
            }
            ActivationPrecision::Int8 => {
                int::products_ref(&w, &QuantizedActs::<i8>::new(Layout::Q4, &xs, n, cols), 0..rows, &mut want, rows)
            }
        }
        want
    };
    let (exact, lossy) = (reference(ActivationPrecision::Int16), reference(ActivationPrecision::Int8));
    assert_ne!(bits(&exact), bits(&lossy), "int8 must quantize differently");
    for isa in vector_isas() {
        let mut got = vec![0.0; n * rows];
        m.matmul_with(isa, &xs, n, &mut got);
        assert_eq!(bits(&got), bits(&exact), "{isa:?}: matmul_with is int16");
        m.matmul_at(isa, ActivationPrecision::Int8, &xs, n, &mut got);
        assert_eq!(bits(&got), bits(&lossy), "{isa:?}: int8 asked for");
    }
    let threads = crate::Threads::new(1).unwrap();
    assert_eq!(threads.activations(), ActivationPrecision::Int16);
    assert_eq!(threads.with_activations(ActivationPrecision::Int8).activations(), ActivationPrecision::Int8);
}

#[test]
fn activation_precisions_parse_from_their_flag_names_only() {
    for precision in ActivationPrecision::ALL {
        assert_eq!(precision.name().parse::<ActivationPrecision>(), Ok(precision));
    }
    assert_eq!(" Q8 ".parse::<ActivationPrecision>(), Ok(ActivationPrecision::Int8));
    assert!("int8".parse::<ActivationPrecision>().is_err());
    assert!(ActivationPrecision::Int8.is_lossy() && !ActivationPrecision::Int16.is_lossy());
    assert_eq!(ActivationPrecision::default(), ActivationPrecision::Int16);
}

#[test]
fn plane_positions_are_a_permutation() {
    fn check<E: ActElem>(layout: Layout) {
        let mut seen = vec![false; layout.block_cols()];
        for j in 0..layout.block_cols() {
            let p = layout.position::<E>(j);
            assert!(!seen[p], "{layout:?} {}: position {p} twice", E::MAX);
            seen[p] = true;
        }
    }
    for layout in [Layout::Q8, Layout::Q4] {
        check::<i16>(layout);
        check::<i8>(layout);
    }
}

#[test]
fn supported_groups_are_powers_of_two_covering_whole_lanes() {
    for group in [4, 8, 16, 32, 64, 128, 256, 1024] {
        assert!(Layout::Q8.supports_group(group), "q8 {group}");
    }
    for group in [8, 16, 32, 64, 128, 256] {
        assert!(Layout::Q4.supports_group(group), "q4 {group}");
    }
    for group in [0, 1, 2, 3, 24, 33, 48, 96] {
        assert!(!Layout::Q8.supports_group(group), "q8 {group}");
    }
    for group in [0, 2, 4, 12, 96] {
        assert!(!Layout::Q4.supports_group(group), "q4 {group}");
    }
}

/// Extreme inputs: all-zero blocks, one huge value among tiny ones, and
/// non-finite values, which must poison the products that read them (as
/// the f32 path would) instead of vanishing into a zero code.
#[test]
fn extreme_activations() {
    extreme_activations_of::<i16>();
    extreme_activations_of::<i8>();
}

fn extreme_activations_of<E: IntElem>() {
    let (rows, cols, group) = (5, 200, 32);
    let src: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    for layout in [Layout::Q8, Layout::Q4] {
        let owned = Owned::new(layout, rows, cols, group, &src);
        let w = owned.weights();
        let mut x = vec![0.0f32; cols];
        let check = |x: &[f32], expect_nan: bool| {
            let acts = QuantizedActs::<E>::new(layout, x, 1, cols);
            let mut want = vec![0.0; rows];
            int::products_ref(&w, &acts, 0..rows, &mut want, rows);
            for (r, &v) in want.iter().enumerate() {
                assert_eq!(v.is_nan(), expect_nan, "{layout:?} row {r}: {v}");
            }
            for isa in vector_isas() {
                let mut got = vec![0.0; rows];
                int::products(isa, &w, &acts, 0..rows, &mut got, rows);
                assert_eq!(bits(&got), bits(&want), "{isa:?} {layout:?} {}", E::MAX);
            }
            want
        };
        assert!(check(&x, false).iter().all(|&v| v == 0.0));
        x[40] = 1e30;
        x[41] = 1e-30;
        x[150] = -3.0;
        check(&x, false);
        x[7] = f32::INFINITY;
        check(&x, true);
        x[7] = f32::NAN;
        check(&x, true);
    }
}

/// The integer kernels are reached through `Matrix` for the presets' groups
/// and not for groups they cannot lane-align.
#[test]
fn matrix_takes_the_integer_path_where_supported() {
    let src = vec![0.5f32; 4 * 96];
    let (q8, s8) = quantize_q8(&src, 4, 96, 32);
    let m8 = crate::Matrix::new(4, 96, crate::MatData::Q8 { qs: &q8, scales: &s8, group: 32 }).unwrap();
    let (q4, s4) = quantize_q4(&src, 4, 96, 48);
    let m4 = crate::Matrix::new(4, 96, crate::MatData::Q4 { qs: &q4, scales: &s4, group: 48 }).unwrap();
    for isa in Isa::all_supported() {
        assert_eq!(m8.uses_int_path(isa), isa.level() != IsaLevel::Scalar, "{isa:?}");
        assert!(!m4.uses_int_path(isa), "group 48 is not a power of two");
    }
}
