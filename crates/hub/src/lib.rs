//! Where models come from: the demo model built into the binary, Hugging
//! Face checkpoints converted once into a cache keyed by their content, and
//! models by name ([`resolve_model`]); the engine opens containers only.
//!
//! Models by name, as Ollama has them: `pull` fetches a Hugging Face
//! repository (`ORG/NAME[@REVISION]`) over the hub's HTTP protocol
//! ([`client`]), checks every file against the digest the hub publishes for
//! it, converts the checkpoint into the model cache and publishes the
//! container there under its name; from then `--model ORG/NAME` opens it
//! ([`resolve_model`]). `list` and `remove` are `strata models` and `strata rm`.
//!
//! The cache (docs/FORMAT.md, "The model cache"). Every path below is built
//! here from checked names ([`names`]): nothing the hub sends chooses one.
//!
//! ```text
//! <cache_dir>/pulled/ORG/NAME/                  a container, plus pulled.json (PulledRecord)
//! <cache_dir>/.downloads/ORG/NAME/COMMIT/FILE   the checkpoint while a pull runs;
//!                                     FILE.part: a partial file, resumed on the next pull
//! ```

mod client;
mod demo;
mod error;
mod names;
mod resolve;
mod resolved;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use strata_format::{ConvertOptions, QuantPreset};

pub use self::client::HubHeaders;
use self::client::{FileRequest, HubClient};
pub use self::error::{Error, Result};
pub use self::resolve::{DEMO_NAME, default_cache_dir, resolve_model};
pub use self::resolved::{AUTO_CONVERT_PRESET, ResolvedModel};

/// Where pulled containers live, under the model cache.
pub const PULLED_DIR: &str = "pulled";
/// Where checkpoints are downloaded to, under the model cache.
pub const DOWNLOADS_DIR: &str = ".downloads";
/// The record of a pulled model, inside its container directory.
pub const RECORD_FILE: &str = "pulled.json";
/// The hub when neither `--endpoint` nor `HF_ENDPOINT` names another.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The revision pulled when the name gives none.
pub const DEFAULT_REVISION: &str = "main";

/// The hub's limits on names (96 characters each side of the slash), so a
/// name past them is a typo, not a repository.
const NAME_PART_BYTES_MAX: usize = 96;
const REVISION_BYTES_MAX: usize = 255;
/// The repository description read from the hub: large repositories list
/// thousands of files, a few hundred bytes each.
const REPO_INFO_BYTES_MAX: u64 = 64 << 20;
/// Files a pull fetches; the largest checkpoints have under two thousand shards.
const FILES_MAX: usize = 4096;
/// Files a repository may list (a model repository with more is not one
/// this pull understands: datasets of images, per-step checkpoints).
const SIBLINGS_MAX: usize = 65_536;
/// What is read of a JSON file of the checkpoint or the cache (index,
/// record, manifest).
const JSON_FILE_BYTES_MAX: u64 = 64 << 20;
/// The file every checkpoint has, fetched first: it says whether this build
/// can run the model at all.
const CONFIG_FILE: &str = strata_format::checkpoint::CONFIG_FILE;
/// The checkpoint files fetched besides config.json and the weights when the
/// repository has them: what conversion reads or copies into the container.
const CHECKPOINT_FILES: [&str; 5] = [
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
];
const INDEX_FILE: &str = "model.safetensors.index.json";
/// Held by a pull in its download directory (`File::try_lock`).
const LOCK_FILE: &str = ".lock";

/// `ORG/NAME[@REVISION]`: a repository on the hub and, optionally, a branch,
/// tag or commit of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelName {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for (`None`: [`DEFAULT_REVISION`] when pulling,
    /// whichever was pulled when opening).
    pub revision: Option<String>,
}

impl ModelName {
    /// Parses `ORG/NAME[@REVISION]`; `None` when `text` is not such a name.
    pub fn parse(text: &str) -> Option<ModelName> {
        let (repo, revision) = match text.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision)),
            None => (text, None),
        };
        let (org, name) = repo.split_once('/')?;
        let part_ok = |part: &str| {
            !part.is_empty()
                && part.len() <= NAME_PART_BYTES_MAX
                && !part.starts_with(['.', '-'])
                && !part.contains("..")
                && part.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        let revision_ok = |rev: &str| {
            !rev.is_empty()
                && rev.len() <= REVISION_BYTES_MAX
                && !rev.starts_with(['.', '/'])
                && !rev.contains("..")
                && rev.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        };
        if !part_ok(org) || !part_ok(name) || !revision.is_none_or(revision_ok) {
            return None;
        }
        Some(ModelName { repo: repo.to_owned(), revision: revision.map(str::to_owned) })
    }

    /// The container directory of this name in `cache_dir`.
    fn container_dir(&self, cache_dir: &Path) -> PathBuf {
        cache_dir.join(PULLED_DIR).join(&self.repo)
    }

    /// Where a pull of this name downloads to in `cache_dir`.
    fn downloads_dir(&self, cache_dir: &Path) -> PathBuf {
        cache_dir.join(DOWNLOADS_DIR).join(&self.repo)
    }
}

impl std::fmt::Display for ModelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.revision {
            Some(revision) => write!(f, "{}@{revision}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// How to reach the hub and what to make of the checkpoint.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The hub's address, e.g. [`DEFAULT_ENDPOINT`] or a mirror's.
    pub endpoint: String,
    /// A Hugging Face access token, for gated and private repositories.
    pub token: Option<String>,
    /// Draw a progress bar per file, and conversion's.
    pub progress: bool,
    /// The weight format of the container.
    pub preset: QuantPreset,
    /// config.json keys to accept although the family does not know them
    /// (`--allow-unknown-config`).
    pub allow_unknown_config: Vec<String>,
}

/// What [`pull`] did.
#[derive(Debug, Clone)]
pub struct PullReport {
    /// The published model.
    pub model: PulledModel,
    /// Files fetched or found complete from an earlier, interrupted pull.
    pub files: usize,
    /// Bytes of those files.
    pub checkpoint_bytes: u64,
    /// Time spent fetching and checking them.
    pub download_time: Duration,
    /// Time spent converting.
    pub convert_time: Duration,
}

/// What the cache keeps of a pulled model beside its container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulledRecord {
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for (a branch, tag or commit).
    pub revision: String,
    /// The commit it was at: every file is from this commit.
    pub commit: String,
    /// The hub it came from.
    pub endpoint: String,
    /// When it was pulled, in seconds since the Unix epoch.
    pub pulled_unix_s: u64,
    /// When it was last opened by name (`None`: never).
    pub last_used_unix_s: Option<u64>,
}

/// One model of the cache, as `strata models` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledModel {
    pub record: PulledRecord,
    /// The container directory.
    pub dir: PathBuf,
    /// The model family, as the container's manifest names it.
    pub family: String,
    /// The weight format it was converted with.
    pub preset: QuantPreset,
    /// Bytes of every file of the container.
    pub size_bytes: u64,
}

/// The metadata the hub gives of a repository at a revision
/// (`/api/models/ORG/NAME/revision/REV?blobs=true`), the parts used.
#[derive(Debug, Deserialize)]
struct RepoInfo {
    /// The commit the revision is at.
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    /// The git blob id (SHA-1 of `blob <size>\0` and the bytes): the only
    /// digest the hub has of a file kept in git rather than LFS.
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    size: Option<u64>,
    lfs: Option<LfsInfo>,
}

#[derive(Debug, Deserialize)]
struct LfsInfo {
    sha256: String,
    size: u64,
}

/// The digest a file must have (lower-case hex).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    /// An LFS file: the SHA-256 of its bytes.
    Sha256(String),
    /// A file kept in git: its blob id.
    GitBlobSha1(String),
}

impl Expected {
    fn hex(&self) -> &str {
        match self {
            Expected::Sha256(hex) | Expected::GitBlobSha1(hex) => hex,
        }
    }
}

/// Fetches `name` from the hub into `cache_dir` and publishes it there as a
/// container under its name, replacing an earlier pull of the same name.
/// Files already complete from an interrupted pull are not fetched again and
/// a partial one is resumed where it stopped. A file whose bytes do not match
/// the hub's digest is removed and the pull refused; nothing is published
/// unless every file matched and conversion succeeded. A refusal that a
/// retry cannot change (not found, gated, an architecture Strata cannot
/// run, an answer a pull must not use) keeps nothing of the download.
pub fn pull(name: &ModelName, cache_dir: &Path, options: &PullOptions) -> Result<PullReport> {
    // Every path of the pull is built from the name: only a parsed one is
    // safe to join.
    assert_eq!(ModelName::parse(&name.to_string()).as_ref(), Some(name), "an unchecked model name");
    let downloads = name.downloads_dir(cache_dir);
    fs::create_dir_all(&downloads).map_err(io(&downloads))?;
    let _lock = lock_downloads(name, &downloads)?;
    let client = HubClient::new(&options.endpoint, options.token.clone(), options.progress);

    let started = Instant::now();
    let revision = name.revision.clone().unwrap_or_else(|| DEFAULT_REVISION.to_owned());
    let checkpoint = fetch_checkpoint(&client, name, &revision, &downloads, &options.allow_unknown_config)
        .inspect_err(|error| {
            if matches!(error, Error::HubRefused { .. } | Error::HubMetadata { .. }) {
                let _ = fs::remove_dir_all(&downloads);
                remove_if_empty(downloads.parent());
            }
        })?;
    let download_time = started.elapsed();

    let started = Instant::now();
    let record = PulledRecord {
        repo: name.repo.clone(),
        revision,
        commit: checkpoint.commit,
        endpoint: client.endpoint().to_owned(),
        pulled_unix_s: now_unix_s(),
        last_used_unix_s: None,
    };
    let dir = convert_and_publish(&checkpoint.snapshot, &name.container_dir(cache_dir), &record, options)?;
    let convert_time = started.elapsed();
    // The container holds all that runs the model (tokenizer files are
    // copied in): the downloaded checkpoint would only double the disk used.
    let _ = fs::remove_dir_all(&downloads);
    remove_if_empty(downloads.parent());
    Ok(PullReport {
        model: read_model(&dir)?,
        files: checkpoint.files,
        checkpoint_bytes: checkpoint.bytes,
        download_time,
        convert_time,
    })
}

/// Holds the lock of `name`'s download directory, so that two pulls of one
/// name never write the same `.part` file.
fn lock_downloads(name: &ModelName, downloads: &Path) -> Result<fs::File> {
    let path = downloads.join(LOCK_FILE);
    let file = fs::File::create(&path).map_err(io(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(Error::HubMetadata {
            name: name.to_string(),
            reason: "another `strata pull` of it is running".to_owned(),
        }),
        Err(fs::TryLockError::Error(source)) => Err(Error::Io { path, source }),
    }
}

/// A checkpoint fetched and checked, in the download directory.
struct Checkpoint {
    /// `.downloads/ORG/NAME/COMMIT`: the checkpoint's files.
    snapshot: PathBuf,
    /// The commit every file is from.
    commit: String,
    files: usize,
    bytes: u64,
}

/// Fetches the checkpoint's files at the commit the listing of `revision`
/// describes, each checked against it: config.json first (a model this
/// build cannot run is refused there, before any weights), then the other
/// small files, then the weights the index names.
fn fetch_checkpoint(
    client: &HubClient,
    name: &ModelName,
    revision: &str,
    downloads: &Path,
    allow_unknown_config: &[String],
) -> Result<Checkpoint> {
    let metadata = |reason: String| Error::HubMetadata { name: name.to_string(), reason };
    let info = repo_info(client, name, revision)?;
    // A checked commit id: one plain directory name.
    let snapshot = downloads.join(&info.sha);
    fs::create_dir_all(&snapshot).map_err(io(&snapshot))?;
    let fetch = |file: &str| -> Result<u64> {
        let sibling = info
            .siblings
            .iter()
            .find(|s| s.rfilename == file)
            .ok_or_else(|| metadata(format!("{file} is named by the checkpoint but not in the repository")))?;
        let (expected, size_bytes) =
            expected_digest(sibling).ok_or_else(|| metadata(format!("the hub gives no digest for {file}")))?;
        // Checked names only, all at the repository's top level: the file
        // and its `.part` stay in the snapshot directory.
        assert!(names::is_repo_file_name(file) && !file.contains('/'), "{file:?}");
        let path = snapshot.join(file);
        // A file completed by an earlier pull is kept if it still matches.
        if path.is_file() && verify(&path, file, &expected, size_bytes).is_ok() {
            return Ok(size_bytes);
        }
        let part = snapshot.join(format!("{file}.part"));
        let request = FileRequest { name, commit: &info.sha, file, size_bytes, digest_hex: expected.hex() };
        client.download(&request, &part)?;
        verify(&part, file, &expected, size_bytes)?;
        fs::rename(&part, &path).map_err(io(&path))?;
        Ok(size_bytes)
    };
    let mut bytes = fetch(CONFIG_FILE)?;
    check_architecture(name, &snapshot.join(CONFIG_FILE), allow_unknown_config)?;
    let mut files = 1;
    for file in CHECKPOINT_FILES.iter().filter(|file| info.siblings.iter().any(|s| s.rfilename == **file)) {
        bytes = bytes.saturating_add(fetch(file)?);
        files += 1;
    }
    let index = snapshot.join(INDEX_FILE);
    let index_bytes = if index.is_file() { Some(read_bounded(&index)?) } else { None };
    for file in weight_files(name, &info, index_bytes.as_deref())? {
        bytes = bytes.saturating_add(fetch(&file)?);
        files += 1;
    }
    Ok(Checkpoint { snapshot, commit: info.sha, files, bytes })
}

/// Refuses a config.json this build cannot run (another architecture,
/// values out of range, keys its family does not know but those in
/// `allow_unknown_config`) before anything else is downloaded.
fn check_architecture(name: &ModelName, config: &Path, allow_unknown_config: &[String]) -> Result<()> {
    let text = String::from_utf8(read_bounded(config)?)
        .map_err(|e| Error::ModelFile { path: config.to_path_buf(), reason: e.to_string() })?;
    let checked = strata_format::ModelArch::from_config_json(&text).and_then(|_| {
        let value = serde_json::from_str(&text)
            .map_err(|source| strata_format::Error::Json { what: CONFIG_FILE.into(), source })?;
        strata_format::check_config_keys(&value, allow_unknown_config)
    });
    checked.map_err(|e| Error::HubMetadata {
        name: name.to_string(),
        reason: format!("{CONFIG_FILE}: {e}; nothing beyond {CONFIG_FILE} was downloaded"),
    })
}

/// Converts the checkpoint into a staging directory beside `dir`, records
/// `record` in it and renames it to `dir`; on failure removes the staging
/// directory and leaves `dir` as it was.
fn convert_and_publish(snapshot: &Path, dir: &Path, record: &PulledRecord, options: &PullOptions) -> Result<PathBuf> {
    let parent = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    fs::create_dir_all(&parent).map_err(io(&parent))?;
    let leaf = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Per process and beside the target, so two pulls never share a staging
    // directory and the rename stays on one filesystem.
    let staging = parent.join(format!(".{leaf}.{}.staging", std::process::id()));
    let convert_options = ConvertOptions {
        progress: options.progress,
        overwrite: true,
        allow_unknown_config: options.allow_unknown_config.clone(),
        ..ConvertOptions::new(options.preset)
    };
    let published = strata_text::check_text_files(snapshot)
        .map_err(Error::from)
        .and_then(|()| strata_format::convert(snapshot, &staging, &convert_options).map_err(Error::from))
        .and_then(|_| write_record(&staging, record))
        .and_then(|()| publish(&staging, dir));
    if published.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    published.map(|()| dir.to_path_buf())
}

/// The repository's files and their digests at `revision` (read with a
/// bound), checked for what a pull needs before anything is fetched: the
/// commit a 40-hex id, every file name a plain name inside the repository.
fn repo_info(client: &HubClient, name: &ModelName, revision: &str) -> Result<RepoInfo> {
    let body = client.repo_info(name, revision, REPO_INFO_BYTES_MAX)?.ok_or_else(|| Error::HubMetadata {
        name: name.to_string(),
        reason: format!("the repository's description is over {REPO_INFO_BYTES_MAX} bytes"),
    })?;
    parse_repo_info(name, &body)
}

/// The listing's body, parsed and checked: a commit id, plain file names,
/// a config.json.
fn parse_repo_info(name: &ModelName, body: &[u8]) -> Result<RepoInfo> {
    let metadata = |reason: String| Error::HubMetadata { name: name.to_string(), reason };
    let info: RepoInfo =
        serde_json::from_slice(body).map_err(|e| metadata(format!("the repository's description: {e}")))?;
    if info.siblings.len() > SIBLINGS_MAX {
        return Err(metadata(format!("the repository lists {} files", info.siblings.len())));
    }
    if !names::is_commit_id(&info.sha) {
        return Err(metadata(format!("commit {} is not a commit id", names::quoted_for_error(&info.sha, 100))));
    }
    if let Some(bad) = info.siblings.iter().find(|s| !names::is_repo_file_name(&s.rfilename)) {
        return Err(metadata(format!(
            "the repository lists {}, not a plain file name inside it",
            names::quoted_for_error(&bad.rfilename, 100)
        )));
    }
    if !info.siblings.iter().any(|s| s.rfilename == CONFIG_FILE) {
        return Err(metadata("the repository has no config.json (not a transformers checkpoint)".to_owned()));
    }
    Ok(info)
}

/// The safetensors files of the checkpoint: the shards its index names, or
/// else every `.safetensors` file at the top of the repository.
fn weight_files(name: &ModelName, info: &RepoInfo, index: Option<&[u8]>) -> Result<Vec<String>> {
    let metadata = |reason: String| Error::HubMetadata { name: name.to_string(), reason };
    let mut files: Vec<String> = match index {
        Some(index) => {
            #[derive(Deserialize)]
            struct Index {
                weight_map: std::collections::BTreeMap<String, String>,
            }
            let index: Index = serde_json::from_slice(index).map_err(|e| metadata(format!("{INDEX_FILE}: {e}")))?;
            index.weight_map.into_values().collect()
        }
        None => info
            .siblings
            .iter()
            .map(|s| s.rfilename.clone())
            .filter(|f| f.ends_with(".safetensors") && !f.contains('/'))
            .collect(),
    };
    files.sort();
    files.dedup();
    if files.is_empty() {
        return Err(metadata(
            "the repository has no safetensors weights (Strata converts safetensors checkpoints)".to_owned(),
        ));
    }
    if files.len() > FILES_MAX {
        return Err(metadata(format!("{} weight files, more than the {FILES_MAX} a pull takes", files.len())));
    }
    // The index is the checkpoint's own file: a name in it must stay a plain
    // file name at the top of the snapshot.
    if let Some(bad) = files.iter().find(|f| f.contains(['/', '\\']) || f.starts_with('.')) {
        return Err(metadata(format!("{INDEX_FILE} names {bad:?}, not a file of the repository's top level")));
    }
    Ok(files)
}

/// What a pull checks of the hub's answers before a name it sends reaches
/// a path or a byte is written, without a network (the hub fuzz target's
/// entry: the hub chooses every byte here): the listing's body, the headers
/// of each listed file that has a digest (`headers`, as if the hub set the
/// same ones on every file), and the index. The weight files a pull would
/// fetch.
pub fn check_hub_answers(
    name: &ModelName,
    listing: &[u8],
    headers: &HubHeaders,
    index: Option<&[u8]>,
) -> Result<Vec<String>> {
    let info = parse_repo_info(name, listing)?;
    for sibling in &info.siblings {
        if let Some((expected, size_bytes)) = expected_digest(sibling) {
            let request = FileRequest {
                name,
                commit: &info.sha,
                file: &sibling.rfilename,
                size_bytes,
                digest_hex: expected.hex(),
            };
            client::check_hub_headers(headers, &request)?;
        }
    }
    weight_files(name, &info, index)
}

fn expected_digest(sibling: &Sibling) -> Option<(Expected, u64)> {
    match (&sibling.lfs, &sibling.blob_id, sibling.size) {
        (Some(lfs), ..) if names::is_hex(&lfs.sha256, names::SHA256_HEX_DIGITS) => {
            Some((Expected::Sha256(lfs.sha256.to_ascii_lowercase()), lfs.size))
        }
        (None, Some(blob), Some(size)) if names::is_hex(blob, names::SHA1_HEX_DIGITS) => {
            Some((Expected::GitBlobSha1(blob.to_ascii_lowercase()), size))
        }
        _ => None,
    }
}

/// Checks a downloaded file against the hub's digest; a mismatch removes it,
/// so the next pull fetches it afresh rather than trusting it.
fn verify(path: &Path, file: &str, expected: &Expected, size_bytes: u64) -> Result<()> {
    let actual_size = fs::metadata(path).map_err(io(path))?.len();
    let (algorithm, expected_hex, actual_hex) = match expected {
        Expected::Sha256(hex) => ("SHA-256", hex, hash_file(path, Sha256::new())?),
        Expected::GitBlobSha1(hex) => {
            let mut hasher = Sha1::new();
            hasher.update(format!("blob {actual_size}\0"));
            ("git blob SHA-1", hex, hash_file(path, hasher)?)
        }
    };
    if actual_size == size_bytes && &actual_hex == expected_hex {
        return Ok(());
    }
    let _ = fs::remove_file(path);
    Err(Error::Digest {
        file: file.to_owned(),
        algorithm,
        expected: format!("{expected_hex} ({size_bytes} bytes)"),
        actual: format!("{actual_hex} ({actual_size} bytes)"),
    })
}

fn hash_file<D: Digest>(path: &Path, mut hasher: D) -> Result<String> {
    let mut file = fs::File::open(path).map_err(io(path))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Moves `staging` to `dir`, replacing what was there; at every moment `dir`
/// is either the old container or the new one, never a half of either.
fn publish(staging: &Path, dir: &Path) -> Result<()> {
    let old = staging.with_extension("old");
    if dir.exists() {
        fs::rename(dir, &old).map_err(io(dir))?;
    }
    fs::rename(staging, dir).map_err(io(dir))?;
    if old.exists() {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

/// The pulled model named `name`, its last use set to now. `None` when it is
/// not in the cache, or not at the revision `name` asks for.
pub(crate) fn open_pulled(cache_dir: &Path, name: &ModelName) -> Result<Option<PathBuf>> {
    let dir = name.container_dir(cache_dir);
    if !dir.join(strata_format::container::MANIFEST_FILE).is_file() {
        return Ok(None);
    }
    let mut record = read_record(&dir)?;
    if let Some(revision) = &name.revision
        && revision != &record.revision
        && revision != &record.commit
    {
        return Ok(None);
    }
    record.last_used_unix_s = Some(now_unix_s());
    // Last use is for `strata models` only: a cache the user may read but
    // not write still runs the model.
    let _ = write_record(&dir, &record);
    Ok(Some(dir))
}

/// Every pulled model in `cache_dir`, by name.
pub fn list(cache_dir: &Path) -> Result<Vec<PulledModel>> {
    let root = cache_dir.join(PULLED_DIR);
    let mut models = Vec::new();
    for org in visible_dirs(&root)? {
        for dir in visible_dirs(&org)? {
            if dir.join(RECORD_FILE).is_file() {
                models.push(read_model(&dir)?);
            }
        }
    }
    models.sort_by(|a, b| a.record.repo.cmp(&b.record.repo));
    Ok(models)
}

/// What [`remove`] removed.
#[derive(Debug)]
pub struct Removed {
    /// The pulled model (`None`: there was only a partial download).
    pub model: Option<PulledModel>,
    /// Bytes of a partial download of it, removed too.
    pub partial_bytes: u64,
}

/// A pull that stopped before publishing (a dropped connection, Ctrl-C, a
/// file that did not match): what it fetched waits for the next pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialDownload {
    /// `ORG/NAME`.
    pub repo: String,
    pub bytes: u64,
}

/// Removes the pulled model `name` and any partial download of it (either
/// may be there alone).
pub fn remove(cache_dir: &Path, name: &ModelName) -> Result<Removed> {
    let dir = name.container_dir(cache_dir);
    let downloads = name.downloads_dir(cache_dir);
    let pulled = dir.join(RECORD_FILE).is_file();
    if !pulled && !downloads.is_dir() {
        return Err(Error::NotPulled { name: name.repo.clone() });
    }
    let model = if pulled {
        let model = read_model(&dir)?;
        // Renamed first, so an interrupted removal never leaves a container
        // that looks whole but is not.
        // A dot name, which `list` skips, beside the model (one filesystem).
        let leaf = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let doomed = dir.with_file_name(format!(".{leaf}.{}.removing", std::process::id()));
        fs::rename(&dir, &doomed).map_err(io(&dir))?;
        fs::remove_dir_all(&doomed).map_err(io(&doomed))?;
        remove_if_empty(dir.parent());
        Some(model)
    } else {
        None
    };
    let mut partial_bytes = 0;
    if downloads.is_dir() {
        partial_bytes = dir_bytes(&downloads)?;
        fs::remove_dir_all(&downloads).map_err(io(&downloads))?;
        remove_if_empty(downloads.parent());
    }
    // hf-hub's folder, from the pulls of earlier versions.
    let _ = fs::remove_dir_all(cache_dir.join(DOWNLOADS_DIR).join(format!("models--{}", name.repo.replace('/', "--"))));
    Ok(Removed { model, partial_bytes })
}

/// Every partial download in `cache_dir`, by name.
pub fn partial_downloads(cache_dir: &Path) -> Result<Vec<PartialDownload>> {
    let mut partials = Vec::new();
    // hf-hub's `models--ORG--NAME` folders of earlier versions are not
    // `ORG/NAME` (`strata rm ORG/NAME` removes them).
    let orgs = visible_dirs(&cache_dir.join(DOWNLOADS_DIR))?;
    for org in orgs.iter().filter(|org| !org.file_name().is_some_and(|n| n.to_string_lossy().starts_with("models--"))) {
        for dir in visible_dirs(org)? {
            let leaf = |path: &Path| path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            partials.push(PartialDownload { repo: format!("{}/{}", leaf(org), leaf(&dir)), bytes: dir_bytes(&dir)? });
        }
    }
    Ok(partials)
}

/// Removes `dir` when it is empty (an organisation's directory once its
/// last model is gone).
fn remove_if_empty(dir: Option<&Path>) {
    if let Some(dir) = dir {
        // Only succeeds when empty, which is the point.
        let _ = fs::remove_dir(dir);
    }
}

fn visible_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Io { path: dir.to_path_buf(), source: e }),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(dir))?;
        // Staging and removal directories start with a dot.
        if !entry.file_name().to_string_lossy().starts_with('.') && entry.path().is_dir() {
            dirs.push(entry.path());
        }
    }
    dirs.sort();
    Ok(dirs)
}

fn read_model(dir: &Path) -> Result<PulledModel> {
    let record = read_record(dir)?;
    let manifest_path = dir.join(strata_format::container::MANIFEST_FILE);
    let manifest: strata_format::Manifest = serde_json::from_slice(&read_bounded(&manifest_path)?)
        .map_err(|e| Error::ModelFile { path: manifest_path.clone(), reason: e.to_string() })?;
    let family = manifest
        .family()
        .ok_or_else(|| Error::ModelFile { path: manifest_path.clone(), reason: "names no model family".into() })?;
    Ok(PulledModel {
        record,
        dir: dir.to_path_buf(),
        family: family.to_string(),
        preset: manifest.quant.preset,
        size_bytes: dir_bytes(dir)?,
    })
}

fn read_record(dir: &Path) -> Result<PulledRecord> {
    let path = dir.join(RECORD_FILE);
    serde_json::from_slice(&read_bounded(&path)?).map_err(|e| Error::ModelFile { path, reason: e.to_string() })
}

/// Writes the record through a temporary file, so a reader never sees half.
fn write_record(dir: &Path, record: &PulledRecord) -> Result<()> {
    let path = dir.join(RECORD_FILE);
    let tmp = dir.join(format!(".{RECORD_FILE}.{}.tmp", std::process::id()));
    let text = serde_json::to_string_pretty(record)
        .map_err(|e| Error::ModelFile { path: path.clone(), reason: e.to_string() })?;
    fs::write(&tmp, text).map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))
}

fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let file = fs::File::open(path).map_err(io(path))?;
    let mut bytes = Vec::new();
    file.take(JSON_FILE_BYTES_MAX + 1).read_to_end(&mut bytes).map_err(io(path))?;
    if bytes.len() as u64 > JSON_FILE_BYTES_MAX {
        return Err(Error::ModelFile { path: path.to_path_buf(), reason: format!("over {JSON_FILE_BYTES_MAX} bytes") });
    }
    Ok(bytes)
}

/// Bytes of the files in `dir` and its subdirectories (a container is two
/// levels deep: `experts/`).
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0u64;
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let meta = entry.metadata().map_err(io(&entry.path()))?;
        let bytes = if meta.is_dir() { dir_bytes(&entry.path())? } else { meta.len() };
        total = total.saturating_add(bytes);
    }
    Ok(total)
}

fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_org_slash_name_with_an_optional_revision() {
        let name = ModelName::parse("allenai/OLMoE-1B-7B-0125@v1.0").unwrap();
        assert_eq!(name.repo, "allenai/OLMoE-1B-7B-0125");
        assert_eq!(name.revision.as_deref(), Some("v1.0"));
        assert_eq!(name.to_string(), "allenai/OLMoE-1B-7B-0125@v1.0");
        assert_eq!(ModelName::parse("org/name").unwrap().revision, None);
        assert!(ModelName::parse("org/name@refs/pr/1").is_some());
        for bad in [
            "name",
            "org/",
            "/name",
            "a/b/c",
            "../x",
            "org/..",
            "org/.hidden",
            "org/na me",
            "org/name@",
            "org/name@../x",
        ] {
            assert!(ModelName::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_git_blob_id_is_checked_as_git_computes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, "hello\n").unwrap();
        // `echo hello | git hash-object --stdin`
        let expected = Expected::GitBlobSha1("ce013625030ba8dba906f756967f9e9ca394464a".to_owned());
        verify(&path, "config.json", &expected, 6).unwrap();
        let err = verify(&path, "config.json", &Expected::GitBlobSha1("0".repeat(40)), 6).unwrap_err().to_string();
        assert!(err.contains("config.json") && err.contains("ce013625030b"), "{err}");
        // A refused file is removed, so the next pull fetches it afresh.
        assert!(!path.exists());
    }
}
