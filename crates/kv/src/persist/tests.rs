use std::io;
use std::sync::{Arc, Mutex};

use super::*;
use crate::cache::testing::{assert_at, run};
use crate::{LayerLayout, StatePart};

const N_LAYERS: usize = 2;
const ROW_DIMS: [usize; 2] = [4, 3];

fn header() -> SessionHeader {
    SessionHeader {
        content_hash: [0xab; HASH_BYTES],
        tokenizer_hash: Some([0x11; HASH_BYTES]),
        layouts: vec![rows_layout(&ROW_DIMS); N_LAYERS],
        created_by: "strata-kv tests".to_owned(),
    }
}

/// A layer of rows parts of these widths.
fn rows_layout(dims: &[usize]) -> LayerLayout {
    LayerLayout::new(dims.iter().map(|&dim| StatePart::Rows { dim }).collect())
}

fn empty_cache(capacity_tokens: usize) -> SequenceState {
    SequenceState::new(N_LAYERS, rows_layout(&ROW_DIMS), capacity_tokens)
}

fn record_bytes(kind: RecordKind) -> u64 {
    kind.record_bytes(&header(), 0) as u64
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
    run(&mut cache, prefill, false);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), prefill);
    for t in prefill..with_rows {
        tokens.push(100 + t as u32);
        run(&mut cache, 1, false);
        assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    }
    if pending {
        tokens.push(999);
        assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    }
    tokens
}

fn open(path: &Path) -> Result<(SessionFile, Recovered, SequenceState)> {
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
    assert_at(&cache, 5);

    // Continuing runs the pending token (a Rows record), then adds two more.
    run(&mut cache, 1, false);
    let mut tokens = tokens;
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    tokens.extend([7, 8]);
    run(&mut cache, 1, false);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2, "one with rows, one pending");
    assert_eq!(file.committed_tokens(), 8);
    drop(file);

    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_eq!(recovered.rows_tokens, 7);
    assert_at(&cache, 7);
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
        assert_at(&cache, 3);
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
    assert_at(&cache, 2);
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
fn a_damaged_copy_is_refused_and_left_byte_for_byte_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let tokens = write_session(&path, 6, true);
    let recovered = SessionFile::read_copy(&path, &header(), &mut empty_cache(64)).unwrap();
    assert_eq!((recovered.tokens, recovered.cut), (tokens, None));
    let mut bytes = std::fs::read(&path).unwrap();
    let second = header().header_bytes() + record_bytes(RecordKind::TokenWithRows) as usize;
    bytes[second + 40] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let err = SessionFile::read_copy(&path, &header(), &mut empty_cache(64)).unwrap_err();
    assert!(matches!(err, Error::DamagedCopy { record_index: 1, .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the copy is not cut");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["s.kvs"], "no tail is set aside");
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

    let mut cache = SequenceState::new(3, rows_layout(&[4, 5]), 8);
    let other = SessionHeader { layouts: cache.layouts().to_vec(), ..header() };
    let err = SessionFile::open(&path, &other, &mut cache).unwrap_err().to_string();
    assert!(err.contains("n_layers 2 in the file, 3 for this model"), "{err}");
    assert!(
        err.contains(
            "layer 0 keeps [Rows { dim: 4 }, Rows { dim: 3 }] in the file, [Rows { dim: 4 }, Rows { dim: 5 }] for this model"
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
    newer[8] = 4;
    std::fs::write(&path, &newer).unwrap();
    let err = open(&path).unwrap_err().to_string();
    assert!(err.contains("unsupported version 4 (this build reads versions 1 to 3)"), "{err}");

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
    run(&mut cache, 1, false);
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
    run(&mut cache, 1, false);
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
        assert_at(&cache, keep);
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
    run(&mut cache, 3, false);
    assert_eq!(persist.sync(&tokens, &cache), None);
    assert_eq!(*disk.syncs.lock().unwrap(), 1, "one fsync for the whole prefill");

    let mut warnings = Vec::new();
    for step in 0..5 {
        tokens.push(10 + step);
        run(&mut cache, 1, false);
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
    assert_at(&cache, 3);
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
    assert_at(&cache, 3);
    run(&mut cache, 1, false);
    let mut tokens = tokens;
    tokens.push(103);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    drop(file);
    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_at(&cache, 4);
}

/// Attention rows, a recurrent state, and a layer with both.
fn stateful_layouts() -> Vec<LayerLayout> {
    vec![
        rows_layout(&[4, 3]),
        LayerLayout::new(vec![StatePart::Fixed { floats: 5 }]),
        LayerLayout::new(vec![StatePart::Rows { dim: 2 }, StatePart::Fixed { floats: 3 }]),
    ]
}

fn stateful_header() -> SessionHeader {
    SessionHeader { layouts: stateful_layouts(), ..header() }
}

fn stateful_cache() -> SequenceState {
    SequenceState::with_layers(stateful_layouts(), 64)
}

/// A stateful session as `Session::generate` writes one: a 3-token prompt
/// (snapshot at its end), 3 decoded tokens, a snapshot at the end of the
/// answer, then the last, pending token.
fn write_stateful_session(path: &Path) -> Vec<u32> {
    let mut file = SessionFile::create(path, &stateful_header()).unwrap();
    let mut cache = stateful_cache();
    let mut tokens = vec![100, 101, 102];
    run(&mut cache, 3, false);
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 4, "three tokens and a state");
    for t in 103..106 {
        tokens.push(t);
        run(&mut cache, 1, false);
        assert_eq!(file.sync(&tokens, &cache).unwrap(), 1);
    }
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1, "a state");
    tokens.push(999);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 1, "the pending token");
    tokens
}

fn open_stateful(path: &Path) -> Result<(SessionFile, Recovered, SequenceState)> {
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
    let state_record = RecordKind::State.record_bytes(&h, 0) as u64;
    assert_eq!(state_record, 16 + 4 * (5 + 3) + 8);
    let rows_record = RecordKind::TokenWithRows.record_bytes(&h, 0) as u64;
    let expected_len =
        h.header_bytes() as u64 + 6 * rows_record + RecordKind::Token.record_bytes(&h, 0) as u64 + 2 * state_record;
    assert_eq!(file_len(&path), expected_len);

    let (mut file, recovered, mut cache) = open_stateful(&path).unwrap();
    assert_eq!(recovered.tokens, tokens);
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens, recovered.records), (6, 6, 9));
    assert_at(&cache, 6);
    assert_eq!(cache.snapshot_lens().collect::<Vec<_>>(), [3, 6]);

    // Continuing: the pending token's rows, then a new snapshot.
    run(&mut cache, 1, false);
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2, "rows of the pending token and a state");
    drop(file);
    let (_, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens), (7, 7));
    assert_at(&cache, 7);

    // Ended on a token with rows and a state there (killed before sampling
    // on): the cache goes back to the snapshot before, to run it again.
    let (_, _, mut cache) = open_stateful(&path).unwrap();
    assert_eq!(cache.truncate(6), 6);
    assert_at(&cache, 6);
}

#[test]
fn a_torn_state_record_is_cut_and_the_session_resumes_from_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.kvs");
    let tokens = write_stateful_session(&full);
    let bytes = std::fs::read(&full).unwrap();
    let h = stateful_header();
    let state_record = RecordKind::State.record_bytes(&h, 0) as u64;
    let complete = bytes.len() as u64 - RecordKind::Token.record_bytes(&h, 0) as u64 - state_record;
    for torn in 1..state_record {
        let path = dir.path().join(format!("torn-{torn}.kvs"));
        std::fs::write(&path, &bytes[..(complete + torn) as usize]).unwrap();
        let (_, recovered, cache) = open_stateful(&path).unwrap();
        assert_eq!(recovered.tokens, tokens[..6], "torn at {torn}");
        assert_eq!((recovered.rows_tokens, recovered.resumed_tokens), (6, 3), "torn at {torn}");
        assert_at(&cache, 3);
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
    let state_record = RecordKind::State.record_bytes(&stateful_header(), 0);
    // The state at 3 again, after the one at 6: valid alone, out of order.
    let h = stateful_header().header_bytes();
    let rows_record = RecordKind::TokenWithRows.record_bytes(&stateful_header(), 0);
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
    assert_at(&cache, 3);
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
    assert_at(&cache, 6);
    // Keep 4 tokens: the state at 3 precedes token 3's record and stays.
    let mut persist = Persist::new(file);
    assert_eq!(persist.truncate(4), None);
    drop(persist);
    let (file, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.tokens.len(), recovered.resumed_tokens), (4, 3));
    assert_at(&cache, 3);
    // Keep 3: the state at 3 was written right after the rows of token 2.
    let mut persist = Persist::new(file);
    assert_eq!(persist.truncate(3), None);
    drop(persist);
    let (_, recovered, cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.tokens.len(), recovered.resumed_tokens, recovered.cut), (3, 3, None));
    assert_at(&cache, 3);
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
    run(&mut cache, 3, false);
    cache.snapshot();
    run(&mut cache, 2, false);
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
    assert_at(&cache, 3);
}

/// Copies a committed sample session (written by the code at 8fed96e) into
/// `dir`, where opening may append to it.
fn sample(dir: &Path, name: &str) -> PathBuf {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kv_sessions").join(name);
    let path = dir.join(name);
    std::fs::copy(committed, &path).unwrap();
    path
}

#[test]
fn version_2_files_written_before_typed_parts_open_and_continue() {
    let dir = tempfile::tempdir().unwrap();
    // `write_session(path, 5, true)` at 8fed96e: five tokens with rows, then
    // a pending one.
    let path = sample(dir.path(), "v2_rows.kvs");
    assert_eq!(&std::fs::read(&path).unwrap()[8..12], &2u32.to_le_bytes());
    let (mut file, recovered, mut cache) = open(&path).unwrap();
    let mut tokens = vec![100, 101, 102, 103, 104, 999];
    assert_eq!(recovered.tokens, tokens);
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens, recovered.cut), (5, 5, None));
    assert_at(&cache, 5);
    run(&mut cache, 2, false);
    tokens.push(106);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2, "the pending token's rows and a new token");
    drop(file);
    let (_, recovered, cache) = open(&path).unwrap();
    assert_eq!((recovered.tokens, recovered.resumed_tokens), (tokens, 7));
    assert_at(&cache, 7);

    // `write_stateful_session` at 8fed96e: snapshots at 3 and 6.
    let path = sample(dir.path(), "v2_stateful.kvs");
    let (mut file, recovered, mut cache) = open_stateful(&path).unwrap();
    let tokens = write_stateful_session(&dir.path().join("now.kvs"));
    assert_eq!(recovered.tokens, tokens);
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens, recovered.cut), (6, 6, None));
    assert_eq!(cache.snapshot_lens().collect::<Vec<_>>(), [3, 6]);
    assert_at(&cache, 6);
    run(&mut cache, 1, false);
    cache.snapshot();
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2, "the pending token's rows and a state");
    drop(file);
    let (_, recovered, mut cache) = open_stateful(&path).unwrap();
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens), (7, 7));
    assert_at(&cache, 7);
    assert_eq!(cache.snapshot_lens().collect::<Vec<_>>(), [6, 7]);
    assert_eq!(cache.truncate(6), 6, "back to the snapshot the old file holds");
    assert_at(&cache, 6);
}

/// A layer of every kind of part but a fixed state, and one with a fixed
/// state beside a strided part.
fn every_part_layouts() -> Vec<LayerLayout> {
    vec![
        LayerLayout::new(vec![
            StatePart::Rows { dim: 2 },
            StatePart::Ring { dim: 3, window: 4 },
            StatePart::Tokens { n: 3 },
            StatePart::Strided { dim: 2, every: 3 },
        ]),
        LayerLayout::new(vec![StatePart::Fixed { floats: 2 }, StatePart::Strided { dim: 1, every: 2 }]),
    ]
}

#[test]
fn every_kind_of_part_persists_and_resumes_at_the_latest_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kvs");
    let header = SessionHeader { layouts: every_part_layouts(), ..header() };
    let open_parts = |path: &Path| {
        let mut cache = SequenceState::with_layers(every_part_layouts(), 64);
        let (file, recovered) = SessionFile::open(path, &header, &mut cache).unwrap();
        (file, recovered, cache)
    };
    let tokens: Vec<u32> = (0..12).map(crate::cache::testing::token).collect();
    let mut file = SessionFile::create(&path, &header).unwrap();
    let mut cache = SequenceState::with_layers(every_part_layouts(), 64);
    run(&mut cache, 5, false);
    cache.snapshot();
    assert_eq!(file.sync(&tokens[..5], &cache).unwrap(), 6);
    for n in 6..=10 {
        run(&mut cache, 1, false);
        assert_eq!(file.sync(&tokens[..n], &cache).unwrap(), 1);
    }
    cache.snapshot();
    assert_eq!(file.sync(&tokens[..10], &cache).unwrap(), 1, "a state");
    drop(file);

    let (mut file, recovered, mut cache) = open_parts(&path);
    assert_eq!((recovered.tokens.as_slice(), recovered.resumed_tokens, recovered.cut), (&tokens[..10], 10, None));
    assert_at(&cache, 10);
    run(&mut cache, 2, false);
    assert_eq!(file.sync(&tokens, &cache).unwrap(), 2);
    drop(file);
    // No snapshot at 12: the rings, pending rows and the fixed state resume
    // at 10, the rows and groups loaded up to 12 are cut back there.
    let (_, recovered, mut cache) = open_parts(&path);
    assert_eq!((recovered.rows_tokens, recovered.resumed_tokens), (12, 10));
    assert_at(&cache, 10);
    run(&mut cache, 2, false);
    assert_at(&cache, 12);
    assert_eq!(cache.truncate(7), 5, "the earlier snapshot");
    assert_at(&cache, 5);
}

#[test]
fn a_version_3_header_round_trips_every_kind_of_part() {
    let header = SessionHeader { layouts: every_part_layouts(), ..header() };
    let bytes = header.encode();
    assert_eq!(bytes.len(), header.header_bytes());
    let (version, header_bytes) = SessionHeader::decode_prefix(bytes[..HEADER_PREFIX_BYTES].try_into().unwrap())
        .unwrap_or_else(|_| panic!("a valid prefix"));
    assert_eq!((version, header_bytes), (SESSION_VERSION, bytes.len()));
    assert_eq!(SessionHeader::decode(version, &bytes).unwrap(), header);
    // Strided rows are in the records of the last token of each group only.
    assert_eq!(header.record_floats(0), 2);
    assert_eq!(header.record_floats(1), 2 + 1);
    assert_eq!(header.record_floats(2), 2 + 2);
    assert_eq!(header.record_floats(5), 2 + 2 + 1);
    assert_eq!(header.state_floats(), 4 * 3 + 2 * 2 + 2 + 1);
}
