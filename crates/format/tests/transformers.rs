//! End-to-end check against the reference implementation: tiny random models
//! saved by transformers 5.x (both the published per-expert layout and the
//! fused `save_original_format=False` layout) are converted, exported, and
//! loaded back by `AutoModelForCausalLM.from_pretrained`, whose logits must
//! match the original model's.
//!
//! Needs a Python with torch + transformers 5.x: `$STRATA_PYTHON`, default
//! `/work/venv-cache/fixtures/bin/python`. Ignored by default because it
//! takes ~30 s of Python start-up; run it with
//! `cargo test -p strata-format --test transformers -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

use strata_format::{Container, ConvertOptions, QuantPreset, convert, export, npy};

fn python() -> Option<PathBuf> {
    let path = std::env::var_os("STRATA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/venv-cache/fixtures/bin/python"));
    path.is_file().then_some(path)
}

fn run(python: &Path, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/transformers_check.py");
    let output = Command::new(python).arg(script).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprint!("{stdout}");
    assert!(output.status.success(), "python {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
#[ignore = "needs torch + transformers; run with --ignored"]
fn transformers_loads_exports_with_matching_logits() {
    let Some(python) = python() else {
        eprintln!("no Python with transformers; set STRATA_PYTHON");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let root_str = root.to_str().unwrap();
    run(&python, &["make", root_str]);

    let ids = npy::read_token_ids(root.join("ids.npy")).unwrap();
    assert_eq!(ids.len(), 10);
    for fam in ["olmoe", "qwen3_moe", "mixtral"] {
        let dir = root.join(fam);
        let (shape, reference) = npy::read_f32(dir.join("ref.npy")).unwrap();
        assert_eq!(shape[0], ids.len());
        npy::write_f32(dir.join("rust.npy"), &shape, &reference).unwrap();

        // Both transformers layouts give byte-identical containers.
        convert(dir.join("hf"), dir.join("c-f32"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
        let fused = convert(dir.join("hf-fused"), dir.join("c-fused"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
        assert!(fused.ignored_tensors.is_empty(), "{:?}", fused.ignored_tensors);
        let a = Container::open(dir.join("c-f32")).unwrap();
        let b = Container::open(dir.join("c-fused")).unwrap();
        let hashes = |c: &Container| c.manifest().files.iter().map(|f| f.sha256.clone()).collect::<Vec<_>>();
        assert_eq!(hashes(&a), hashes(&b), "{fam}: fused and per-expert checkpoints differ");

        export(dir.join("c-f32"), dir.join("export-f32")).unwrap();
        run(&python, &["check", root_str, fam, dir.join("export-f32").to_str().unwrap(), "1e-4"]);

        // Quantized containers export to loadable checkpoints too; q8 error
        // on logits of scale ~5 stays well below 0.5.
        convert(dir.join("hf"), dir.join("c-q8"), &ConvertOptions::new(QuantPreset::Q8)).unwrap();
        export(dir.join("c-q8"), dir.join("export-q8")).unwrap();
        run(&python, &["check", root_str, fam, dir.join("export-q8").to_str().unwrap(), "0.5"]);
    }
}
