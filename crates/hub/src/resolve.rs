//! Finding the model to run: the built-in demo model when none is named
//! (crate::demo), a container as is, a Hugging Face checkpoint converted
//! once into a cache keyed by its content, or a model pulled by name
//! ([`crate::pull`]).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use strata_format::ConvertOptions;

use crate::resolved::{AUTO_CONVERT_PRESET, ResolvedModel};
use crate::{Error, Result};

/// What names the demo model where a model is named (`strata export demo
/// OUT`, `--model demo`), as `serve` names it to clients.
pub const DEMO_NAME: &str = "demo";

/// The container for `model` (`None`, or `demo` where no such directory is
/// here: the demo model built into the binary, models/demo). A directory with a
/// `manifest.json` is a container; one with a `config.json` is a Hugging
/// Face checkpoint, converted on first use into `cache_dir/<content hash>`
/// and reused after. `ORG/NAME[@REVISION]` that is not a directory here is
/// a model pulled into `cache_dir` by `strata pull` (its last use is set
/// to now). A checkpoint whose config.json has keys its family does not
/// know is refused, but for those in `allow_unknown_config`
/// (`--allow-unknown-config`).
pub fn resolve_model(
    model: Option<&Path>,
    cache_dir: &Path,
    progress: bool,
    allow_unknown_config: &[String],
) -> Result<ResolvedModel> {
    let named_demo = |dir: &&Path| *dir == Path::new(DEMO_NAME) && !dir.exists();
    let Some(dir) = model.filter(|dir| !named_demo(dir)) else {
        return crate::demo::resolve_demo(cache_dir, progress);
    };
    let dir = dir.to_path_buf();
    // A directory wins over a name, so an existing `org/name` folder still
    // runs as it did before models had names.
    if !dir.exists()
        && let Some(name) = dir.to_str().and_then(crate::ModelName::parse)
    {
        return match crate::cache::open_pulled(cache_dir, &name)? {
            Some(container_dir) => Ok(ResolvedModel { container_dir, converted: false }),
            None => Err(Error::NotPulled { name: name.to_string() }),
        };
    }
    if dir.join(strata_format::container::MANIFEST_FILE).is_file() {
        return Ok(ResolvedModel { container_dir: dir, converted: false });
    }
    if let Some(gguf) = gguf_in(&dir) {
        return Err(Error::InvalidRequest(format!(
            "{} is a GGUF file (llama.cpp's format), which Strata does not read: give the Hugging Face checkpoint \
             it was made from (a directory with config.json and *.safetensors), or fetch that with \
             `strata pull ORG/NAME`",
            gguf.display()
        )));
    }
    if dir.is_file() {
        return Err(Error::InvalidRequest(format!(
            "{} is a file: --model takes a directory (a Strata container or a Hugging Face checkpoint) or the \
             ORG/NAME of a pulled model",
            dir.display()
        )));
    }
    if !dir.join("config.json").is_file() {
        return Err(Error::InvalidRequest(format!(
            "{} is neither a Strata container (no manifest.json) nor a Hugging Face checkpoint (no config.json)",
            dir.display()
        )));
    }
    let container_dir = cache_dir.join(checkpoint_hash(&dir)?);
    if container_dir.join(strata_format::container::MANIFEST_FILE).is_file() {
        return Ok(ResolvedModel { container_dir, converted: false });
    }
    fs::create_dir_all(cache_dir).map_err(|source| Error::Io { path: cache_dir.to_path_buf(), source })?;
    let options = ConvertOptions {
        progress,
        overwrite: true,
        allow_unknown_config: allow_unknown_config.to_vec(),
        ..ConvertOptions::new(AUTO_CONVERT_PRESET)
    };
    strata_text::check_text_files(&dir)?;
    strata_format::convert(&dir, &container_dir, &options)?;
    Ok(ResolvedModel { container_dir, converted: true })
}

/// The GGUF file `path` is, or the first one a directory without a
/// config.json holds: by its magic bytes, whatever its name.
fn gguf_in(path: &Path) -> Option<PathBuf> {
    let is_gguf = |file: &Path| {
        let mut magic = [0u8; 4];
        fs::File::open(file).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
    };
    if path.is_file() {
        return is_gguf(path).then(|| path.to_path_buf());
    }
    if path.join("config.json").is_file() {
        return None;
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(path).ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    entries.into_iter().find(|file| file.is_file() && is_gguf(file))
}

/// SHA-256 (first 16 hex digits) over the names and bytes of a checkpoint's
/// files, so an edited checkpoint gets a fresh conversion and an unchanged
/// one is never converted twice.
fn checkpoint_hash(dir: &Path) -> Result<String> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let mut names: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    let mut hasher = Sha256::new();
    hasher.update(format!("strata-format {}", env!("CARGO_PKG_VERSION")));
    let mut buf = vec![0u8; 1 << 20];
    for path in names {
        hasher.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        let mut file = fs::File::open(&path).map_err(io(&path))?;
        loop {
            let n = file.read(&mut buf).map_err(io(&path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    }
    let digest = hasher.finalize();
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The default cache of converted checkpoints: `$XDG_CACHE_HOME/strata` or
/// `~/.cache/strata`, the places every Linux tool keeps such caches.
pub fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("strata").join("models")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/mixtral/hf")
    }

    #[test]
    fn a_checkpoint_is_converted_once_and_reused() {
        let cache = tempfile::tempdir().unwrap();
        let first = resolve_model(Some(&fixture()), cache.path(), false, &[]).unwrap();
        assert!(first.converted);
        let second = resolve_model(Some(&fixture()), cache.path(), false, &[]).unwrap();
        assert_eq!(second, ResolvedModel { container_dir: first.container_dir.clone(), converted: false });
        // A container is used as it is.
        let direct = resolve_model(Some(&first.container_dir), cache.path(), false, &[]).unwrap();
        assert_eq!(direct.container_dir, first.container_dir);
    }

    #[test]
    fn a_checkpoint_whose_config_has_a_key_its_family_does_not_know_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let hf = dir.path().join("hf");
        fs::create_dir(&hf).unwrap();
        for entry in fs::read_dir(fixture()).unwrap() {
            let from = entry.unwrap().path();
            fs::copy(&from, hf.join(from.file_name().unwrap())).unwrap();
        }
        let mut config: serde_json::Value = serde_json::from_slice(&fs::read(hf.join("config.json")).unwrap()).unwrap();
        config["use_sliding_window"] = true.into();
        fs::write(hf.join("config.json"), config.to_string()).unwrap();
        let cache = dir.path().join("cache");
        let err = resolve_model(Some(&hf), &cache, false, &[]).unwrap_err().to_string();
        assert!(err.contains("mixtral does not know use_sliding_window"), "{err}");
        let resolved = resolve_model(Some(&hf), &cache, false, &["use_sliding_window".to_owned()]).unwrap();
        assert!(resolved.converted);
    }

    #[test]
    fn a_name_not_pulled_says_how_to_pull_it() {
        let cache = tempfile::tempdir().unwrap();
        let err = resolve_model(Some(Path::new("no-such-org/no-such-model")), cache.path(), false, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no-such-org/no-such-model is not pulled; run `strata pull no-such-org/no-such-model`"
        );
    }

    #[test]
    fn a_gguf_file_or_a_folder_of_them_says_gguf_is_not_read_and_what_to_use() {
        let dir = tempfile::tempdir().unwrap();
        // Named as downloads often are, and not: the magic decides.
        let gguf = dir.path().join("model-Q4_K_M.bin");
        fs::write(&gguf, b"GGUF\x03\0\0\0rest").unwrap();
        for given in [gguf.as_path(), dir.path()] {
            let err = resolve_model(Some(given), dir.path(), false, &[]).unwrap_err().to_string();
            assert!(err.contains("is a GGUF file") && err.contains("strata pull"), "{err}");
        }
        let other = dir.path().join("notes.txt");
        fs::write(&other, b"hello").unwrap();
        let err = resolve_model(Some(&other), dir.path(), false, &[]).unwrap_err().to_string();
        assert!(err.contains("is a file: --model takes a directory"), "{err}");
    }

    #[test]
    fn a_directory_that_is_neither_is_a_clear_error() {
        let empty = tempfile::tempdir().unwrap();
        let err = resolve_model(Some(empty.path()), empty.path(), false, &[]).unwrap_err().to_string();
        assert!(err.contains("neither a Strata container"), "{err}");
    }
}
