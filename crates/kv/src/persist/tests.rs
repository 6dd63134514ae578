use std::io;
use std::sync::{Arc, Mutex};

use super::*;
use crate::LayerLayout;

const N_LAYERS: usize = 2;
const ROW_DIMS: [usize; 2] = [4, 3];

fn header() -> SessionHeader {
    SessionHeader {
        content_hash: [0xab; HASH_BYTES],
        tokenizer_hash: Some([0x11; HASH_BYTES]),
        layouts: vec![LayerLayout { row_dims: ROW_DIMS.to_vec(), state_floats: 0 }; N_LAYERS],
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
    kind.record_bytes(&header()) as u64
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
fn a_corrupt_record_sets_the_tail_aside_instead_of_destroying_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_session(&path, 6, true);
    let mut bytes = std::fs::read(&path).unwrap();
    let second = header().header_bytes() + record_bytes(RecordKind::TokenWithRows) as usize;
    bytes[second + 40] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let cut = open(&path).unwrap().1.cut.unwrap();
    assert_eq!(cut.kept_in, dir.path().join(format!("s.kvs.tail-{second}")));
    assert_eq!(std::fs::read(&cut.kept_in).unwrap(), bytes[second..], "the good records after it are all kept");
    assert!(cut.to_string().contains("kept in"), "{cut}");
    // Damage at the same place again: the first tail set aside stays.
    let mut again = std::fs::read(&path).unwrap();
    again.extend_from_slice(&[0xAB; 37]);
    std::fs::write(&path, &again).unwrap();
    let cut_again = open(&path).unwrap().1.cut.unwrap();
    assert_eq!(cut_again.kept_in, dir.path().join(format!("s.kvs.tail-{second}-1")));
    assert_eq!(std::fs::read(&cut.kept_in).unwrap(), bytes[second..]);
    assert_eq!(std::fs::read(&cut_again.kept_in).unwrap(), [0xAB; 37]);
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

    let mut cache = KvCache::new(3, vec![4, 5], 8);
    let other = SessionHeader { layouts: cache.layouts().to_vec(), ..header() };
    let err = SessionFile::open(&path, &other, &mut cache).unwrap_err().to_string();
    assert!(err.contains("n_layers 2 in the file, 3 for this model"), "{err}");
    assert!(
        err.contains(
            "layer 0 keeps row_dims [4, 3] and 0 state floats in the file, row_dims [4, 5] and 0 state floats for this model"
        ),
        "{err}"
    );
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
    newer[8] = 3;
    std::fs::write(&path, &newer).unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("unsupported version 3 (this build reads versions 1 to 2)"), "{err}");

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

#[test]
fn a_version_1_file_is_read_and_continued() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let tokens = write_session(&path, 3, false);
    // The same session as version 1 wrote it: one set of row widths for
    // every layer, no state; the records are the same.
    let bytes = std::fs::read(&path).unwrap();
    let records = &bytes[header().header_bytes()..];
    let mut v1 = Vec::new();
    v1.extend_from_slice(&SESSION_MAGIC);
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&(132 + 4 * ROW_DIMS.len() as u32).to_le_bytes());
    v1.extend_from_slice(&bytes[16..84]);
    v1.extend_from_slice(&(N_LAYERS as u32).to_le_bytes());
    v1.extend_from_slice(&(ROW_DIMS.len() as u32).to_le_bytes());
    ROW_DIMS.iter().for_each(|&d| v1.extend_from_slice(&(d as u32).to_le_bytes()));
    let created_by = header().header_bytes() - 40;
    v1.extend_from_slice(&bytes[created_by..created_by + 32]);
    let sum = checksum(&v1);
    v1.extend_from_slice(&sum);
    v1.extend_from_slice(records);
    std::fs::write(&path, &v1).unwrap();

    let (mut file, recovered, mut cache) = open(&path).unwrap();
    assert_eq!((recovered.tokens.as_slice(), recovered.resumed_tokens, recovered.cut), (tokens.as_slice(), 3, None));
    assert_rows(&cache, 3);
    run_tokens(&mut cache, 1);
    let mut tokens = tokens;
    tokens.push(103);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    drop(file);
    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_rows(&cache, 4);
}

/// Attention rows, a recurrent state, and a layer with both.
fn stateful_layouts() -> Vec<LayerLayout> {
    vec![
        LayerLayout { row_dims: vec![4, 3], state_floats: 0 },
        LayerLayout { row_dims: vec![], state_floats: 5 },
        LayerLayout { row_dims: vec![2], state_floats: 3 },
    ]
}

fn stateful_header() -> SessionHeader {
    SessionHeader { layouts: stateful_layouts(), ..header() }
}

fn stateful_cache() -> KvCache {
    KvCache::with_layers(stateful_layouts(), 64)
}

/// The test recurrence: position `p` folds into every float of the state.
fn step(state: &mut [f32], position: usize) {
    for (i, s) in state.iter_mut().enumerate() {
        *s = *s * 0.5 + position as f32 + i as f32 * 0.125;
    }
}

/// Runs `n` more positions through every layer of a stateful cache.
fn run_stateful(cache: &mut KvCache, n: usize) {
    let start = cache.len();
    cache.reserve(n).unwrap();
    for layer in 0..cache.n_layers() {
        for (stream, dim) in cache.layout(layer).row_dims.clone().into_iter().enumerate() {
            let rows: Vec<f32> =
                (start..start + n).flat_map(|p| (0..dim).map(move |c| value(layer, stream, p, c))).collect();
            cache.write(layer, stream, &rows);
        }
        if cache.layout(layer).state_floats > 0 {
            (start..start + n).for_each(|p| step(cache.stage_state(layer), p));
        }
    }
    cache.advance(n);
}

fn assert_stateful(cache: &KvCache, n_tokens: usize) {
    assert_eq!(cache.len(), n_tokens);
    for layer in 0..cache.n_layers() {
        let mut state = vec![0.0; cache.layout(layer).state_floats];
        (0..n_tokens).for_each(|p| step(&mut state, p));
        assert_eq!(cache.state(layer), state.as_slice(), "layer {layer} at {n_tokens}");
        for (stream, &dim) in cache.layout(layer).row_dims.iter().enumerate() {
            let want: Vec<f32> =
                (0..n_tokens).flat_map(|p| (0..dim).map(move |c| value(layer, stream, p, c))).collect();
            assert_eq!(cache.rows(layer, stream, n_tokens), want.as_slice());
        }
    }
}

/// A stateful session as `Session::generate` writes one: a 3-token prompt
/// (snapshot at its end), 3 decoded tokens, a snapshot at the end of the
/// answer, then the last, pending token.
fn write_stateful_session(path: &Path) -> Vec<u32> {
    let mut file = SessionFile::create(path, &stateful_header()).unwrap();
    let mut cache = stateful_cache();
    let mut tokens = vec![100, 101, 102];
    run_stateful(&mut cache, 3);
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 4, "three tokens and a state");
    for t in 103..106 {
        tokens.push(t);
        run_stateful(&mut cache, 1);
        assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    }
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1, "a state");
    tokens.push(999);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1, "the pending token");
    tokens
}

fn open_stateful(path: &Path) -> Result<(SessionFile, Recovered, KvCache)> {
    let mut cache = stateful_cache();
    let (file, recovered) = SessionFile::open(path, &stateful_header(), &mut cache)?;
    Ok((file, recovered, cache))
}

#[test]
fn a_stateful_session_reopens_at_its_latest_snapshot_without_rerunning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let tokens = write_stateful_session(&path);
    let h = stateful_header();
    let state_record = RecordKind::State.record_bytes(&h) as u64;
    assert_eq!(state_record, 16 + 4 * (5 + 3) + 8);
    let rows_record = RecordKind::TokenWithRows.record_bytes(&h) as u64;
    let expected_len =
        h.header_bytes() as u64 + 6 * rows_record + RecordKind::Token.record_bytes(&h) as u64 + 2 * state_record;
    assert_eq!(file_len(&path), expected_len);

    let (mut file, recovered, mut cache) = open_stateful(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens, recovered.records), (6, 6, 9));
    assert_stateful(&cache, 6);
    assert_eq!(cache.snapshot_lens().collect::<Vec<_>>(), [3, 6]);

    // Continuing: the pending token's rows, then a new snapshot.
    run_stateful(&mut cache, 1);
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2, "rows of the pending token and a state");
    drop(file);
    let (_, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens), (7, 7));
    assert_stateful(&cache, 7);

    // Ended on a token with rows and a state there (killed before sampling
    // on): the cache goes back to the snapshot before, to run it again.
    let (_, _, mut cache) = open_stateful(&path).unwrap();
    assert_eq!(cache.truncate(6), 6);
    assert_stateful(&cache, 6);
}

#[test]
fn a_torn_state_record_is_cut_and_the_session_resumes_from_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.kvs");
    let tokens = write_stateful_session(&full);
    let bytes = std::fs::read(&full).unwrap();
    let h = stateful_header();
    let state_record = RecordKind::State.record_bytes(&h) as u64;
    let complete = bytes.len() as u64 - RecordKind::Token.record_bytes(&h) as u64 - state_record;
    for torn in 1..state_record {
        let path = dir.path().join(format!("torn-{torn}.kvs"));
        std::fs::write(&path, &bytes[..(complete + torn) as usize]).unwrap();
        let (_, recovered, cache) = open_stateful(&path).unwrap();
        assert_eq!(recovered.tokens, tokens[..6], "torn at {torn}");
        assert_eq!((recovered.rows_tokens, recovered.resumed_tokens), (6, 3), "torn at {torn}");
        assert_stateful(&cache, 3);
        let cut = recovered.cut.unwrap();
        assert_eq!((cut.offset_bytes, cut.cut_bytes, cut.record_index), (complete, torn, 7));
        assert_eq!(file_len(&path), complete);
    }
    // A damaged state is cut like any record, with everything after it.
    let path = dir.path().join("flipped.kvs");
    let mut flipped = bytes.clone();
    flipped[complete as usize + 20] ^= 0x04;
    std::fs::write(&path, &flipped).unwrap();
    let (_, recovered, _) = open_stateful(&path).unwrap();
    assert_eq!((recovered.resumed_tokens, recovered.cut.unwrap().reason.as_str()), (3, "checksum mismatch"));
    assert_eq!(recovered.tokens, tokens[..6]);
}

#[test]
fn state_records_out_of_place_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_stateful_session(&path);
    let bytes = std::fs::read(&path).unwrap();
    let state_record = RecordKind::State.record_bytes(&stateful_header());
    // The state at 3 again, after the one at 6: valid alone, out of order.
    let h = stateful_header().header_bytes();
    let rows_record = RecordKind::TokenWithRows.record_bytes(&stateful_header());
    let first_state = bytes[h + 3 * rows_record..h + 3 * rows_record + state_record].to_vec();
    let mut spliced = bytes.clone();
    spliced.extend_from_slice(&first_state);
    std::fs::write(&path, &spliced).unwrap();
    let (_, recovered, _) = open_stateful(&path).unwrap();
    let cut = recovered.cut.unwrap();
    assert!(cut.reason.contains("after one at a greater length"), "{}", cut.reason);
    assert_eq!(recovered.resumed_tokens, 6);

    // In a file for a cache without state, a state record is refused.
    let plain = dir.path().join("plain.kvs");
    write_session(&plain, 3, false);
    let mut plain_bytes = std::fs::read(&plain).unwrap();
    // An empty state, as long as a state record of such a file would be.
    let mut record = first_state[..RECORD_PREFIX_BYTES].to_vec();
    record[..4].copy_from_slice(&((RECORD_PREFIX_BYTES + CHECKSUM_BYTES) as u32).to_le_bytes());
    let sum = checksum(&record);
    record.extend_from_slice(&sum);
    plain_bytes.extend_from_slice(&record);
    std::fs::write(&plain, &plain_bytes).unwrap();
    let (_, recovered, cache) = open(&plain).unwrap();
    assert_eq!(recovered.cut.unwrap().reason, "a state record for a cache without state");
    assert_rows(&cache, 3);
}

#[test]
fn truncating_a_stateful_file_keeps_the_snapshot_right_after_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    write_stateful_session(&path);
    // Keep 6 (the pending token goes): the state at 6 follows the rows of
    // token 5, written before the pending token for this.
    let (file, _, _) = open_stateful(&path).unwrap();
    let mut persist = Persist::new(file);
    assert_eq!(persist.truncate(6), None);
    drop(persist);
    let (file, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.tokens.len(), recovered.resumed_tokens), (6, 6));
    assert_stateful(&cache, 6);
    // Keep 4 tokens: the state at 3 precedes token 3's record and stays.
    let mut persist = Persist::new(file);
    assert_eq!(persist.truncate(4), None);
    drop(persist);
    let (file, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.tokens.len(), recovered.resumed_tokens), (4, 3));
    assert_stateful(&cache, 3);
    // Keep 3: the state at 3 was written right after the rows of token 2.
    let mut persist = Persist::new(file);
    assert_eq!(persist.truncate(3), None);
    drop(persist);
    let (_, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.tokens.len(), recovered.resumed_tokens, recovered.cut), (3, 3, None));
    assert_stateful(&cache, 3);
}

#[test]
fn a_snapshot_a_file_cut_lost_is_written_again_by_the_next_sync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let mut file = SessionFile::create(&path, &stateful_header()).unwrap();
    let mut cache = stateful_cache();
    let tokens = [100, 101, 102, 103, 104];
    // The snapshot at 3 reaches the file after the rows of 3 and 4 (as one
    // taken before the pieces of a long input does).
    run_stateful(&mut cache, 3);
    cache.snapshot();
    run_stateful(&mut cache, 2);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 6);
    let mut persist = Persist::new(file);
    // A cut to 4: the cache resumes at 3, the file keeps 3 tokens and loses
    // the state record after them; the next sync writes it again.
    assert_eq!(cache.truncate(4), 3);
    assert_eq!(persist.truncate(3), None);
    assert_eq!(persist.sync(&tokens[..3], &cache), None);
    drop(persist);
    let (_, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.tokens.as_slice(), recovered.resumed_tokens, recovered.records), (&tokens[..3], 3, 4));
    assert_stateful(&cache, 3);
}
