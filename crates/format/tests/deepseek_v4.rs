//! DeepSeek V4 through the format crate, on its oracle fixture: the tensor
//! names `save_pretrained` writes (testdata/deepseek_v4/hf) and the hub's
//! (as hf_bf16 stores them) convert to the same container, and export
//! writes `save_pretrained`'s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use strata_format::{Container, ConvertOptions, ModelArch, QuantPreset, convert, export};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deepseek_v4")
}

fn arch_of(dir: &Path) -> ModelArch {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    ModelArch::from_config_value(&serde_json::from_str(&text).unwrap()).unwrap()
}

/// A copy of `src` (a checkpoint directory) with every tensor renamed by
/// `rename`, bytes and dtypes as they were.
fn renamed_copy(src: &Path, dst: &Path, rename: impl Fn(&str) -> String) {
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        tensors.tensors().into_iter().map(|(name, view)| (rename(&name), view)).collect();
    let meta = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(meta), &dst.join("model.safetensors")).unwrap();
}

/// The hub's names, from what `save_pretrained` writes: written out here
/// rather than taken from the family's tables, so a wrong table fails.
fn hub_name(saved: &str) -> String {
    let name = saved.replace("model.embed_tokens.", "embed.").replace("model.hc_head.hc_", "hc_head_");
    name.strip_prefix("model.").map_or(name.clone(), str::to_owned)
}

fn weight_hashes(dir: &Path) -> Vec<String> {
    let c = Container::open(dir).unwrap();
    c.manifest().files.iter().filter(|f| f.path.ends_with(".bin")).map(|f| f.sha256.clone()).collect()
}

#[test]
fn the_saved_and_the_hub_tensor_names_convert_to_the_same_container() {
    let tmp = tempfile::tempdir().unwrap();
    let saved = fixture().join("hf");
    renamed_copy(&saved, &tmp.path().join("hub"), hub_name);
    let options = ConvertOptions::new(QuantPreset::F32);
    let mut hashes = Vec::new();
    for src in [saved, tmp.path().join("hub")] {
        let out = src.with_extension("strata");
        let out = tmp.path().join(out.file_name().unwrap());
        let report = convert(&src, &out, &options).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        assert!(report.ignored_tensors.is_empty(), "{}: {:?}", src.display(), report.ignored_tensors);
        hashes.push(weight_hashes(&out));
    }
    assert_eq!(hashes[0], hashes[1]);
}

#[test]
fn export_writes_the_names_save_pretrained_writes_and_converts_back_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let options = ConvertOptions::new(QuantPreset::F32);
    convert(fixture().join("hf"), tmp.path().join("c1"), &options).unwrap();
    export(tmp.path().join("c1"), tmp.path().join("exported")).unwrap();
    let names = |dir: &Path| {
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let tensors = SafeTensors::deserialize(&bytes).unwrap();
        let mut names = tensors.names().into_iter().map(str::to_owned).collect::<Vec<_>>();
        names.sort();
        names
    };
    assert_eq!(names(&tmp.path().join("exported")), names(&fixture().join("hf")));
    convert(tmp.path().join("exported"), tmp.path().join("c2"), &options).unwrap();
    assert_eq!(weight_hashes(&tmp.path().join("c1")), weight_hashes(&tmp.path().join("c2")));
}

#[test]
fn the_hub_config_spelling_reads_as_the_saved_one() {
    assert_eq!(arch_of(&fixture().join("hf_bf16")), arch_of(&fixture().join("hf")));
}
