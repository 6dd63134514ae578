//! MXFP4 weights as the hub's gpt-oss checkpoints store their experts, and
//! their dequantization to `f32`.
//!
//! A weight row of `cols` values is cut into blocks of [`BLOCK_VALUES`]:
//!
//! * `*_blocks`: [`BLOCK_BYTES`] bytes per block, two FP4 (e2m1) codes per
//!   byte, the low nibble first (value `2i` in the low nibble of byte `i`).
//! * `*_scales`: one byte per block, an E8M0 exponent: the block's values are
//!   multiplied by `2^(scale - 127)`.
//!
//! This is what transformers' `convert_moe_packed_tensors` reads. It widens
//! each code through the FP4 table (in bf16) and applies the exponent with
//! `torch.ldexp`, which multiplies by `pow(2.0, scale - 127)` computed in
//! f32 and rounds the product to bf16. Here the same product is taken in
//! f32; rounding it to bf16 would change nothing, because every code has at
//! most two significant bits, so every finite product (down to `0.5 *
//! 2^-127 = 2^-128`, which bf16 holds as a subnormal) is exact in bf16. The
//! edges follow f32 as torch's do: scale 0 is `2^-127` (an f32 subnormal),
//! scale 255 is `2^128 = inf` (so its zero codes give NaN, `0 * inf`), and
//! products past `f32::MAX` (e.g. `2.0 * 2^127`) are infinite.
//!
//! transformers then transposes the dequantized `[rows, cols]` to its own
//! parameter layout; the rows here stay in the checkpoint's order.

/// Values per block (one scale each).
pub const BLOCK_VALUES: usize = 32;

/// Bytes of packed codes per block.
pub const BLOCK_BYTES: usize = BLOCK_VALUES / 2;

/// The e2m1 code table: sign bit 3, then `0, 0.5, 1, 1.5, 2, 3, 4, 6`.
const FP4_VALUES: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// `2^(scale - 127)` as f32, exactly what `pow(2.0, scale - 127)` gives:
/// a power of two for every scale, the subnormal `2^-127` for 0 and
/// infinity for 255.
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
            pair[0] = FP4_VALUES[usize::from(byte & 0x0F)] * factor;
            pair[1] = FP4_VALUES[usize::from(byte >> 4)] * factor;
        }
    }
}
