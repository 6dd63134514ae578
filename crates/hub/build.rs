//! Builds the demo model into the engine (src/demo.rs): writes
//! `$OUT_DIR/demo.rs`, the demo's files as `include_bytes!` and their
//! content key, so that a binary carries the demo wherever it is copied and
//! knows the key without hashing 29 MB at every start.

use std::fmt::Write as _;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// What running the demo needs of models/demo (not its training log or
/// held-out text); README.md carries the data's licence notice.
const FILES: [&str; 6] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let demo = manifest_dir.join("../../models/demo").canonicalize().expect("models/demo is in the workspace");
    // The converter's version is part of the key, as in `resolve`'s
    // checkpoint hash: a new converter converts the demo afresh.
    let mut hasher = Sha256::new();
    hasher.update(format!("strata-format {}", std::env::var("CARGO_PKG_VERSION").unwrap()));
    let mut files = String::new();
    for name in FILES {
        let path = demo.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        hasher.update(name);
        hasher.update(&bytes);
        writeln!(files, "    ({name:?}, include_bytes!({:?})),", path.display().to_string()).unwrap();
    }
    let key: String = hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    let source = format!(
        "/// The demo model's files (written by build.rs).\n\
         const DEMO_FILES: [(&str, &[u8]); {}] = [\n{files}];\n\
         /// SHA-256 (first 16 hex digits) of the converter version and the files.\n\
         const DEMO_KEY: &str = {key:?};\n",
        FILES.len()
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("demo.rs");
    std::fs::write(&out, source).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
