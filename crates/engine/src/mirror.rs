//! The container's side of `--mirror`: its expert files as the manifest
//! records them, which is what a mirror is checked and staged against
//! (`strata_tier::mirror` does the rest).

use strata_format::Container;
use strata_tier::{LayerFile, MirrorOptions, MirrorSpec};

use crate::{Error, Result};

/// Every expert file of `container`: path, size and SHA-256 from the
/// manifest, record size and count from its layout.
pub fn expert_files(container: &Container) -> Result<Vec<LayerFile>> {
    let manifest = container.manifest();
    manifest
        .expert_layers
        .iter()
        .map(|entry| {
            let layout = container.expert_layout(entry.layer)?;
            let recorded = manifest
                .files
                .iter()
                .find(|f| f.path == entry.file)
                .ok_or_else(|| Error::InvalidRequest(format!("the manifest lists no hash for {}", entry.file)))?;
            let record_bytes = usize::try_from(layout.record_bytes).map_err(|_| {
                Error::InvalidRequest(format!("layer {}: expert records too large for this machine", entry.layer))
            })?;
            Ok(LayerFile {
                layer: entry.layer,
                path: entry.file.clone(),
                size_bytes: recorded.size_bytes,
                sha256: recorded.sha256.clone(),
                record_bytes,
                num_experts: layout.num_experts,
            })
        })
        .collect()
}

/// What the expert store needs to validate and read `mirrors`.
pub fn mirror_options(container: &Container, mirrors: &[MirrorSpec]) -> Result<MirrorOptions> {
    if mirrors.is_empty() {
        return Ok(MirrorOptions::default());
    }
    Ok(MirrorOptions {
        mirrors: mirrors.to_vec(),
        container_hash: container.content_hash().to_owned(),
        files: expert_files(container)?,
        // Measured at open, on the same backend the run reads with.
        primary_rate_bytes_per_s: None,
    })
}
