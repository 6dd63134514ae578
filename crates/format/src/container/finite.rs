//! Every float a container stores must be finite: a NaN or infinite
//! quantization scale (or f32/bf16 weight, or MXFP4's E8M0 NaN scale) turns
//! every answer it touches into garbage without any other sign. Conversion never writes one (it
//! refuses non-finite source values, and a scale is `max|x| / 127` of finite
//! values); these checks catch damage on disk when a tensor is loaded.

use strata_kernels::QuantFormat;
use strata_kernels::mxfp4::E8M0_NAN;

/// The first non-finite float of a stored matrix: what it is (`"weight"` or
/// `"scale"`), its index among those, and its value.
pub(super) fn first_non_finite(
    format: QuantFormat,
    weights: &[u8],
    scales: &[u8],
) -> Option<(&'static str, usize, f32)> {
    let weight = match format {
        QuantFormat::F32 => first_non_finite_f32(weights),
        QuantFormat::Bf16 => first_non_finite_bf16(weights),
        // Integer weights (and E2M1 codes) have no non-finite values.
        QuantFormat::Q8 | QuantFormat::Q4 | QuantFormat::Mxfp4 => None,
    };
    let scale = || match format {
        // E8M0 scales are bytes; OCP reserves one of them for NaN.
        QuantFormat::Mxfp4 => scales.iter().position(|&scale| scale == E8M0_NAN).map(|index| (index, f32::NAN)),
        QuantFormat::F32 | QuantFormat::Bf16 | QuantFormat::Q8 | QuantFormat::Q4 => first_non_finite_f32(scales),
    };
    weight
        .map(|(index, value)| ("weight", index, value))
        .or_else(|| scale().map(|(index, value)| ("scale", index, value)))
}

/// Host-order f32 values (the container's byte order, see docs/FORMAT.md).
fn first_non_finite_f32(bytes: &[u8]) -> Option<(usize, f32)> {
    // `all` over plain floats vectorises; the position is looked up only
    // once something is wrong.
    let value = |chunk: &[u8]| f32::from_ne_bytes(chunk.try_into().expect("chunks of 4"));
    if bytes.chunks_exact(4).all(|c| value(c).is_finite()) {
        return None;
    }
    bytes.chunks_exact(4).map(value).enumerate().find(|(_, v)| !v.is_finite())
}

/// bf16 values: the upper half of an f32, non-finite when every exponent bit
/// is set.
fn first_non_finite_bf16(bytes: &[u8]) -> Option<(usize, f32)> {
    const EXPONENT: u16 = 0x7f80;
    let bits = |chunk: &[u8]| u16::from_ne_bytes(chunk.try_into().expect("chunks of 2"));
    if bytes.chunks_exact(2).all(|c| bits(c) & EXPONENT != EXPONENT) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(bits)
        .enumerate()
        .find(|(_, b)| b & EXPONENT == EXPONENT)
        .map(|(index, b)| (index, f32::from_bits(u32::from(b) << 16)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    #[test]
    fn finds_the_first_non_finite_weight_or_scale() {
        let good = f32_bytes(&[1.0, -3.39e38, 0.0]);
        assert_eq!(first_non_finite(QuantFormat::F32, &good, &[]), None);
        let bad = f32_bytes(&[1.0, f32::INFINITY, f32::NAN]);
        assert_eq!(first_non_finite(QuantFormat::F32, &bad, &[]), Some(("weight", 1, f32::INFINITY)));
        let (kind, index, value) = first_non_finite(QuantFormat::Q4, &[0xff; 8], &bad[4..]).unwrap();
        assert_eq!((kind, index), ("scale", 0));
        assert!(value.is_infinite());
        let nan_scale = f32_bytes(&[0.5, f32::NAN]);
        let (kind, index, value) = first_non_finite(QuantFormat::Q8, &[0x80; 8], &nan_scale).unwrap();
        assert_eq!((kind, index), ("scale", 1));
        assert!(value.is_nan());
    }

    #[test]
    fn an_mxfp4_scale_of_e8m0_nan_is_found_and_its_codes_never_are() {
        assert_eq!(first_non_finite(QuantFormat::Mxfp4, &[0xff; 32], &[0, 127, 254]), None);
        let (kind, index, value) = first_non_finite(QuantFormat::Mxfp4, &[0xff; 32], &[127, 0xff, 0xff]).unwrap();
        assert_eq!((kind, index), ("scale", 1));
        assert!(value.is_nan());
    }

    #[test]
    fn bf16_infinities_and_nans_are_found_by_their_exponent() {
        let bf16 = |v: f32| ((v.to_bits() >> 16) as u16).to_ne_bytes();
        let bytes: Vec<u8> = [1.0f32, 65504.0, f32::NEG_INFINITY].iter().flat_map(|&v| bf16(v)).collect();
        assert_eq!(first_non_finite(QuantFormat::Bf16, &bytes, &[]), Some(("weight", 2, f32::NEG_INFINITY)));
        assert_eq!(first_non_finite(QuantFormat::Bf16, &bytes[..4], &[]), None);
    }
}
