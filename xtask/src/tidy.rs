//! Checks on the repository itself, run as ordinary tests.

use std::path::{Path, PathBuf};

use crate::cli::workspace_root;

/// The library crates, bottom layer first. A crate may depend only on crates
/// listed before it (docs/ARCHITECTURE.md).
const LAYERS: [&str; 11] =
    ["kernels", "format", "tier", "kv", "sched", "models", "engine", "text", "grammar", "hub", "dist"];

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
        let manifest = workspace_root().join("crates").join(name).join("Cargo.toml");
        // A crate's dev-dependency on itself only turns on its own test
        // features (`test-util`) for its integration tests.
        for dep in internal_deps(&manifest).into_iter().filter(|dep| dep != name) {
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
        let manifest = workspace_root().join("bins").join(bin).join("Cargo.toml");
        for dep in internal_deps(&manifest) {
            assert!(LAYERS.contains(&dep.as_str()), "bins/{bin} depends on strata-{dep}");
        }
    }
}

/// What text, grammars and pulling from the hub bring (docs/ARCHITECTURE.md):
/// `tokenizers`, the Jinja engine, the grammar engine and its token trie, the
/// HTTP client. They live in strata-text, strata-grammar and strata-hub.
const NOT_IN_THE_ENGINE: [&str; 6] = ["tokenizers", "minijinja", "minijinja-contrib", "llguidance", "toktrie", "ureq"];

/// The crates a program that depends only on `package` (with all its
/// features, on this platform) links: `cargo tree`'s normal edges.
fn linked_crates(package: &str) -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args(["tree", "--manifest-path"])
        .arg(workspace_root().join("Cargo.toml"))
        .args(["-p", package, "--all-features", "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo tree runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).expect("cargo tree prints UTF-8");
    text.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_owned).collect()
}

/// A program that only runs a model (token ids in, token ids out) links the
/// engine and nothing of text, grammars or the hub: those are crates of
/// their own, above it.
#[test]
fn the_engine_links_no_tokenizer_template_grammar_or_http_crate() {
    let linked = linked_crates("strata-engine");
    assert!(linked.iter().any(|name| name == "strata-models"), "cargo tree lists the engine's crates: {linked:?}");
    for name in NOT_IN_THE_ENGINE {
        assert!(!linked.iter().any(|linked| linked == name), "strata-engine links {name}");
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A family is data in its own file under `crates/format/src/family/`
/// (docs/ARCHITECTURE.md): no other source names one, so adding a family
/// never means editing the graph, the names or the engine. Tests may.
#[test]
fn a_model_family_is_named_only_in_its_registry() {
    let registry = workspace_root().join("crates/format/src/family");
    let mut files = Vec::new();
    for dir in ["crates", "bins"] {
        rust_files(&workspace_root().join(dir), &mut files);
    }
    for file in files {
        let is_test = file.components().any(|c| c.as_os_str() == "tests")
            || file.file_stem().is_some_and(|s| s == "tests" || s.to_string_lossy().ends_with("_tests"));
        if file.starts_with(&registry) || is_test {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // A variant (`Family::Olmoe`) or the list of them names a family; an
        // associated function (`Family::of_config`) does not.
        let names_one = text
            .match_indices("Family::")
            .any(|(at, needle)| text[at + needle.len()..].starts_with(|c: char| c.is_ascii_uppercase()));
        assert!(!names_one, "{} names a model family outside crates/format/src/family/", file.display());
    }
}

/// Whether `line` builds a `ModelSpec` by struct literal (rather than
/// naming the type in a signature, a declaration or an `impl`).
fn builds_a_model_spec(line: &str) -> bool {
    line.match_indices("ModelSpec {").any(|(at, _)| {
        let before = line[..at].trim_end();
        let declares = ["struct", "impl", "for", "&", "->"].iter().any(|word| before.ends_with(word));
        !declares
    })
}

/// The manifest's flat `ModelSpec` is frozen, the on-disk counterpart of
/// containers already written (docs/FORMAT.md): only the legacy conversion
/// builds one. A family file produces the in-memory model, `CoreSpec` and a
/// `LayerSpec` per layer.
#[test]
fn a_model_spec_is_built_only_by_the_legacy_conversion() {
    let allowed = [workspace_root().join("crates/format/src/spec/legacy.rs")];
    let mut files = Vec::new();
    for dir in ["crates", "bins"] {
        rust_files(&workspace_root().join(dir), &mut files);
    }
    for file in files {
        if allowed.iter().any(|a| file.starts_with(a)) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if let Some((n, line)) = text.lines().enumerate().find(|(_, line)| builds_a_model_spec(line)) {
            panic!(
                "{}:{}: builds a ModelSpec outside crates/format/src/spec/legacy.rs: {}",
                file.display(),
                n + 1,
                line.trim()
            );
        }
    }
}

/// Outside `crates/format` the model is `ModelArch` (and its `CoreSpec`):
/// the flat `ModelSpec` is only the form version-1 manifests store, read
/// and converted inside the format crate.
#[test]
fn no_crate_outside_format_names_the_flat_spec() {
    // This file names it to look for it.
    let this_file = workspace_root().join("xtask/src/tidy.rs");
    let mut files = Vec::new();
    for dir in ["crates", "bins", "benches", "fuzz", "xtask"] {
        rust_files(&workspace_root().join(dir), &mut files);
    }
    let format = workspace_root().join("crates/format");
    for file in files {
        if file.starts_with(&format) || file == this_file {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if let Some((n, line)) = text.lines().enumerate().find(|(_, line)| line.contains("ModelSpec")) {
            panic!("{}:{}: names ModelSpec outside crates/format: {}", file.display(), n + 1, line.trim());
        }
    }
}

#[test]
fn a_model_spec_literal_is_told_from_a_signature() {
    assert!(builds_a_model_spec("    let spec = ModelSpec {"));
    assert!(builds_a_model_spec("    Ok(ModelSpec {"));
    assert!(builds_a_model_spec("        Some(x) => ModelSpec {"));
    assert!(!builds_a_model_spec("pub struct ModelSpec {"));
    assert!(!builds_a_model_spec("impl ModelSpec {"));
    assert!(!builds_a_model_spec("    pub fn spec(&self) -> &ModelSpec {"));
    assert!(!builds_a_model_spec("fn parse(text: &str) -> ModelSpec {"));
}

/// Whether a line of Rust names `krate` as a path (`krate::…`), outside a
/// comment.
fn names_crate(line: &str, krate: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices(krate).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = &code[at + krate.len()..];
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && (after.starts_with("::") || after.starts_with(';'))
    })
}

/// The blocks of `crates/models` run on a backend that owns their weights
/// (docs/ARCHITECTURE.md): only its module calls the kernels or spreads
/// work over the pool, so that another device replaces that module, not
/// the blocks.
#[test]
fn crates_models_calls_the_kernels_only_in_its_backend() {
    let src = workspace_root().join("crates/models/src");
    let backend = src.join("backend");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files.iter().filter(|file| !file.starts_with(&backend)) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            for krate in ["strata_kernels", "rayon"] {
                assert!(
                    !names_crate(line, krate),
                    "{}:{}: uses {krate} outside crates/models/src/backend/: {}",
                    file.display(),
                    n + 1,
                    line.trim()
                );
            }
        }
    }
}

#[test]
fn a_crate_path_is_told_from_a_word_or_a_comment() {
    assert!(names_crate("use strata_kernels::ops;", "strata_kernels"));
    assert!(names_crate("    let isa = strata_kernels::simd::Isa::detect();", "strata_kernels"));
    assert!(names_crate("use rayon::prelude::*;", "rayon"));
    assert!(names_crate("extern crate rayon;", "rayon"));
    assert!(!names_crate("// the rayon pool: strata_kernels::Threads", "rayon"));
    assert!(!names_crate("    /// see strata_kernels::ops", "strata_kernels"));
    assert!(!names_crate("let no_rayon::x = 1;", "rayon"));
}
