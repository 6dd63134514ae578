use std::io;
use std::sync::{Arc, Mutex};

use super::*;

const N_LAYERS: usize = 2;
const ROW_DIMS: [usize; 2] = [4, 3];

fn header() -> SessionHeader {
    SessionHeader {
        content_hash: [0xab; HASH_BYTES],
        tokenizer_hash: Some([0x11; HASH_BYTES]),
        n_layers: N_LAYERS,
        row_dims: ROW_DIMS.to_vec(),
        created_by: "strata-kv tests".to_owned(),
    }
}

fn empty_cache(capacity_tokens: usize) -> KvCache {
    KvCache::new(N_LAYERS, ROW_DIMS.to_vec(), capacity_tokens)
}

/// A distinct value for every (layer, stream, position, column).
fn value(layer: usize, stream: usize, position: usize, column: usize) -> f32 {
    (layer * 1000 + stream * 100 + column) as f32 + position as f32 * 0.25 - 7.5
}

/// Runs `n` more positions "through the model": writes their rows and commits.
fn run_tokens(cache: &mut KvCache, n: usize) {
    let start = cache.len();
    cache.reserve(n).unwrap();
    for layer in 0..cache.n_layers() {
        for (stream, &dim) in ROW_DIMS.iter().enumerate() {
            let rows: Vec<f32> =
                (start..start + n).flat_map(|p| (0..dim).map(move |c| value(layer, stream, p, c))).collect();
            cache.write(layer, stream, &rows);
        }
    }
    cache.advance(n);
}

fn assert_rows(cache: &KvCache, n_tokens: usize) {
    assert_eq!(cache.len(), n_tokens);
    for layer in 0..N_LAYERS {
        for (stream, &dim) in ROW_DIMS.iter().enumerate() {
            let rows = cache.rows(layer, stream, n_tokens);
            for p in 0..n_tokens {
                for c in 0..dim {
                    assert_eq!(rows[p * dim + c].to_bits(), value(layer, stream, p, c).to_bits());
                }
            }
        }
    }
}

fn record_bytes(kind: RecordKind) -> u64 {
    kind.record_bytes(header().floats_per_token()) as u64
}

/// A session of `with_rows` run tokens and, if `pending`, one more without
/// rows, written through `SessionFile::sync` as the engine does: a prefill
/// of 3 tokens, then one token per step.
fn write_session(path: &Path, with_rows: usize, pending: bool) -> Vec<u32> {
    let mut file = SessionFile::create(path, &header()).unwrap();
    let mut cache = empty_cache(64);
    let mut tokens = Vec::new();
    let prefill = with_rows.min(3);
    tokens.extend((0..prefill as u32).map(|t| 100 + t));
    run_tokens(&mut cache, prefill);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), prefill);
    for t in prefill..with_rows {
        tokens.push(100 + t as u32);
        run_tokens(&mut cache, 1);
        assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    }
    if pending {
        tokens.push(999);
        assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    }
    tokens
}

fn open(path: &Path) -> Result<(SessionFile, Recovered, KvCache)> {
    let mut cache = empty_cache(64);
    let (file, recovered) = SessionFile::open(path, &header(), &mut cache)?;
    Ok((file, recovered, cache))
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn round_trip_restores_tokens_rows_and_the_pending_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let tokens = write_session(&path, 5, true);
    let h = header().header_bytes() as u64;
    assert_eq!(file_len(&path), h + 5 * record_bytes(RecordKind::TokenWithRows) + record_bytes(RecordKind::Token));

    let (mut file, recovered, mut cache) = open(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_eq!((recovered.rows_tokens, recovered.records, recovered.cut.clone()), (5, 6, None));
    assert!(!recovered.created);
    assert_rows(&cache, 5);

    // Continuing runs the pending token (a Rows record), then adds two more.
    run_tokens(&mut cache, 1);
    let mut tokens = tokens;
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    tokens.extend([7, 8]);
    run_tokens(&mut cache, 1);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2, "one with rows, one pending");
    assert_eq!(file.committed_tokens(), 8);
    drop(file);

    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_eq!(recovered.rows_tokens, 7);
    assert_rows(&cache, 7);
}

#[test]
fn open_or_create_creates_then_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.kvs");
    // A stale temporary file of a crashed process that had our pid.
    std::fs::write(sibling(&path, &format!("tmp-{}", std::process::id())), b"stale").unwrap();
    let mut cache = empty_cache(8);
    let (file, recovered) = SessionFile::open_or_create(&path, &header(), &mut cache).unwrap();
    assert!(recovered.created && recovered.tokens.is_empty());
    assert_eq!(file_len(&path), header().header_bytes() as u64);
    assert!(std::fs::read_dir(dir.path()).unwrap().count() == 1, "no temporary file left");
    drop(file);
    let (_, recovered) = SessionFile::open_or_create(&path, &header(), &mut cache).unwrap();
    assert!(!recovered.created && recovered.tokens.is_empty());
    let err = SessionFile::create(&path, &header()).unwrap_err();
    assert!(matches!(&err, Error::Io { source, .. } if source.kind() == ErrorKind::AlreadyExists), "{err}");
}

#[test]
fn a_torn_last_record_is_cut_back_at_every_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.kvs");
    let tokens = write_session(&full, 4, false);
    let bytes = std::fs::read(&full).unwrap();
    let last = record_bytes(RecordKind::TokenWithRows);
    let complete = bytes.len() as u64 - last;
    for torn in 0..last {
        let path = dir.path().join(format!("torn-{torn}.kvs"));
        std::fs::write(&path, &bytes[..(complete + torn) as usize]).unwrap();
        let (_, recovered, cache) = open(&path).unwrap();
        assert_eq!(recovered.tokens, tokens[..3], "torn at {torn}");
        assert_rows(&cache, 3);
        assert_eq!(file_len(&path), complete, "the file is cut back to its last complete record");
        match recovered.cut {
            None => assert_eq!(torn, 0),
            Some(cut) => {
                assert_eq!((cut.offset_bytes, cut.cut_bytes, cut.record_index), (complete, torn, 3));
                assert!(cut.reason.contains("torn"), "{}", cut.reason);
            }
        }
        // Reopening the repaired file finds nothing more to cut.
        assert_eq!(open(&path).unwrap().1.cut, None);
    }
}

#[test]
fn a_bad_checksum_cuts_that_record_and_everything_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_session(&path, 6, true);
    let mut bytes = std::fs::read(&path).unwrap();
    let before = bytes.len() as u64;
    let third = header().header_bytes() + 2 * record_bytes(RecordKind::TokenWithRows) as usize;
    bytes[third + 40] ^= 0x01; // one bit of a row value of record 2
    std::fs::write(&path, &bytes).unwrap();
    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!(recovered.tokens, [100, 101]);
    assert_rows(&cache, 2);
    let cut = recovered.cut.unwrap();
    assert_eq!((cut.offset_bytes, cut.cut_bytes, cut.record_index), (third as u64, before - third as u64, 2));
    assert_eq!(cut.reason, "checksum mismatch");
    assert_eq!(file_len(&path), third as u64);
}

#[test]
fn records_with_good_checksums_out_of_sequence_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_session(&path, 3, false);
    let mut bytes = std::fs::read(&path).unwrap();
    let record = record_bytes(RecordKind::TokenWithRows) as usize;
    // A record repeated (say, by a bad splice): valid on its own, wrong position.
    let last = bytes[bytes.len() - record..].to_vec();
    bytes.extend_from_slice(&last);
    std::fs::write(&path, &bytes).unwrap();
    let (_, recovered, _) = open(&path).unwrap();
    assert_eq!(recovered.tokens.len(), 3);
    let cut = recovered.cut.unwrap();
    assert!(cut.reason.contains("expected position 3"), "{}", cut.reason);
    assert_eq!(cut.cut_bytes, record as u64);
}

#[test]
fn garbage_after_the_records_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_session(&path, 2, true);
    let clean = file_len(&path);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0xff; 37]);
    std::fs::write(&path, &bytes).unwrap();
    let (_, recovered, _) = open(&path).unwrap();
    assert_eq!(recovered.tokens, [100, 101, 999]);
    assert_eq!(recovered.cut.unwrap().cut_bytes, 37);
    assert_eq!(file_len(&path), clean);
}

#[test]
fn a_header_for_another_model_is_refused_naming_both_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_session(&path, 2, false);
    let before = std::fs::read(&path).unwrap();

    let mut other = header();
    other.content_hash = [0xcd; HASH_BYTES];
    let err = SessionFile::open(&path, &other, &mut empty_cache(8)).unwrap_err().to_string();
    assert!(err.contains("another model") && err.contains(&"ab".repeat(32)) && err.contains(&"cd".repeat(32)), "{err}");

    let mut other = header();
    other.tokenizer_hash = None;
    let err = SessionFile::open(&path, &other, &mut empty_cache(8)).unwrap_err().to_string();
    assert!(err.contains("tokenizer hash") && err.contains(&"11".repeat(32)) && err.contains("none"), "{err}");

    let mut other = header();
    other.n_layers = 3;
    other.row_dims = vec![4, 5];
    let mut cache = KvCache::new(3, vec![4, 5], 8);
    let err = SessionFile::open(&path, &other, &mut cache).unwrap_err().to_string();
    assert!(err.contains("n_layers 2 in the file, 3 for this model"), "{err}");
    assert!(err.contains("row_dims [4, 3] in the file, [4, 5] for this model"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "a refused file is left untouched");
}

#[test]
fn foreign_damaged_or_newer_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    std::fs::write(&path, b"{\"not\": \"a session\"}").unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("not a Strata KV session file"), "{err}");

    let good_path = dir.path().join("good.kvs");
    write_session(&good_path, 1, false);
    let good = std::fs::read(&good_path).unwrap();
    let mut newer = good.clone();
    newer[8] = 2;
    std::fs::write(&path, &newer).unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("unsupported version 2"), "{err}");

    let mut damaged = good.clone();
    damaged[20] ^= 0x80; // inside the content hash
    std::fs::write(&path, &damaged).unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("corrupt header: header checksum mismatch"), "{err}");

    std::fs::write(&path, &good[..50]).unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("corrupt header") && err.contains("shorter"), "{err}");
}

#[test]
fn a_session_longer_than_the_context_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_session(&path, 5, false);
    let err = SessionFile::open(&path, &header(), &mut empty_cache(4)).unwrap_err().to_string();
    assert!(err.contains("at least 5 tokens") && err.contains("context of 4"), "{err}");
}

#[test]
fn a_session_is_locked_against_a_second_opener() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let file = SessionFile::create(&path, &header()).unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("in use by another process"), "{err}");
    drop(file);
    open(&path).unwrap();
}

#[test]
fn appends_out_of_sequence_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = SessionFile::create(&dir.path().join("s.kvs"), &header()).unwrap();
    let mut cache = empty_cache(8);
    assert!(file.append(1, true, &cache).unwrap_err().to_string().contains("no rows in the cache"));
    file.append(1, false, &cache).unwrap();
    assert!(file.append(2, false, &cache).unwrap_err().to_string().contains("after a token without rows"));
    run_tokens(&mut cache, 1);
    file.append_rows(1, &cache).unwrap();
    file.commit().unwrap();
    assert_eq!(file.committed_tokens(), 1);
    assert!(file.sync(&[], &cache).unwrap_err().to_string().contains("the sequence has 0 tokens, the file 1"));
}

#[test]
fn truncating_keeps_a_prefix_of_whole_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let tokens = write_session(&path, 4, true);
    // Continue once, so that position 4 gets its rows from a Rows record.
    let (mut file, _, mut cache) = open(&path).unwrap();
    run_tokens(&mut cache, 1);
    let mut tokens = tokens;
    tokens.push(555);
    file.sync(&tokens, &cache).unwrap();
    let mut persist = Persist::new(file);
    let warning = persist.truncate(6).unwrap();
    assert!(warning.contains("5 of the file's tokens have rows") && !persist.is_active(), "{warning}");
    drop(persist);
    let mut before = tokens.len();
    for keep in [5, 3, 0] {
        let (file, recovered, _) = open(&path).unwrap();
        assert_eq!(recovered.tokens.len(), before, "the failed truncation changed nothing, then each cut held");
        before = keep;
        let mut persist = Persist::new(file);
        assert_eq!(persist.truncate(keep), None);
        drop(persist);
        let (_, recovered, cache) = open(&path).unwrap();
        assert_eq!((recovered.tokens.as_slice(), recovered.cut), (&tokens[..keep], None), "keep {keep}");
        assert_rows(&cache, keep);
    }
    assert_eq!(file_len(&path), header().header_bytes() as u64);
}

/// A disk with room for `capacity_bytes`: appends past it write what fits,
/// then fail with ENOSPC, as a real file system does.
#[derive(Debug, Clone)]
struct SmallDisk {
    bytes: Arc<Mutex<Vec<u8>>>,
    capacity_bytes: usize,
    syncs: Arc<Mutex<usize>>,
}

impl Sink for SmallDisk {
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut disk = self.bytes.lock().unwrap();
        let room = self.capacity_bytes.saturating_sub(disk.len());
        disk.extend_from_slice(&bytes[..room.min(bytes.len())]);
        if room < bytes.len() {
            return Err(io::Error::new(ErrorKind::StorageFull, "No space left on device"));
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        *self.syncs.lock().unwrap() += 1;
        Ok(())
    }

    fn truncate(&mut self, len_bytes: u64) -> io::Result<()> {
        self.bytes.lock().unwrap().truncate(len_bytes as usize);
        Ok(())
    }
}

#[test]
fn a_full_disk_stops_persisting_with_one_warning_and_keeps_a_valid_prefix() {
    let h = header();
    let record = record_bytes(RecordKind::TokenWithRows) as usize;
    // Room for the header, a 3-token prefill and half of the next record.
    let disk = SmallDisk {
        bytes: Arc::new(Mutex::new(h.encode())),
        capacity_bytes: h.header_bytes() + 3 * record + record / 2,
        syncs: Arc::new(Mutex::new(0)),
    };
    let file = SessionFile::with_sink(
        "small-disk.kvs".into(),
        Box::new(disk.clone()),
        &h,
        h.header_bytes() as u64,
        Counts::default(),
    );
    let mut persist = Persist::new(file);
    let mut cache = empty_cache(64);
    let mut tokens = vec![1, 2, 3];
    run_tokens(&mut cache, 3);
    assert_eq!(persist.sync(&tokens, &cache), None);
    assert_eq!(*disk.syncs.lock().unwrap(), 1, "one fsync for the whole prefill");

    let mut warnings = Vec::new();
    for step in 0..5 {
        tokens.push(10 + step);
        run_tokens(&mut cache, 1);
        warnings.extend(persist.sync(&tokens, &cache));
    }
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("No space left on device") && warnings[0].contains("first 3 tokens"), "{warnings:?}");
    assert!(!persist.is_active());
    assert_eq!(*disk.syncs.lock().unwrap(), 1, "nothing more was written or synced");

    // The half-written record was rolled back: the disk holds a valid prefix.
    let bytes = disk.bytes.lock().unwrap().clone();
    assert_eq!(bytes.len(), h.header_bytes() + 3 * record);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    std::fs::write(&path, &bytes).unwrap();
    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!((recovered.tokens, recovered.cut), (vec![1, 2, 3], None));
    assert_rows(&cache, 3);
}

#[test]
fn storage_full_is_recognised_from_the_os_error() {
    let enospc = Error::Append {
        path: "x".into(),
        action: "appending to",
        offset_bytes: 0,
        source: io::Error::from_raw_os_error(28),
    };
    assert!(enospc.is_storage_full(), "{enospc}");
    let eio = Error::Append {
        path: "x".into(),
        action: "appending to",
        offset_bytes: 0,
        source: io::Error::from_raw_os_error(5),
    };
    assert!(!eio.is_storage_full());
}

#[test]
fn hashes_round_trip_through_hex() {
    let hash: [u8; HASH_BYTES] = std::array::from_fn(|i| (i * 37) as u8);
    assert_eq!(parse_hash(&hex(&hash)), Some(hash));
    assert_eq!(parse_hash(&hex(&hash).to_uppercase()), Some(hash));
    assert_eq!(parse_hash("abc"), None);
    assert_eq!(parse_hash(&format!("+f{}", "0".repeat(62))), None);
}
