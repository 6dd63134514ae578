//! `strata pull`: a repository's listing, its files fetched and checked
//! against the digests the hub publishes, the architecture checked at
//! config.json before any weights, and the conversion published into the
//! cache ([`crate::cache`]) in one rename.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use strata_format::{ConvertOptions, QuantPreset};

use crate::cache::{PulledModel, PulledRecord, read_model, remove_if_empty, write_record};
use crate::client::{self, FileRequest, HubClient, HubHeaders};
use crate::names;
use crate::{DEFAULT_REVISION, Error, ModelName, Result, io, now_unix_s, read_bounded};

/// The repository description read from the hub: large repositories list
/// thousands of files, a few hundred bytes each.
const REPO_INFO_BYTES_MAX: u64 = 64 << 20;
/// Files a pull fetches; the largest checkpoints have under two thousand shards.
const FILES_MAX: usize = 4096;
/// Files a repository may list (a model repository with more is not one
/// this pull understands: datasets of images, per-step checkpoints).
const SIBLINGS_MAX: usize = 65_536;
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

/// How to reach the hub and what to make of the checkpoint.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The hub's address, e.g. [`crate::DEFAULT_ENDPOINT`] or a mirror's.
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
    checked.map_err(|e| {
        // Some of the format's messages name the file already; say it once.
        let said = e.to_string();
        let cause = said.strip_prefix(CONFIG_FILE).and_then(|rest| rest.strip_prefix(": ")).unwrap_or(&said);
        Error::HubMetadata {
            name: name.to_string(),
            reason: format!("{CONFIG_FILE}: {cause}; nothing beyond {CONFIG_FILE} was downloaded"),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
