//! Block-scaled FP8 weights as DeepSeek-V3/V4, Kimi K2 and GLM-5-FP8 publish
//! them (and DeepSeek V4's FP4 experts, [`fp4_experts`]): `X.weight` in
//! float8 e4m3 (`F8_E4M3`) next to `X.weight_scale_inv`, one scale per block of `weight_block_size` (128 × 128) elements of the
//! last two dimensions. Despite the name the scale multiplies:
//! `w[i, j] = e4m3(q[i, j]) * scale_inv[i / 128, j / 128]`, as transformers'
//! `finegrained_fp8` dequantizes.

use std::sync::LazyLock;

use serde_json::Value;

/// The block size when config.json does not give `weight_block_size`.
pub const DEFAULT_BLOCK: [usize; 2] = [128, 128];

/// Names under which the scales of FP8 (or FP4) tensor `name` may be
/// stored, most common first: `weight_scale_inv` (DeepSeek, Kimi, GLM),
/// `weight_scale` (compressed-tensors block FP8, also a multiplier), `scale`
/// (DeepSeek V4's hub checkpoints, which transformers renames to
/// `weight_scale_inv` on load), and `<name>_scale_inv` for tensors without a
/// `.weight` suffix (transformers' fused experts).
pub fn scale_candidates(name: &str) -> Vec<String> {
    match name.strip_suffix(".weight") {
        Some(stem) => {
            vec![format!("{stem}.weight_scale_inv"), format!("{stem}.weight_scale"), format!("{stem}.scale")]
        }
        None => vec![format!("{name}_scale_inv"), format!("{name}_scale")],
    }
}

/// FP4 weights as DeepSeek V4 publishes its routed experts
/// (`expert_dtype: "fp4"`, at the top of config.json or inside
/// `quantization_config`): an `I8` tensor with two e2m1 codes per byte, the
/// even column in the low nibble, so its last dimension is half the
/// matrix's; one scale per row and per [`FP4_BLOCK`]`[1]` columns,
/// as transformers' `FP8Experts` allocates them (`sf_gran_n = 1`,
/// `sf_gran_k = 32`) and `Fp8Dequantize` unpacks them.
pub fn fp4_experts(config: &Value) -> bool {
    let says_fp4 = |v: Option<&Value>| v.and_then(Value::as_str) == Some("fp4");
    says_fp4(config.get("expert_dtype"))
        || says_fp4(config.get("quantization_config").and_then(|q| q.get("expert_dtype")))
}

/// The scale block of an FP4 tensor: one row by 32 columns.
pub const FP4_BLOCK: [usize; 2] = [1, 32];

/// Dequantizes flat elements `first..first + count` of an FP4 tensor from
/// `bytes`, its packed bytes `first / 2..(first + count).div_ceil(2)`.
pub fn dequantize_fp4(bytes: &[u8], first: usize, count: usize, grid: &ScaleGrid, scales: &[f32]) -> Vec<f32> {
    let byte0 = first / 2;
    (first..first + count)
        .map(|i| {
            let byte = bytes[i / 2 - byte0];
            let code = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
            strata_kernels::mxfp4::e2m1_to_f32(code) * scales[grid.scale_index(i)]
        })
        .collect()
}

/// `quantization_config.weight_block_size` of a config.json, if well formed.
pub fn block_size(config: &Value) -> Option<[usize; 2]> {
    let sizes = config.get("quantization_config")?.get("weight_block_size")?.as_array()?;
    match sizes.as_slice() {
        [r, c] => Some([r.as_u64()? as usize, c.as_u64()? as usize]).filter(|b| b[0] > 0 && b[1] > 0),
        _ => None,
    }
}

/// Every e4m3fn byte as f32: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
/// no infinities, `S.1111.111` is NaN.
static E4M3: LazyLock<[f32; 256]> = LazyLock::new(|| {
    let mut table = [0.0f32; 256];
    for (byte, value) in table.iter_mut().enumerate() {
        let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = ((byte >> 3) & 0xF) as i32;
        let man = (byte & 7) as f32;
        *value = if exp == 0xF && byte & 7 == 7 {
            f32::NAN
        } else if exp == 0 {
            sign * man * 2f32.powi(-9)
        } else {
            sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
        };
    }
    table
});

/// One float8 e4m3fn value.
pub fn e4m3_to_f32(byte: u8) -> f32 {
    E4M3[byte as usize]
}

/// One float8 e8m0 (UE8M0, a power of two) scale: `2^(byte - 127)`. The
/// kernels' decoding, so block-scaled float8 and MXFP4 read a scale alike;
/// 255 gives infinity, which the converter's finiteness check refuses.
pub use strata_kernels::mxfp4::e8m0_to_f32;

/// How a tensor's scales cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleGrid {
    /// Rows and columns of the last two dimensions of the weight.
    pub rows: usize,
    pub cols: usize,
    /// Block height and width (the whole matrix for a per-tensor scale).
    pub block: [usize; 2],
    /// Scale rows and columns per matrix (`ceil(rows / block[0])`, ...).
    pub scale_rows: usize,
    pub scale_cols: usize,
    /// One scale for the whole tensor.
    pub single: bool,
}

impl ScaleGrid {
    /// The grid for `weight_shape` with `scale_shape`, or why they do not fit.
    pub fn new(weight_shape: &[usize], scale_shape: &[usize], block: [usize; 2]) -> Result<Self, String> {
        let (batch, rows, cols) = match weight_shape {
            [n] => (1, 1, *n),
            [lead @ .., r, c] => (lead.iter().product::<usize>(), *r, *c),
            [] => (1, 1, 1),
        };
        let scale_elems: usize = scale_shape.iter().product();
        // A single scale for the whole tensor (per-tensor FP8).
        if scale_elems == 1 {
            return Ok(Self { rows, cols, block, scale_rows: 1, scale_cols: 1, single: true });
        }
        let (scale_rows, scale_cols) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
        if scale_elems != batch * scale_rows * scale_cols
            || scale_shape.last().is_some_and(|&c| c != scale_cols && weight_shape.len() >= 2)
        {
            return Err(format!(
                "scales {scale_shape:?} do not cover {weight_shape:?} in blocks of {}x{}",
                block[0], block[1]
            ));
        }
        Ok(Self { rows, cols, block, scale_rows, scale_cols, single: false })
    }

    /// The scale of flat element `index` of the tensor.
    pub fn scale_index(&self, index: usize) -> usize {
        if self.single {
            return 0;
        }
        let col = index % self.cols;
        let row = (index / self.cols) % self.rows;
        let matrix = index / (self.cols * self.rows);
        (matrix * self.scale_rows + row / self.block[0]) * self.scale_cols + col / self.block[1]
    }
}

/// Dequantizes e4m3 bytes holding flat elements `first..first + bytes.len()`.
pub fn dequantize(bytes: &[u8], first: usize, grid: &ScaleGrid, scales: &[f32]) -> Vec<f32> {
    bytes.iter().enumerate().map(|(k, &b)| e4m3_to_f32(b) * scales[grid.scale_index(first + k)]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(120), 2f32.powi(-7));
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert!(!e8m0_to_f32(255).is_finite());
    }

    #[test]
    fn fp4_codes_unpack_low_nibble_first_with_a_scale_per_32_columns() {
        // Row 0: codes 2 (1.0) and 0xF (-6.0) in byte 0, then zeros; row 1 all 1.5 (code 3).
        let mut bytes = vec![0u8; 32];
        bytes[0] = 0xF2;
        bytes[16..].fill(0x33);
        let grid = ScaleGrid::new(&[2, 32], &[2, 1], FP4_BLOCK).unwrap();
        let scales = [2.0, 0.5];
        let all = dequantize_fp4(&bytes, 0, 64, &grid, &scales);
        assert_eq!(&all[..3], &[2.0, -12.0, 0.0]);
        assert!(all[32..].iter().all(|&v| v == 0.75));
        // An odd window starts inside a byte.
        assert_eq!(dequantize_fp4(&bytes[0..1], 1, 1, &grid, &scales), [-12.0]);
        assert!(fp4_experts(&serde_json::json!({"quantization_config": {"expert_dtype": "fp4"}})));
        assert!(fp4_experts(&serde_json::json!({"expert_dtype": "fp4"})));
        assert!(!fp4_experts(&serde_json::json!({"quantization_config": {"fmt": "e4m3"}})));
    }

    #[test]
    fn block_grid_with_partial_blocks() {
        let grid = ScaleGrid::new(&[300, 200], &[3, 2], [128, 128]).unwrap();
        assert_eq!(grid.scale_index(0), 0);
        assert_eq!(grid.scale_index(127), 0);
        assert_eq!(grid.scale_index(128), 1);
        assert_eq!(grid.scale_index(128 * 200), 2);
        assert_eq!(grid.scale_index(299 * 200 + 199), 5);
        // Stacked experts: one grid per leading index.
        let grid = ScaleGrid::new(&[2, 130, 10], &[2, 2, 1], [128, 128]).unwrap();
        assert_eq!(grid.scale_index(130 * 10), 2);
        assert!(ScaleGrid::new(&[300, 200], &[2, 2], [128, 128]).is_err());
        let scalar = ScaleGrid::new(&[300, 200], &[], [128, 128]).unwrap();
        assert_eq!(scalar.scale_index(59_999), 0);
    }
}
