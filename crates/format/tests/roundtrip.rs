//! Checkpoint -> container -> checkpoint round trips for every preset and
//! family, including bf16/f16 sources, sharded checkpoints and the fused
//! expert tensors of transformers 5.x.

mod common;

use std::path::Path;

use common::{Layout, Store, TinyModel, assert_within_bound, mixtral_config, olmoe_config, qwen_config, read_record};
use strata_format::container::{RECORD_ALIGN_BYTES, TENSOR_ALIGN_BYTES};
use strata_format::{
    Checkpoint, Container, ConvertOptions, Embedding, Error, ExpertProj, ModelSpec, QuantPreset, TensorKind, convert,
    export, names,
};
use strata_kernels::QuantFormat;

/// Checks every dense tensor and every expert record of `container` against
/// the model it was converted from.
fn check_container(model: &TinyModel, container: &Container, preset: QuantPreset, q4_group: usize) {
    let spec = &ModelSpec::frozen(container.arch()).unwrap();
    assert_eq!(spec, &model.spec);
    assert_eq!(container.preset(), preset);

    for desc in names::dense_tensors(&spec.arch()) {
        let (shape, want) = &model.tensors[&desc.name];
        let entry = container.dense_entry(&desc.name).unwrap();
        assert_eq!(&entry.shape, shape);
        assert_eq!(entry.offset_bytes % TENSOR_ALIGN_BYTES, 0, "{}", desc.name);
        assert_eq!(entry.scale_offset_bytes % TENSOR_ALIGN_BYTES, 0, "{}", desc.name);
        let format = preset_dense_format(preset, desc.kind);
        assert_eq!(entry.format, format.ordinal(), "{}", desc.name);
        let m = container.dense(&desc.name).unwrap();
        assert_eq!(m.format(), format);
        let cols = *shape.last().unwrap();
        assert_within_bound(&desc.name, format, cols, m.data.group().unwrap_or(0), want, &m.to_f32());
        if !desc.kind.is_matrix() {
            assert_eq!(container.dense_vec(&desc.name).unwrap(), &want[..], "{}", desc.name);
        }
    }

    let expert_format = preset.expert_format();
    for layer in 0..spec.num_layers {
        if !spec.is_moe(layer) {
            assert!(container.expert_layout(layer).is_err());
            continue;
        }
        let layout = container.expert_layout(layer).unwrap();
        assert_eq!(layout.record_bytes % RECORD_ALIGN_BYTES, 0);
        assert_eq!(layout.num_experts, spec.moe.num_experts);
        assert_eq!(std::fs::metadata(&layout.path).unwrap().len(), layout.file_bytes());
        assert_eq!(container.expert_file(layer).unwrap(), layout.path);
        assert!(layout.path.ends_with(format!("experts/layer_{layer:03}.bin")));
        for c in &layout.components {
            assert_eq!(c.format, expert_format);
            assert_eq!(c.offset_bytes % TENSOR_ALIGN_BYTES, 0);
            assert_eq!(c.scale_offset_bytes % TENSOR_ALIGN_BYTES, 0);
            assert!(c.end_bytes() <= layout.record_bytes);
        }
        let group = match expert_format {
            QuantFormat::Q4 => q4_group,
            QuantFormat::Q8 => 32,
            _ => 0,
        };
        for e in 0..spec.moe.num_experts {
            let buf = read_record(layout, e);
            let mats = layout.matrices(bytemuck::cast_slice(&buf)).unwrap();
            let hf = names::expert_names(&spec.arch().core, layer, e);
            for ((m, name), proj) in mats.iter().zip(&hf).zip(ExpertProj::ALL) {
                let (shape, want) = &model.tensors[name];
                assert_eq!(&[m.rows, m.cols][..], &shape[..], "{name} ({proj:?})");
                assert_within_bound(name, expert_format, m.cols, group, want, &m.to_f32());
            }
        }
    }
}

fn preset_dense_format(preset: QuantPreset, kind: TensorKind) -> QuantFormat {
    if !kind.is_matrix() {
        return QuantFormat::F32;
    }
    match preset {
        QuantPreset::F32 => QuantFormat::F32,
        QuantPreset::Bf16 => QuantFormat::Bf16,
        QuantPreset::Q8 | QuantPreset::Q4 => QuantFormat::Q8,
    }
}

/// Exports `container` and checks the result holds exactly the container's
/// dequantized tensors under the published names, plus config and tokenizer.
fn check_export(container: &Container, out: &Path) {
    export(container.dir(), out).unwrap();
    let ckpt = Checkpoint::open(out).unwrap();
    let spec = ModelSpec::from_config_json(ckpt.config_json()).unwrap();
    assert_eq!(spec.arch(), *container.arch());
    let config: serde_json::Value = serde_json::from_str(ckpt.config_json()).unwrap();
    assert_eq!(config["dtype"], "float32");
    assert!(out.join("tokenizer.json").is_file());

    let mut expected = 0;
    for name in container.dense_names() {
        let (shape, values) = ckpt.tensor_f32(name).unwrap();
        assert_eq!(shape, container.dense_entry(name).unwrap().shape);
        assert_eq!(values, container.dense(name).unwrap().to_f32(), "{name}");
        expected += 1;
    }
    for layer in spec.moe_layers() {
        let layout = container.expert_layout(layer).unwrap();
        for e in 0..spec.moe.num_experts {
            let buf = read_record(layout, e);
            let mats = layout.matrices(bytemuck::cast_slice(&buf)).unwrap();
            let experts = ckpt.expert_f32(&spec.arch(), layer, e).unwrap();
            for (m, got) in mats.iter().zip(&experts) {
                assert_eq!(got, &m.to_f32());
            }
            expected += 3;
        }
    }
    assert_eq!(ckpt.names().count(), expected, "no extra tensors");
}

/// Opened with the embedding read by rows, every row reads bit for bit as
/// the resident table's, and an untied table takes no memory (a tied one is
/// the lm head too, and stays resident).
fn check_embedding_by_row(dir: &Path, resident: &Container) {
    let by_row = Container::open_with(dir, Embedding::ReadByRow).unwrap();
    let name = names::embedding_name(&resident.arch().core);
    let table = resident.dense(&name).unwrap();
    let rows: Vec<usize> = (0..table.rows).rev().chain([0, 0]).collect();
    let read = |c: &Container| {
        let mut out = vec![0f32; rows.len() * table.cols];
        c.dense_rows(&name, &rows, &mut out).unwrap();
        out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    assert_eq!(read(&by_row), read(resident), "{name}");
    let entry = resident.dense_entry(&name).unwrap();
    if resident.arch().core.tie_word_embeddings {
        assert_eq!(by_row.dense_resident_bytes(), resident.dense_resident_bytes());
        assert_eq!(by_row.dense(&name).unwrap(), table);
    } else {
        let table_bytes = entry.length_bytes + entry.scale_length_bytes;
        let row_checksum_bytes = 4 * table.rows as u64;
        assert_eq!(by_row.dense_resident_bytes(), resident.dense_resident_bytes() - table_bytes + row_checksum_bytes);
        assert!(matches!(by_row.dense(&name), Err(Error::ReadByRow { .. })));
    }
    let mut out = vec![0f32; table.cols];
    let err = by_row.dense_rows(&name, &[table.rows], &mut out).unwrap_err();
    assert!(matches!(err, Error::RowOutOfRange { row, rows, .. } if row == rows), "{err}");
}

#[test]
fn olmoe_every_preset_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let model = TinyModel::new(olmoe_config(), Store::Mixed, 1);
    let hf = tmp.path().join("hf");
    model.write(&hf, Store::Mixed, Layout::Single);
    std::fs::write(hf.join("chat_template.jinja"), "{{ messages }}").unwrap();

    for preset in QuantPreset::ALL {
        let out = tmp.path().join(format!("c-{preset}"));
        let report = convert(&hf, &out, &ConvertOptions::new(preset)).unwrap();
        assert_eq!(report.out_dir, out);
        assert_eq!(report.num_moe_layers, 2);
        assert!(report.ignored_tensors.is_empty(), "{:?}", report.ignored_tensors);
        assert_eq!(report.expert_record_bytes % RECORD_ALIGN_BYTES, 0);
        assert_eq!(report.expert_bytes, 2 * 4 * report.expert_record_bytes);
        assert_eq!(report.dense_bytes, std::fs::metadata(out.join("dense.bin")).unwrap().len());
        assert!(report.total_bytes > report.dense_bytes + report.expert_bytes);

        let container = Container::open(&out).unwrap();
        container.verify().unwrap();
        check_container(&model, &container, preset, 64);
        check_embedding_by_row(&out, &container);
        for aux in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
            let p = container.aux_file(aux).unwrap_or_else(|| panic!("{aux} not carried"));
            assert_eq!(std::fs::read(p).unwrap(), std::fs::read(hf.join(aux)).unwrap());
        }
        assert!(container.aux_file("generation_config.json").is_none());
        // The original config.json is embedded verbatim.
        let raw: serde_json::Value = serde_json::from_str(container.manifest().hf_config.get()).unwrap();
        assert_eq!(raw, model.config);

        check_export(&container, &tmp.path().join(format!("export-{preset}")));
    }
}

#[test]
fn bf16_preset_record_is_smaller_than_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let model = TinyModel::new(olmoe_config(), Store::F32, 2);
    let hf = tmp.path().join("hf");
    model.write(&hf, Store::F32, Layout::Single);
    let mut sizes = Vec::new();
    for preset in QuantPreset::ALL {
        let r = convert(&hf, tmp.path().join(preset.name()), &ConvertOptions::new(preset)).unwrap();
        sizes.push(r.total_bytes);
    }
    assert!(sizes.windows(2).all(|w| w[0] > w[1]), "f32 > bf16 > q8 > q4: {sizes:?}");
}

#[test]
fn qwen3_moe_dense_layers_tied_embeddings_biases() {
    let tmp = tempfile::tempdir().unwrap();
    let model = TinyModel::new(qwen_config(), Store::Bf16, 3);
    let hf = tmp.path().join("hf");
    model.write(&hf, Store::Bf16, Layout::Single);
    for (preset, group) in [(QuantPreset::Q4, 32), (QuantPreset::Bf16, 64)] {
        let out = tmp.path().join(format!("c-{preset}"));
        let opts = ConvertOptions { q4_group: group, ..ConvertOptions::new(preset) };
        let report = convert(&hf, &out, &opts).unwrap();
        assert_eq!(report.num_moe_layers, 2);
        let container = Container::open(&out).unwrap();
        assert!(!container.has_dense("lm_head.weight"));
        assert!(container.has_dense("model.layers.1.mlp.gate_proj.weight"));
        assert!(container.has_dense("model.layers.0.self_attn.q_proj.bias"));
        assert_eq!(container.dense_vec("model.layers.0.self_attn.q_norm.weight").unwrap().len(), 24);
        assert!(container.expert_layout(1).is_err());
        check_container(&model, &container, preset, group);
        check_embedding_by_row(&out, &container);
        check_export(&container, &tmp.path().join(format!("export-{preset}")));
    }
}

#[test]
fn mixtral_names_and_odd_width() {
    let tmp = tempfile::tempdir().unwrap();
    let model = TinyModel::new(mixtral_config(), Store::F16, 4);
    let hf = tmp.path().join("hf");
    model.write(&hf, Store::F16, Layout::Single);
    let out = tmp.path().join("c");
    convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q4)).unwrap();
    let container = Container::open(&out).unwrap();
    assert!(container.has_dense("model.layers.0.block_sparse_moe.gate.weight"));
    let layout = container.expert_layout(1).unwrap();
    assert_eq!(layout.components[2].cols, 45);
    assert_eq!(layout.components[2].length_bytes, 64 * 23, "odd q4 rows round up to whole bytes");
    let manifest = container.manifest();
    assert_eq!(
        manifest.expert_layers[0].components[0].name,
        "model.layers.0.block_sparse_moe.experts.{expert}.w1.weight"
    );
    check_container(&model, &container, QuantPreset::Q4, 64);
    check_embedding_by_row(&out, &container);
    check_export(&container, &tmp.path().join("export"));
}

#[test]
fn sharded_and_fused_checkpoints_convert_identically() {
    for (config, seed) in [(olmoe_config(), 5), (mixtral_config(), 6), (qwen_config(), 7)] {
        let tmp = tempfile::tempdir().unwrap();
        let model = TinyModel::new(config, Store::Bf16, seed);
        let mut manifests = Vec::new();
        let mut experts = Vec::new();
        for (i, layout) in [Layout::Single, Layout::Sharded(3), Layout::Fused].into_iter().enumerate() {
            let hf = tmp.path().join(format!("hf{i}"));
            model.write(&hf, Store::Bf16, layout);
            let out = tmp.path().join(format!("c{i}"));
            let report = convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
            assert!(report.ignored_tensors.is_empty(), "{layout:?}: {:?}", report.ignored_tensors);
            let container = Container::open(&out).unwrap();
            check_container(&model, &container, QuantPreset::Q8, 64);
            manifests.push(container.manifest().files.clone());
            let layer = container.arch().moe_layers()[0];
            experts.push(std::fs::read(container.expert_file(layer).unwrap()).unwrap());
        }
        assert_eq!(manifests[0], manifests[1], "sharding must not change the container");
        assert_eq!(experts[0], experts[2], "fused experts must give identical records");
    }
}

#[test]
fn overwrite_and_empty_output_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = TinyModel::new(olmoe_config(), Store::F32, 8);
    let hf = tmp.path().join("hf");
    model.write(&hf, Store::F32, Layout::Single);
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    let err = convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q4)).unwrap_err();
    assert!(matches!(err, strata_format::Error::OutputExists { .. }), "{err}");
    assert_eq!(Container::open(&out).unwrap().preset(), QuantPreset::Q8, "untouched");
    let opts = ConvertOptions { overwrite: true, ..ConvertOptions::new(QuantPreset::Q4) };
    convert(&hf, &out, &opts).unwrap();
    assert_eq!(Container::open(&out).unwrap().preset(), QuantPreset::Q4);
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "only hf and out remain: {leftovers:?}");
}
