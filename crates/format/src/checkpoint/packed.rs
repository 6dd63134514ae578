//! Kimi K3's routed experts as its hub checkpoint stores them
//! (compressed-tensors "mxfp4-pack-quantized", docs/kimi_k3.md): each
//! matrix `{stem}.weight` `[rows, cols]` as `{stem}.weight_packed` `[rows,
//! cols / 2]` u8 (two E2M1 codes a byte, the even column in the low
//! nibble) and `{stem}.weight_scale` `[rows, cols / 32]` u8 (an E8M0
//! exponent per 32 columns). Each row is whole blocks, so its bytes are
//! the blocks [`strata_kernels::mxfp4`] decodes, exactly (every value is a
//! code times a power of two), and the container's `mxfp4` format stores
//! them as they are ([`Mxfp4Bytes`]).

use strata_kernels::mxfp4::{BLOCK_BYTES, BLOCK_VALUES, dequantize_mxfp4};

use super::Checkpoint;
use crate::error::{Error, Result};

/// One `[rows, cols]` matrix as MXFP4 codes (`rows · cols / 2` bytes) and
/// E8M0 scales (`rows · cols / 32` bytes), both row-major: the bytes of a
/// container's `mxfp4` component, and of every MXFP4 checkpoint's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mxfp4Bytes {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

impl Mxfp4Bytes {
    /// The matrix's values, as transformers dequantizes them.
    ///
    /// # Panics
    /// Unless `codes` holds 16 bytes per scale, as every checkpoint reader
    /// makes it.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut values = vec![0.0f32; self.scales.len() * BLOCK_VALUES];
        dequantize_mxfp4(&self.codes, &self.scales, &mut values);
        values
    }
}

/// The packed codes' and scales' names of the matrix `name` (`….weight`).
pub(crate) fn packed_names(name: &str) -> Option<[String; 2]> {
    let stem = name.strip_suffix(".weight")?;
    Some([format!("{stem}.weight_packed"), format!("{stem}.weight_scale")])
}

impl Checkpoint {
    /// Whether the matrix `name` is stored only as packed MXFP4 tensors.
    pub(super) fn is_packed_mxfp4(&self, name: &str) -> bool {
        !self.has(name) && packed_names(name).is_some_and(|[packed, _]| self.has(&packed))
    }

    /// The matrix `name` `[rows, cols]` as its packed MXFP4 codes and
    /// scales, shapes checked, or `None` where the checkpoint has no packed
    /// tensors for it.
    pub(crate) fn packed_mxfp4(&self, name: &str, [rows, cols]: [usize; 2]) -> Result<Option<Mxfp4Bytes>> {
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
        let codes = self.u8_elements(&packed, 0, rows * groups * BLOCK_BYTES)?.to_vec();
        Ok(Some(Mxfp4Bytes { codes, scales: self.u8_elements(&scale, 0, rows * groups)?.to_vec() }))
    }
}
