//! gpt-oss through `strata export`: its experts written fused with gate and
//! up interleaved, its router as `mlp.router`, as transformers'
//! `save_pretrained` writes them, so that transformers loads the export as
//! the model the container holds. The hub's MXFP4 experts are kept as
//! stored, or dequantized by choice.

mod common;

use std::path::{Path, PathBuf};

use common::{read_safetensors, stored_expert, weight_file_hashes};
use strata_format::{Checkpoint, Container, ConvertOptions, QuantPreset, convert, export};
use strata_kernels::QuantFormat;

fn fixture(checkpoint: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gpt_oss").join(checkpoint)
}

/// Every tensor of a checkpoint by name: its shape and its values' bits.
fn tensors(dir: &Path) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    let ckpt = Checkpoint::open(dir).unwrap();
    let mut names: Vec<String> = ckpt.names().map(str::to_owned).collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let (shape, values) = ckpt.tensor_f32(&name).unwrap();
            (name, shape, values.iter().map(|v| v.to_bits()).collect())
        })
        .collect()
}

/// The fixture was written by `save_pretrained` (f32): an f32 container
/// exports to the same tensors, names, shapes and bits.
#[test]
fn an_f32_export_holds_the_tensors_save_pretrained_wrote_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    convert(fixture("hf"), tmp.path().join("c"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    export(tmp.path().join("c"), tmp.path().join("hf")).unwrap();
    let (want, got) = (tensors(&fixture("hf")), tensors(&tmp.path().join("hf")));
    let names = |t: &[(String, Vec<usize>, Vec<u32>)]| t.iter().map(|(n, ..)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want));
    for (w, g) in want.iter().zip(&got) {
        assert!(w == g, "{}: {:?} vs {:?}", w.0, w.1, g.1);
    }
}

/// At every preset, converting the export gives the container's bits again:
/// its dense file and every expert record.
#[test]
fn convert_export_convert_gives_the_same_bits_at_every_preset() {
    let tmp = tempfile::tempdir().unwrap();
    for preset in QuantPreset::ALL {
        let dir = tmp.path().join(preset.name());
        convert(fixture("hf"), dir.join("c1"), &ConvertOptions::new(preset)).unwrap();
        export(dir.join("c1"), dir.join("hf")).unwrap();
        let second = convert(dir.join("hf"), dir.join("c2"), &ConvertOptions::new(preset)).unwrap();
        assert!(second.ignored_tensors.is_empty(), "{preset}: {:?}", second.ignored_tensors);
        let (a, b) = (Container::open(dir.join("c1")).unwrap(), Container::open(dir.join("c2")).unwrap());
        assert_eq!(a.arch(), b.arch(), "{preset}");
        assert_eq!(weight_file_hashes(&a).len(), 3, "dense.bin and two layers of experts");
        assert_eq!(weight_file_hashes(&a), weight_file_hashes(&b), "{preset}: the exported weights differ");
    }
}

/// Rows `parity`, `parity + 2`, … of an expert's slab of `[2·inter, width]`
/// rows of `row_bytes` each: gate's rows (0) or up's (1) of the hub's
/// interleaved `gate_up_proj_{blocks,scales}`.
fn every_other_row(slab: &[u8], row_bytes: usize, parity: usize) -> Vec<u8> {
    slab.chunks_exact(row_bytes).skip(parity).step_by(2).flatten().copied().collect()
}

/// The hub's `*_blocks`/`*_scales` are kept as `mxfp4` records at every
/// preset: gate and up are `gate_up_proj`'s even and odd rows, moved as
/// bytes, down its own slab, each byte the checkpoint's.
#[test]
fn the_hub_s_mxfp4_experts_are_kept_as_their_bytes_with_gate_and_up_rows_apart() {
    let stored: std::collections::HashMap<String, (Vec<usize>, Vec<u8>)> = read_safetensors(&fixture("hf_mxfp4"))
        .into_iter()
        .map(|(name, shape, _, data)| (name, (shape, data)))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    for preset in QuantPreset::ALL {
        let out = tmp.path().join(preset.name());
        convert(fixture("hf_mxfp4"), &out, &ConvertOptions::new(preset)).unwrap();
        let container = Container::open(&out).unwrap();
        let arch = container.arch();
        assert_eq!(arch.expert_layers(), [0, 1]);
        for layer in arch.expert_layers() {
            // An expert's slab and the bytes of one of its rows.
            let slab = |tensor: &str, expert: usize| {
                let (shape, data) = &stored[&format!("model.layers.{layer}.mlp.experts.{tensor}")];
                let slab_bytes = data.len() / shape[0];
                (data[expert * slab_bytes..(expert + 1) * slab_bytes].to_vec(), slab_bytes / shape[1])
            };
            for expert in 0..arch.num_experts() {
                let [(gate_format, gate, gate_scales), (up_format, up, up_scales), (down_format, down, down_scales)] =
                    stored_expert(&container, layer, expert);
                let what = format!("{preset} layer {layer} expert {expert}");
                assert!([gate_format, up_format, down_format].iter().all(|&f| f == QuantFormat::Mxfp4), "{what}");
                let (codes, row_bytes) = slab("gate_up_proj_blocks", expert);
                assert_eq!((gate, up), (every_other_row(&codes, row_bytes, 0), every_other_row(&codes, row_bytes, 1)));
                let (scales, row_bytes) = slab("gate_up_proj_scales", expert);
                assert_eq!(
                    (gate_scales, up_scales),
                    (every_other_row(&scales, row_bytes, 0), every_other_row(&scales, row_bytes, 1)),
                    "{what}"
                );
                assert_eq!(
                    (down, down_scales),
                    (slab("down_proj_blocks", expert).0, slab("down_proj_scales", expert).0)
                );
            }
        }
    }
}

/// With `dequantize_mxfp4` the hub's experts convert as today: as the
/// `save_pretrained` checkpoint's (the same values) in the preset's format,
/// every weight file the same bits.
#[test]
fn dequantized_mxfp4_experts_convert_as_the_saved_f32_experts_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    for preset in QuantPreset::ALL {
        let [saved, hub] = common::f32_and_dequantized_mxfp4(&fixture(""), &tmp.path().join(preset.name()), preset);
        assert_eq!(weight_file_hashes(&hub), weight_file_hashes(&saved), "{preset}");
        assert_eq!(hub.expert_layout(0).unwrap().components[2].format, preset.expert_format());
    }
}
