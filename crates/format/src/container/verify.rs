//! Integrity checking: SHA-256 of every container file against the manifest.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::manifest::FileEntry;
use crate::error::{Error, Result};

/// Read size for hashing: large enough to stream at disk speed.
const HASH_CHUNK_BYTES: usize = 4 << 20;

/// Lower-case hex SHA-256 of a file's bytes, and its size.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_CHUNK_BYTES];
    let mut total_bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total_bytes += n as u64;
    }
    Ok((hex(&hasher.finalize()), total_bytes))
}

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Checks size and SHA-256 of every listed file.
pub(super) fn verify_files(dir: &Path, files: &[FileEntry]) -> Result<()> {
    for entry in files {
        let path = dir.join(&entry.path);
        let (actual, size_bytes) = sha256_file(&path)?;
        if size_bytes != entry.size_bytes {
            return Err(Error::FileSize { path, expected_bytes: entry.size_bytes, actual_bytes: size_bytes });
        }
        if !actual.eq_ignore_ascii_case(&entry.sha256) {
            return Err(Error::Checksum { path, expected: entry.sha256.clone(), actual });
        }
    }
    Ok(())
}
