//! The manifest's checksum of itself: the SHA-256 of every field but the
//! one that holds it. The data files each have their SHA-256 and CRC32Cs,
//! but the fields that decide the model (its spec and config, the
//! quantization, the tensor table) were covered by nothing: a hand edit of
//! `top_k` or `norm_topk_prob` that still validated ran, and changed every
//! answer. Whitespace does not count; any value does.

use sha2::{Digest, Sha256};

use super::verify::hex;

/// The manifest field holding the seal.
pub const SEAL_FIELD: &str = "manifest_sha256";

/// The seal of a manifest's JSON: the SHA-256 (lower-case hex) of its compact
/// form without [`SEAL_FIELD`].
pub(crate) fn seal_of(manifest_json: &[u8]) -> serde_json::Result<String> {
    let mut value: serde_json::Value = serde_json::from_slice(manifest_json)?;
    if let serde_json::Value::Object(fields) = &mut value {
        // Shift, not swap: the fields after it keep their order.
        fields.shift_remove(SEAL_FIELD);
    }
    Ok(hex(&Sha256::digest(serde_json::to_vec(&value)?)))
}
