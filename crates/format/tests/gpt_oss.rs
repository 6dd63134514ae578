//! gpt-oss through `strata export`: its experts written fused with gate and
//! up interleaved, its router as `mlp.router`, as transformers'
//! `save_pretrained` writes them, so that transformers loads the export as
//! the model the container holds.

use std::path::{Path, PathBuf};

use strata_format::{Checkpoint, Container, ConvertOptions, QuantPreset, convert, export};

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
        let hashes = |c: &Container| {
            c.manifest().files.iter().filter(|f| f.path.ends_with(".bin")).map(|f| f.sha256.clone()).collect::<Vec<_>>()
        };
        assert_eq!(hashes(&a).len(), 3, "dense.bin and two layers of experts");
        assert_eq!(hashes(&a), hashes(&b), "{preset}: the exported weights differ");
    }
}
