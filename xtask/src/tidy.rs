//! Checks on the repository itself, run as ordinary tests.

use std::path::{Path, PathBuf};

/// The library crates, bottom layer first. A crate may depend only on crates
/// listed before it (docs/ARCHITECTURE.md).
const LAYERS: [&str; 7] = ["kernels", "format", "tier", "kv", "sched", "models", "engine"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn internal_deps(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("strata-"))
        .filter_map(|rest| rest.split(['.', ' ', '=']).next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_crate_depends_on_a_layer_above_it() {
    for (rank, name) in LAYERS.iter().enumerate() {
        let manifest = root().join("crates").join(name).join("Cargo.toml");
        for dep in internal_deps(&manifest) {
            let dep_rank = LAYERS
                .iter()
                .position(|l| *l == dep)
                .unwrap_or_else(|| panic!("{name} depends on unknown strata-{dep}"));
            assert!(dep_rank < rank, "strata-{name} depends on strata-{dep}, which is not below it");
        }
    }
}

#[test]
fn binaries_depend_only_on_library_crates() {
    for bin in ["strata", "chat", "serve"] {
        let manifest = root().join("bins").join(bin).join("Cargo.toml");
        for dep in internal_deps(&manifest) {
            assert!(LAYERS.contains(&dep.as_str()), "bins/{bin} depends on strata-{dep}");
        }
    }
}
