//! Mirrors against a container-like directory: the primary under the
//! system's temporary directory and, where it exists, the mirror on a tmpfs
//! (`/dev/shm`), a different filesystem as a fast drive would be.

use std::path::{Path, PathBuf};

use super::*;
use crate::io::tests::{record_pattern, write_records};
use crate::test_util::WarningLog;
use crate::{ExpertKey, ExpertSource, ExpertStore, PolicyKind, StoreOptions, Usage};
use strata_format::test_util::dead_pid;

const RECORD_BYTES: usize = 4096;
const NUM_EXPERTS: usize = 16;
const LAYERS: usize = 3;

struct Fixture {
    container: tempfile::TempDir,
    mirror: tempfile::TempDir,
    files: Vec<LayerFile>,
}

fn layer_path(layer: usize) -> String {
    format!("experts/layer_{layer:03}.bin")
}

/// A tmpfs directory if the machine has one, else a temporary directory.
fn fast_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

fn fixture() -> Fixture {
    let container = tempfile::tempdir().unwrap();
    std::fs::create_dir(container.path().join("experts")).unwrap();
    let files = (0..LAYERS)
        .map(|layer| {
            let path = container.path().join(layer_path(layer));
            // Each layer's records differ: pattern seeded by layer too.
            write_records(&path, NUM_EXPERTS + layer, RECORD_BYTES);
            let hashes = hash_file(&path, RECORD_BYTES).unwrap();
            LayerFile {
                layer,
                path: layer_path(layer),
                size_bytes: hashes.size_bytes,
                sha256: hashes.sha256,
                record_bytes: RECORD_BYTES,
                num_experts: NUM_EXPERTS + layer,
            }
        })
        .collect();
    Fixture { container, mirror: fast_dir(), files }
}

impl Fixture {
    fn primary(&self, layer: usize) -> PathBuf {
        self.container.path().join(layer_path(layer))
    }

    fn mirrored(&self, layer: usize) -> PathBuf {
        self.mirror.path().join(layer_path(layer))
    }

    fn stage(&self, layers: &[usize]) -> StageReport {
        let planned: Vec<PlannedFile> =
            layers.iter().map(|&layer| PlannedFile { file: self.files[layer].clone(), uses: 0 }).collect();
        stage(self.container.path(), self.mirror.path(), "hash", &planned, 0).unwrap()
    }

    fn options(&self, rate: Option<u64>) -> MirrorOptions {
        MirrorOptions {
            mirrors: vec![MirrorSpec { dir: self.mirror.path().to_owned(), rate_bytes_per_s: rate }],
            container_hash: "hash".into(),
            files: self.files.clone(),
            primary_rate_bytes_per_s: Some(1 << 30),
        }
    }

    fn store(&self, mirrors: &MirrorOptions) -> Result<ExpertStore> {
        let sources = self
            .files
            .iter()
            .map(|f| {
                Some(ExpertSource {
                    path: self.primary(f.layer),
                    record_bytes: RECORD_BYTES,
                    num_experts: f.num_experts,
                    check: None,
                })
            })
            .collect();
        // No cache: every get is a read, so every read is checked.
        let options = StoreOptions { capacity_bytes: 0, policy: PolicyKind::Lru, ..StoreOptions::default() };
        ExpertStore::open_mirrored(sources, options, Usage::default(), mirrors)
    }
}

/// Reads every record of every layer and checks the bytes.
fn read_all(store: &ExpertStore, files: &[LayerFile]) {
    for file in files {
        for expert in 0..file.num_experts {
            let buf = store.get(ExpertKey { layer: file.layer, expert }).unwrap();
            assert!(buf.as_slice() == record_pattern(expert, RECORD_BYTES), "layer {} expert {expert}", file.layer);
        }
    }
}

#[test]
fn specs_parse_with_and_without_a_rate() {
    assert_eq!("/m".parse::<MirrorSpec>().unwrap(), MirrorSpec { dir: "/m".into(), rate_bytes_per_s: None });
    let spec = "/mnt/a=b=3GiB".parse::<MirrorSpec>().unwrap();
    assert_eq!(spec, MirrorSpec { dir: "/mnt/a=b".into(), rate_bytes_per_s: Some(3 << 30) });
    assert!("/m=0".parse::<MirrorSpec>().unwrap_err().to_string().contains("more than 0"));
    assert!("/m=fast".parse::<MirrorSpec>().is_err());
    assert!("=1GB".parse::<MirrorSpec>().unwrap_err().to_string().contains("no directory"));
}

#[test]
fn a_staged_mirror_serves_its_share_of_identical_bytes() {
    let fx = fixture();
    let report = fx.stage(&[0, 2]);
    assert_eq!(report.copied, [layer_path(0), layer_path(2)]);
    assert_eq!(report.copied_bytes, fx.files[0].size_bytes + fx.files[2].size_bytes);
    // Equal rates: the mirror serves about half of layers 0 and 2.
    let store = fx.store(&fx.options(Some(1 << 30))).unwrap();
    assert_eq!(store.mirrors().rates_bytes_per_s().len(), 2);
    read_all(&store, &fx.files);
    let stats = store.stats();
    let mirrored_bytes = (fx.files[0].size_bytes + fx.files[2].size_bytes) as f64;
    let share = stats.mirror_bytes_read[0] as f64 / mirrored_bytes;
    assert!(share > 0.0 && share < 1.0, "{share}");
    assert_eq!(store.mirrors().failed_copies(), 0);
    // Staging again copies nothing and keeps the files.
    let again = fx.stage(&[0, 2]);
    assert!(again.copied.is_empty() && again.kept.len() == 2);
}

#[test]
fn a_fast_drive_serves_more() {
    let fx = fixture();
    fx.stage(&[0, 1, 2]);
    // A mirror far faster than the container's drive serves nearly all.
    let options = fx.options(Some(1 << 40));
    let store = fx.store(&options).unwrap();
    read_all(&store, &fx.files);
    let total: u64 = fx.files.iter().map(|f| f.size_bytes).sum();
    assert!(store.stats().mirror_bytes_read[0] * 10 >= total * 9, "{:?}", store.stats());
}

#[test]
fn a_read_its_caller_stops_is_no_failure_of_the_mirror() {
    let fx = fixture();
    fx.stage(&[0]);
    let options = fx.options(Some(1 << 40));
    let primary = Arc::new(RecordFile::open(IoBackend::Pread, &fx.primary(0), 0, RECORD_BYTES, NUM_EXPERTS).unwrap());
    let mirrors = Mirrors::open(&options, IoBackend::Pread, &[Some(Arc::clone(&primary))]).unwrap();
    let source = mirrors.source(0, primary);
    let mut buf = AlignedBuf::zeroed(RECORD_BYTES);
    for expert in 0..NUM_EXPERTS {
        let err = source.read_record_until(expert, &mut buf, &|| true).unwrap_err();
        assert!(matches!(err, Error::ReadStopped { done_bytes: 0, .. }), "{err}");
    }
    // No warning, and the mirror still serves (the fast one serves nearly all).
    assert_eq!(mirrors.failed_copies(), 0);
    for expert in 0..NUM_EXPERTS {
        source.read_record_until(expert, &mut buf, &|| false).unwrap();
        assert!(buf.as_slice() == record_pattern(expert, RECORD_BYTES));
    }
    assert!(mirrors.bytes_read()[0] > 0);
}

#[test]
fn a_copy_corrupted_or_truncated_after_open_falls_back_with_one_warning() {
    // The logger, before anything is read.
    logged_warnings();
    let fx = fixture();
    fx.stage(&[0, 1]);
    let options = fx.options(Some(1 << 40));
    let store = fx.store(&options).unwrap();
    // Layer 0: one byte changed in every record; layer 1: cut short.
    let mut bytes = std::fs::read(fx.mirrored(0)).unwrap();
    for record in bytes.chunks_mut(RECORD_BYTES) {
        record[100] ^= 0xff;
    }
    std::fs::write(fx.mirrored(0), &bytes).unwrap();
    std::fs::OpenOptions::new().write(true).open(fx.mirrored(1)).unwrap().set_len(100).unwrap();
    read_all(&store, &fx.files);
    read_all(&store, &fx.files);
    assert_eq!(store.mirrors().failed_copies(), 2);
    // Other tests log too: this one's lines name its mirror.
    let mirror = fx.mirror.path().display().to_string();
    let warnings: Vec<String> = logged_warnings().into_iter().filter(|w| w.contains(&mirror)).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("differs from the container")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("truncated")), "{warnings:?}");
    assert!(warnings.iter().all(|w| w.contains("from the container from now on")), "{warnings:?}");
}

/// The warnings every thread of this test process logged so far (the
/// mirrors' reads run on the I/O pool's threads), one a line.
fn logged_warnings() -> Vec<String> {
    static LOG: std::sync::OnceLock<WarningLog> = std::sync::OnceLock::new();
    let log = LOG.get_or_init(|| {
        let log = WarningLog::default();
        tracing::subscriber::set_global_default(log.subscriber()).expect("the only logger of the tests");
        log
    });
    log.lines()
}

#[test]
fn a_mirror_that_does_not_match_is_refused_at_open() {
    let fx = fixture();
    // No receipt.
    let err = fx.store(&fx.options(Some(1))).err().unwrap().to_string();
    assert!(err.contains("strata mirror stage"), "{err}");
    fx.stage(&[1]);
    // Another container.
    let mut other = fx.options(Some(1));
    other.container_hash = "other".into();
    assert!(fx.store(&other).err().unwrap().to_string().contains("stage it again"));
    // The container's file changed since staging (its manifest hash differs).
    let mut changed = fx.options(Some(1));
    changed.files[1].sha256 = "0".repeat(64);
    assert!(fx.store(&changed).err().unwrap().to_string().contains("does not match"));
    // A copy cut short before open.
    std::fs::OpenOptions::new().write(true).open(fx.mirrored(1)).unwrap().set_len(4096).unwrap();
    assert!(fx.store(&fx.options(Some(1))).err().unwrap().to_string().contains("has 4096 bytes"));
    // A copy removed.
    std::fs::remove_file(fx.mirrored(1)).unwrap();
    assert!(fx.store(&fx.options(Some(1))).err().unwrap().to_string().contains("cannot be read"));
}

#[test]
fn rates_are_measured_when_not_given() {
    let fx = fixture();
    fx.stage(&[0]);
    let mut options = fx.options(None);
    options.primary_rate_bytes_per_s = None;
    let store = fx.store(&options).unwrap();
    assert!(store.mirrors().rates_bytes_per_s().iter().all(|&rate| rate > 0));
    read_all(&store, &fx.files);
}

#[test]
fn staging_keeps_the_reserve_and_never_replaces_a_file() {
    let fx = fixture();
    let planned = vec![PlannedFile { file: fx.files[0].clone(), uses: 0 }];
    let err = stage(fx.container.path(), fx.mirror.path(), "hash", &planned, u64::MAX / 2).unwrap_err();
    assert!(matches!(err, Error::MirrorNoSpace { .. }), "{err}");
    assert!(!fx.mirrored(0).exists());
    assert!(Receipt::read(fx.mirror.path()).unwrap().is_none(), "no receipt before the staging completes");
    // A different file already at the destination is an error, left as it is.
    std::fs::create_dir_all(fx.mirrored(0).parent().unwrap()).unwrap();
    std::fs::write(fx.mirrored(0), b"mine").unwrap();
    let err = stage(fx.container.path(), fx.mirror.path(), "hash", &planned, 0).unwrap_err().to_string();
    assert!(err.contains("left as it is"), "{err}");
    assert_eq!(std::fs::read(fx.mirrored(0)).unwrap(), b"mine");
    // No temporary files remain.
    let names: Vec<_> =
        std::fs::read_dir(fx.mirrored(0).parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn verify_adopts_hand_made_copies_and_plan_takes_the_hottest_layers() {
    let fx = fixture();
    std::fs::create_dir_all(fx.mirrored(2).parent().unwrap()).unwrap();
    std::fs::copy(fx.primary(2), fx.mirrored(2)).unwrap();
    let report = verify(fx.mirror.path(), "hash", &fx.files).unwrap();
    assert_eq!(report.intact, [layer_path(2)]);
    assert_eq!(report.absent, [layer_path(0), layer_path(1)]);
    let store = fx.store(&fx.options(Some(1 << 30))).unwrap();
    read_all(&store, &fx.files);
    // A changed copy fails verification.
    std::fs::write(fx.mirrored(2), b"x").unwrap();
    assert!(verify(fx.mirror.path(), "hash", &fx.files).is_err());

    let mut usage = Usage::default();
    usage.add(ExpertKey { layer: 1, expert: 0 }, 50);
    usage.add(ExpertKey { layer: 2, expert: 3 }, 20);
    usage.add(ExpertKey { layer: 0, expert: 3 }, 10);
    let budget = fx.files[1].size_bytes + fx.files[2].size_bytes;
    let layers: Vec<usize> = plan(&fx.files, &usage, budget).iter().map(|p| p.file.layer).collect();
    assert_eq!(layers, [1, 2]);
    assert!(plan(&fx.files, &usage, 10).is_empty());
}

#[test]
fn a_killed_stages_temporary_copy_is_removed_by_the_next_and_a_live_ones_kept() {
    let fx = fixture();
    let dir = fx.mirrored(0).parent().unwrap().to_owned();
    std::fs::create_dir_all(&dir).unwrap();
    let killed = dir.join(format!(".layer_000.bin.tmp-{}", dead_pid()));
    // Our parent (the test harness's) is alive: as a stage running now.
    let running = dir.join(format!(".layer_001.bin.tmp-{}", std::os::unix::process::parent_id()));
    for left in [&killed, &running] {
        std::fs::write(left, b"half a copy").unwrap();
    }
    let report = fx.stage(&[0, 1]);
    assert_eq!(report.copied, [layer_path(0), layer_path(1)]);
    assert!(!killed.exists(), "the killed stage's copy is removed");
    assert!(running.exists(), "a running stage's copy is left alone");
}
