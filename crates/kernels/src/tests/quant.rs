//! Quantizers: layouts, round-trip error bounds, bf16 rounding, formats.

use proptest::prelude::*;

use super::{CASES, cols, group};
use crate::quant::{
    QuantFormat, bf16_to_f32, f32_to_bf16, f32_to_bf16_bits, q4_at, quantize_q4, quantize_q8, round_ties_even_small,
};
use crate::{Error, MatData, Matrix};

/// A `[rows, cols]` matrix with a wide dynamic range per row, and a group.
fn matrix_case() -> impl Strategy<Value = (usize, usize, usize, Vec<f32>)> {
    (1usize..=4, cols(), group()).prop_flat_map(|(rows, cols, group)| {
        (
            Just(rows),
            Just(cols),
            Just(group),
            prop::collection::vec(prop_oneof![-3.0f32..3.0, -0.01f32..0.01, Just(0.0f32)], rows * cols),
        )
    })
}

/// Asserts `|x - deq| <= scale / 2` plus float slack, value by value.
fn assert_round_trip(src: &[f32], deq: &[f32], scales: &[f32], cols: usize, group: usize) {
    let groups = cols.div_ceil(group);
    for (i, (&x, &d)) in src.iter().zip(deq).enumerate() {
        let scale = scales[(i / cols) * groups + (i % cols) / group];
        let bound = scale / 2.0 * (1.0 + 1e-5) + x.abs() * 1e-6;
        assert!((x - d).abs() <= bound, "value {i}: {x} dequantized to {d}, scale {scale}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn q8_round_trip_within_half_a_step((rows, cols, group, src) in matrix_case()) {
        let (qs, scales) = quantize_q8(&src, rows, cols, group);
        prop_assert!(qs.iter().all(|&q| q >= -127));
        let m = Matrix::new(rows, cols, MatData::Q8 { qs: &qs, scales: &scales, group }).unwrap();
        assert_round_trip(&src, &m.to_f32(), &scales, cols, group);
    }

    #[test]
    fn q4_round_trip_within_half_a_step((rows, cols, group, src) in matrix_case()) {
        let (qs, scales) = quantize_q4(&src, rows, cols, group);
        prop_assert_eq!(qs.len(), rows * cols.div_ceil(2));
        let m = Matrix::new(rows, cols, MatData::Q4 { qs: &qs, scales: &scales, group }).unwrap();
        assert_round_trip(&src, &m.to_f32(), &scales, cols, group);
    }

    #[test]
    fn grouped_scales_are_max_abs_over_q_max((rows, cols, group, src) in matrix_case()) {
        let (_, s8) = quantize_q8(&src, rows, cols, group);
        let (_, s4) = quantize_q4(&src, rows, cols, group);
        let mut k = 0;
        for row in src.chunks(cols.max(1)).take(rows) {
            for chunk in row.chunks(group) {
                let max = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                prop_assert_eq!(s8[k], max / 127.0);
                prop_assert_eq!(s4[k], max / 7.0);
                k += 1;
            }
        }
        prop_assert_eq!(k, s8.len());
    }

    #[test]
    fn bf16_matches_half_crate_rounding(bits in any::<u32>()) {
        let x = f32::from_bits(bits);
        prop_assume!(!x.is_nan());
        prop_assert_eq!(f32_to_bf16(x), half::bf16::from_f32(x).to_bits());
    }
}

#[test]
fn bf16_rounds_to_nearest_even() {
    let one_plus = |k: u32| f32::from_bits(0x3F80_0000 + k);
    assert_eq!(f32_to_bf16(1.0), 0x3F80);
    // Exactly halfway between 0x3F80 and 0x3F81: ties go to the even 0x3F80.
    assert_eq!(f32_to_bf16(one_plus(0x8000)), 0x3F80);
    // Halfway between 0x3F81 and 0x3F82: ties go to the even 0x3F82.
    assert_eq!(f32_to_bf16(one_plus(0x1_8000)), 0x3F82);
    // Just above halfway rounds up.
    assert_eq!(f32_to_bf16(one_plus(0x8001)), 0x3F81);
    assert_eq!(f32_to_bf16(f32::NAN), 0x7FC0);
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7F80, "rounds up into infinity");
    assert_eq!(f32_to_bf16_bits(&[-2.0, 0.5]), vec![0xC000, 0x3F00]);
    assert_eq!(bf16_to_f32(0xC000), -2.0);
}

#[test]
fn q4_layout_low_nibble_is_even_column() {
    // One group of 3 with max 7: scale 1, codes 1, -2, 7 -> nibbles 9, 6, 15.
    let (qs, scales) = quantize_q4(&[1.0, -2.0, 7.0], 1, 3, 8);
    assert_eq!(scales, vec![1.0]);
    // The unused high nibble of the odd row's last byte encodes 0 (8).
    assert_eq!(qs, vec![0x69, 0x8F]);
    assert_eq!([q4_at(&qs, 0), q4_at(&qs, 1), q4_at(&qs, 2)], [1, -2, 7]);
}

#[test]
fn q4_rows_start_on_fresh_bytes() {
    let (qs, _) = quantize_q4(&[7.0, 7.0, 7.0, -7.0, -7.0, -7.0], 2, 3, 3);
    // 15 = 7 + 8, 1 = -7 + 8; each row is 2 bytes, padded with 8.
    assert_eq!(qs, vec![0xFF, 0x8F, 0x11, 0x81]);
}

#[test]
fn q8_layout_and_rounding() {
    // Partial last group [2.0]; 63.5 / 127 * 127 is a tie that rounds to even.
    let (qs, scales) = quantize_q8(&[127.0, -63.5, 0.0, 2.0], 1, 4, 3);
    assert_eq!(scales, vec![1.0, 2.0 / 127.0]);
    assert_eq!(qs, vec![127, -64, 0, 127]);
}

#[test]
fn rounding_without_libm_is_round_ties_even_over_the_quantizers_range() {
    // Every multiple of 2^-10 over the int16 activations' range (the widest
    // caller; the weight quantizers stay within ±127), every tie, and the
    // floats either side of each tie. Equal as floats: a negative value that
    // rounds to zero gives +0.0 here, -0.0 from libm, and both cast to 0.
    let grid = (-(32_768i32 << 10)..=(32_768 << 10)).map(|i| i as f32 / 1024.0);
    let ties = (-32_768..32_768).map(|i| i as f32 + 0.5).flat_map(|tie| [tie, tie.next_down(), tie.next_up()]);
    let edges = [4_194_304.0, -4_194_304.0, 4_194_303.5, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, -0.0];
    for v in grid.chain(ties).chain(edges) {
        let (got, want) = (round_ties_even_small(v), v.round_ties_even());
        assert!(got == want, "{v}: {got} against {want}");
    }
}

#[test]
fn zero_groups_have_zero_scale_and_dequantize_to_zero() {
    let src = [0.0f32; 10];
    let (q8, s8) = quantize_q8(&src, 2, 5, 2);
    let (q4, s4) = quantize_q4(&src, 2, 5, 2);
    assert!(s8.iter().chain(&s4).all(|&s| s == 0.0));
    assert!(q8.iter().all(|&q| q == 0));
    let m4 = Matrix::new(2, 5, MatData::Q4 { qs: &q4, scales: &s4, group: 2 }).unwrap();
    assert!(m4.to_f32().iter().all(|&v| v == 0.0));
}

#[test]
fn format_ordinals_names_and_sizes() {
    for (i, format) in QuantFormat::ALL.into_iter().enumerate() {
        assert_eq!(usize::from(format.ordinal()), i);
        assert_eq!(QuantFormat::from_ordinal(format.ordinal()), Ok(format));
        assert_eq!(format.name().parse::<QuantFormat>(), Ok(format));
        assert_eq!(format.to_string(), format.name());
    }
    assert_eq!(QuantFormat::F32.ordinal(), 0);
    assert_eq!(QuantFormat::Bf16.ordinal(), 1);
    assert_eq!(QuantFormat::Q8.ordinal(), 2);
    assert_eq!(QuantFormat::Q4.ordinal(), 3);
    assert_eq!(QuantFormat::Mxfp4.ordinal(), 4);
    assert!(matches!(QuantFormat::from_ordinal(5), Err(Error::UnknownFormatOrdinal { ordinal: 5 })));
    assert!(matches!("q5".parse::<QuantFormat>(), Err(Error::UnknownFormatName { .. })));

    assert_eq!(QuantFormat::F32.weight_bytes(3, 5), 60);
    assert_eq!(QuantFormat::Bf16.weight_bytes(3, 5), 30);
    assert_eq!(QuantFormat::Q8.weight_bytes(3, 5), 15);
    assert_eq!(QuantFormat::Q4.weight_bytes(3, 5), 9);
    assert_eq!(QuantFormat::F32.scale_count(3, 5, 2), 0);
    assert_eq!(QuantFormat::Q8.scale_count(3, 5, 2), 9);
    assert_eq!(QuantFormat::Q4.scale_count(3, 64, 32), 6);
    // MXFP4: half a byte a value, one scale byte per 32 whatever the group.
    assert_eq!(QuantFormat::Mxfp4.weight_bytes(3, 64), 96);
    assert_eq!(QuantFormat::Mxfp4.scale_count(3, 64, 0), 6);
    assert_eq!(QuantFormat::Mxfp4.scale_bytes(3, 64, 0), 6);
    assert_eq!(QuantFormat::Q4.scale_bytes(3, 64, 32), 24);
    // Invalid or overflowing inputs saturate instead of panicking.
    assert_eq!(QuantFormat::Q8.scale_count(3, 5, 0), usize::MAX);
    assert_eq!(QuantFormat::F32.weight_bytes(usize::MAX, 2), usize::MAX);
}
