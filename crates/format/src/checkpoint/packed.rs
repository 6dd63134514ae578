//! Kimi K3's routed experts as its hub checkpoint stores them
//! (compressed-tensors "mxfp4-pack-quantized", docs/kimi_k3.md): each
//! matrix `{stem}.weight` `[rows, cols]` as `{stem}.weight_packed` `[rows,
//! cols / 2]` u8 (two E2M1 codes a byte, the even column in the low
//! nibble) and `{stem}.weight_scale` `[rows, cols / 32]` u8 (an E8M0
//! exponent per 32 columns). Each row is whole blocks, so its bytes are
//! the blocks [`strata_kernels::mxfp4`] decodes, exactly: every value is a
//! code times a power of two.

use strata_kernels::mxfp4::{BLOCK_BYTES, BLOCK_VALUES, dequantize_mxfp4};

use super::Checkpoint;
use crate::error::{Error, Result};

/// The packed codes' and scales' names of the matrix `name` (`….weight`).
pub(crate) fn packed_names(name: &str) -> Option<[String; 2]> {
    let stem = name.strip_suffix(".weight")?;
    Some([format!("{stem}.weight_packed"), format!("{stem}.weight_scale")])
}

impl Checkpoint {
    /// The matrix `name` `[rows, cols]` dequantized from its packed MXFP4
    /// tensors, or `None` where the checkpoint has none for it.
    pub(crate) fn packed_mxfp4_f32(&self, name: &str, [rows, cols]: [usize; 2]) -> Result<Option<Vec<f32>>> {
        let Some([packed, scale]) = packed_names(name).filter(|[packed, _]| self.has(packed)) else {
            return Ok(None);
        };
        if !cols.is_multiple_of(BLOCK_VALUES) {
            return Err(Error::TensorShape {
                name: packed,
                expected: vec![rows, cols.next_multiple_of(BLOCK_VALUES) / 2],
                found: vec![rows, cols / 2],
            });
        }
        let groups = cols / BLOCK_VALUES;
        self.check_shape(&packed, &[rows, groups * BLOCK_BYTES])?;
        self.check_shape(&scale, &[rows, groups])?;
        // Both products are of a matrix whose shape was just checked.
        let (codes, scales) =
            (self.u8_elements(&packed, 0, rows * groups * BLOCK_BYTES)?, self.u8_elements(&scale, 0, rows * groups)?);
        let mut values = vec![0.0f32; rows * cols];
        dequantize_mxfp4(codes, scales, &mut values);
        Ok(Some(values))
    }
}
