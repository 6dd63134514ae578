//! Every vector tier this CPU supports against the scalar reference.

use proptest::prelude::*;

use super::{CASES, assert_close, cols, group, magnitude, values};
use crate::mxfp4;
use crate::quant::{bf16_to_f32, f32_to_bf16_bits, q4_at};
use crate::scalar;
use crate::simd::{Isa, IsaLevel, RowScale};

/// The vector tiers to check (the scalar tier is the reference itself).
fn vector_isas() -> Vec<Isa> {
    Isa::all_supported().into_iter().filter(|isa| isa.level() != IsaLevel::Scalar).collect()
}

/// `sum |q * scale * x|` over a grouped row whose value at column `c` is
/// `q(c)`.
fn grouped_magnitude(q: impl Fn(usize) -> f32, scales: &[f32], group: usize, x: &[f32]) -> f32 {
    x.iter().enumerate().map(|(c, xc)| (q(c) * scales[c / group] * xc).abs()).sum()
}

/// A q8 row with arbitrary codes: (qs, scales, group, x).
fn q8_row() -> impl Strategy<Value = (Vec<i8>, Vec<f32>, usize, Vec<f32>)> {
    (cols(), group()).prop_flat_map(|(cols, group)| {
        (
            prop::collection::vec(-127i8..=127, cols),
            prop::collection::vec(0.0f32..0.1, cols.div_ceil(group)),
            Just(group),
            values(cols),
        )
    })
}

/// A packed q4 row with arbitrary bytes, including -8 codes and junk in the
/// unused high nibble of odd rows (which every path must ignore).
fn q4_row() -> impl Strategy<Value = (Vec<u8>, Vec<f32>, usize, Vec<f32>)> {
    (cols(), group()).prop_flat_map(|(cols, group)| {
        (
            prop::collection::vec(any::<u8>(), cols.div_ceil(2)),
            prop::collection::vec(0.0f32..0.1, cols.div_ceil(group)),
            Just(group),
            values(cols),
        )
    })
}

/// An MXFP4 row of 0..=12 blocks with arbitrary codes and scales around
/// 2^0, and the smallest, 0 (2^-127, whose products are subnormal):
/// (codes, scales, x).
pub(super) fn mxfp4_row() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, Vec<f32>)> {
    (0usize..=12).prop_flat_map(|blocks| {
        let scale = prop_oneof![9 => 110u8..=140, 1 => Just(0u8)];
        (
            prop::collection::vec(any::<u8>(), blocks * mxfp4::BLOCK_BYTES),
            prop::collection::vec(scale, blocks),
            values(blocks * mxfp4::BLOCK_VALUES),
        )
    })
}

fn two_vectors() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    cols().prop_flat_map(|n| (values(n), values(n)))
}

/// Strided rows as an attention cache holds them: (row length, stride,
/// rows, the values, a vector of the row length, one weight per row).
#[allow(clippy::type_complexity)]
fn strided_rows() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>, Vec<f32>, Vec<f32>)> {
    (1usize..150, 0usize..40, 0usize..11).prop_flat_map(|(len, gap, count)| {
        let stride = len + gap;
        let total = if count == 0 { 0 } else { (count - 1) * stride + len };
        (Just(len), Just(stride), Just(count), values(total), values(len), prop::collection::vec(0.0f32..1.0, count))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn dot_f32_matches_scalar((a, b) in two_vectors()) {
        let want = scalar::dot_f32(&a, &b);
        for isa in vector_isas() {
            assert_close(isa.dot_f32(&a, &b), want, magnitude(&a, &b), &format!("{isa:?}"));
        }
    }

    #[test]
    fn dot_rows_f32_matches_scalar_per_row((len, stride, count, rows, q, _w) in strided_rows()) {
        for isa in vector_isas() {
            let mut got = vec![f32::NAN; count];
            isa.dot_rows_f32(&q, &rows, stride, &mut got);
            for (t, g) in got.iter().enumerate() {
                let row = &rows[t * stride..t * stride + len];
                assert_close(*g, scalar::dot_f32(&q, row), magnitude(&q, row), &format!("{isa:?} row {t}"));
            }
        }
    }

    #[test]
    fn axpy_rows_matches_scalar_axpy((len, stride, _count, rows, y0, w) in strided_rows()) {
        let mut want = y0.clone();
        for (t, &wt) in w.iter().enumerate() {
            scalar::axpy(wt, &rows[t * stride..t * stride + len], &mut want);
        }
        for isa in vector_isas() {
            let mut got = y0.clone();
            isa.axpy_rows(&w, &rows, stride, &mut got);
            for (c, (g, v)) in got.iter().zip(&want).enumerate() {
                let mag = y0[c].abs() + w.iter().enumerate().map(|(t, wt)| (wt * rows[t * stride + c]).abs()).sum::<f32>();
                assert_close(*g, *v, mag, &format!("{isa:?} column {c}"));
            }
        }
    }

    #[test]
    fn update_rows_matches_scalar(
        (len, stride, count, rows0, y0, w) in strided_rows(),
        alpha in prop_oneof![Just(1.0f32), 0.0f32..1.5],
        per_row in any::<bool>(),
        rank1 in any::<bool>(),
    ) {
        // Per row (Kimi Delta Attention's per-channel decay): a factor of
        // its own for each row, around `alpha`.
        let alphas: Vec<f32> = w.iter().map(|wt| alpha * (0.5 + wt)).collect();
        let scale = if per_row { RowScale::PerRow(&alphas) } else { RowScale::Uniform(alpha) };
        let alpha_of = |t: usize| if per_row { alphas[t] } else { alpha };
        let c: Vec<f32> = w.iter().map(|wt| 1.0 - 2.0 * wt).collect();
        let u: Vec<f32> = y0.iter().map(|v| 0.5 - v).collect();
        let rank1 = rank1.then_some((c.as_slice(), u.as_slice()));
        let (mut want_rows, mut want_y) = (rows0.clone(), y0.clone());
        Isa::scalar().update_rows(scale, rank1, &mut want_rows, stride, &w, &mut want_y);
        // The scalar tier is the definition, written out.
        let mut def_rows = rows0.clone();
        let mut def_y = y0.clone();
        for t in 0..count {
            for j in 0..len {
                let r = &mut def_rows[t * stride + j];
                *r *= alpha_of(t);
                if let Some((c, u)) = rank1 {
                    *r += c[t] * u[j];
                }
                def_y[j] += w[t] * *r;
            }
        }
        prop_assert_eq!(&want_rows, &def_rows);
        prop_assert_eq!(&want_y, &def_y);
        for isa in vector_isas() {
            let (mut got_rows, mut got_y) = (rows0.clone(), y0.clone());
            isa.update_rows(scale, rank1, &mut got_rows, stride, &w, &mut got_y);
            for (i, (g, v)) in got_rows.iter().zip(&want_rows).enumerate() {
                let (t, j) = (i / stride, i % stride);
                if j >= len {
                    // Gaps between rows are not touched.
                    prop_assert_eq!(g.to_bits(), rows0[i].to_bits());
                    continue;
                }
                let mag = (alpha_of(t) * rows0[i]).abs() + rank1.map_or(0.0, |(c, u)| (c[t] * u[j]).abs());
                assert_close(*g, *v, mag, &format!("{isa:?} row {t} column {j}"));
            }
            for (j, (g, v)) in got_y.iter().zip(&want_y).enumerate() {
                let mag = y0[j].abs() + (0..count).map(|t| (w[t] * want_rows[t * stride + j]).abs()).sum::<f32>();
                assert_close(*g, *v, mag, &format!("{isa:?} y[{j}]"));
            }
        }
    }

    #[test]
    fn dot_bf16_matches_scalar((w, x) in two_vectors()) {
        let bits = f32_to_bf16_bits(&w);
        let widened: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
        let want = scalar::dot_bf16(&bits, &x);
        for isa in vector_isas() {
            assert_close(isa.dot_bf16(&bits, &x), want, magnitude(&widened, &x), &format!("{isa:?}"));
        }
    }

    #[test]
    fn dot_q8_matches_scalar((qs, scales, group, x) in q8_row()) {
        let want = scalar::dot_q8(&qs, &scales, group, &x);
        let mag = grouped_magnitude(|c| f32::from(qs[c]), &scales, group, &x);
        for isa in vector_isas() {
            assert_close(isa.dot_q8(&qs, &scales, group, &x), want, mag, &format!("{isa:?}"));
        }
    }

    #[test]
    fn dot_q4_matches_scalar((qs, scales, group, x) in q4_row()) {
        let want = scalar::dot_q4(&qs, &scales, group, &x);
        let mag = grouped_magnitude(|c| q4_at(&qs, c) as f32, &scales, group, &x);
        for isa in vector_isas() {
            assert_close(isa.dot_q4(&qs, &scales, group, &x), want, mag, &format!("{isa:?}"));
        }
    }

    #[test]
    fn dot_mxfp4_matches_scalar((codes, scales, x) in mxfp4_row()) {
        let want = scalar::dot_mxfp4(&codes, &scales, &x);
        let mut w = vec![0.0f32; x.len()];
        mxfp4::dequantize_mxfp4(&codes, &scales, &mut w);
        let mag = magnitude(&w, &x);
        for isa in vector_isas() {
            assert_close(isa.dot_mxfp4(&codes, &scales, &x), want, mag, &format!("{isa:?}"));
        }
    }

    #[test]
    fn axpy_matches_scalar((x, y) in two_vectors(), alpha in -2.0f32..2.0) {
        let mut want = y.clone();
        scalar::axpy(alpha, &x, &mut want);
        for isa in vector_isas() {
            let mut got = y.clone();
            isa.axpy(alpha, &x, &mut got);
            for i in 0..got.len() {
                // FMA vs separate multiply-add: one rounding apart.
                let mag = (alpha * x[i]).abs() + y[i].abs();
                assert_close(got[i], want[i], mag, &format!("{isa:?} axpy[{i}]"));
            }
        }
    }

    #[test]
    fn scale_matches_scalar(x in cols().prop_flat_map(values), alpha in -2.0f32..2.0) {
        let mut want = x.clone();
        scalar::scale(alpha, &mut want);
        for isa in vector_isas() {
            let mut got = x.clone();
            isa.scale(alpha, &mut got);
            // A single multiply rounds identically everywhere.
            prop_assert_eq!(&got, &want);
        }
    }

    /// The reference itself against an f64 evaluation of the definition.
    #[test]
    fn scalar_q4_matches_definition((qs, scales, group, x) in q4_row()) {
        let want: f64 = x
            .iter()
            .enumerate()
            .map(|(c, &xc)| f64::from(q4_at(&qs, c)) * f64::from(scales[c / group]) * f64::from(xc))
            .sum();
        let mag = grouped_magnitude(|c| q4_at(&qs, c) as f32, &scales, group, &x);
        assert_close(scalar::dot_q4(&qs, &scales, group, &x), want as f32, mag, "scalar q4");
    }

    #[test]
    fn scalar_mxfp4_matches_definition((codes, scales, x) in mxfp4_row()) {
        let mut w = vec![0.0f32; x.len()];
        mxfp4::dequantize_mxfp4(&codes, &scales, &mut w);
        let want: f64 = w.iter().zip(&x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
        assert_close(scalar::dot_mxfp4(&codes, &scales, &x), want as f32, magnitude(&w, &x), "scalar mxfp4");
    }

    #[test]
    fn scalar_q8_matches_definition((qs, scales, group, x) in q8_row()) {
        let want: f64 = x
            .iter()
            .enumerate()
            .map(|(c, &xc)| f64::from(qs[c]) * f64::from(scales[c / group]) * f64::from(xc))
            .sum();
        let mag = grouped_magnitude(|c| f32::from(qs[c]), &scales, group, &x);
        assert_close(scalar::dot_q8(&qs, &scales, group, &x), want as f32, mag, "scalar q8");
    }
}

#[test]
fn scalar_is_always_available() {
    assert_eq!(Isa::scalar().level(), IsaLevel::Scalar);
    assert_eq!(Isa::with_level(IsaLevel::Scalar), Some(Isa::scalar()));
    assert!(Isa::all_supported().contains(&Isa::scalar()));
    assert!(Isa::all_supported().contains(&Isa::detect()));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Detection and direct calls of the `#[target_feature]` bodies, so a
    //! dispatch bug cannot silently route everything to the scalar path.

    use super::*;
    use crate::simd::{avx2, avx512};

    fn has_avx512() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
    }

    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    #[test]
    fn detection_picks_the_best_tier() {
        let expected = if has_avx512() && is_x86_feature_detected!("avx512vnni") {
            IsaLevel::Avx512Vnni
        } else if has_avx512() {
            IsaLevel::Avx512
        } else if has_avx2() {
            IsaLevel::Avx2
        } else {
            IsaLevel::Scalar
        };
        assert_eq!(Isa::detect().level(), expected);
        assert_eq!(IsaLevel::Avx512.is_supported(), has_avx512());
        assert_eq!(IsaLevel::Avx2.is_supported(), has_avx2());
        // Development and CI hosts have AVX-512; say so loudly when not, so
        // a silently skipped vector path is visible in the test log.
        if !has_avx512() {
            eprintln!("note: no AVX-512 on this CPU; its kernels are untested here");
        }
    }

    /// Odd, non-multiple-of-vector sizes for the fixed direct-call cases.
    const COLS: usize = 203;
    const GROUP: usize = 34;

    struct Case {
        a: Vec<f32>,
        x: Vec<f32>,
        bits: Vec<u16>,
        q8: (Vec<i8>, Vec<f32>),
        q4: (Vec<u8>, Vec<f32>),
    }

    fn case() -> Case {
        let a: Vec<f32> = (0..COLS).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        let x: Vec<f32> = (0..COLS).map(|i| ((i * 53 % 97) as f32 - 48.0) / 30.0).collect();
        Case {
            bits: f32_to_bf16_bits(&a),
            q8: crate::quant::quantize_q8(&a, 1, COLS, GROUP),
            q4: crate::quant::quantize_q4(&a, 1, COLS, GROUP),
            a,
            x,
        }
    }

    /// Runs each kernel of one tier directly and compares with the scalar
    /// reference. `dots` is (f32, bf16, q8, q4).
    fn check_tier(c: &Case, dots: [f32; 4], axpy_out: &[f32], scale_out: &[f32]) {
        // Dequantized weights never exceed max|a|, so this bounds every
        // format's sum of |w x|.
        let a_max = c.a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mag: f32 = c.x.iter().map(|v| v.abs() * a_max).sum();
        let wants = [
            scalar::dot_f32(&c.a, &c.x),
            scalar::dot_bf16(&c.bits, &c.x),
            scalar::dot_q8(&c.q8.0, &c.q8.1, GROUP, &c.x),
            scalar::dot_q4(&c.q4.0, &c.q4.1, GROUP, &c.x),
        ];
        for (k, (got, want)) in dots.into_iter().zip(wants).enumerate() {
            assert_close(got, want, mag, &format!("kernel {k}"));
        }
        let mut want = c.x.clone();
        scalar::axpy(0.5, &c.a, &mut want);
        for i in 0..COLS {
            assert_close(axpy_out[i], want[i], c.a[i].abs() + c.x[i].abs(), "axpy");
        }
        let mut want = c.x.clone();
        scalar::scale(0.5, &mut want);
        assert_eq!(scale_out, want.as_slice());
    }

    #[test]
    fn avx512_kernels_called_directly() {
        if !has_avx512() {
            return;
        }
        let c = case();
        let (mut y, mut s) = (c.x.clone(), c.x.clone());
        // SAFETY: features detected above; all slices are COLS long and the
        // grouped rows come from the quantizers (GROUP is even).
        let dots = unsafe {
            avx512::axpy(0.5, &c.a, &mut y);
            avx512::scale(0.5, &mut s);
            [
                avx512::dot_f32(&c.a, &c.x),
                avx512::dot_bf16(&c.bits, &c.x),
                avx512::dot_q8(&c.q8.0, &c.q8.1, GROUP, &c.x),
                avx512::dot_q4(&c.q4.0, &c.q4.1, GROUP, &c.x),
            ]
        };
        check_tier(&c, dots, &y, &s);
    }

    /// The fused row update has an AVX-512 body only; checked directly so
    /// the fallback cannot stand in for it unnoticed.
    #[test]
    fn avx512_update_rows_called_directly() {
        if !has_avx512() {
            return;
        }
        let c = case();
        // 7 rows of 23 values, 29 apart, out of the case's 203 values.
        let (rows_n, len, stride) = (7, 23, 29);
        let coef: Vec<f32> = c.x[..rows_n].to_vec();
        let (u, w) = (&c.a[100..100 + len], &c.x[50..50 + rows_n]);
        let per_row: Vec<f32> = (0..rows_n).map(|t| 0.5 + 0.1 * t as f32).collect();
        let scales = [RowScale::Uniform(0.75), RowScale::PerRow(&per_row)];
        for (rank1, scale) in [None, Some((coef.as_slice(), u))].into_iter().flat_map(|r| scales.map(|s| (r, s))) {
            let (mut want_rows, mut want_y) = (c.a.clone(), c.x[..len].to_vec());
            Isa::scalar().update_rows(scale, rank1, &mut want_rows, stride, w, &mut want_y);
            let (mut got_rows, mut got_y) = (c.a.clone(), c.x[..len].to_vec());
            // SAFETY: features detected above; 6 * 29 + 23 <= 203 values,
            // one factor per row, and the rank-1 lengths match.
            unsafe { avx512::update_rows(scale, rank1, &mut got_rows, stride, w, &mut got_y) };
            for (i, (g, v)) in got_rows.iter().zip(&want_rows).enumerate() {
                assert_close(*g, *v, c.a[i].abs() + 4.0, &format!("row value {i}"));
            }
            for (j, (g, v)) in got_y.iter().zip(&want_y).enumerate() {
                assert_close(*g, *v, 64.0, &format!("y[{j}]"));
            }
        }
    }

    #[test]
    fn avx2_kernels_called_directly() {
        if !has_avx2() {
            return;
        }
        let c = case();
        let (mut y, mut s) = (c.x.clone(), c.x.clone());
        // SAFETY: as in `avx512_kernels_called_directly`.
        let dots = unsafe {
            avx2::axpy(0.5, &c.a, &mut y);
            avx2::scale(0.5, &mut s);
            [
                avx2::dot_f32(&c.a, &c.x),
                avx2::dot_bf16(&c.bits, &c.x),
                avx2::dot_q8(&c.q8.0, &c.q8.1, GROUP, &c.x),
                avx2::dot_q4(&c.q4.0, &c.q4.1, GROUP, &c.x),
            ]
        };
        check_tier(&c, dots, &y, &s);
    }
}
