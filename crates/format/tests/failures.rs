//! Bad inputs must surface as errors that name the file, tensor or field,
//! and a failed conversion must leave no container behind.

mod common;

use std::path::Path;

use common::{Layout, Store, TinyModel, olmoe_config, read_record};
use safetensors::tensor::Dtype;
use serde_json::Value;
use strata_format::spec::{MAX_MANIFEST_BYTES, MAX_TOKENIZER_BYTES};
use strata_format::test_util::dead_pid;
use strata_format::{Container, ConvertOptions, Embedding, Error, QuantPreset, convert, export};

fn converted(tmp: &Path, preset: QuantPreset) -> (TinyModel, std::path::PathBuf) {
    let model = TinyModel::new(olmoe_config(), Store::F32, 11);
    let hf = tmp.join("hf");
    model.write(&hf, Store::F32, Layout::Single);
    let out = tmp.join("c");
    convert(&hf, &out, &ConvertOptions::new(preset)).unwrap();
    (model, out)
}

/// Entries of `dir` other than `keep`.
fn stray_entries(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

/// Rewrites model.safetensors with `name` replaced by `bytes` of `dtype`.
fn replace_tensor(model: &TinyModel, hf: &Path, name: &str, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>) {
    let mut stored = Vec::new();
    for (n, (s, v)) in &model.tensors {
        if n == name {
            stored.push((n.clone(), shape.clone(), dtype, bytes.clone()));
        } else {
            stored.push((n.clone(), s.clone(), Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
        }
    }
    common::write_safetensors(&hf.join("model.safetensors"), &stored);
}

#[test]
fn failing_tensor_mid_conversion_leaves_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    let model = TinyModel::new(olmoe_config(), Store::F32, 12);
    let hf = tmp.path().join("hf");
    model.write(&hf, Store::F32, Layout::Single);
    let out = tmp.path().join("out");

    // An expert of the last layer in an unsupported dtype: dense.bin and
    // layer 0 are already written when conversion fails.
    let bad = "model.layers.1.mlp.experts.2.up_proj.weight";
    let n: usize = model.tensors[bad].0.iter().product();
    replace_tensor(&model, &hf, bad, Dtype::I32, model.tensors[bad].0.clone(), vec![0; 4 * n]);
    let err = convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q4)).unwrap_err();
    assert!(matches!(&err, Error::UnsupportedDtype { name, .. } if name == bad), "{err}");
    assert!(!out.exists());
    assert!(stray_entries(tmp.path(), &["hf"]).is_empty(), "temporary directory removed");

    // Wrong shape.
    replace_tensor(&model, &hf, bad, Dtype::F32, vec![1, n], vec![0; 4 * n]);
    let err = convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q8)).unwrap_err();
    assert!(matches!(&err, Error::TensorShape { name, .. } if name == bad), "{err}");
    assert!(err.to_string().contains(bad));
    assert!(stray_entries(tmp.path(), &["hf"]).is_empty());

    // A NaN weight.
    let mut values = model.tensors[bad].1.clone();
    values[5] = f32::NAN;
    replace_tensor(
        &model,
        &hf,
        bad,
        Dtype::F32,
        model.tensors[bad].0.clone(),
        values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    );
    let err = convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q8)).unwrap_err();
    assert!(matches!(&err, Error::NonFinite { name, index: 5, .. } if name == bad), "{err}");
    assert!(stray_entries(tmp.path(), &["hf"]).is_empty());

    // A missing tensor.
    let mut stored = Vec::new();
    for (n, (s, v)) in &model.tensors {
        if n != "model.norm.weight" {
            stored.push((
                n.clone(),
                s.clone(),
                Dtype::F32,
                v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            ));
        }
    }
    common::write_safetensors(&hf.join("model.safetensors"), &stored);
    let err = convert(&hf, &out, &ConvertOptions::new(QuantPreset::F32)).unwrap_err();
    assert!(matches!(&err, Error::MissingTensor { name, .. } if name == "model.norm.weight"), "{err}");
    assert!(stray_entries(tmp.path(), &["hf"]).is_empty());
}

/// DeepSeek V4's `tid2eid` is the one integer tensor a checkpoint carries
/// (int64, as transformers saves it): it reads as its whole numbers.
#[test]
fn an_int64_tensor_reads_as_its_whole_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.json"), olmoe_config().to_string()).unwrap();
    let ids: [i64; 6] = [0, 3, 7, 1, 255, 2];
    let bytes = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    let table = "model.layers.0.mlp.gate.tid2eid".to_owned();
    common::write_safetensors(&tmp.path().join("model.safetensors"), &[(table.clone(), vec![3, 2], Dtype::I64, bytes)]);
    let (shape, values) = strata_format::Checkpoint::open(tmp.path()).unwrap().tensor_f32(&table).unwrap();
    assert_eq!((shape, values), (vec![3, 2], vec![0.0, 3.0, 7.0, 1.0, 255.0, 2.0]));
}

#[test]
fn a_killed_conversions_temporary_is_removed_by_the_next_and_a_live_ones_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let killed = tmp.path().join(format!("c.tmp-{}", dead_pid()));
    // Our parent (the test harness's) is alive: as a conversion running now.
    let running = tmp.path().join(format!("c.tmp-{}", std::os::unix::process::parent_id()));
    for left in [&killed, &running] {
        std::fs::create_dir_all(left.join("experts")).unwrap();
        std::fs::write(left.join("dense.bin"), [0u8; 64]).unwrap();
    }
    let (_, out) = converted(tmp.path(), QuantPreset::Q8);
    Container::open(&out).unwrap();
    assert!(!killed.exists(), "the killed conversion's temporary is removed");
    assert!(running.join("dense.bin").is_file(), "a running conversion's temporary is left alone");
}

#[test]
fn bad_checkpoint_dirs_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let opts = ConvertOptions::new(QuantPreset::Q8);
    // No config.json.
    let err = convert(tmp.path(), &out, &opts).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
    // No weights.
    std::fs::write(tmp.path().join("config.json"), olmoe_config().to_string()).unwrap();
    let err = convert(tmp.path(), &out, &opts).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    // Truncated safetensors.
    std::fs::write(tmp.path().join("model.safetensors"), [8, 0, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
    let err = convert(tmp.path(), &out, &opts).unwrap_err();
    assert!(matches!(err, Error::Safetensors { .. }), "{err}");
    // Index pointing outside the directory.
    std::fs::write(tmp.path().join("model.safetensors.index.json"), r#"{"weight_map": {"a": "../x.safetensors"}}"#)
        .unwrap();
    let err = convert(tmp.path(), &out, &opts).unwrap_err();
    assert!(err.to_string().contains("not a plain file name"), "{err}");
    // Malformed config (next to valid weights).
    std::fs::remove_file(tmp.path().join("model.safetensors.index.json")).unwrap();
    common::write_safetensors(&tmp.path().join("model.safetensors"), &[("x".into(), vec![1], Dtype::F32, vec![0; 4])]);
    std::fs::write(tmp.path().join("config.json"), "{\"model_type\": \"olmoe\",").unwrap();
    let err = convert(tmp.path(), &out, &opts).unwrap_err();
    assert!(matches!(err, Error::Json { .. }), "{err}");
    assert!(!out.exists());
    // Zero q4 group.
    let err = convert(tmp.path(), &out, &ConvertOptions { q4_group: 0, ..opts }).unwrap_err();
    assert!(err.to_string().contains("q4_group"), "{err}");
}

/// Edits manifest.json of a copy of `src` and returns the open() error.
fn open_with_manifest_edit(src: &Path, dst: &Path, edit: impl FnOnce(&mut Value)) -> Error {
    copy_dir(src, dst);
    let path = dst.join("manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    Container::open(dst).unwrap_err()
}

fn copy_dir(src: &Path, dst: &Path) {
    let _ = std::fs::remove_dir_all(dst);
    std::fs::create_dir_all(dst.join("experts")).unwrap();
    for entry in walk(src) {
        let rel = entry.strip_prefix(src).unwrap();
        std::fs::copy(&entry, dst.join(rel)).unwrap();
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

#[test]
fn corrupt_manifests_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q4);
    Container::open(&good).unwrap();
    let bad = tmp.path().join("bad");
    let msg = |e: Error| e.to_string();

    // Truncated JSON.
    copy_dir(&good, &bad);
    let text = std::fs::read(bad.join("manifest.json")).unwrap();
    std::fs::write(bad.join("manifest.json"), &text[..text.len() / 2]).unwrap();
    let err = Container::open(&bad).unwrap_err();
    assert!(matches!(err, Error::Json { .. }) && msg(err).contains("manifest.json"));

    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|m| m["magic"] = "gguf".into()), "not a Strata container"),
        (Box::new(|m| m["format_version"] = 99.into()), "unsupported format_version 99"),
        (Box::new(|m| m["tensors"][0]["format"] = 9.into()), "unknown quant format ordinal 9"),
        (Box::new(|m| m["tensors"][3]["length_bytes"] = 12.into()), "weight bytes"),
        (Box::new(|m| m["tensors"][0]["offset_bytes"] = 8.into()), "not 64-byte aligned"),
        (Box::new(|m| m["tensors"][0]["offset_bytes"] = (1u64 << 40).into()), "exceed"),
        (Box::new(|m| m["tensors"][1]["format"] = 2.into()), "must be f32"),
        (Box::new(|m| m["tensors"][2]["shape"] = serde_json::json!([64, 4])), "the spec implies"),
        (
            Box::new(|m| {
                m["tensors"].as_array_mut().unwrap().pop();
            }),
            "\"lm_head.weight\" is missing",
        ),
        (Box::new(|m| m["tensors"][2]["offset_bytes"] = m["tensors"][3]["offset_bytes"].clone()), "overlaps"),
        (Box::new(|m| m["expert_layers"][0]["record_bytes"] = 1000.into()), "record_bytes 1000"),
        (Box::new(|m| m["expert_layers"][1]["components"][2]["offset_bytes"] = 0.into()), "overlaps"),
        (Box::new(|m| m["expert_layers"][0]["file"] = "../../etc/passwd".into()), "file must be"),
        (Box::new(|m| m["expert_layers"][0]["num_experts"] = 5.into()), "5 experts"),
        (
            Box::new(|m| {
                // The down projection's 48 columns as mxfp4: not whole blocks of 32.
                let down = &mut m["expert_layers"][0]["components"][2];
                down["format"] = 4.into();
                down["group"] = 0.into();
            }),
            "mxfp4 rows are whole blocks of 32 columns, not 48",
        ),
        (Box::new(|m| m["files"][0]["path"] = "/etc/passwd".into()), "not a plain relative path"),
        (Box::new(|m| m["hf_config"]["num_key_value_heads"] = 3.into()), "num_key_value_heads"),
        (Box::new(|m| m["model"]["layers"][1]["mixer"] = "mla".into()), "layer 1: recorded Mla"),
        (
            Box::new(|m| {
                m.as_object_mut().unwrap().remove("model");
            }),
            "stores `spec` (version 1) or `model` (version 2)",
        ),
    ];
    for (edit, needle) in cases {
        let text = msg(open_with_manifest_edit(&good, &bad, edit));
        assert!(text.contains(needle), "expected {needle:?} in: {text}");
    }
}

#[test]
fn a_new_container_records_its_layers_not_the_flat_spec_and_reopens_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, out) = converted(tmp.path(), QuantPreset::F32);
    let container = Container::open(&out).unwrap();
    let manifest = container.manifest();
    assert_eq!(manifest.format_version, strata_format::container::FORMAT_VERSION);
    assert!(manifest.spec.is_none());
    let derived = strata_format::ModelArch::from_config_json(manifest.hf_config.get()).unwrap();
    assert_eq!(container.arch(), &derived);
    assert_eq!(manifest.model, Some(strata_format::container::ModelRecord::of(&derived)));
    assert_eq!(manifest.family(), Some(derived.core.family));
}

/// Makes `path` one byte over `max_bytes` (sparse: no disk is used).
fn grow_past(path: &Path, max_bytes: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(max_bytes + 1).unwrap();
}

#[test]
fn a_manifest_over_its_size_limit_is_refused_naming_the_file_and_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, container) = converted(tmp.path(), QuantPreset::Q8);
    grow_past(&container.join("manifest.json"), MAX_MANIFEST_BYTES);
    let err = Container::open(&container).unwrap_err();
    assert!(matches!(err, Error::FileTooLarge { max_bytes: MAX_MANIFEST_BYTES, .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("manifest.json") && text.contains(&MAX_MANIFEST_BYTES.to_string()), "{text}");
}

#[test]
fn a_tokenizer_over_its_size_limit_is_refused_at_convert() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join("hf");
    TinyModel::new(olmoe_config(), Store::F32, 11).write(&hf, Store::F32, Layout::Single);
    std::fs::write(hf.join("tokenizer.json"), b"{}").unwrap();
    grow_past(&hf.join("tokenizer.json"), MAX_TOKENIZER_BYTES);
    let out = tmp.path().join("out");
    let err = convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q8)).unwrap_err();
    assert!(matches!(err, Error::FileTooLarge { max_bytes: MAX_TOKENIZER_BYTES, .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    assert!(!out.exists());
}

#[test]
fn truncated_or_corrupted_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q8);
    let bad = tmp.path().join("bad");

    // Truncated expert file: caught on open from sizes alone.
    copy_dir(&good, &bad);
    let f = bad.join("experts/layer_001.bin");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len - 4096).unwrap();
    let err = Container::open(&bad).unwrap_err();
    assert!(matches!(&err, Error::FileSize { path, .. } if path.ends_with("experts/layer_001.bin")), "{err}");

    // Missing dense.bin.
    copy_dir(&good, &bad);
    std::fs::remove_file(bad.join("dense.bin")).unwrap();
    let err = Container::open(&bad).unwrap_err();
    assert!(err.to_string().contains("dense.bin"), "{err}");

    // A flipped byte: open is fine (no hashing), verify names the file.
    copy_dir(&good, &bad);
    let f = bad.join("experts/layer_000.bin");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&f, bytes).unwrap();
    let c = Container::open(&bad).unwrap();
    let err = c.verify().unwrap_err();
    assert!(matches!(&err, Error::Checksum { path, .. } if path.ends_with("experts/layer_000.bin")), "{err}");
    // Export refuses a non-empty target.
    let err = export(&good, tmp.path()).unwrap_err();
    assert!(matches!(err, Error::OutputExists { .. }), "{err}");
}

/// Removes the CRC32Cs and the manifest's own checksum from a container's
/// manifest, as a container written before they existed.
fn strip_checksums(dir: &Path) {
    let path = dir.join("manifest.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for tensor in manifest["tensors"].as_array_mut().unwrap() {
        tensor.as_object_mut().unwrap().remove("crc32c").expect("a tensor checksum");
    }
    for layer in manifest["expert_layers"].as_array_mut().unwrap() {
        layer.as_object_mut().unwrap().remove("record_crc32c").expect("record checksums");
    }
    manifest.as_object_mut().unwrap().remove(strata_format::container::SEAL_FIELD).expect("the manifest's checksum");
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// Every dense tensor and expert record carries a CRC32C: one flipped bit is
/// an error naming the file and the tensor, or the layer and expert, when
/// it is read; a container without checksums still opens.
#[test]
fn checksums_catch_flipped_bytes_when_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q4);
    let bad = tmp.path().join("bad");

    // A bit of a dense tensor's weights: refused at open.
    copy_dir(&good, &bad);
    let manifest = Container::open(&good).unwrap().manifest().clone();
    let q = manifest.tensors.iter().find(|t| t.name == "model.layers.1.self_attn.o_proj.weight").unwrap();
    let dense = bad.join("dense.bin");
    let mut bytes = std::fs::read(&dense).unwrap();
    bytes[q.offset_bytes as usize + 3] ^= 0x10;
    std::fs::write(&dense, &bytes).unwrap();
    let err = Container::open(&bad).unwrap_err();
    assert!(matches!(&err, Error::Crc32c { what, .. } if what.contains(&q.name)), "{err}");
    assert!(err.to_string().contains("dense.bin"), "{err}");

    // A bit of an expert record: refused when that record is read, naming
    // the file, layer and expert; the other records pass.
    copy_dir(&good, &bad);
    let c = Container::open(&bad).unwrap();
    let layout = c.expert_layout(0).unwrap();
    let file = bad.join("experts/layer_000.bin");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[layout.record_offset(3).unwrap() as usize + 77] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let err = layout.check_record(3, bytemuck::cast_slice(&read_record(layout, 3))).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Crc32c { .. }), "{text}");
    assert!(text.contains("expert 3 of layer 0") && text.contains("layer_000.bin"), "{text}");
    layout.check_record(2, bytemuck::cast_slice(&read_record(layout, 2))).unwrap();

    // A container without checksums opens, and its records pass unchecked.
    copy_dir(&good, &bad);
    strip_checksums(&bad);
    let c = Container::open(&bad).unwrap();
    let layout = c.expert_layout(0).unwrap();
    assert!(layout.record_crc32c.is_none());
    layout.check_record(3, bytemuck::cast_slice(&read_record(layout, 3))).unwrap();
    // A checksum list of the wrong length is a manifest error.
    copy_dir(&good, &bad);
    let err = open_with_manifest_edit(&good, &bad, |m| {
        m["expert_layers"][0]["record_crc32c"] = serde_json::json!([1, 2]);
    });
    assert!(err.to_string().contains("record_crc32c"), "{err}");
}

/// A hand edit of the model's settings that still validates (the config's
/// `norm_topk_prob`, which the layer record does not spell out) used to open
/// and change every answer. The manifest's checksum of itself refuses it,
/// naming the manifest; reformatting it changes no value and still opens.
#[test]
fn a_hand_edit_of_the_model_settings_is_refused_naming_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q8);
    let bad = tmp.path().join("bad");
    let err = open_with_manifest_edit(&good, &bad, |m| {
        let flipped = !m["hf_config"]["norm_topk_prob"].as_bool().expect("norm_topk_prob");
        m["hf_config"]["norm_topk_prob"] = flipped.into();
    });
    let text = err.to_string();
    assert!(matches!(err, Error::Manifest { .. }), "{text}");
    assert!(text.contains("manifest.json") && text.contains("edited"), "{text}");

    // Compact rather than pretty: the same values.
    let path = bad.join("manifest.json");
    copy_dir(&good, &bad);
    let manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let container = Container::open(&bad).unwrap();
    assert_eq!(container.missing_checksums_notice(), None, "a container this build wrote checks everything");

    // Without checksums (written before they existed): opens, and says what it cannot check.
    strip_checksums(&bad);
    let notice = Container::open(&bad).unwrap().missing_checksums_notice().expect("a notice");
    for part in ["model settings (manifest.json)", "dense tensors", "expert records"] {
        assert!(notice.contains(part), "{part:?} not in {notice}");
    }
}

/// Writes `value` as the `index`-th f32 at `offset_bytes` of `file`.
fn poke_f32(file: &Path, offset_bytes: u64, index: u64, value: f32) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.seek(SeekFrom::Start(offset_bytes + 4 * index)).unwrap();
    f.write_all(&value.to_ne_bytes()).unwrap();
}

/// A NaN or infinity stored in a container (damage on disk: conversion
/// never writes one) is refused when the tensor is loaded, naming it,
/// instead of turning every answer into garbage.
#[test]
fn non_finite_stored_floats_are_refused_naming_the_tensor_or_expert() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q8);
    // Without checksums (as containers written before them), so that the
    // damage below is left to the finite checks: a CRC32C would catch it
    // first (see `checksums_catch_flipped_bytes_when_read`).
    strip_checksums(&good);
    let bad = tmp.path().join("bad");
    let manifest = Container::open(&good).unwrap().manifest().clone();
    let entry = |name: &str| manifest.tensors.iter().find(|t| t.name == name).unwrap().clone();

    // A q8 scale of a dense matrix.
    copy_dir(&good, &bad);
    let q = entry("model.layers.0.self_attn.q_proj.weight");
    assert_eq!(q.format, 2, "q8");
    poke_f32(&bad.join("dense.bin"), q.scale_offset_bytes, 3, f32::NAN);
    let err = Container::open(&bad).unwrap_err();
    assert!(
        matches!(&err, Error::NonFiniteStored { kind: "scale", index: 3, what, .. } if what.contains(&q.name)),
        "{err}"
    );
    assert!(err.to_string().contains("dense.bin"), "{err}");

    // An f32 weight (the final norm).
    copy_dir(&good, &bad);
    let norm = entry("model.norm.weight");
    poke_f32(&bad.join("dense.bin"), norm.offset_bytes, 0, f32::INFINITY);
    let err = Container::open(&bad).unwrap_err();
    assert!(matches!(&err, Error::NonFiniteStored { kind: "weight", index: 0, .. }), "{err}");
    assert!(err.to_string().contains("model.norm.weight"), "{err}");

    // An expert record's scale: refused when the record is read.
    copy_dir(&good, &bad);
    let c = Container::open(&bad).unwrap();
    let layout = c.expert_layout(1).unwrap();
    let down = &layout.components[2];
    poke_f32(&layout.path, layout.record_offset(2).unwrap() + down.scale_offset_bytes, 1, f32::NEG_INFINITY);
    let record = read_record(layout, 2);
    let err = layout.check_record(2, bytemuck::cast_slice(&record)).unwrap_err();
    assert!(matches!(&err, Error::NonFiniteStored { kind: "scale", index: 1, .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("expert 2 of layer 1") && text.contains("down") && text.contains("layer_001.bin"), "{text}");
    // The other records are fine.
    layout.check_record(1, bytemuck::cast_slice(&read_record(layout, 1))).unwrap();
}

/// Writes `bytes` at `offset_bytes` of `file`, in place.
fn poke(file: &Path, offset_bytes: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(file).unwrap().write_all_at(bytes, offset_bytes).unwrap();
}

/// An embedding table read by rows is checked at open like every dense
/// tensor, and each row again when it is read: a row changed or cut off
/// after open is an error naming it, never a wrong value.
#[test]
fn an_embedding_read_by_rows_is_checked_at_open_and_at_every_row() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q8);
    let bad = tmp.path().join("bad");
    let name = "model.embed_tokens.weight";
    let entry = Container::open(&good).unwrap().dense_entry(name).unwrap().clone();
    let (rows, cols) = (entry.shape[0], entry.shape[1]);
    let row_bytes = entry.length_bytes / rows as u64;
    let mut out = vec![0f32; cols];

    // A flipped bit: refused at open.
    copy_dir(&good, &bad);
    poke(&bad.join("dense.bin"), entry.offset_bytes + 5 * row_bytes + 1, &[0x5a]);
    let err = Container::open_with(&bad, Embedding::ReadByRow).unwrap_err();
    assert!(matches!(&err, Error::Crc32c { what, .. } if what.contains(name)), "{err}");

    // Changed after open: that row is refused, the others still read.
    copy_dir(&good, &bad);
    let c = Container::open_with(&bad, Embedding::ReadByRow).unwrap();
    poke(&bad.join("dense.bin"), entry.offset_bytes + 7 * row_bytes + 3, &[0xa5]);
    c.dense_rows(name, &[6], &mut out).unwrap();
    let err = c.dense_rows(name, &[7], &mut out).unwrap_err();
    assert!(matches!(&err, Error::Crc32c { what, .. } if what.contains("row 7")), "{err}");
    assert!(err.to_string().contains("dense.bin"), "{err}");

    // Cut off after open: a size error, not a fault.
    copy_dir(&good, &bad);
    let c = Container::open_with(&bad, Embedding::ReadByRow).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(bad.join("dense.bin")).unwrap();
    // Into the last row's scales, which follow the weights.
    assert!(entry.scale_offset_bytes > entry.offset_bytes);
    file.set_len(entry.scale_offset_bytes + entry.scale_length_bytes - 1).unwrap();
    c.dense_rows(name, &[0], &mut out).unwrap_or_else(|e| panic!("row 0 is whole: {e}"));
    let err = c.dense_rows(name, &[rows - 1], &mut out).unwrap_err();
    assert!(matches!(&err, Error::FileSize { path, .. } if path.ends_with("dense.bin")), "{err}");

    // Without checksums a non-finite scale is still refused at open, at its
    // index in the tensor.
    copy_dir(&good, &bad);
    strip_checksums(&bad);
    let scales_per_row = entry.scale_length_bytes / rows as u64 / 4;
    poke_f32(&bad.join("dense.bin"), entry.scale_offset_bytes, 2 * scales_per_row + 1, f32::NAN);
    let err = Container::open_with(&bad, Embedding::ReadByRow).unwrap_err();
    let index = 2 * scales_per_row as usize + 1;
    assert!(matches!(&err, Error::NonFiniteStored { kind: "scale", index: i, .. } if *i == index), "{err}");
}

#[test]
fn accessor_misuse_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q4);
    let c = Container::open(&good).unwrap();
    assert!(matches!(c.expert_layout(7), Err(Error::NotMoeLayer { layer: 7 })));
    let layout = c.expert_layout(0).unwrap();
    assert!(matches!(layout.record_offset(4), Err(Error::ExpertOutOfRange { expert: 4, .. })));
    assert_eq!(layout.record_offset(3).unwrap(), 3 * layout.record_bytes);
    let buf = read_record(layout, 0);
    let bytes: &[u8] = bytemuck::cast_slice(&buf);
    assert!(matches!(layout.matrices(&bytes[..bytes.len() - 8]), Err(Error::RecordSize { .. })));
    // A misaligned record is reported by the kernels crate, not a panic.
    let mut shifted = vec![0u8; bytes.len() + 1];
    shifted[1..].copy_from_slice(bytes);
    assert!(layout.matrices(&shifted[1..]).is_err());
    assert!(matches!(c.dense("nope"), Err(Error::MissingTensor { .. })));
    assert!(matches!(c.dense_vec("model.embed_tokens.weight"), Err(Error::WrongFormat { .. })));
    assert!(c.aux_file("manifest.json").is_none());
}

#[test]
fn handles_are_shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Container>();
    send_sync::<strata_format::Checkpoint>();
    send_sync::<strata_format::ExpertLayout>();
    send_sync::<Error>();
}

#[test]
fn random_manifest_corruption_never_panics() {
    use proptest::prelude::*;
    let tmp = tempfile::tempdir().unwrap();
    let (_, good) = converted(tmp.path(), QuantPreset::Q4);
    let path = good.join("manifest.json");
    let original = std::fs::read(&path).unwrap();
    let len = original.len();
    // Digit edits keep the JSON valid and exercise validation (offsets,
    // lengths, shapes, ordinals); byte edits and truncation exercise parsing.
    let digits: Vec<usize> = original.iter().enumerate().filter(|(_, b)| b.is_ascii_digit()).map(|(i, _)| i).collect();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 400, ..ProptestConfig::default() });
    let strategy = (0..digits.len(), 0u8..10, 0..len, any::<u8>(), proptest::option::weighted(0.1, 0..len));
    let opened_ok = std::cell::Cell::new(0);
    runner
        .run(&strategy, |(d, digit, pos, byte, cut)| {
            let mut bytes = original.clone();
            bytes[digits[d]] = b'0' + digit;
            if cut.is_some() {
                bytes[pos] = byte;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut);
            }
            std::fs::write(&path, &bytes).unwrap();
            // Ok (a harmless edit, e.g. in created_by or a norm's value
            // range) or an error; never a panic.
            if let Ok(c) = Container::open(&good) {
                opened_ok.set(opened_ok.get() + 1);
                for name in c.dense_names() {
                    let _ = c.dense(name).map(|m| m.to_f32());
                }
                for layer in 0..c.arch().layers.len() {
                    if let Ok(layout) = c.expert_layout(layer) {
                        let buf = read_record(layout, 0);
                        let _ = layout.matrices(bytemuck::cast_slice(&buf)).map(|m| m.map(|m| m.to_f32()));
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    eprintln!("{} of 400 corrupted manifests still opened", opened_ok.get());
    std::fs::write(&path, original).unwrap();
    Container::open(&good).unwrap();
}
