//! Containers written before layers were stored (by 8fed96e) still open:
//! their manifests keep the flat spec, frozen, and a container's layers are
//! derived from its embedded config.json and checked against that spec.
//!
//! `testdata/containers-8fed96e/` holds the manifests 8fed96e wrote for the
//! committed checkpoints (`strata convert testdata/FAMILY/hf --quant f32`);
//! the data files are converted again here, which must give the same bytes
//! (the manifest records their SHA-256).

use std::path::{Path, PathBuf};

use strata_format::{Container, ConvertOptions, Error, MixerSpec, ModelArch, QuantPreset, convert};

/// One family each of GQA, hybrid (Gated DeltaNet and gated attention) and
/// MLA with the DSA indexer.
const FAMILIES: [&str; 3] = ["olmoe", "qwen3_next", "glm_moe_dsa"];

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// A container of `family`'s committed checkpoint under the manifest
/// 8fed96e wrote for it, its manifest passed through `edit` first.
fn old_container(tmp: &Path, family: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let out = tmp.join(family);
    convert(testdata().join(family).join("hf"), &out, &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let old = std::fs::read_to_string(testdata().join("containers-8fed96e").join(format!("{family}.json"))).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&old).unwrap();
    edit(&mut manifest);
    std::fs::write(out.join("manifest.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    out
}

#[test]
fn a_container_written_by_8fed96e_opens_with_the_layers_its_config_derives() {
    let tmp = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let container = Container::open(old_container(tmp.path(), family, |_| {})).unwrap();
        let config = std::fs::read_to_string(testdata().join(family).join("hf/config.json")).unwrap();
        let derived = ModelArch::from_config_json(&config).unwrap();
        assert_eq!(container.arch(), &derived, "{family}");
        assert_eq!(container.arch(), &container.legacy_spec().unwrap().arch(), "{family}");
        let spec = container.legacy_spec().unwrap();
        assert_eq!(derived.layers.len(), spec.num_layers, "{family}");
        // Every GQA layer has the heads the frozen spec gives the model.
        for layer in &derived.layers {
            if let MixerSpec::Gqa(gqa) = &layer.mixer {
                assert_eq!(
                    (gqa.num_heads, gqa.num_kv_heads, gqa.head_dim),
                    (spec.num_heads, spec.num_kv_heads, spec.head_dim)
                );
            }
        }
    }
}

#[test]
fn a_container_whose_spec_disagrees_with_its_config_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // An epsilon fixes no tensor shape: only the derivation can tell.
    let dir = old_container(tmp.path(), "olmoe", |m| m["spec"]["rms_norm_eps"] = 1e-3.into());
    let err = Container::open(dir).unwrap_err();
    assert!(matches!(err, Error::Manifest { .. }), "{err}");
    assert!(err.to_string().contains("disagrees with the embedded config.json"), "{err}");
}
