//! The CRC32C (Castagnoli) the container keeps per dense tensor and per
//! expert record (docs/FORMAT.md), checked on every read from disk.

/// Pieces of at least this many bytes are summed on one thread: a join
/// costs microseconds, a piece this size ~60 µs.
const PIECE_MIN_BYTES: usize = 512 << 10;

/// CRC32C of `bytes`. Called on a thread of a rayon pool (the engine's: the
/// store checks a record just read inside it), a large input is summed in
/// pieces side by side and their CRCs combined, so that the check of the
/// last record of a layer, which the layer waits for, takes a fraction of
/// the time. Elsewhere it runs on the calling thread alone: no pool is ever
/// started for it.
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    if bytes.len() < 2 * PIECE_MIN_BYTES || rayon::current_thread_index().is_none() {
        return crc32c::crc32c(bytes);
    }
    let (head, tail) = bytes.split_at(bytes.len() / 2);
    let (crc_head, crc_tail) = rayon::join(|| crc32c(head), || crc32c(tail));
    combine(crc_head, crc_tail, tail.len())
}

/// CRC32C of `a` followed by `b`, from each one's CRC32C and `b`'s length.
pub(crate) fn combine(crc_a: u32, crc_b: u32, len_b_bytes: usize) -> u32 {
    crc32c::crc32c_combine(crc_a, crc_b, len_b_bytes)
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

    #[test]
    fn checksum_in_a_pool_equals_checksum_on_one_thread() {
        let bytes: Vec<u8> = (0..5 * PIECE_MIN_BYTES + 12345).map(|i| (i * 7 + i / 251) as u8).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for len in [0, 1, 2 * PIECE_MIN_BYTES - 1, 2 * PIECE_MIN_BYTES, 3 * PIECE_MIN_BYTES + 1, bytes.len()] {
            let alone = crc32c(&bytes[..len]);
            assert_eq!(alone, crc32c::crc32c(&bytes[..len]));
            assert_eq!(pool.install(|| crc32c(&bytes[..len])), alone, "{len} bytes");
        }
    }
}
