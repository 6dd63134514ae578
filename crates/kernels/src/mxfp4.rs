//! MXFP4 weights (the OCP Microscaling Formats v1.0 MXFP4 type): the layout
//! of the hub's gpt-oss experts (`*_blocks`/`*_scales`) and of Kimi K3's
//! compressed-tensors "mxfp4-pack-quantized" experts
//! (`weight_packed`/`weight_scale`), their dequantization to `f32`, and the
//! checks of a row kept in that layout ([`crate::MatData::Mxfp4`], whose
//! products are [`crate::scalar::dot_mxfp4`] and [`crate::simd::Isa::dot_mxfp4`]).
//!
//! A weight row of `cols` values is cut into blocks of [`BLOCK_VALUES`]:
//!
//! * codes (`*_blocks`, `weight_packed`): [`BLOCK_BYTES`] bytes per block,
//!   two E2M1 codes per byte, the low nibble first (value `2i` in the low
//!   nibble of byte `i`). E2M1 is sign bit 3, exponent bits 2..1 (bias 1)
//!   and mantissa bit 0: `0, 0.5, 1, 1.5, 2, 3, 4, 6` and their negatives.
//! * scales (`*_scales`, `weight_scale`): one byte per block, an E8M0
//!   exponent: the block's values are multiplied by `2^(scale - 127)`. OCP
//!   makes 255 ([`E8M0_NAN`]) NaN; a matrix kept in this layout must not
//!   hold it (the container's finiteness check refuses it), so its products
//!   never meet it.
//!
//! A row kept in the layout is whole blocks (`cols` a multiple of
//! [`BLOCK_VALUES`]), as every MXFP4 checkpoint's rows are.
//!
//! [`dequantize_mxfp4`] is what transformers' `convert_moe_packed_tensors`
//! computes for gpt-oss. It widens each code through the FP4 table (in
//! bf16) and applies the exponent with `torch.ldexp`, which multiplies by
//! `pow(2.0, scale - 127)` computed in f32 and rounds the product to bf16.
//! Here the same product is taken in f32; rounding it to bf16 would change
//! nothing, because every code has at most two significant bits, so every
//! finite product (down to `0.5 * 2^-127 = 2^-128`, which bf16 holds as a
//! subnormal) is exact in bf16. The edges follow f32 as torch's do: scale 0
//! is `2^-127` (an f32 subnormal), scale 255 is `2^128 = inf` (so its zero
//! codes give NaN, `0 * inf`), and products past `f32::MAX` (e.g. `2.0 *
//! 2^127`) are infinite.
//!
//! transformers then transposes the dequantized `[rows, cols]` to its own
//! parameter layout; the rows here stay in the checkpoint's order.

/// Values per block (one scale each).
pub const BLOCK_VALUES: usize = 32;

/// Bytes of packed codes per block.
pub const BLOCK_BYTES: usize = BLOCK_VALUES / 2;

/// The E8M0 scale OCP reserves for NaN.
pub const E8M0_NAN: u8 = 0xFF;

/// The E2M1 magnitudes of codes 0..8 in half units (`2 |value|`): small
/// integers, so vector paths look them up as bytes and fold the half into
/// the block's scale, exactly (scales are powers of two).
pub(crate) const E2M1_HALF_UNITS: [u8; 8] = [0, 1, 2, 3, 4, 6, 8, 12];

/// [`E2M1_HALF_UNITS`] for all 16 codes, signed (code 8, `-0.0`, is 0):
/// the byte table the vector paths look codes up in.
pub(crate) const E2M1_SIGNED_HALF_UNITS: [i8; 16] = {
    let mut table = [0i8; 16];
    let mut code = 0;
    while code < 8 {
        // At most 12: the cast is exact.
        table[code] = E2M1_HALF_UNITS[code] as i8;
        table[code + 8] = -table[code];
        code += 1;
    }
    table
};

/// The value of E2M1 code `code & 0xF`; code 8 is `-0.0`.
pub fn e2m1_to_f32(code: u8) -> f32 {
    let magnitude = f32::from(E2M1_HALF_UNITS[usize::from(code & 7)]) * 0.5;
    if code & 8 == 0 { magnitude } else { -magnitude }
}

/// `2^(scale - 127)` as f32, exactly what `pow(2.0, scale - 127)` gives:
/// a power of two for every scale, the subnormal `2^-127` for 0 and
/// infinity for 255 (torch's value; OCP's is NaN, see [`E8M0_NAN`]).
pub fn e8m0_to_f32(scale: u8) -> f32 {
    match scale {
        // The exponent field cannot hold 2^-127; it is the subnormal with
        // the top mantissa bit set.
        0 => f32::from_bits(1 << 22),
        // Exponent field `scale` is 2^(scale - 127); 255 is infinity.
        _ => f32::from_bits(u32::from(scale) << 23),
    }
}

/// Dequantizes MXFP4 blocks into `out`: block `b` (bytes
/// `b * BLOCK_BYTES..`, scale `scales[b]`) fills `out[b * BLOCK_VALUES..]`.
///
/// # Panics
/// If `blocks` does not hold [`BLOCK_BYTES`] per scale or `out` does not
/// hold [`BLOCK_VALUES`] per scale.
pub fn dequantize_mxfp4(blocks: &[u8], scales: &[u8], out: &mut [f32]) {
    assert_eq!(Some(blocks.len()), scales.len().checked_mul(BLOCK_BYTES), "mxfp4: 16 code bytes per scale");
    assert_eq!(Some(out.len()), scales.len().checked_mul(BLOCK_VALUES), "mxfp4: 32 outputs per scale");
    for ((codes, &scale), values) in
        blocks.chunks_exact(BLOCK_BYTES).zip(scales).zip(out.chunks_exact_mut(BLOCK_VALUES))
    {
        let factor = e8m0_to_f32(scale);
        for (&byte, pair) in codes.iter().zip(values.chunks_exact_mut(2)) {
            pair[0] = e2m1_to_f32(byte & 0x0F) * factor;
            pair[1] = e2m1_to_f32(byte >> 4) * factor;
        }
    }
}

/// Code `col` of a packed row, doubled ([`E2M1_SIGNED_HALF_UNITS`]) as the
/// vector paths compute it, for the columns they finish in scalar.
#[cfg(target_arch = "x86_64")]
pub(crate) fn signed_half_units_at(codes: &[u8], col: usize) -> f32 {
    let byte = codes[col / 2];
    let code = if col.is_multiple_of(2) { byte & 0x0F } else { byte >> 4 };
    f32::from(E2M1_SIGNED_HALF_UNITS[usize::from(code)])
}

/// Asserts the length invariants of one MXFP4 row of `x.len()` columns:
/// whole blocks, [`BLOCK_BYTES`] code bytes and one scale each. The SIMD
/// paths rely on them for memory safety.
pub(crate) fn check_row(codes: &[u8], scales: &[u8], x: &[f32]) {
    assert!(x.len().is_multiple_of(BLOCK_VALUES), "mxfp4 row: {} columns are not whole blocks of 32", x.len());
    assert_eq!(codes.len(), x.len() / 2, "mxfp4 row: code bytes do not match x length");
    assert_eq!(scales.len(), x.len() / BLOCK_VALUES, "mxfp4 row: one scale per 32 columns");
}
