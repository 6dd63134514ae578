//! MXFP4: its element and scale values against their OCP definitions,
//! dequantization against hand-computed values and torch's f32 semantics at
//! the exponent edges, and matrices kept in the layout.

use proptest::prelude::*;

use super::{CASES, simd::mxfp4_row};
use crate::mxfp4::{
    BLOCK_BYTES, BLOCK_VALUES, E2M1_SIGNED_HALF_UNITS, E8M0_NAN, dequantize_mxfp4, e2m1_to_f32, e8m0_to_f32,
};
use crate::quant::{QuantFormat, bf16_to_f32, f32_to_bf16};
use crate::simd::Isa;
use crate::{Error, MatData, Matrix};

/// OCP MX v1.0, E2M1: sign bit 3, exponent bits 2..1 with bias 1, mantissa
/// bit 0; exponent 0 is subnormal, `2^(1 - bias) * (m / 2)`, and there is
/// no infinity or NaN.
#[test]
fn every_e2m1_code_is_its_ocp_value() {
    for code in 0..16u8 {
        let (sign, exponent, mantissa) = (code >> 3, i32::from((code >> 1) & 3), f64::from(code & 1));
        let magnitude = if exponent == 0 { mantissa / 2.0 } else { 2f64.powi(exponent - 1) * (1.0 + mantissa / 2.0) };
        let want = if sign == 1 { -magnitude } else { magnitude } as f32;
        assert_eq!(e2m1_to_f32(code).to_bits(), want.to_bits(), "code {code:#06b}");
    }
}

/// OCP MX v1.0, E8M0: eight exponent bits, bias 127, no sign or mantissa;
/// every byte but 0xFF is `2^(e - 127)` (0 the f32 subnormal `2^-127`),
/// 0xFF is NaN.
#[test]
fn every_e8m0_scale_but_nan_is_its_ocp_power_of_two() {
    for scale in 0..E8M0_NAN {
        let want = (i32::from(scale) - 127) as f64;
        assert_eq!(f64::from(e8m0_to_f32(scale)), want.exp2(), "scale {scale}");
    }
    assert_eq!(E8M0_NAN, 0xFF);
}

/// The vector paths look codes up doubled, as bytes.
#[test]
fn the_vector_code_table_is_every_code_doubled() {
    for code in 0..16u8 {
        assert_eq!(f32::from(E2M1_SIGNED_HALF_UNITS[usize::from(code)]), 2.0 * e2m1_to_f32(code), "code {code}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// A matrix kept as a checkpoint's bytes: its rows dequantize as the
    /// checkpoint's blocks do, its products on every tier match the
    /// dequantized rows', and its row ranges are the same rows.
    #[test]
    fn an_mxfp4_matrix_is_its_checkpoint_blocks(rows in 1usize..=4, (codes, scales, x) in mxfp4_row()) {
        let cols = x.len();
        let all_codes = codes.repeat(rows);
        let all_scales = scales.repeat(rows);
        let m = Matrix::from_bytes(QuantFormat::Mxfp4, rows, cols, 0, &all_codes, &all_scales).unwrap();
        prop_assert_eq!(m.data, MatData::Mxfp4 { codes: &all_codes, scales: &all_scales });
        let mut want = vec![0.0f32; rows * cols];
        dequantize_mxfp4(&all_codes, &all_scales, &mut want);
        prop_assert_eq!(m.to_f32(), want.clone());
        for isa in Isa::all_supported() {
            let mut y = vec![f32::NAN; rows];
            m.matvec_with(isa, &x, &mut y);
            for &got in &y {
                prop_assert_eq!(got.to_bits(), isa.dot_mxfp4(&codes, &scales, &x).to_bits(), "{:?}", isa);
            }
        }
        if rows > 1 {
            prop_assert_eq!(m.row_range(1, rows - 1).unwrap().to_f32(), want[cols..].to_vec());
        }
    }
}

#[test]
fn an_mxfp4_row_of_part_of_a_block_is_refused() {
    let codes = [0u8; BLOCK_BYTES + 1];
    let got = Matrix::new(1, BLOCK_VALUES + 2, MatData::Mxfp4 { codes: &codes, scales: &[127, 127] });
    assert_eq!(got, Err(Error::PartialMxfp4Block { cols: BLOCK_VALUES + 2 }));
    let got = Matrix::from_bytes(QuantFormat::Mxfp4, 1, 2, 0, &[0], &[127]);
    assert_eq!(got, Err(Error::PartialMxfp4Block { cols: 2 }));
}

#[test]
fn an_mxfp4_matrix_with_a_scale_missing_is_refused() {
    let codes = [0u8; 2 * BLOCK_BYTES];
    let got = Matrix::from_bytes(QuantFormat::Mxfp4, 1, 2 * BLOCK_VALUES, 0, &codes, &[127]);
    assert!(matches!(got, Err(Error::Length { what: "scales", expected: 2, actual: 1, .. })), "{got:?}");
}

/// One block whose first byte is `byte` (the rest zero codes).
fn first_pair(byte: u8, scale: u8) -> [f32; 2] {
    let mut blocks = [0u8; BLOCK_BYTES];
    blocks[0] = byte;
    let mut out = [0.0f32; BLOCK_VALUES];
    dequantize_mxfp4(&blocks, &[scale], &mut out);
    [out[0], out[1]]
}

#[test]
fn the_low_nibble_is_the_first_value() {
    // Code 1 = 0.5 low, code 2 = 1.0 high; scale 127 is 2^0.
    assert_eq!(first_pair(0x21, 127), [0.5, 1.0]);
    // Code 7 = 6.0, code 15 = -6.0; scale 128 doubles them.
    assert_eq!(first_pair(0xF7, 128), [12.0, -12.0]);
    // Scale 125 quarters: code 5 = 3.0, code 11 = -1.5.
    assert_eq!(first_pair(0xB5, 125), [0.75, -0.375]);
}

#[test]
fn code_eight_is_negative_zero() {
    let [zero, negative_zero] = first_pair(0x80, 127);
    assert_eq!(zero.to_bits(), 0.0f32.to_bits());
    assert_eq!(negative_zero.to_bits(), (-0.0f32).to_bits());
}

#[test]
fn each_block_takes_its_own_scale_in_order() {
    // Block 0: every code 2 (1.0) at 2^1; block 1: every code 10 (-1.0) at 2^-1.
    let blocks: Vec<u8> = [[0x22u8; BLOCK_BYTES], [0xAAu8; BLOCK_BYTES]].concat();
    let mut out = vec![0.0f32; 2 * BLOCK_VALUES];
    dequantize_mxfp4(&blocks, &[128, 126], &mut out);
    assert!(out[..BLOCK_VALUES].iter().all(|&v| v == 2.0));
    assert!(out[BLOCK_VALUES..].iter().all(|&v| v == -0.5));
}

#[test]
fn every_scale_is_the_f32_power_of_two_torch_computes() {
    for scale in 0..=255u8 {
        // `pow(2.0, scale - 127)` in f32: exact in f64, then rounded once
        // (2^-127 is an f32 subnormal, 2^128 overflows to infinity).
        let want = 2.0f64.powi(i32::from(scale) - 127) as f32;
        assert_eq!(e8m0_to_f32(scale).to_bits(), want.to_bits(), "scale {scale}");
    }
}

#[test]
fn the_smallest_scale_keeps_subnormal_values() {
    assert_eq!(first_pair(0x71, 0), [2.0f32.powi(-128), 6.0 * 2.0f32.powi(-127)]);
    assert!(first_pair(0x71, 0)[0] > 0.0, "2^-128 is an f32 subnormal, not zero");
}

#[test]
fn large_scales_overflow_to_infinity_as_in_f32() {
    // 2^127: 1.5 * 2^127 is finite, 2.0 * 2^127 is not.
    assert_eq!(first_pair(0x43, 254), [1.5 * 2.0f32.powi(127), f32::INFINITY]);
    assert_eq!(first_pair(0xC0, 254)[1], f32::NEG_INFINITY);
    // 2^128 is already infinite: 0 * inf is NaN.
    let [zero_code, half] = first_pair(0x10, 255);
    assert!(zero_code.is_nan());
    assert_eq!(half, f32::INFINITY);
    assert_eq!(first_pair(0x90, 255)[1], f32::NEG_INFINITY);
}

/// transformers produces bf16; the f32 products must be those same values.
#[test]
fn every_dequantized_value_is_exact_in_bf16() {
    let blocks: Vec<u8> = (0..=255u8).flat_map(|_| (0..BLOCK_BYTES as u8).map(|i| i * 0x11)).collect();
    let scales: Vec<u8> = (0..=255u8).collect();
    let mut out = vec![0.0f32; 256 * BLOCK_VALUES];
    dequantize_mxfp4(&blocks, &scales, &mut out);
    for (i, &v) in out.iter().enumerate() {
        let rounded = bf16_to_f32(f32_to_bf16(v));
        assert!(rounded.to_bits() == v.to_bits() || (v.is_nan() && rounded.is_nan()), "value {i}: {v}");
    }
}

#[test]
#[should_panic(expected = "16 code bytes per scale")]
fn blocks_shorter_than_their_scales_are_refused() {
    dequantize_mxfp4(&[0; BLOCK_BYTES], &[127, 127], &mut [0.0; 2 * BLOCK_VALUES]);
}

#[test]
#[should_panic(expected = "32 outputs per scale")]
fn an_output_of_the_wrong_length_is_refused() {
    dequantize_mxfp4(&[0; BLOCK_BYTES], &[127], &mut [0.0; BLOCK_VALUES - 1]);
}
