//! Multi-token-prediction layers: kept at convert where the checkpoint
//! holds them (DeepSeek-V3's layer `num_hidden_layers`), their experts in
//! an expert file of their own never below q8, and left out on request.

use std::path::{Path, PathBuf};

use strata_format::{Container, ConvertOptions, QuantPreset, convert, export};
use strata_kernels::QuantFormat;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// The deepseek_v3 fixture with its MTP layer (layer 3) added.
fn with_mtp() -> PathBuf {
    testdata().join("deepseek_v3_mtp/hf")
}

/// Each expert file's layer and the format of its components.
fn expert_formats(container: &Container) -> Vec<(usize, QuantFormat)> {
    let layers = &container.manifest().expert_layers;
    let format = |ordinal| QuantFormat::from_ordinal(ordinal).unwrap();
    layers
        .iter()
        .map(|l| {
            assert!(l.components.iter().all(|c| c.format == l.components[0].format), "one format a record");
            (l.layer, format(l.components[0].format))
        })
        .collect()
}

#[test]
fn convert_keeps_the_mtp_layer_with_its_experts_never_below_q8() {
    let tmp = tempfile::tempdir().unwrap();
    let report = convert(with_mtp(), tmp.path().join("q4"), &ConvertOptions::new(QuantPreset::Q4)).unwrap();
    // Its copies of the embedding and lm head are not in the shard: nothing is unread.
    assert!(report.ignored_tensors.is_empty(), "{:?}", report.ignored_tensors);
    let container = Container::open(tmp.path().join("q4")).unwrap();
    let arch = container.arch();
    assert_eq!((arch.layers.len(), arch.mtp.len()), (3, 1));
    assert_eq!(arch.expert_layers(), [1, 2, 3]);
    assert_eq!(expert_formats(&container), [(1, QuantFormat::Q4), (2, QuantFormat::Q4), (3, QuantFormat::Q8)]);
    for name in ["eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "mlp.gate.weight"] {
        let name = format!("model.layers.3.{name}");
        assert!(container.manifest().tensors.iter().any(|t| t.name == name), "{name} kept");
    }
    container.expert_layout(3).unwrap();
}

#[test]
fn drop_mtp_leaves_the_mtp_layer_out_as_a_checkpoint_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let options = ConvertOptions { drop_mtp: true, ..ConvertOptions::new(QuantPreset::Q8) };
    let report = convert(with_mtp(), tmp.path().join("dropped"), &options).unwrap();
    assert!(report.ignored_tensors.contains(&"model.layers.3.eh_proj.weight".to_owned()));
    let container = Container::open(tmp.path().join("dropped")).unwrap();
    assert!(container.arch().mtp.is_empty());
    assert_eq!(expert_formats(&container), [(1, QuantFormat::Q8), (2, QuantFormat::Q8)]);
    // The fixture's config declares the layer its checkpoint lacks.
    convert(testdata().join("deepseek_v3/hf"), tmp.path().join("plain"), &ConvertOptions::new(QuantPreset::Q8))
        .unwrap();
    assert!(Container::open(tmp.path().join("plain")).unwrap().arch().mtp.is_empty());
}

#[test]
fn an_exported_container_keeps_its_mtp_layer() {
    let tmp = tempfile::tempdir().unwrap();
    convert(with_mtp(), tmp.path().join("c"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    export(tmp.path().join("c"), tmp.path().join("hf")).unwrap();
    convert(tmp.path().join("hf"), tmp.path().join("again"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let again = Container::open(tmp.path().join("again")).unwrap();
    assert_eq!(again.arch().mtp.len(), 1);
}
