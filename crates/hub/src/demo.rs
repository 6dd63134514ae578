//! The demo model, built into the binary (see build.rs): on first use its
//! files are unpacked into a scratch folder of the cache, converted into
//! the cache under their content key, and the scratch folder removed; every
//! later start opens the converted container directly. A binary copied or
//! installed anywhere runs the demo with nothing else on disk.

use std::path::Path;

use strata_format::ConvertOptions;

use crate::resolved::{AUTO_CONVERT_PRESET, ResolvedModel};
use crate::{Error, Result};

include!(concat!(env!("OUT_DIR"), "/demo.rs"));

/// The name the demo's container has in the cache.
fn container_name() -> String {
    format!("demo-{DEMO_KEY}")
}

/// The demo's container in `cache_dir`, unpacked and converted if missing.
pub(crate) fn resolve_demo(cache_dir: &Path, progress: bool) -> Result<ResolvedModel> {
    let container_dir = cache_dir.join(container_name());
    if container_dir.join(strata_format::container::MANIFEST_FILE).is_file() {
        return Ok(ResolvedModel { container_dir, converted: false });
    }
    // Per process, so two first runs at once do not write the same files.
    let unpacked = cache_dir.join(format!(".{}-{}.unpacked", container_name(), std::process::id()));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(&unpacked).map_err(io(&unpacked))?;
    let converted = DEMO_FILES
        .iter()
        .try_for_each(|(name, bytes)| std::fs::write(unpacked.join(name), bytes).map_err(io(&unpacked.join(name))))
        .and_then(|()| {
            let options = ConvertOptions { progress, overwrite: true, ..ConvertOptions::new(AUTO_CONVERT_PRESET) };
            Ok(strata_format::convert(&unpacked, &container_dir, &options)?)
        });
    // The checkpoint is not needed once converted (or if conversion failed).
    let _ = std::fs::remove_dir_all(&unpacked);
    converted.map(|_| ResolvedModel { container_dir, converted: true })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_demo_is_converted_once_and_then_opened_from_the_cache() {
        let cache = tempfile::tempdir().unwrap();
        let first = resolve_demo(cache.path(), false).unwrap();
        assert!(first.converted && first.container_dir.ends_with(container_name()));
        let second = resolve_demo(cache.path(), false).unwrap();
        assert_eq!(second, ResolvedModel { container_dir: first.container_dir, converted: false });
        // Only the container is left: the unpacked checkpoint is removed.
        let entries: Vec<_> = std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(entries, [container_name().as_str()]);
    }
}
