//! The CRC32C (Castagnoli) the container keeps per dense tensor and per
//! expert record (docs/FORMAT.md), checked on every read from disk.

/// CRC32C of `bytes`.
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of bytes given piece by piece.
pub(crate) struct Crc32c(u32);

impl Crc32c {
    pub(crate) fn new() -> Self {
        Crc32c(0)
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
    }

    pub(crate) fn finish(&self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_crc32c_whole_or_in_pieces() {
        // The catalogue's check value of CRC-32C (iSCSI): what every
        // container written so far holds.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let mut pieces = Crc32c::new();
        for piece in [&b"1234"[..], b"", b"56789"] {
            pieces.update(piece);
        }
        assert_eq!(pieces.finish(), 0xe306_9283);
        assert_eq!(Crc32c::new().finish(), crc32c(&[]));
    }
}
