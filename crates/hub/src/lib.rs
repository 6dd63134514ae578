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

mod cache;
mod client;
mod demo;
mod error;
mod names;
mod pull;
mod resolve;
mod resolved;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use self::cache::{PartialDownload, PulledModel, PulledRecord, Removed, list, partial_downloads, remove};
pub use self::client::HubHeaders;
pub use self::error::{Error, Result};
pub use self::pull::{PullOptions, PullReport, check_hub_answers, pull};
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
/// What is read of a JSON file of the checkpoint or the cache (index,
/// record, manifest).
const JSON_FILE_BYTES_MAX: u64 = 64 << 20;

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

fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let file = fs::File::open(path).map_err(io(path))?;
    let mut bytes = Vec::new();
    file.take(JSON_FILE_BYTES_MAX + 1).read_to_end(&mut bytes).map_err(io(path))?;
    if bytes.len() as u64 > JSON_FILE_BYTES_MAX {
        return Err(Error::ModelFile { path: path.to_path_buf(), reason: format!("over {JSON_FILE_BYTES_MAX} bytes") });
    }
    Ok(bytes)
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
}
