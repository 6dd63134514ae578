//! Named KV sessions on disk: a header binding the file to one model, then
//! append-only records, one per token, and for caches with parts that keep
//! a state, snapshot records of it, each with a checksum (normative layout:
//! docs/FORMAT.md, "KV session file").
//!
//! Crash safety rests on ordering: records are written, fsynced, and only
//! then counted as committed. Opening scans the records, loads every one
//! whose checksum and place in the sequence are right straight into a
//! [`SequenceState`], and cuts the file back to the first one that is not (a torn
//! write from a killed process, or corruption), reporting how much was cut.
//! A cache with state then resumes from the latest snapshot the file holds.
//! A header for another model (content hash, tokenizer hash or dimensions)
//! is refused, never used.

mod format;
mod sink;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};

pub use format::{
    HASH_BYTES, MAX_LAYERS, MAX_PARTS, SESSION_MAGIC, SESSION_VERSION, SESSION_VERSION_OLDEST, SessionHeader, hex,
    parse_hash,
};
pub use sink::Sink;

use format::{
    CHECKSUM_BYTES, HEADER_PREFIX_BYTES, PrefixError, RECORD_PREFIX_BYTES, RecordKind, RecordPrefix, checksum,
    encode_record,
};

use crate::{Error, Result, SequenceState, StatePart};

/// Bytes read at a time while scanning records on open.
const SCAN_BUFFER_BYTES: usize = 1 << 20;

/// How much of the sequence a run of records holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    tokens: usize,
    /// Leading tokens whose rows are held; `tokens` or `tokens - 1`.
    rows_tokens: usize,
}

impl Counts {
    /// Whether the last token has no rows yet.
    fn has_pending(self) -> bool {
        self.rows_tokens < self.tokens
    }
}

/// A tail of the file that was not a sequence of complete, valid records,
/// and was cut off when the session was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutTail {
    /// Where the cut was made: the end of the last complete record.
    pub offset_bytes: u64,
    /// Bytes removed.
    pub cut_bytes: u64,
    /// Index of the first record that was dropped.
    pub record_index: usize,
    /// What was wrong with it (torn, checksum mismatch, ...).
    pub reason: String,
    /// Where the bytes cut were set aside (a sibling file): good records
    /// after a damaged one are never destroyed, only no longer part of the
    /// session.
    pub kept_in: PathBuf,
}

impl std::fmt::Display for CutTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cut {} bytes at byte {} (record {}: {}); they are kept in {}",
            self.cut_bytes,
            self.offset_bytes,
            self.record_index,
            self.reason,
            self.kept_in.display()
        )
    }
}

/// What opening a session file found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Whether the file was created by this call (and so is empty).
    pub created: bool,
    /// The whole token sequence.
    pub tokens: Vec<u32>,
    /// Leading tokens whose rows the file holds: `tokens.len()`, or one
    /// less when the last token was never run through the model.
    pub rows_tokens: usize,
    /// Leading tokens the cache holds after opening, rows and state: all of
    /// `rows_tokens` for a cache without state; with state, those up to the
    /// latest snapshot in the file (0 without one). The caller runs the
    /// others again when it needs them.
    pub resumed_tokens: usize,
    /// Complete records read.
    pub records: usize,
    /// The tail cut off, if the file did not end on a complete record.
    pub cut: Option<CutTail>,
}

/// Where a state record lies and the length it is a snapshot at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StateRecord {
    len_tokens: usize,
    start_bytes: u64,
    end_bytes: u64,
}

/// An open session file, locked against other processes, positioned to
/// append.
#[derive(Debug)]
pub struct SessionFile {
    path: PathBuf,
    sink: Box<dyn Sink>,
    /// Sizes every record.
    header: SessionHeader,
    /// Where the records start.
    header_bytes: u64,
    /// Bytes known durable (written and fsynced).
    committed_bytes: u64,
    /// Bytes written, committed or not.
    written_bytes: u64,
    committed: Counts,
    written: Counts,
    /// `rows_end[p]`: the end of the record that gave position `p` its
    /// rows, where the file is cut to keep the first `p + 1` tokens.
    rows_end: Vec<u64>,
    /// Every state record written, in file order (so by length, too).
    states: Vec<StateRecord>,
    /// Set when a failed append could not be rolled back: the file may end
    /// in an uncommitted tail, so nothing more may be appended after it.
    broken: bool,
    record: Vec<u8>,
}

impl SessionFile {
    /// Creates the session file at `path` for `header`, refusing if it
    /// exists. The header is written to a temporary file, fsynced, and
    /// linked into place, so `path` never holds a partial header.
    pub fn create(path: &Path, header: &SessionHeader) -> Result<SessionFile> {
        if let Some(reason) = header.invalid_reason() {
            return Err(Error::CorruptHeader { path: path.to_owned(), reason });
        }
        let io_err = |action: &'static str| move |source| Error::Io { path: path.to_owned(), action, source };
        let tmp = sibling(path, &format!("tmp-{}", std::process::id()));
        // Not `create_new`: a temporary file left by a crashed process that
        // had our pid is stale, and is emptied once we hold its lock.
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&tmp)
            .map_err(|source| Error::Io { path: tmp.clone(), action: "creating", source })?;
        let published = (|| {
            lock(&file, &tmp)?;
            file.set_len(0).map_err(io_err("creating"))?;
            let bytes = header.encode();
            file.append(&bytes).map_err(io_err("writing the header of"))?;
            file.sync_all().map_err(io_err("syncing"))?;
            // A hard link publishes atomically and, unlike rename, never
            // replaces a session another process created meanwhile.
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(io_err("creating")(e)),
                // File systems without hard links: rename, after checking
                // (racily, but only there) that nothing would be replaced.
                Err(_) if path.exists() => return Err(io_err("creating")(ErrorKind::AlreadyExists.into())),
                Err(_) => std::fs::rename(&tmp, path).map_err(io_err("creating"))?,
            }
            sync_parent_dir(path)?;
            Ok(bytes.len() as u64)
        })();
        // The temporary name is gone after a rename; after a link, drop it.
        let _ = std::fs::remove_file(&tmp);
        let header_bytes = published?;
        Ok(Self::with_sink(path.to_owned(), Box::new(file), header, header_bytes, Counts::default()))
    }

    /// Opens the session file at `path`, refusing it unless its header
    /// matches `expected` (content hash, tokenizer hash, dimensions), and
    /// loads its rows into `cache`, which must be empty and shaped like
    /// `expected`. A torn or corrupt tail is cut off the file and reported.
    pub fn open(path: &Path, expected: &SessionHeader, cache: &mut SequenceState) -> Result<(SessionFile, Recovered)> {
        assert!(cache.is_empty(), "sessions load into an empty cache");
        assert_eq!(cache.layouts(), expected.layouts.as_slice(), "the cache is shaped like the expected header");
        let mut file = OpenOptions::new().read(true).append(true).open(path).map_err(|source| Error::Io {
            path: path.to_owned(),
            action: "opening",
            source,
        })?;
        lock(&file, path)?;
        let file_bytes = file
            .metadata()
            .map_err(|source| Error::Io { path: path.to_owned(), action: "reading the size of", source })?
            .len();
        let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, &file);
        let header_bytes = read_header(&mut reader, path, expected, file_bytes)?;
        let scan = scan_records(&mut reader, path, expected, header_bytes as u64, cache)?;
        drop(reader);
        let cut = match scan.bad_record {
            Some((record_index, reason)) => {
                // Set aside first: if that fails the file is left as it was.
                let kept_in = set_tail_aside(&file, path, scan.end_bytes)?;
                file.truncate(scan.end_bytes).map_err(|source| Error::Io {
                    path: path.to_owned(),
                    action: "cutting the torn tail of",
                    source,
                })?;
                Some(CutTail {
                    offset_bytes: scan.end_bytes,
                    cut_bytes: file_bytes - scan.end_bytes,
                    record_index,
                    reason,
                    kept_in,
                })
            }
            None => None,
        };
        let mut session = Self::with_sink(path.to_owned(), Box::new(file), expected, scan.end_bytes, scan.counts);
        session.rows_end = scan.rows_end;
        session.states = scan.states;
        let resumed_tokens = cache.finish_load();
        let recovered = Recovered {
            created: false,
            tokens: scan.tokens,
            rows_tokens: scan.counts.rows_tokens,
            resumed_tokens,
            records: scan.records,
            cut,
        };
        Ok((session, recovered))
    }

    /// Reads the session file at `path` into `cache` (empty, shaped like
    /// `expected`) without changing the file or locking it: a published
    /// copy is never written again, and one that is damaged is refused
    /// as it is, so the user still holds every byte of it.
    pub fn read_copy(path: &Path, expected: &SessionHeader, cache: &mut SequenceState) -> Result<Recovered> {
        assert!(cache.is_empty(), "sessions load into an empty cache");
        assert_eq!(cache.layouts(), expected.layouts.as_slice(), "the cache is shaped like the expected header");
        let file = File::open(path).map_err(|source| Error::Io { path: path.to_owned(), action: "opening", source })?;
        let file_bytes = file
            .metadata()
            .map_err(|source| Error::Io { path: path.to_owned(), action: "reading the size of", source })?
            .len();
        let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, &file);
        let header_bytes = read_header(&mut reader, path, expected, file_bytes)?;
        let scan = scan_records(&mut reader, path, expected, header_bytes as u64, cache)?;
        if let Some((record_index, reason)) = scan.bad_record {
            return Err(Error::DamagedCopy {
                path: path.to_owned(),
                offset_bytes: scan.end_bytes,
                record_index,
                reason,
            });
        }
        let resumed_tokens = cache.finish_load();
        Ok(Recovered {
            created: false,
            tokens: scan.tokens,
            rows_tokens: scan.counts.rows_tokens,
            resumed_tokens,
            records: scan.records,
            cut: None,
        })
    }

    /// Opens the session at `path` (see [`Self::open`]), or creates it if
    /// there is none.
    pub fn open_or_create(
        path: &Path,
        header: &SessionHeader,
        cache: &mut SequenceState,
    ) -> Result<(SessionFile, Recovered)> {
        if !path.exists() {
            match Self::create(path, header) {
                Ok(file) => return Ok((file, Recovered { created: true, ..Recovered::default() })),
                // Another process created it first: open theirs.
                Err(Error::Io { source, .. }) if source.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Self::open(path, header, cache)
    }

    /// A session file over any sink that already holds `header_bytes` of
    /// header and the records `counts` describes.
    fn with_sink(path: PathBuf, sink: Box<dyn Sink>, header: &SessionHeader, end_bytes: u64, counts: Counts) -> Self {
        Self {
            path,
            sink,
            header: header.clone(),
            header_bytes: header.header_bytes() as u64,
            committed_bytes: end_bytes,
            written_bytes: end_bytes,
            committed: counts,
            written: counts,
            rows_end: Vec::new(),
            states: Vec::new(),
            broken: false,
            record: Vec::new(),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens held by committed (durable) records.
    pub fn committed_tokens(&self) -> usize {
        self.committed.tokens
    }

    /// Bytes of the file known durable.
    pub fn committed_bytes(&self) -> u64 {
        self.committed_bytes
    }

    /// Appends, without committing, a record for the next token of the
    /// sequence: `token` with its rows taken from `cache` at that position
    /// when `with_rows`, else without rows (the last generated token, not
    /// yet run; nothing may follow it but [`Self::append_rows`]).
    pub fn append(&mut self, token: u32, with_rows: bool, cache: &SequenceState) -> Result<()> {
        let position = self.written.tokens;
        if self.written.has_pending() {
            return Err(self.out_of_sequence(format!("token at position {position} after a token without rows")));
        }
        if with_rows && cache.len() <= position {
            return Err(self.out_of_sequence(format!("no rows in the cache for position {position}")));
        }
        let kind = if with_rows { RecordKind::TokenWithRows } else { RecordKind::Token };
        self.write_record(kind, position, token, cache)?;
        self.written.tokens += 1;
        if with_rows {
            self.written.rows_tokens += 1;
            self.rows_end.push(self.written_bytes);
        }
        Ok(())
    }

    /// Appends, without committing, the rows of the trailing token that was
    /// recorded without them, taken from `cache`.
    pub fn append_rows(&mut self, token: u32, cache: &SequenceState) -> Result<()> {
        let position = self.written.rows_tokens;
        if !self.written.has_pending() || cache.len() <= position {
            return Err(self.out_of_sequence(format!("no pending token with rows at position {position}")));
        }
        self.write_record(RecordKind::Rows, position, token, cache)?;
        self.written.rows_tokens += 1;
        self.rows_end.push(self.written_bytes);
        Ok(())
    }

    /// Makes every appended record durable (one fsync), then advances the
    /// committed length. On error nothing new counts as committed; call
    /// [`Self::rollback`].
    pub fn commit(&mut self) -> Result<()> {
        if self.written_bytes == self.committed_bytes {
            return Ok(());
        }
        self.sink.sync().map_err(|source| self.io_error("syncing", source))?;
        self.committed_bytes = self.written_bytes;
        self.committed = self.written;
        Ok(())
    }

    /// Cuts the file back to its committed length after a failed append or
    /// commit. If even that fails the file is marked broken: its tail will
    /// be cut when it is next opened, and nothing more is appended.
    pub fn rollback(&mut self) {
        if self.written_bytes != self.committed_bytes && self.sink.truncate(self.committed_bytes).is_err() {
            self.broken = true;
        }
        self.written_bytes = self.committed_bytes;
        self.written = self.committed;
        self.rows_end.truncate(self.committed.rows_tokens);
        let committed_bytes = self.committed_bytes;
        self.states.retain(|r| r.end_bytes <= committed_bytes);
    }

    /// Appends and commits whatever `tokens` (the whole sequence) and
    /// `cache` (rows of its leading tokens) hold beyond the file: one record
    /// per new token, one fsync for all of them. Returns the records
    /// written. On error the file is rolled back to its committed length.
    pub fn sync(&mut self, tokens: &[u32], cache: &SequenceState) -> Result<usize> {
        let result = self.append_new(tokens, cache).and_then(|records| self.commit().map(|()| records));
        if result.is_err() {
            self.rollback();
        }
        result
    }

    /// Keeps only the first `len_tokens` tokens, which must all have rows
    /// in committed records (0: a session reset), and the snapshots at most
    /// that long written before the next token's record. Cuts the file at a
    /// record boundary; durable when it returns.
    pub fn truncate_tokens(&mut self, len_tokens: usize) -> Result<()> {
        if self.written != self.committed || len_tokens > self.committed.rows_tokens {
            let reason = format!(
                "cannot keep {len_tokens} tokens: {} of the file's tokens have rows",
                self.committed.rows_tokens
            );
            return Err(self.out_of_sequence(reason));
        }
        let mut end_bytes = match len_tokens {
            0 => self.header_bytes,
            n => self.rows_end[n - 1],
        };
        // A snapshot written right after the rows it follows stays, so that
        // reopening resumes there rather than from an older one.
        for state in &self.states {
            if state.start_bytes == end_bytes && state.len_tokens <= len_tokens {
                end_bytes = state.end_bytes;
            }
        }
        self.states.retain(|r| r.end_bytes <= end_bytes);
        self.sink.truncate(end_bytes).map_err(|source| self.io_error("truncating", source))?;
        self.committed_bytes = end_bytes;
        self.written_bytes = end_bytes;
        self.broken = false;
        self.committed = Counts { tokens: len_tokens, rows_tokens: len_tokens };
        self.written = self.committed;
        self.rows_end.truncate(len_tokens);
        Ok(())
    }

    fn append_new(&mut self, tokens: &[u32], cache: &SequenceState) -> Result<usize> {
        if tokens.len() < self.written.tokens {
            let reason = format!("the sequence has {} tokens, the file {}", tokens.len(), self.written.tokens);
            return Err(self.out_of_sequence(reason));
        }
        let mut records = 0;
        if self.written.has_pending() && cache.len() > self.written.rows_tokens {
            self.append_rows(tokens[self.written.rows_tokens], cache)?;
            records += 1;
        }
        for position in self.written.tokens..tokens.len() {
            self.append(tokens[position], position < cache.len(), cache)?;
            records += 1;
        }
        // The cache's latest snapshot, unless the file holds it already (or
        // a later one, which only a truncation could make the cache lack).
        if let Some((len_tokens, _)) = cache.latest_snapshot() {
            let persisted = self.states.last().map(|r| r.len_tokens);
            if persisted.is_none_or(|p| p < len_tokens) && len_tokens <= self.written.rows_tokens {
                let start_bytes = self.written_bytes;
                self.write_record(RecordKind::State, len_tokens, tokens[len_tokens - 1], cache)?;
                self.states.push(StateRecord { len_tokens, start_bytes, end_bytes: self.written_bytes });
                records += 1;
            }
        }
        Ok(records)
    }

    fn write_record(&mut self, kind: RecordKind, position: usize, token: u32, cache: &SequenceState) -> Result<()> {
        if self.broken {
            return Err(self.out_of_sequence("an earlier failed append could not be rolled back".to_owned()));
        }
        debug_assert_eq!(cache.layouts(), self.header.layouts.as_slice());
        if u32::try_from(position).is_err() {
            return Err(self.out_of_sequence(format!("position {position} beyond what a record can hold")));
        }
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        encode_record(&mut record, kind, position, token, cache, &self.header);
        let result = self.sink.append(&record).map_err(|source| self.io_error("appending to", source));
        // Counted as written even on error: part of it may be on disk, and
        // rollback must cut it.
        self.written_bytes += record.len() as u64;
        self.record = record;
        result
    }

    fn io_error(&self, action: &'static str, source: io::Error) -> Error {
        Error::Append { path: self.path.clone(), action, offset_bytes: self.written_bytes, source }
    }

    fn out_of_sequence(&self, reason: String) -> Error {
        Error::OutOfSequence { path: self.path.clone(), reason }
    }
}

/// A session file that stops persisting, with one warning, when an append
/// fails (a full disk above all), so that generation goes on from memory.
#[derive(Debug)]
pub struct Persist {
    file: Option<SessionFile>,
    path: PathBuf,
}

impl Persist {
    /// Persists through `file`.
    pub fn new(file: SessionFile) -> Self {
        Self { path: file.path.clone(), file: Some(file) }
    }

    /// Whether records are still being written.
    pub fn is_active(&self) -> bool {
        self.file.is_some()
    }

    /// The session file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens durable in the file (0 once persisting stopped).
    pub fn committed_tokens(&self) -> usize {
        self.file.as_ref().map_or(0, SessionFile::committed_tokens)
    }

    /// Appends and commits what the sequence holds beyond the file (see
    /// [`SessionFile::sync`]). If that fails (ENOSPC, a quota, any I/O
    /// error) persisting stops: the file is cut back to its last committed
    /// record, this returns the one warning to show, and later calls do
    /// nothing. A session must not fail because its copy on disk did.
    pub fn sync(&mut self, tokens: &[u32], cache: &SequenceState) -> Option<String> {
        let result = self.file.as_mut()?.sync(tokens, cache);
        result.err().map(|e| self.stop(e))
    }

    /// Keeps only the first `len_tokens` tokens in the file (see
    /// [`SessionFile::truncate_tokens`]); on failure persisting stops, with
    /// the warning returned.
    pub fn truncate(&mut self, len_tokens: usize) -> Option<String> {
        let result = self.file.as_mut()?.truncate_tokens(len_tokens);
        result.err().map(|e| self.stop(e))
    }

    fn stop(&mut self, error: Error) -> String {
        let kept = self.committed_tokens();
        self.file = None;
        format!(
            "{error}; the session is no longer saved and goes on in memory only (the file keeps its first {kept} tokens)"
        )
    }
}

impl Error {
    /// Whether this is a full disk or an exhausted quota.
    pub fn is_storage_full(&self) -> bool {
        match self {
            Error::Io { source, .. } | Error::Append { source, .. } => {
                matches!(source.kind(), ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
            }
            _ => false,
        }
    }
}

/// Reads and checks the header, returning its length.
fn read_header(reader: &mut impl Read, path: &Path, expected: &SessionHeader, file_bytes: u64) -> Result<usize> {
    let corrupt = |reason: String| Error::CorruptHeader { path: path.to_owned(), reason };
    let io_err = |source| Error::Io { path: path.to_owned(), action: "reading", source };
    let mut prefix = [0u8; HEADER_PREFIX_BYTES];
    let got = read_full(reader, &mut prefix).map_err(io_err)?;
    let magic_got = got.min(SESSION_MAGIC.len());
    if got < prefix.len() && prefix[..magic_got] != SESSION_MAGIC[..magic_got] {
        return Err(Error::NotASession { path: path.to_owned(), found: lossy(&prefix[..got.min(8)]) });
    }
    if got < prefix.len() {
        return Err(corrupt(format!("the file is {file_bytes} bytes, shorter than a header")));
    }
    let (version, header_bytes) = match SessionHeader::decode_prefix(&prefix) {
        Ok(found) => found,
        Err(PrefixError::Magic(found)) => return Err(Error::NotASession { path: path.to_owned(), found }),
        Err(PrefixError::Version(version)) => return Err(Error::UnsupportedVersion { path: path.to_owned(), version }),
        Err(PrefixError::Corrupt(reason)) => return Err(corrupt(reason)),
    };
    let mut bytes = vec![0u8; header_bytes];
    bytes[..HEADER_PREFIX_BYTES].copy_from_slice(&prefix);
    let got = read_full(reader, &mut bytes[HEADER_PREFIX_BYTES..]).map_err(io_err)?;
    if HEADER_PREFIX_BYTES + got < header_bytes {
        return Err(corrupt(format!("the file is {file_bytes} bytes, shorter than its {header_bytes}-byte header")));
    }
    let found = SessionHeader::decode(version, &bytes).map_err(corrupt)?;
    let mismatches = found.mismatches(expected);
    if !mismatches.is_empty() {
        return Err(Error::ModelMismatch { path: path.to_owned(), mismatches: mismatches.join("; ") });
    }
    Ok(header_bytes)
}

struct Scan {
    tokens: Vec<u32>,
    counts: Counts,
    records: usize,
    /// End of the last complete, valid record.
    end_bytes: u64,
    /// See [`SessionFile::rows_end`].
    rows_end: Vec<u64>,
    /// See [`SessionFile::states`].
    states: Vec<StateRecord>,
    /// The first record that is not, and why.
    bad_record: Option<(usize, String)>,
}

/// Reads records until the end of the file or the first one that is torn,
/// fails its checksum or does not continue the sequence, loading each good
/// one's rows into `cache`, and the latest snapshots it holds.
fn scan_records(
    reader: &mut impl Read,
    path: &Path,
    header: &SessionHeader,
    header_bytes: u64,
    cache: &mut SequenceState,
) -> Result<Scan> {
    let mut scan = Scan {
        tokens: Vec::new(),
        counts: Counts::default(),
        records: 0,
        end_bytes: header_bytes,
        rows_end: Vec::new(),
        states: Vec::new(),
        bad_record: None,
    };
    let largest = RecordKind::TokenWithRows.record_bytes_max(header).max(RecordKind::State.record_bytes_max(header));
    let mut record = vec![0u8; largest];
    let mut row = Vec::new();
    loop {
        let offset_bytes = scan.end_bytes;
        let io_err = |source| Error::Io { path: path.to_owned(), action: "reading", source };
        let got = read_full(reader, &mut record[..RECORD_PREFIX_BYTES]).map_err(io_err)?;
        if got == 0 {
            return Ok(scan);
        }
        let bad = |reason: String| Some((scan.records, reason));
        if got < RECORD_PREFIX_BYTES {
            scan.bad_record = bad(format!("torn record: {got} of its {RECORD_PREFIX_BYTES}-byte prefix present"));
            return Ok(scan);
        }
        let prefix = RecordPrefix::decode(record[..RECORD_PREFIX_BYTES].try_into().expect("prefix"));
        let Some(kind) = prefix.kind else {
            scan.bad_record = bad(format!("unknown record kind {}", prefix.kind_byte));
            return Ok(scan);
        };
        let expected_bytes = kind.record_bytes(header, prefix.position);
        if prefix.record_bytes != expected_bytes || !prefix.reserved_zero {
            scan.bad_record = bad(format!(
                "record length {} (a {kind:?} record is {expected_bytes} bytes) or reserved bytes not zero",
                prefix.record_bytes
            ));
            return Ok(scan);
        }
        let got = read_full(reader, &mut record[RECORD_PREFIX_BYTES..expected_bytes]).map_err(io_err)?;
        if RECORD_PREFIX_BYTES + got < expected_bytes {
            scan.bad_record =
                bad(format!("torn record: {} of {expected_bytes} bytes present", RECORD_PREFIX_BYTES + got));
            return Ok(scan);
        }
        let body = expected_bytes - CHECKSUM_BYTES;
        if checksum(&record[..body]) != record[body..expected_bytes] {
            scan.bad_record = bad("checksum mismatch".to_owned());
            return Ok(scan);
        }
        if let Some(reason) = out_of_place(kind, &prefix, scan.counts, &scan.tokens, header, &scan.states) {
            scan.bad_record = bad(reason);
            return Ok(scan);
        }
        if kind.has_rows() {
            cache.reserve(1).map_err(|_| Error::SessionTooLong {
                path: path.to_owned(),
                tokens: scan.counts.rows_tokens + 1,
                capacity_tokens: cache.capacity_tokens(),
            })?;
            load_rows(cache, prefix.token, &record[RECORD_PREFIX_BYTES..body], &mut row);
            scan.counts.rows_tokens += 1;
        }
        if kind == RecordKind::State {
            let floats = record[RECORD_PREFIX_BYTES..body]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4")))
                .collect();
            cache.push_loaded_snapshot(prefix.position, floats);
        } else if kind != RecordKind::Rows {
            scan.tokens.push(prefix.token);
            scan.counts.tokens += 1;
        }
        scan.records += 1;
        scan.end_bytes = offset_bytes + expected_bytes as u64;
        if kind.has_rows() {
            scan.rows_end.push(scan.end_bytes);
        }
        if kind == RecordKind::State {
            let len_tokens = prefix.position;
            scan.states.push(StateRecord { len_tokens, start_bytes: offset_bytes, end_bytes: scan.end_bytes });
        }
    }
}

/// Why a record with a good checksum still cannot follow `counts`, if so.
/// Records are written strictly in sequence, so this is corruption (or a
/// file spliced together), never a crash.
fn out_of_place(
    kind: RecordKind,
    prefix: &RecordPrefix,
    counts: Counts,
    tokens: &[u32],
    header: &SessionHeader,
    states: &[StateRecord],
) -> Option<String> {
    let position = prefix.position;
    match kind {
        RecordKind::State if header.state_floats() == 0 => Some("a state record for a cache without state".to_owned()),
        RecordKind::State if position == 0 || position > counts.rows_tokens => {
            Some(format!("a state at length {position}, {} tokens have rows", counts.rows_tokens))
        }
        RecordKind::State if prefix.token != tokens[position - 1] => Some(format!(
            "a state after token {} at length {position}, the token is {}",
            prefix.token,
            tokens[position - 1]
        )),
        RecordKind::State if states.last().is_some_and(|s| s.len_tokens > position) => {
            Some(format!("a state at length {position} after one at a greater length"))
        }
        RecordKind::TokenWithRows | RecordKind::Token if counts.has_pending() => {
            Some(format!("a new token at position {} after a token without rows", prefix.position))
        }
        RecordKind::TokenWithRows | RecordKind::Token if prefix.position != counts.tokens => {
            Some(format!("token for position {}, expected position {}", prefix.position, counts.tokens))
        }
        RecordKind::Rows if !counts.has_pending() => Some("rows record without a pending token".to_owned()),
        RecordKind::Rows if prefix.position != counts.rows_tokens || prefix.token != tokens[counts.rows_tokens] => {
            Some(format!(
                "rows for token {} at position {}, the pending token is {} at {}",
                prefix.token, prefix.position, tokens[counts.rows_tokens], counts.rows_tokens
            ))
        }
        _ => None,
    }
}

/// Writes one token's record (layer by layer, part by part, as
/// little-endian f32) into the cache's next position, with `token` in the
/// token parts, and commits them (the parts with state follow from the
/// snapshots when loading ends).
fn load_rows(cache: &mut SequenceState, token: u32, bytes: &[u8], row: &mut Vec<f32>) {
    let position = cache.len();
    let mut at = 0;
    for layer in 0..cache.n_layers() {
        for (i, part) in cache.layout(layer).parts.clone().into_iter().enumerate() {
            let floats = part.record_floats(position);
            row.clear();
            row.extend(
                bytes[at..at + 4 * floats].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4"))),
            );
            at += 4 * floats;
            match part {
                StatePart::Rows { .. } => cache.write(layer, i, row),
                StatePart::Strided { .. } => cache.write_groups(layer, i, row),
                StatePart::Tokens { .. } => cache.write_tokens(layer, i, &[token]),
                StatePart::Ring { .. } | StatePart::Fixed { .. } => {}
            }
        }
    }
    cache.advance_loaded_rows(1);
}

/// Reads until `buf` is full or the end of the file; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Takes the advisory lock that keeps two processes from appending to one
/// session (their records would interleave).
fn lock(file: &File, path: &Path) -> Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(Error::SessionInUse { path: path.to_owned() }),
        Err(TryLockError::Error(source)) => Err(Error::Io { path: path.to_owned(), action: "locking", source }),
    }
}

/// Makes a new directory entry durable.
fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(|source| Error::Io {
        path: dir.to_owned(),
        action: "syncing the directory",
        source,
    })
}

/// Copies the bytes of `file` (the session at `path`) from `offset_bytes` to
/// its end into a new sibling, `NAME.tail-OFFSET` (`-N` added if taken),
/// fsynced, and returns its path. On failure nothing is left behind.
fn set_tail_aside(file: &File, path: &Path, offset_bytes: u64) -> Result<PathBuf> {
    use std::io::{Seek, SeekFrom};
    const NAMES_MAX: u32 = 1000;
    let io_error = |path: &Path, action: &'static str| {
        let path = path.to_owned();
        move |source| Error::Io { path, action, source }
    };
    for attempt in 0..NAMES_MAX {
        let suffix = match attempt {
            0 => format!("tail-{offset_bytes}"),
            n => format!("tail-{offset_bytes}-{n}"),
        };
        let aside = sibling(path, &suffix);
        let mut out = match OpenOptions::new().write(true).create_new(true).open(&aside) {
            Ok(out) => out,
            Err(err) if err.kind() == ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(io_error(&aside, "setting aside the damaged tail in")(source)),
        };
        let mut reader = file;
        let copied = reader
            .seek(SeekFrom::Start(offset_bytes))
            .and_then(|_| io::copy(&mut reader, &mut out))
            .and_then(|_| out.sync_all());
        if let Err(source) = copied {
            // Best effort: the copy already failed with the error that matters.
            let _ = std::fs::remove_file(&aside);
            return Err(io_error(&aside, "setting aside the damaged tail in")(source));
        }
        sync_parent_dir(&aside)?;
        return Ok(aside);
    }
    Err(io_error(path, "setting aside the damaged tail of")(io::Error::other(format!(
        "{NAMES_MAX} earlier tails set aside at byte {offset_bytes}; remove some"
    ))))
}

/// `path` with `.suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    path.with_file_name(name)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
