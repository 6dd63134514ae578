//! The mirror receipt, `strata-mirror.json` at the root of a mirror
//! directory: which expert files the mirror holds, each with the content
//! hash the container's manifest records for it and one digest per record.
//!
//! Staging (or `strata mirror verify`) writes it after hashing every copy,
//! so opening a mirror costs a `stat` per file, not a re-read of the mirror;
//! the per-record digests catch a copy changed after that, one record at a
//! time, as it is read. docs/FORMAT.md documents the file.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The receipt's file name inside a mirror directory.
pub const RECEIPT_FILE_NAME: &str = "strata-mirror.json";
/// `format` of a receipt.
pub const RECEIPT_FORMAT: &str = "strata-mirror";
/// The receipt version this build reads and writes.
pub const RECEIPT_VERSION: u32 = 1;

/// Bytes of SHA-256 kept per record: 64 bits leave a changed record
/// unnoticed with negligible probability, and keep the receipt small.
pub const RECORD_DIGEST_BYTES: usize = 8;

/// One record's digest: the first [`RECORD_DIGEST_BYTES`] of its SHA-256.
pub type RecordDigest = [u8; RECORD_DIGEST_BYTES];

/// What a mirror holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub format: String,
    pub version: u32,
    /// The container's content hash (SHA-256 of its manifest).
    pub container_hash: String,
    /// Files the mirror holds, sorted by path.
    pub files: Vec<ReceiptFile>,
}

/// One mirrored expert file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptFile {
    /// Relative to the mirror (and the container), `/`-separated.
    pub path: String,
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the whole file, as in the manifest.
    pub sha256: String,
    pub record_bytes: u64,
    /// Per record, in order: lower-case hex of its [`RecordDigest`].
    pub record_digests: Vec<String>,
}

impl Receipt {
    pub fn new(container_hash: &str, mut files: Vec<ReceiptFile>) -> Self {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Self {
            format: RECEIPT_FORMAT.to_owned(),
            version: RECEIPT_VERSION,
            container_hash: container_hash.to_owned(),
            files,
        }
    }

    /// Reads the receipt of the mirror `dir`; `None` if it has none.
    pub fn read(dir: &Path) -> Result<Option<Receipt>> {
        let path = dir.join(RECEIPT_FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::MirrorIo { path, action: "read", source }),
        };
        let bad = |reason: String| Error::MirrorInvalid { dir: dir.to_owned(), reason };
        let receipt: Receipt =
            serde_json::from_str(&text).map_err(|err| bad(format!("{RECEIPT_FILE_NAME} does not parse: {err}")))?;
        if receipt.format != RECEIPT_FORMAT || receipt.version != RECEIPT_VERSION {
            return Err(bad(format!(
                "{RECEIPT_FILE_NAME} is format {:?} version {}, this build reads {RECEIPT_FORMAT:?} version {RECEIPT_VERSION}",
                receipt.format, receipt.version
            )));
        }
        Ok(Some(receipt))
    }

    /// Writes the receipt into `dir` atomically: a temporary file, fsync,
    /// rename over the old receipt, fsync of the directory. A reader sees
    /// the old receipt or the new one, never a partial one.
    pub fn publish(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RECEIPT_FILE_NAME);
        let temp = dir.join(format!(".{RECEIPT_FILE_NAME}.tmp-{}", std::process::id()));
        let io_err = |action, source| Error::MirrorIo { path: path.clone(), action, source };
        let mut json = serde_json::to_vec_pretty(self).expect("a receipt serialises: strings and numbers");
        json.push(b'\n');
        let written = (|| {
            let mut file = File::options().write(true).create(true).truncate(true).open(&temp)?;
            file.write_all(&json)?;
            file.sync_all()?;
            std::fs::rename(&temp, &path)?;
            File::open(dir)?.sync_all()
        })();
        if let Err(source) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(io_err("write", source));
        }
        Ok(())
    }

    /// The parsed record digests of `file`.
    pub fn record_digests(dir: &Path, file: &ReceiptFile) -> Result<Vec<RecordDigest>> {
        file.record_digests
            .iter()
            .map(|hex| {
                parse_digest(hex).ok_or_else(|| Error::MirrorInvalid {
                    dir: dir.to_owned(),
                    reason: format!("{RECEIPT_FILE_NAME}: {}: bad record digest {hex:?}", file.path),
                })
            })
            .collect()
    }
}

/// SHA-256 of a whole file and the digest of each `record_bytes` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHashes {
    pub size_bytes: u64,
    pub sha256: String,
    pub record_digests: Vec<RecordDigest>,
}

/// Reads `path` once, record by record.
pub fn hash_file(path: &Path, record_bytes: usize) -> Result<FileHashes> {
    assert!(record_bytes > 0, "records have a size");
    let io_err = |source| Error::MirrorIo { path: path.to_owned(), action: "hash", source };
    let mut file = File::open(path).map_err(io_err)?;
    let mut whole = Sha256::new();
    let mut record_digests = Vec::new();
    let mut record = vec![0u8; record_bytes];
    let mut size_bytes = 0u64;
    loop {
        let mut filled = 0;
        while filled < record_bytes {
            match file.read(&mut record[filled..]) {
                Ok(0) => break,
                Ok(got) => filled += got,
                Err(err) if err.kind() == ErrorKind::Interrupted => {}
                Err(err) => return Err(io_err(err)),
            }
        }
        if filled == 0 {
            break;
        }
        whole.update(&record[..filled]);
        record_digests.push(record_digest(&record[..filled]));
        size_bytes += filled as u64;
        if filled < record_bytes {
            break;
        }
    }
    Ok(FileHashes { size_bytes, sha256: hex(&whole.finalize()), record_digests })
}

/// The digest a receipt keeps for one record.
pub fn record_digest(record: &[u8]) -> RecordDigest {
    let full = Sha256::digest(record);
    let mut digest = [0; RECORD_DIGEST_BYTES];
    digest.copy_from_slice(&full[..RECORD_DIGEST_BYTES]);
    digest
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_digest(text: &str) -> Option<RecordDigest> {
    if text.len() != 2 * RECORD_DIGEST_BYTES || !text.is_ascii() {
        return None;
    }
    let mut digest = [0; RECORD_DIGEST_BYTES];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

/// A receipt entry for a file whose hashes were just computed.
pub fn receipt_file(path: &str, record_bytes: usize, hashes: &FileHashes) -> ReceiptFile {
    ReceiptFile {
        path: path.to_owned(),
        size_bytes: hashes.size_bytes,
        sha256: hashes.sha256.clone(),
        record_bytes: record_bytes as u64,
        record_digests: hashes.record_digests.iter().map(|d| hex(d)).collect(),
    }
}

/// `dir` joined with a manifest-style relative path.
pub fn join(dir: &Path, relative: &str) -> PathBuf {
    relative.split('/').fold(dir.to_path_buf(), |path, part| path.join(part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_round_trip_and_digests_parse() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Receipt::read(dir.path()).unwrap(), None);
        let data: Vec<u8> = (0..3 * 4096 + 5).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f.bin"), &data).unwrap();
        let hashes = hash_file(&dir.path().join("f.bin"), 4096).unwrap();
        assert_eq!(hashes.size_bytes, data.len() as u64);
        assert_eq!(hashes.sha256, hex(&Sha256::digest(&data)));
        assert_eq!(hashes.record_digests.len(), 4);
        assert_eq!(hashes.record_digests[1], record_digest(&data[4096..8192]));
        let receipt = Receipt::new("abc", vec![receipt_file("experts/f.bin", 4096, &hashes)]);
        receipt.publish(dir.path()).unwrap();
        let read = Receipt::read(dir.path()).unwrap().unwrap();
        assert_eq!(read, receipt);
        assert_eq!(Receipt::record_digests(dir.path(), &read.files[0]).unwrap(), hashes.record_digests);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_foreign_or_broken_receipt_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(RECEIPT_FILE_NAME), "{").unwrap();
        assert!(Receipt::read(dir.path()).unwrap_err().to_string().contains("does not parse"));
        let mut receipt = Receipt::new("abc", Vec::new());
        receipt.version = 9;
        receipt.publish(dir.path()).unwrap();
        assert!(Receipt::read(dir.path()).unwrap_err().to_string().contains("version 9"));
        assert_eq!(parse_digest("zz00000000000000"), None);
        assert_eq!(parse_digest("00"), None);
    }
}
