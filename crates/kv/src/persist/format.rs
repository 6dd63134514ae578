//! Byte layout of a KV session file (normative: docs/FORMAT.md, "KV session
//! file"). Everything is little-endian and fixed-width, so a file can be
//! checked field by field without trusting any length it contains.

use sha2::{Digest, Sha256};

use crate::KvCache;

/// First bytes of every KV session file.
pub const SESSION_MAGIC: [u8; 8] = *b"STRATAKV";
/// The session file version this build reads and writes.
pub const SESSION_VERSION: u32 = 1;
/// Bytes of a SHA-256 digest, as held in the header.
pub const HASH_BYTES: usize = 32;
/// The most streams per layer a header may declare. A real cache has one to
/// three; the bound only stops a corrupt count from sizing an allocation.
pub const MAX_STREAMS: usize = 16;

/// Checksums are the first 8 bytes of a SHA-256: sha2 is already a
/// dependency (no CRC crate needed), SHA-NI makes it cheap next to a forward
/// pass, and 64 bits make an undetected corruption vanishingly unlikely.
pub(crate) const CHECKSUM_BYTES: usize = 8;
/// Bytes of the zero-padded `created_by` field.
const CREATED_BY_BYTES: usize = 32;
/// Header bytes before the `row_dims` array.
const HEADER_FIXED_BYTES: usize = 92;
/// The header bytes read before its length is known: magic, version, length.
pub(crate) const HEADER_PREFIX_BYTES: usize = 16;
/// Record bytes before the rows: length, kind, reserved, position, token.
pub(crate) const RECORD_PREFIX_BYTES: usize = 16;
/// Header flag: the tokenizer hash field is meaningful.
const FLAG_TOKENIZER_HASH: u8 = 1;

/// What binds a session file to one model: the container's content hash,
/// the tokenizer's hash and the cache's dimensions. A file whose header
/// differs in any of these is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionHeader {
    /// SHA-256 identifying the model's weights (the container's content hash).
    pub content_hash: [u8; HASH_BYTES],
    /// SHA-256 of the tokenizer, when the model has one.
    pub tokenizer_hash: Option<[u8; HASH_BYTES]>,
    pub n_layers: usize,
    /// Width of each stream's row, in f32s (see [`KvCache::row_dims`]).
    pub row_dims: Vec<usize>,
    /// The writing program, for humans; at most 32 bytes are kept and it is
    /// never compared.
    pub created_by: String,
}

impl SessionHeader {
    /// The header for persisting `cache`.
    pub fn for_cache(
        content_hash: [u8; HASH_BYTES],
        tokenizer_hash: Option<[u8; HASH_BYTES]>,
        cache: &KvCache,
        created_by: impl Into<String>,
    ) -> Self {
        Self {
            content_hash,
            tokenizer_hash,
            n_layers: cache.n_layers(),
            row_dims: cache.row_dims().to_vec(),
            created_by: created_by.into(),
        }
    }

    /// Size of the encoded header; the first record starts here.
    pub fn header_bytes(&self) -> usize {
        HEADER_FIXED_BYTES + 4 * self.row_dims.len() + CREATED_BY_BYTES + CHECKSUM_BYTES
    }

    /// f32s of one token's rows: every stream of every layer.
    pub fn floats_per_token(&self) -> usize {
        self.n_layers * self.row_dims.iter().sum::<usize>()
    }

    /// Why this header cannot describe a file at all (too many streams,
    /// sizes beyond the u32 fields), if it cannot.
    pub(crate) fn invalid_reason(&self) -> Option<String> {
        let u32_max = u32::MAX as usize;
        if self.n_layers == 0 || self.n_layers > u32_max {
            return Some(format!("n_layers {} out of range", self.n_layers));
        }
        if self.row_dims.is_empty() || self.row_dims.len() > MAX_STREAMS {
            return Some(format!("{} streams (1 to {MAX_STREAMS} allowed)", self.row_dims.len()));
        }
        if self.row_dims.iter().any(|&d| d == 0 || d > u32_max) {
            return Some(format!("row_dims {:?} out of range", self.row_dims));
        }
        let record = self.n_layers.checked_mul(self.row_dims.iter().sum()).and_then(|f| f.checked_mul(4));
        match record.and_then(|r| r.checked_add(RECORD_PREFIX_BYTES + CHECKSUM_BYTES)) {
            Some(bytes) if bytes <= u32_max => None,
            _ => Some("one token's rows exceed the 4 GiB a record can hold".to_owned()),
        }
    }

    /// The header's bytes, checksum included. The header must be valid.
    pub(crate) fn encode(&self) -> Vec<u8> {
        debug_assert!(self.invalid_reason().is_none());
        let mut out = Vec::with_capacity(self.header_bytes());
        out.extend_from_slice(&SESSION_MAGIC);
        out.extend_from_slice(&SESSION_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.header_bytes() as u32).to_le_bytes());
        out.extend_from_slice(&self.content_hash);
        out.extend_from_slice(&self.tokenizer_hash.unwrap_or([0; HASH_BYTES]));
        out.push(if self.tokenizer_hash.is_some() { FLAG_TOKENIZER_HASH } else { 0 });
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&(self.n_layers as u32).to_le_bytes());
        out.extend_from_slice(&(self.row_dims.len() as u32).to_le_bytes());
        for &dim in &self.row_dims {
            out.extend_from_slice(&(dim as u32).to_le_bytes());
        }
        let mut created_by = [0u8; CREATED_BY_BYTES];
        let text = truncate_utf8(&self.created_by, CREATED_BY_BYTES);
        created_by[..text.len()].copy_from_slice(text.as_bytes());
        out.extend_from_slice(&created_by);
        let sum = checksum(&out);
        out.extend_from_slice(&sum);
        debug_assert_eq!(out.len(), self.header_bytes());
        out
    }

    /// Reads the header length out of its first [`HEADER_PREFIX_BYTES`],
    /// after checking magic and version.
    pub(crate) fn decode_prefix(prefix: &[u8; HEADER_PREFIX_BYTES]) -> Result<usize, PrefixError> {
        if prefix[..8] != SESSION_MAGIC {
            return Err(PrefixError::Magic(String::from_utf8_lossy(&prefix[..8]).into_owned()));
        }
        let version = u32_at(prefix, 8);
        if version != SESSION_VERSION {
            return Err(PrefixError::Version(version));
        }
        let header_bytes = u32_at(prefix, 12) as usize;
        let smallest = HEADER_FIXED_BYTES + 4 + CREATED_BY_BYTES + CHECKSUM_BYTES;
        let largest = smallest + 4 * (MAX_STREAMS - 1);
        if !(smallest..=largest).contains(&header_bytes) {
            return Err(PrefixError::Corrupt(format!("header length {header_bytes} outside {smallest}..={largest}")));
        }
        Ok(header_bytes)
    }

    /// Parses a whole header (prefix included) whose length
    /// [`Self::decode_prefix`] gave.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let body = &bytes[..bytes.len() - CHECKSUM_BYTES];
        if checksum(body) != bytes[body.len()..] {
            return Err("header checksum mismatch".to_owned());
        }
        let flags = bytes[80];
        if flags & !FLAG_TOKENIZER_HASH != 0 || bytes[81..84] != [0; 3] {
            return Err(format!("unknown header flags {flags:#04x}"));
        }
        let n_layers = u32_at(bytes, 84) as usize;
        let n_streams = u32_at(bytes, 88) as usize;
        if HEADER_FIXED_BYTES + 4 * n_streams + CREATED_BY_BYTES + CHECKSUM_BYTES != bytes.len() {
            return Err(format!("{n_streams} streams do not fit a header of {} bytes", bytes.len()));
        }
        let row_dims = (0..n_streams).map(|s| u32_at(bytes, HEADER_FIXED_BYTES + 4 * s) as usize).collect();
        let created_at = HEADER_FIXED_BYTES + 4 * n_streams;
        let created_by = &bytes[created_at..created_at + CREATED_BY_BYTES];
        let created_by = String::from_utf8_lossy(created_by).trim_end_matches('\0').to_owned();
        let header = Self {
            content_hash: bytes[16..48].try_into().expect("32 bytes"),
            tokenizer_hash: (flags & FLAG_TOKENIZER_HASH != 0).then(|| bytes[48..80].try_into().expect("32 bytes")),
            n_layers,
            row_dims,
            created_by,
        };
        match header.invalid_reason() {
            Some(reason) => Err(reason),
            None => Ok(header),
        }
    }

    /// Every field in which `self` (read from a file) differs from `expected`
    /// (the model's), naming both values.
    pub(crate) fn mismatches(&self, expected: &Self) -> Vec<String> {
        let mut out = Vec::new();
        if self.content_hash != expected.content_hash {
            out.push(format!(
                "content hash {} in the file, {} for this model",
                hex(&self.content_hash),
                hex(&expected.content_hash)
            ));
        }
        if self.tokenizer_hash != expected.tokenizer_hash {
            let show = |h: &Option<[u8; HASH_BYTES]>| h.as_ref().map_or_else(|| "none".to_owned(), |h| hex(h));
            out.push(format!(
                "tokenizer hash {} in the file, {} for this model",
                show(&self.tokenizer_hash),
                show(&expected.tokenizer_hash)
            ));
        }
        if self.n_layers != expected.n_layers {
            out.push(format!("n_layers {} in the file, {} for this model", self.n_layers, expected.n_layers));
        }
        if self.row_dims != expected.row_dims {
            out.push(format!("row_dims {:?} in the file, {:?} for this model", self.row_dims, expected.row_dims));
        }
        out
    }
}

/// Why the first bytes of a file are not a session header this build reads.
pub(crate) enum PrefixError {
    Magic(String),
    Version(u32),
    Corrupt(String),
}

/// What a record adds to the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordKind {
    /// A new token with its rows (it has been run through the model).
    TokenWithRows = 1,
    /// A new token without rows yet: the last generated one, which the model
    /// runs only when the sequence continues. Only the last token may lack rows.
    Token = 2,
    /// The rows of the trailing row-less token, once it has been run.
    Rows = 3,
}

impl RecordKind {
    pub(crate) fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Self::TokenWithRows),
            2 => Some(Self::Token),
            3 => Some(Self::Rows),
            _ => None,
        }
    }

    pub(crate) fn has_rows(self) -> bool {
        self != Self::Token
    }

    /// Bytes of a whole record of this kind, prefix and checksum included.
    pub(crate) fn record_bytes(self, floats_per_token: usize) -> usize {
        let rows = if self.has_rows() { floats_per_token * 4 } else { 0 };
        RECORD_PREFIX_BYTES + rows + CHECKSUM_BYTES
    }
}

/// A record's fixed prefix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordPrefix {
    pub record_bytes: usize,
    pub kind: Option<RecordKind>,
    pub kind_byte: u8,
    pub reserved_zero: bool,
    pub position: usize,
    pub token: u32,
}

impl RecordPrefix {
    pub(crate) fn decode(bytes: &[u8; RECORD_PREFIX_BYTES]) -> Self {
        Self {
            record_bytes: u32_at(bytes, 0) as usize,
            kind: RecordKind::from_byte(bytes[4]),
            kind_byte: bytes[4],
            reserved_zero: bytes[5..8] == [0; 3],
            position: u32_at(bytes, 8) as usize,
            token: u32_at(bytes, 12),
        }
    }
}

/// Appends one whole record to `out`: the token at `position` and, for
/// kinds with rows, every layer's row of every stream of `cache` there.
pub(crate) fn encode_record(out: &mut Vec<u8>, kind: RecordKind, position: usize, token: u32, cache: &KvCache) {
    let floats = cache.n_layers() * cache.row_dims().iter().sum::<usize>();
    let start = out.len();
    out.extend_from_slice(&(kind.record_bytes(floats) as u32).to_le_bytes());
    out.extend_from_slice(&[kind as u8, 0, 0, 0]);
    out.extend_from_slice(&(position as u32).to_le_bytes());
    out.extend_from_slice(&token.to_le_bytes());
    if kind.has_rows() {
        out.reserve(floats * 4 + CHECKSUM_BYTES);
        for layer in 0..cache.n_layers() {
            for (stream, &dim) in cache.row_dims().iter().enumerate() {
                let row = &cache.rows(layer, stream, position + 1)[position * dim..];
                for value in row {
                    out.extend_from_slice(&value.to_le_bytes());
                }
            }
        }
    }
    let sum = checksum(&out[start..]);
    out.extend_from_slice(&sum);
    debug_assert_eq!(out.len() - start, kind.record_bytes(floats));
}

/// The checksum of `bytes`: the first 8 bytes of their SHA-256.
pub(crate) fn checksum(bytes: &[u8]) -> [u8; CHECKSUM_BYTES] {
    Sha256::digest(bytes)[..CHECKSUM_BYTES].try_into().expect("8 bytes")
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits (either case) into a hash.
pub fn parse_hash(text: &str) -> Option<[u8; HASH_BYTES]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * HASH_BYTES || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = [0u8; HASH_BYTES];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
