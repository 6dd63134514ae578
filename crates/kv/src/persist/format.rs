//! Byte layout of a KV session file (normative: docs/FORMAT.md, "KV session
//! file"). Everything is little-endian and fixed-width, so a file can be
//! checked field by field without trusting any length it contains.

use sha2::{Digest, Sha256};

use crate::{LayerLayout, SequenceState, StatePart};

/// First bytes of every KV session file.
pub const SESSION_MAGIC: [u8; 8] = *b"STRATAKV";
/// The session file version this build writes. Version 3 lists each layer's
/// typed parts; version 2 (each layer's row widths and state floats) and
/// version 1 (one set of row widths for every layer, no state) are still
/// read, and appended to as they are: their layouts are rows parts and a
/// fixed state, whose records version 3 writes byte for byte alike.
pub const SESSION_VERSION: u32 = 3;
/// The oldest version this build reads.
pub const SESSION_VERSION_OLDEST: u32 = 1;
/// Bytes of a SHA-256 digest, as held in the header.
pub const HASH_BYTES: usize = 32;
/// The most parts per layer a header may declare (and streams of rows, in
/// versions 1 and 2). A real layer has one to three; the bound only stops a
/// corrupt count from sizing an allocation.
pub const MAX_PARTS: usize = 16;
/// The most layers a header may declare. Models have at most a few hundred;
/// the bound only stops a corrupt count from sizing an allocation.
pub const MAX_LAYERS: usize = 4096;

/// Checksums are the first 8 bytes of a SHA-256: sha2 is already a
/// dependency (no CRC crate needed), SHA-NI makes it cheap next to a forward
/// pass, and 64 bits make an undetected corruption vanishingly unlikely.
pub(crate) const CHECKSUM_BYTES: usize = 8;
/// Bytes of the zero-padded `created_by` field.
const CREATED_BY_BYTES: usize = 32;
/// Header bytes before the layouts: magic to `n_layers`.
const HEADER_FIXED_BYTES: usize = 88;
/// Header bytes after the layouts: `created_by` and the checksum.
const HEADER_TAIL_BYTES: usize = CREATED_BY_BYTES + CHECKSUM_BYTES;
/// The header bytes read before its length is known: magic, version, length.
pub(crate) const HEADER_PREFIX_BYTES: usize = 16;
/// Record bytes before the rows: length, kind, reserved, position, token.
pub(crate) const RECORD_PREFIX_BYTES: usize = 16;
/// Bytes of one part in a version 3 header: kind and two sizes.
const PART_BYTES: usize = 12;
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
    /// What each layer keeps (see [`SequenceState::layout`]). Versions 1 and 2
    /// read as rows parts, then a fixed state if the layer has one.
    pub layouts: Vec<LayerLayout>,
    /// The writing program, for humans; at most 32 bytes are kept and it is
    /// never compared.
    pub created_by: String,
}

impl SessionHeader {
    /// The header for persisting `cache`.
    pub fn for_cache(
        content_hash: [u8; HASH_BYTES],
        tokenizer_hash: Option<[u8; HASH_BYTES]>,
        cache: &SequenceState,
        created_by: impl Into<String>,
    ) -> Self {
        Self { content_hash, tokenizer_hash, layouts: cache.layouts().to_vec(), created_by: created_by.into() }
    }

    /// Size of the encoded header; the first record starts here.
    pub fn header_bytes(&self) -> usize {
        let layouts: usize = self.layouts.iter().map(|l| 4 + PART_BYTES * l.parts.len()).sum();
        HEADER_FIXED_BYTES + layouts + HEADER_TAIL_BYTES
    }

    fn parts(&self) -> impl Iterator<Item = &StatePart> {
        self.layouts.iter().flat_map(|l| &l.parts)
    }

    /// f32s in the record of the token at `position`: every part's
    /// [`StatePart::record_floats`], layer by layer.
    pub fn record_floats(&self, position: usize) -> usize {
        self.parts().map(|p| p.record_floats(position)).sum()
    }

    /// The most f32s one token's record holds.
    pub fn record_floats_max(&self) -> usize {
        self.parts().map(StatePart::record_floats_max).sum()
    }

    /// f32s of a state record: the state of every part with one.
    pub fn state_floats(&self) -> usize {
        self.parts().map(StatePart::state_floats).sum()
    }

    /// Why this header cannot describe a file at all (too many parts, sizes
    /// beyond the u32 fields), if it cannot.
    pub(crate) fn invalid_reason(&self) -> Option<String> {
        let u32_max = u32::MAX as usize;
        if self.layouts.is_empty() || self.layouts.len() > MAX_LAYERS {
            return Some(format!("{} layers (1 to {MAX_LAYERS} allowed)", self.layouts.len()));
        }
        for (layer, layout) in self.layouts.iter().enumerate() {
            if layout.parts.is_empty() || layout.parts.len() > MAX_PARTS {
                return Some(format!("layer {layer}: {} parts (1 to {MAX_PARTS} allowed)", layout.parts.len()));
            }
            for part in &layout.parts {
                if let Some(reason) = part.invalid_reason() {
                    return Some(format!("layer {layer}: {reason}"));
                }
                let (_, a, b) = part_code(part);
                if a > u32_max || b > u32_max {
                    return Some(format!("layer {layer}: {part:?} out of range"));
                }
            }
        }
        // Checked: the sums come from a file (each term's bytes fit a usize,
        // `StatePart::invalid_reason`), but the record sizes must fit a u32.
        fn sum(floats: impl Iterator<Item = usize>) -> Option<usize> {
            floats.into_iter().try_fold(0usize, usize::checked_add)
        }
        let fits = |floats: Option<usize>| {
            floats
                .and_then(|f| f.checked_mul(4))
                .and_then(|r| r.checked_add(RECORD_PREFIX_BYTES + CHECKSUM_BYTES))
                .is_some_and(|bytes| bytes <= u32_max)
        };
        if !fits(sum(self.parts().map(StatePart::record_floats_max))) {
            return Some("one token's rows exceed the 4 GiB a record can hold".to_owned());
        }
        if !fits(sum(self.parts().map(StatePart::state_floats))) {
            return Some("the state exceeds the 4 GiB a record can hold".to_owned());
        }
        None
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
        out.extend_from_slice(&(self.layouts.len() as u32).to_le_bytes());
        for layout in &self.layouts {
            out.extend_from_slice(&(layout.parts.len() as u32).to_le_bytes());
            for part in &layout.parts {
                let (kind, a, b) = part_code(part);
                for field in [kind, a as u32, b as u32] {
                    out.extend_from_slice(&field.to_le_bytes());
                }
            }
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

    /// Reads the version and the header length out of its first
    /// [`HEADER_PREFIX_BYTES`], after checking magic and version.
    pub(crate) fn decode_prefix(prefix: &[u8; HEADER_PREFIX_BYTES]) -> Result<(u32, usize), PrefixError> {
        if prefix[..8] != SESSION_MAGIC {
            return Err(PrefixError::Magic(String::from_utf8_lossy(&prefix[..8]).into_owned()));
        }
        let version = u32_at(prefix, 8);
        let header_bytes = u32_at(prefix, 12) as usize;
        let (smallest, largest) = match version {
            // n_streams, then 1 to MAX_PARTS widths for every layer.
            1 => {
                (HEADER_FIXED_BYTES + 8 + HEADER_TAIL_BYTES, HEADER_FIXED_BYTES + 4 + 4 * MAX_PARTS + HEADER_TAIL_BYTES)
            }
            // One layer without rows, to MAX_LAYERS of MAX_PARTS streams each.
            2 => (
                HEADER_FIXED_BYTES + 8 + HEADER_TAIL_BYTES,
                HEADER_FIXED_BYTES + MAX_LAYERS * (8 + 4 * MAX_PARTS) + HEADER_TAIL_BYTES,
            ),
            // One layer of one part, to MAX_LAYERS of MAX_PARTS each.
            SESSION_VERSION => (
                HEADER_FIXED_BYTES + 4 + PART_BYTES + HEADER_TAIL_BYTES,
                HEADER_FIXED_BYTES + MAX_LAYERS * (4 + PART_BYTES * MAX_PARTS) + HEADER_TAIL_BYTES,
            ),
            _ => return Err(PrefixError::Version(version)),
        };
        if !(smallest..=largest).contains(&header_bytes) {
            return Err(PrefixError::Corrupt(format!("header length {header_bytes} outside {smallest}..={largest}")));
        }
        Ok((version, header_bytes))
    }

    /// Parses a whole header (prefix included) of `version` whose length
    /// [`Self::decode_prefix`] gave.
    pub(crate) fn decode(version: u32, bytes: &[u8]) -> Result<Self, String> {
        let body = &bytes[..bytes.len() - CHECKSUM_BYTES];
        if checksum(body) != bytes[body.len()..] {
            return Err("header checksum mismatch".to_owned());
        }
        let flags = bytes[80];
        if flags & !FLAG_TOKENIZER_HASH != 0 || bytes[81..84] != [0; 3] {
            return Err(format!("unknown header flags {flags:#04x}"));
        }
        let n_layers = u32_at(bytes, 84) as usize;
        if n_layers == 0 || n_layers > MAX_LAYERS {
            return Err(format!("{n_layers} layers (1 to {MAX_LAYERS} allowed)"));
        }
        let layouts_end = bytes.len() - HEADER_TAIL_BYTES;
        let layouts = match version {
            1 => decode_layouts_v1(bytes, n_layers, layouts_end)?,
            2 => decode_layouts_v2(bytes, n_layers, layouts_end)?,
            _ => decode_layouts(bytes, n_layers, layouts_end)?,
        };
        let created_at = layouts_end;
        let created_by = &bytes[created_at..created_at + CREATED_BY_BYTES];
        let created_by = String::from_utf8_lossy(created_by).trim_end_matches('\0').to_owned();
        let header = Self {
            content_hash: bytes[16..48].try_into().expect("32 bytes"),
            tokenizer_hash: (flags & FLAG_TOKENIZER_HASH != 0).then(|| bytes[48..80].try_into().expect("32 bytes")),
            layouts,
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
        if self.layouts.len() != expected.layouts.len() {
            out.push(format!("n_layers {} in the file, {} for this model", self.layouts.len(), expected.layouts.len()));
        }
        // The first layer that differs: a model's layers come in few kinds,
        // so one names the difference without a line per layer.
        let differing = self.layouts.iter().zip(&expected.layouts).position(|(a, b)| a != b);
        if let Some(layer) = differing {
            let show = |l: &LayerLayout| format!("{:?}", l.parts);
            out.push(format!(
                "layer {layer} keeps {} in the file, {} for this model",
                show(&self.layouts[layer]),
                show(&expected.layouts[layer])
            ));
        }
        out
    }
}

/// A part as a version 3 header holds it: kind, then two sizes (0 if unused).
fn part_code(part: &StatePart) -> (u32, usize, usize) {
    match *part {
        StatePart::Rows { dim } => (1, dim, 0),
        StatePart::Ring { dim, window } => (2, dim, window),
        StatePart::Strided { dim, every } => (3, dim, every),
        StatePart::Fixed { floats } => (4, floats, 0),
        StatePart::Tokens { n } => (5, n, 0),
    }
}

/// The part [`part_code`] wrote, if the kind is known and unused sizes are 0.
fn part_of_code(kind: u32, a: usize, b: usize) -> Option<StatePart> {
    let part = match kind {
        1 => StatePart::Rows { dim: a },
        2 => StatePart::Ring { dim: a, window: b },
        3 => StatePart::Strided { dim: a, every: b },
        4 => StatePart::Fixed { floats: a },
        5 => StatePart::Tokens { n: a },
        _ => return None,
    };
    (part_code(&part) == (kind, a, b)).then_some(part)
}

/// Version 3 layouts: per layer `n_parts`, then each part's kind and sizes.
fn decode_layouts(bytes: &[u8], n_layers: usize, layouts_end: usize) -> Result<Vec<LayerLayout>, String> {
    let mut at = HEADER_FIXED_BYTES;
    let mut layouts = Vec::with_capacity(n_layers);
    for layer in 0..n_layers {
        if at + 4 > layouts_end {
            return Err(format!("layer {layer}'s layout runs past the header's {} bytes", bytes.len()));
        }
        let n_parts = u32_at(bytes, at) as usize;
        at += 4;
        if n_parts > MAX_PARTS || at + PART_BYTES * n_parts > layouts_end {
            return Err(format!("layer {layer}: {n_parts} parts do not fit a header of {} bytes", bytes.len()));
        }
        let mut parts = Vec::with_capacity(n_parts);
        for _ in 0..n_parts {
            let [kind, a, b] = [0, 4, 8].map(|o| u32_at(bytes, at + o));
            let part = part_of_code(kind, a as usize, b as usize)
                .ok_or_else(|| format!("layer {layer}: unknown part kind {kind} with sizes {a} and {b}"))?;
            parts.push(part);
            at += PART_BYTES;
        }
        layouts.push(LayerLayout::new(parts));
    }
    if at != layouts_end {
        return Err(format!("{} bytes after the layouts of {n_layers} layers", layouts_end - at));
    }
    Ok(layouts)
}

/// Version 2 layouts: per layer `n_streams`, `state_floats`, then the row
/// widths; as parts, rows then a fixed state.
fn decode_layouts_v2(bytes: &[u8], n_layers: usize, layouts_end: usize) -> Result<Vec<LayerLayout>, String> {
    let mut at = HEADER_FIXED_BYTES;
    let mut layouts = Vec::with_capacity(n_layers);
    for layer in 0..n_layers {
        if at + 8 > layouts_end {
            return Err(format!("layer {layer}'s layout runs past the header's {} bytes", bytes.len()));
        }
        let n_streams = u32_at(bytes, at) as usize;
        let state_floats = u32_at(bytes, at + 4) as usize;
        at += 8;
        if n_streams > MAX_PARTS || at + 4 * n_streams > layouts_end {
            return Err(format!("layer {layer}: {n_streams} streams do not fit a header of {} bytes", bytes.len()));
        }
        let rows = (0..n_streams).map(|s| StatePart::Rows { dim: u32_at(bytes, at + 4 * s) as usize });
        let state = (state_floats > 0).then_some(StatePart::Fixed { floats: state_floats });
        layouts.push(LayerLayout::new(rows.chain(state).collect()));
        at += 4 * n_streams;
    }
    if at != layouts_end {
        return Err(format!("{} bytes after the layouts of {n_layers} layers", layouts_end - at));
    }
    Ok(layouts)
}

/// Version 1 layouts: one `n_streams` and its row widths for every layer.
fn decode_layouts_v1(bytes: &[u8], n_layers: usize, layouts_end: usize) -> Result<Vec<LayerLayout>, String> {
    let n_streams = u32_at(bytes, HEADER_FIXED_BYTES) as usize;
    if HEADER_FIXED_BYTES + 4 + 4 * n_streams.min(MAX_PARTS + 1) != layouts_end || n_streams == 0 {
        return Err(format!("{n_streams} streams do not fit a header of {} bytes", bytes.len()));
    }
    let rows = (0..n_streams).map(|s| StatePart::Rows { dim: u32_at(bytes, HEADER_FIXED_BYTES + 4 + 4 * s) as usize });
    Ok(vec![LayerLayout::new(rows.collect()); n_layers])
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
    /// A snapshot: the state of every stateful layer after the first
    /// `position` tokens (the record's `token` is the one at `position - 1`).
    State = 4,
}

impl RecordKind {
    pub(crate) fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Self::TokenWithRows),
            2 => Some(Self::Token),
            3 => Some(Self::Rows),
            4 => Some(Self::State),
            _ => None,
        }
    }

    pub(crate) fn has_rows(self) -> bool {
        matches!(self, Self::TokenWithRows | Self::Rows)
    }

    /// Bytes of a whole record of this kind at `position` in a file of
    /// `header`, prefix and checksum included (the header is valid, so this
    /// fits a u32).
    pub(crate) fn record_bytes(self, header: &SessionHeader, position: usize) -> usize {
        let floats = match self {
            Self::TokenWithRows | Self::Rows => header.record_floats(position),
            Self::Token => 0,
            Self::State => header.state_floats(),
        };
        RECORD_PREFIX_BYTES + floats * 4 + CHECKSUM_BYTES
    }

    /// The most bytes a record of this kind takes in a file of `header`.
    pub(crate) fn record_bytes_max(self, header: &SessionHeader) -> usize {
        match self {
            Self::TokenWithRows | Self::Rows => RECORD_PREFIX_BYTES + header.record_floats_max() * 4 + CHECKSUM_BYTES,
            _ => self.record_bytes(header, 0),
        }
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
/// kinds with rows, what each part of each layer of `cache` records there
/// ([`StatePart::record_floats`]: its row, or the row of the group the
/// position completes); for
/// a state record, `token` is the one at `position - 1` and the body the
/// cache's latest snapshot, which must be at `position`.
pub(crate) fn encode_record(
    out: &mut Vec<u8>,
    kind: RecordKind,
    position: usize,
    token: u32,
    cache: &SequenceState,
    header: &SessionHeader,
) {
    let start = out.len();
    let record_bytes = kind.record_bytes(header, position);
    out.reserve(record_bytes);
    out.extend_from_slice(&(record_bytes as u32).to_le_bytes());
    out.extend_from_slice(&[kind as u8, 0, 0, 0]);
    out.extend_from_slice(&(position as u32).to_le_bytes());
    out.extend_from_slice(&token.to_le_bytes());
    let mut put = |values: &[f32]| values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    match kind {
        RecordKind::TokenWithRows | RecordKind::Rows => {
            for (layer, layout) in cache.layouts().iter().enumerate() {
                for (i, part) in layout.parts.iter().enumerate() {
                    match part {
                        StatePart::Rows { .. } => put(cache.rows_between(layer, i, position, position + 1)),
                        StatePart::Strided { dim, .. } if part.record_floats(position) > 0 => {
                            let groups = cache.groups(layer, i, position + 1);
                            put(&groups[groups.len() - dim..]);
                        }
                        _ => {}
                    }
                }
            }
        }
        RecordKind::Token => {}
        RecordKind::State => {
            let (len_tokens, floats) = cache.latest_snapshot().expect("a snapshot to write");
            assert_eq!(len_tokens, position, "the state record holds the latest snapshot");
            put(floats);
        }
    }
    let sum = checksum(&out[start..]);
    out.extend_from_slice(&sum);
    assert_eq!(out.len() - start, record_bytes, "the record is as long as its prefix says");
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
