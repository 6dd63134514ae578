//! The model cache's pulled models: their records, listing, removal, and
//! partial downloads (docs/FORMAT.md, "The model cache").

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_format::QuantPreset;

use crate::{DOWNLOADS_DIR, Error, ModelName, PULLED_DIR, RECORD_FILE, Result, io, now_unix_s, read_bounded};

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
pub(crate) fn remove_if_empty(dir: Option<&Path>) {
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

pub(crate) fn read_model(dir: &Path) -> Result<PulledModel> {
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
pub(crate) fn write_record(dir: &Path, record: &PulledRecord) -> Result<()> {
    let path = dir.join(RECORD_FILE);
    let tmp = dir.join(format!(".{RECORD_FILE}.{}.tmp", std::process::id()));
    let text = serde_json::to_string_pretty(record)
        .map_err(|e| Error::ModelFile { path: path.clone(), reason: e.to_string() })?;
    fs::write(&tmp, text).map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))
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
