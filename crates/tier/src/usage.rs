//! Learned expert usage: how often each routed expert was used, and the
//! latest routing decisions (which experts each token used in each layer),
//! kept across runs in a usage file bound to one container.
//!
//! The file is JSON:
//!
//! ```json
//! {"format":"strata-usage","version":1,"container_hash":"…","counts":[[layer,expert,count],…],
//!  "routing":[[layer,expert,…],…]}
//! ```
//!
//! `routing` is optional (files written before it existed lack it, and a
//! build that predates it ignores it): the last [`ROUTING_EVENTS_MAX`]
//! routing events, oldest first, from which the `predict` cache policy
//! learns its transitions before a run's first token, so that a run starts
//! from what earlier runs taught it rather than cold.
//!
//! Learned usage only steers placement, so it can change speed but never
//! results. That is why loading never fails: a missing file is an empty
//! usage, and a file for another container, of an unknown version, or
//! unreadable is an empty usage plus a warning for the caller to print.
//! Saving is atomic (temporary file in the same directory, fsync, rename,
//! fsync of the directory), so a crash leaves the old file or the new one,
//! never a torn one.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{Error, ExpertKey, Result};

/// The `format` field of a usage file.
pub const USAGE_FORMAT: &str = "strata-usage";
/// The usage file version this build reads and writes.
pub const USAGE_VERSION: u32 = 1;

/// Routing events a usage keeps, the latest: enough for `predict` to learn
/// a layer's transitions (on the demo model's sampled runs, five earlier
/// runs' 4,660 events took a quarter-size cache from 34% to 47% of the way
/// from LRU to Belady), few enough that a file stays small (a model routing
/// 8 experts a token: under 300 KB).
pub const ROUTING_EVENTS_MAX: usize = 8192;

/// The most experts one kept routing event may name; a wider one (no
/// family routes so many experts a token) is not kept.
pub const EVENT_EXPERTS_MAX: usize = 64;

/// Use counts per routed expert, and the latest routing events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    counts: HashMap<ExpertKey, u64>,
    /// `(layer, experts)` of the latest routing events, oldest first, at
    /// most [`ROUTING_EVENTS_MAX`].
    routing: VecDeque<(usize, Vec<usize>)>,
}

/// The fields every version of the file shares, read first so that a file
/// of another version is recognised as such rather than as corrupt.
#[derive(Deserialize)]
struct FileHead {
    format: String,
    version: u64,
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    format: String,
    version: u32,
    container_hash: String,
    /// `[layer, expert, count]`, sorted by layer then expert.
    counts: Vec<(usize, usize, u64)>,
    /// `[layer, expert, …]` per routing event, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routing: Vec<Vec<usize>>,
}

impl Usage {
    /// An empty usage.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one use of `key`.
    pub fn record(&mut self, key: ExpertKey) {
        self.add(key, 1);
    }

    /// Counts `uses` uses of `key` (saturating).
    pub fn add(&mut self, key: ExpertKey, uses: u64) {
        if uses > 0 {
            let count = self.counts.entry(key).or_insert(0);
            *count = count.saturating_add(uses);
        }
    }

    /// Uses of `key` so far.
    pub fn count(&self, key: ExpertKey) -> u64 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// Adds every count of `other` to this one (a generation's usage into
    /// the learned total), and its routing events after this one's.
    pub fn merge(&mut self, other: &Usage) {
        for (&key, &uses) in &other.counts {
            self.add(key, uses);
        }
        for (layer, experts) in &other.routing {
            self.record_routing(*layer, experts);
        }
    }

    /// Keeps one routing event, one token's `experts` at `layer`, dropping
    /// the oldest beyond [`ROUTING_EVENTS_MAX`]. An event naming more than
    /// [`EVENT_EXPERTS_MAX`] experts is not kept.
    pub fn record_routing(&mut self, layer: usize, experts: &[usize]) {
        if experts.is_empty() || experts.len() > EVENT_EXPERTS_MAX {
            return;
        }
        if self.routing.len() == ROUTING_EVENTS_MAX {
            self.routing.pop_front();
        }
        self.routing.push_back((layer, experts.to_vec()));
    }

    /// The routing events kept, oldest first.
    pub fn routing(&self) -> impl Iterator<Item = (usize, &[usize])> + '_ {
        self.routing.iter().map(|(layer, experts)| (*layer, experts.as_slice()))
    }

    /// The `n` most used keys, most used first; ties go to the lower layer,
    /// then the lower expert, so the choice is deterministic. Keys never used
    /// are not returned, so the result may be shorter than `n`.
    pub fn top(&self, n: usize) -> Vec<ExpertKey> {
        let mut ranked: Vec<(u64, ExpertKey)> = self.counts.iter().map(|(&key, &count)| (count, key)).collect();
        let by_rank = |a: &(u64, ExpertKey), b: &(u64, ExpertKey)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        if n < ranked.len() {
            // Partition around the n-th first: O(keys) rather than a full sort.
            ranked.select_nth_unstable_by(n, by_rank);
            ranked.truncate(n);
        }
        ranked.sort_unstable_by(by_rank);
        ranked.into_iter().map(|(_, key)| key).collect()
    }

    /// Distinct keys with a nonzero count.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was learned: no count and no routing event.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.routing.is_empty()
    }

    /// Total uses over all keys.
    pub fn total(&self) -> u64 {
        self.counts.values().fold(0u64, |sum, &count| sum.saturating_add(count))
    }

    /// Every `(key, count)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (ExpertKey, u64)> + '_ {
        self.counts.iter().map(|(&key, &count)| (key, count))
    }

    /// Reads the usage learned for the container whose content hash is
    /// `container_hash`.
    ///
    /// Never fails for a bad or foreign file: a missing file gives an empty
    /// usage and no warning; a file for another container, of an unknown
    /// format or version, corrupt, or unreadable gives an empty usage and a
    /// warning naming the file (and both hashes, for another container).
    /// The `Result` is kept so that a future version may report errors that
    /// must stop a run.
    ///
    /// `experts_per_layer[l]` is the number of routed experts of layer `l`
    /// (0 for a layer without any): a file larger than the most those keys
    /// can take is not read (a forged file cannot make loading use more
    /// memory than the model's usage can), and a key outside them is a
    /// corrupt file, not a count kept forever.
    pub fn load(
        path: impl AsRef<Path>,
        container_hash: &str,
        experts_per_layer: &[usize],
    ) -> Result<(Usage, Option<String>)> {
        let path = path.as_ref();
        let ignored = |why: String| Ok((Usage::new(), Some(format!("ignoring usage file {}: {why}", path.display()))));
        let max_bytes = usage_file_max_bytes(experts_per_layer);
        let text = match read_bounded(path, max_bytes) {
            Ok(Some(text)) => text,
            Ok(None) => return ignored(format!("it is larger than the {max_bytes} bytes this model's usage can take")),
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok((Usage::new(), None)),
            Err(err) => return ignored(format!("cannot read it: {err}")),
        };
        let head: FileHead = match serde_json::from_str(&text) {
            Ok(head) => head,
            Err(err) => return ignored(format!("not a usage file: {err}")),
        };
        if head.format != USAGE_FORMAT {
            return ignored(format!("format is {:?}, expected {USAGE_FORMAT:?}", head.format));
        }
        if head.version != u64::from(USAGE_VERSION) {
            return ignored(format!(
                "version {} is not supported (this build reads version {USAGE_VERSION})",
                head.version
            ));
        }
        let file: FileV1 = match serde_json::from_str(&text) {
            Ok(file) => file,
            Err(err) => return ignored(format!("corrupt: {err}")),
        };
        if file.container_hash != container_hash {
            return ignored(format!(
                "it was learned for container {} but this container is {container_hash}; the model changed, so \
                 usage is learned afresh",
                file.container_hash
            ));
        }
        let mut usage = Usage::new();
        for (layer, expert, count) in file.counts {
            if experts_per_layer.get(layer).is_none_or(|&experts| expert >= experts) {
                return ignored(format!(
                    "corrupt: expert {expert} of layer {layer} is not in this model ({} layers)",
                    experts_per_layer.len()
                ));
            }
            let key = ExpertKey { layer, expert };
            match usage.counts.entry(key) {
                Entry::Occupied(_) => {
                    return ignored(format!("corrupt: expert {expert} of layer {layer} is listed twice"));
                }
                Entry::Vacant(slot) if count > 0 => {
                    slot.insert(count);
                }
                Entry::Vacant(_) => {}
            }
        }
        if file.routing.len() > ROUTING_EVENTS_MAX {
            return ignored(format!(
                "corrupt: {} routing events, more than the {ROUTING_EVENTS_MAX} a file keeps",
                file.routing.len()
            ));
        }
        for event in file.routing {
            let Some((&layer, experts)) = event.split_first() else {
                return ignored("corrupt: an empty routing event".into());
            };
            let layer_experts = experts_per_layer.get(layer).copied().unwrap_or(0);
            let mut seen = vec![false; layer_experts];
            let valid = !experts.is_empty()
                && experts.len() <= EVENT_EXPERTS_MAX
                && experts.iter().all(|&expert| expert < layer_experts && !std::mem::replace(&mut seen[expert], true));
            if !valid {
                return ignored(format!(
                    "corrupt: routing event {event:?} names an expert twice, none, too many, or one not in this model"
                ));
            }
            usage.record_routing(layer, experts);
        }
        Ok((usage, None))
    }

    /// Writes this usage for the container `container_hash` to `path`,
    /// atomically: a temporary file in the same directory is written,
    /// fsynced and renamed over `path`, then the directory is fsynced so
    /// the rename itself is durable.
    pub fn save(&self, path: impl AsRef<Path>, container_hash: &str) -> Result<()> {
        let mut counts: Vec<(usize, usize, u64)> =
            self.counts.iter().map(|(key, &count)| (key.layer, key.expert, count)).collect();
        counts.sort_unstable();
        let routing = self
            .routing
            .iter()
            .map(|(layer, experts)| std::iter::once(*layer).chain(experts.iter().copied()).collect())
            .collect();
        let file = FileV1 {
            format: USAGE_FORMAT.to_owned(),
            version: USAGE_VERSION,
            container_hash: container_hash.to_owned(),
            counts,
            routing,
        };
        let mut json = serde_json::to_vec(&file).expect("usage serialises: plain numbers and strings");
        json.push(b'\n');
        write_atomically(path.as_ref(), &json)
    }
}

impl FromIterator<ExpertKey> for Usage {
    fn from_iter<I: IntoIterator<Item = ExpertKey>>(keys: I) -> Self {
        let mut usage = Usage::new();
        keys.into_iter().for_each(|key| usage.record(key));
        usage
    }
}

/// The largest usage file a model with `experts_per_layer` can have: one
/// `[layer,expert,count]` entry per expert (at most 64 bytes with a 20-digit
/// count), the routing events (each at most its layer and
/// [`EVENT_EXPERTS_MAX`] experts, 21 bytes a number) and the fixed fields.
fn usage_file_max_bytes(experts_per_layer: &[usize]) -> u64 {
    const ENTRY_MAX_BYTES: u64 = 64;
    const NUMBER_MAX_BYTES: u64 = 21;
    const FIXED_MAX_BYTES: u64 = 4096;
    let keys = experts_per_layer.iter().fold(0u64, |sum, &n| sum.saturating_add(n as u64));
    let event_max_bytes = (EVENT_EXPERTS_MAX as u64 + 1) * NUMBER_MAX_BYTES + 2;
    keys.saturating_mul(ENTRY_MAX_BYTES)
        .saturating_add(ROUTING_EVENTS_MAX as u64 * event_max_bytes)
        .saturating_add(FIXED_MAX_BYTES)
}

/// The text of `path` when it holds at most `max_bytes` (`None` when more):
/// read through a limit, so a file that grows while read is bounded too.
fn read_bounded(path: &Path, max_bytes: u64) -> std::io::Result<Option<String>> {
    use std::io::Read;
    let mut text = String::new();
    File::open(path)?.take(max_bytes.saturating_add(1)).read_to_string(&mut text)?;
    Ok((text.len() as u64 <= max_bytes).then_some(text))
}

/// Makes temporary names unique among threads of one process; the pid makes
/// them unique among processes.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `bytes` so that readers see the old file or the new
/// one, never a mix, even across a crash.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let write_err = |source| Error::UsageWrite { path: path.to_path_buf(), source };
    let name = path.file_name().ok_or_else(|| write_err(std::io::Error::other("the path names no file")))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let unique = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    // Same directory as the target: rename is only atomic within a file system.
    let temp = dir.join(format!(".{}.tmp-{}-{unique}", name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut file = File::options().write(true).create_new(true).open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if let Err(source) = written {
        // Best effort: the write already failed with the error that matters.
        let _ = std::fs::remove_file(&temp);
        return Err(write_err(source));
    }
    File::open(&dir).and_then(|d| d.sync_all()).map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four layers of four experts: room for every key `sample` uses.
    const SHAPE: &[usize] = &[4, 4, 4, 4];

    fn key(layer: usize, expert: usize) -> ExpertKey {
        ExpertKey { layer, expert }
    }

    fn sample() -> Usage {
        let mut usage = Usage::new();
        usage.add(key(0, 3), 5);
        usage.add(key(1, 0), 7);
        usage.add(key(0, 1), 5);
        usage.record(key(2, 2));
        usage
    }

    #[test]
    fn records_counts_merges_and_ranks() {
        let mut usage = sample();
        assert_eq!(usage.count(key(0, 3)), 5);
        assert_eq!(usage.count(key(9, 9)), 0);
        // Ties at 5: the lower expert of the same layer first.
        assert_eq!(usage.top(3), [key(1, 0), key(0, 1), key(0, 3)]);
        assert_eq!(usage.top(10).len(), 4);
        assert!(usage.top(0).is_empty());
        usage.merge(&[key(2, 2), key(2, 2), key(0, 0)].into_iter().collect());
        assert_eq!(usage.count(key(2, 2)), 3);
        assert_eq!((usage.len(), usage.total()), (5, 21));
        usage.add(key(0, 0), u64::MAX);
        assert_eq!(usage.count(key(0, 0)), u64::MAX);
    }

    #[test]
    fn ties_break_by_layer_then_expert() {
        let usage: Usage = [key(1, 0), key(0, 5), key(0, 2)].into_iter().collect();
        assert_eq!(usage.top(2), [key(0, 2), key(0, 5)]);
    }

    #[test]
    fn round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        let usage = sample();
        usage.save(&path, "abc123").unwrap();
        let (loaded, warning) = Usage::load(&path, "abc123", SHAPE).unwrap();
        assert_eq!(loaded, usage);
        assert_eq!(warning, None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with(r#"{"format":"strata-usage","version":1,"container_hash":"abc123","counts":[[0,1,5],"#),
            "{text}"
        );
        // Saving again replaces the file and leaves no temporary behind.
        Usage::new().save(&path, "abc123").unwrap();
        assert!(Usage::load(&path, "abc123", SHAPE).unwrap().0.is_empty());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["usage.json"]);
    }

    #[test]
    fn routing_events_round_trip_and_keep_only_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        let mut usage = sample();
        usage.record_routing(1, &[3, 0]);
        usage.record_routing(0, &[2]);
        usage.record_routing(0, &[]);
        usage.record_routing(0, &(0..=EVENT_EXPERTS_MAX).collect::<Vec<_>>());
        assert_eq!(
            usage.routing().collect::<Vec<_>>(),
            [(1, &[3, 0][..]), (0, &[2])],
            "empty and too wide are not kept"
        );
        usage.save(&path, "h").unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains(r#""routing":[[1,3,0],[0,2]]"#));
        assert_eq!(Usage::load(&path, "h", SHAPE).unwrap(), (usage.clone(), None));
        // Merged after this one's; beyond the bound the oldest go first.
        let mut merged = Usage::new();
        for expert in 0..ROUTING_EVENTS_MAX {
            merged.record_routing(2, &[expert % 4]);
        }
        merged.merge(&usage);
        assert_eq!(merged.routing().count(), ROUTING_EVENTS_MAX);
        assert_eq!(merged.routing().next(), Some((2, &[2][..])));
        assert_eq!(merged.routing().last(), Some((0, &[2][..])));
        merged.save(&path, "h").unwrap();
        assert_eq!(Usage::load(&path, "h", SHAPE).unwrap(), (merged, None), "the largest routing fits the bound");
    }

    #[test]
    fn a_file_without_routing_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        std::fs::write(&path, r#"{"format":"strata-usage","version":1,"container_hash":"h","counts":[[0,1,5]]}"#)
            .unwrap();
        let (usage, warning) = Usage::load(&path, "h", SHAPE).unwrap();
        assert_eq!((usage.count(key(0, 1)), usage.routing().count(), warning), (5, 0, None));
    }

    #[test]
    fn corrupt_routing_events_are_ignored_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        for routing in ["[[]]", "[[0]]", "[[0,1,1]]", "[[0,4]]", "[[4,0]]", "[[0,-1]]", "{}"] {
            let text = format!(
                r#"{{"format":"strata-usage","version":1,"container_hash":"h","counts":[],"routing":{routing}}}"#
            );
            std::fs::write(&path, text).unwrap();
            let (usage, warning) = Usage::load(&path, "h", SHAPE).unwrap();
            assert!(usage.is_empty(), "{routing}");
            assert!(warning.unwrap().contains("corrupt"), "{routing}");
        }
        let too_many = format!("[{}]", vec!["[0,1]"; ROUTING_EVENTS_MAX + 1].join(","));
        let text =
            format!(r#"{{"format":"strata-usage","version":1,"container_hash":"h","counts":[],"routing":{too_many}}}"#);
        std::fs::write(&path, text).unwrap();
        assert!(Usage::load(&path, "h", SHAPE).unwrap().1.unwrap().contains("more than"));
    }

    #[test]
    fn missing_file_is_empty_without_warning() {
        let dir = tempfile::tempdir().unwrap();
        let (usage, warning) = Usage::load(dir.path().join("none.json"), "h", SHAPE).unwrap();
        assert!(usage.is_empty() && warning.is_none());
    }

    #[test]
    fn another_containers_file_is_ignored_with_both_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        sample().save(&path, "oldhash").unwrap();
        let (usage, warning) = Usage::load(&path, "newhash", SHAPE).unwrap();
        assert!(usage.is_empty());
        let warning = warning.unwrap();
        assert!(warning.contains("oldhash") && warning.contains("newhash"), "{warning}");
        assert!(warning.contains(&path.display().to_string()), "{warning}");
    }

    #[test]
    fn corrupt_or_unknown_files_are_ignored_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        let cases = [
            (
                "{\"format\":\"strata-usage\",\"version\":1,\"container_hash\":\"h\",\"counts\":[[0,1",
                "not a usage file",
            ),
            ("not json", "not a usage file"),
            (r#"{"format":"strata-trace","version":1}"#, "format"),
            (r#"{"format":"strata-usage","version":2,"counts":{}}"#, "version 2"),
            (r#"{"format":"strata-usage","version":1,"container_hash":"h","counts":[[0,1]]}"#, "corrupt"),
            (r#"{"format":"strata-usage","version":1,"container_hash":"h","counts":[[0,1,2],[0,1,3]]}"#, "twice"),
        ];
        for (text, why) in cases {
            std::fs::write(&path, text).unwrap();
            let (usage, warning) = Usage::load(&path, "h", SHAPE).unwrap();
            assert!(usage.is_empty(), "{text}");
            let warning = warning.unwrap_or_else(|| panic!("no warning for {text}"));
            assert!(warning.contains(why) && warning.contains("usage.json"), "{text}: {warning}");
        }
    }

    #[test]
    fn usage_keys_outside_the_model_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        for counts in ["[[4,0,1]]", "[[0,4,1]]", "[[1,1,1],[18446744073709551615,0,1]]"] {
            let text = format!(r#"{{"format":"strata-usage","version":1,"container_hash":"h","counts":{counts}}}"#);
            std::fs::write(&path, text).unwrap();
            let (usage, warning) = Usage::load(&path, "h", SHAPE).unwrap();
            assert!(usage.is_empty(), "{counts}");
            assert!(warning.unwrap().contains("not in this model"), "{counts}");
        }
    }

    #[test]
    fn oversized_usage_file_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.json");
        // Valid JSON padded past what 16 keys can take.
        let padding = " ".repeat(usize::try_from(usage_file_max_bytes(SHAPE)).unwrap());
        let text = format!(r#"{{"format":"strata-usage","version":1,"container_hash":"h",{padding}"counts":[]}}"#);
        std::fs::write(&path, text).unwrap();
        let (usage, warning) = Usage::load(&path, "h", SHAPE).unwrap();
        assert!(usage.is_empty());
        assert!(warning.unwrap().contains("larger than"));
        // The largest real file fits: every key with the largest count.
        let mut full = Usage::new();
        for layer in 0..SHAPE.len() {
            for expert in 0..SHAPE[layer] {
                full.add(key(layer, expert), u64::MAX);
            }
        }
        full.save(&path, "h").unwrap();
        assert_eq!(Usage::load(&path, "h", SHAPE).unwrap(), (full, None));
    }

    #[test]
    fn unreadable_path_is_a_warning_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (usage, warning) = Usage::load(dir.path(), "h", SHAPE).unwrap();
        assert!(usage.is_empty());
        assert!(warning.unwrap().contains("cannot read"));
    }

    #[test]
    fn failed_save_names_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // Renaming a file over a non-empty directory fails.
        let target = dir.path().join("occupied");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("x"), "x").unwrap();
        let err = sample().save(&target, "h").unwrap_err().to_string();
        assert!(err.contains("occupied"), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["occupied"]);
        let missing_dir = dir.path().join("no/such/dir/usage.json");
        assert!(sample().save(&missing_dir, "h").is_err());
    }
}
