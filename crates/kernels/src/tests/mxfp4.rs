//! MXFP4 dequantization against hand-computed values and torch's f32
//! semantics at the exponent edges.

use crate::mxfp4::{BLOCK_BYTES, BLOCK_VALUES, dequantize_mxfp4, e8m0_to_f32};
use crate::quant::{bf16_to_f32, f32_to_bf16};

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
