//! FP8 checkpoints as DeepSeek-V3, Kimi K2 and GLM-5-FP8 publish them:
//! every linear weight in float8 e4m3 with a `weight_scale_inv` of block
//! scales (`w = e4m3 * scale_inv[i / 128, j / 128]`). Built here from the
//! deepseek_v3 oracle fixture; conversion must give the fixture's model
//! within the FP8 rounding, and exactly the FP8 values as dequantized.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::write_safetensors;
use safetensors::tensor::Dtype;
use serde_json::{Value, json};
use strata_format::{Checkpoint, Container, ConvertOptions, ModelSpec, QuantPreset, TensorKind, convert, names};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family)
}

/// float8 e4m3fn -> f32, written independently of the crate's table.
fn e4m3(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((byte >> 3) & 0xF);
    let man = f32::from(byte & 7);
    match exp {
        0 => sign * man / 8.0 * 2f32.powi(-6),
        _ => sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7),
    }
}

/// The e4m3 code nearest `x` (|x| <= 448), ties to an even mantissa.
fn to_e4m3(x: f32) -> u8 {
    let mut best = 0u8;
    for code in 0..=255u8 {
        if code & 0x7F == 0x7F {
            continue; // NaN
        }
        let (d, b) = ((e4m3(code) - x).abs(), (e4m3(best) - x).abs());
        if d < b || (d == b && code & 1 == 0 && best & 1 == 1) {
            best = code;
        }
    }
    best
}

/// Quantizes a `[rows, cols]` matrix in `block` blocks: codes, per-block
/// scales (`amax / 448`), and the values they decode to.
fn quantize(values: &[f32], rows: usize, cols: usize, block: [usize; 2]) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let (sr, sc) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
    let mut scales = vec![0.0f32; sr * sc];
    for r in 0..rows {
        for c in 0..cols {
            let s = &mut scales[(r / block[0]) * sc + c / block[1]];
            *s = s.max(values[r * cols + c].abs() / 448.0);
        }
    }
    let mut codes = vec![0u8; rows * cols];
    let mut decoded = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let s = scales[(r / block[0]) * sc + c / block[1]];
            let q = if s == 0.0 { 0 } else { to_e4m3(values[r * cols + c] / s) };
            codes[r * cols + c] = q;
            decoded[r * cols + c] = e4m3(q) * s;
        }
    }
    (codes, scales, decoded)
}

/// What an FP8 release quantizes: every linear weight and expert; norms,
/// biases, routers, embeddings and lm_head stay high precision.
fn quantized_names(spec: &ModelSpec) -> Vec<String> {
    let mut out: Vec<String> = names::dense_tensors(&spec.arch())
        .into_iter()
        .filter(|d| d.kind == TensorKind::Linear)
        .map(|d| d.name)
        .collect();
    for layer in spec.moe_layers() {
        for e in 0..spec.moe.num_experts {
            out.extend(names::expert_names(&spec.arch().core, layer, e));
        }
    }
    out
}

/// Writes the FP8 version of `source` into `dir`; returns the values each
/// quantized tensor decodes to.
fn write_fp8(source: &Path, dir: &Path, block: [usize; 2], scale_suffix: &str) -> BTreeMap<String, Vec<f32>> {
    write_fp8_with(source, dir, block, scale_suffix, None)
}

/// As [`write_fp8`], leaving out the scales of `unscaled`.
fn write_fp8_dropping(source: &Path, dir: &Path, block: [usize; 2], unscaled: Option<&str>) {
    write_fp8_with(source, dir, block, "weight_scale_inv", unscaled);
}

fn write_fp8_with(
    source: &Path,
    dir: &Path,
    block: [usize; 2],
    scale_suffix: &str,
    unscaled: Option<&str>,
) -> BTreeMap<String, Vec<f32>> {
    let ckpt = Checkpoint::open(source).unwrap();
    let mut config: Value = serde_json::from_str(ckpt.config_json()).unwrap();
    config["quantization_config"] = json!({
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": block
    });
    let spec = ModelSpec::from_config_value(&config).unwrap();
    let quantized = quantized_names(&spec);
    let mut stored = Vec::new();
    let mut decoded = BTreeMap::new();
    for name in ckpt.names().map(str::to_owned).collect::<Vec<_>>() {
        let (shape, values) = ckpt.tensor_f32(&name).unwrap();
        if quantized.contains(&name) {
            let (codes, scales, dec) = quantize(&values, shape[0], shape[1], block);
            let scale_shape = vec![shape[0].div_ceil(block[0]), shape[1].div_ceil(block[1])];
            let stem = name.strip_suffix(".weight").unwrap();
            stored.push((name.clone(), shape, Dtype::F8_E4M3, codes));
            let scale_bytes = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
            if unscaled != Some(name.as_str()) {
                stored.push((format!("{stem}.{scale_suffix}"), scale_shape, Dtype::F32, scale_bytes));
            }
            decoded.insert(name, dec);
        } else {
            stored.push((name, shape, Dtype::F32, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &stored);
    decoded
}

/// Every tensor of `container` as f32 under its published name.
fn container_values(container: &Container) -> BTreeMap<String, Vec<f32>> {
    let spec = &ModelSpec::frozen(container.arch()).unwrap();
    let mut out: BTreeMap<String, Vec<f32>> =
        container.dense_names().map(|n| (n.to_owned(), container.dense(n).unwrap().to_f32())).collect();
    for layer in spec.moe_layers() {
        let layout = container.expert_layout(layer).unwrap();
        let bytes = std::fs::read(&layout.path).unwrap();
        for e in 0..spec.moe.num_experts {
            let start = layout.record_offset(e).unwrap() as usize;
            // Aligned copy: the record is viewed as f32 in place.
            let words: Vec<u32> = bytes[start..start + layout.record_bytes as usize]
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let mats = layout.matrices(bytemuck::cast_slice(&words)).unwrap();
            for (name, m) in names::expert_names(&spec.arch().core, layer, e).into_iter().zip(mats) {
                out.insert(name, m.to_f32());
            }
        }
    }
    out
}

#[test]
fn fp8_block_checkpoints_convert_to_the_model_within_fp8_rounding() {
    let source = fixture("deepseek_v3").join("hf");
    let tmp = tempfile::tempdir().unwrap();
    let reference = convert(&source, tmp.path().join("ref"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let want = container_values(&Container::open(&reference.out_dir).unwrap());
    // The published layout (128 x 128, weight_scale_inv), and small blocks
    // with partial ones at the edges under the compressed-tensors name.
    for (block, suffix) in [([128, 128], "weight_scale_inv"), ([16, 40], "weight_scale")] {
        let dir = tmp.path().join(format!("fp8-{}x{}", block[0], block[1]));
        let decoded = write_fp8(&source, &dir.join("hf"), block, suffix);
        let report = convert(dir.join("hf"), dir.join("c"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
        assert!(report.ignored_tensors.is_empty(), "scales are part of their weights: {:?}", report.ignored_tensors);
        let got = container_values(&Container::open(&report.out_dir).unwrap());
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
        let mut worst = 0.0f32;
        for (name, values) in &got {
            match decoded.get(name) {
                // Exactly what the FP8 codes and scales decode to...
                Some(dec) => assert_eq!(values, dec, "{name}"),
                None => assert_eq!(values, &want[name], "{name}: not quantized, must be unchanged"),
            }
            // ...which is the original within e4m3's rounding: half an ulp of
            // 3 mantissa bits, or half the subnormal step of the block scale.
            let amax = want[name].iter().fold(0f32, |m, x| m.max(x.abs()));
            for (&x, &w) in values.iter().zip(&want[name]) {
                let bound = w.abs() / 16.0 + amax / 448.0 * 2f32.powi(-10) + 1e-12;
                assert!((x - w).abs() <= bound, "{name}: {x} vs {w}");
                worst = worst.max((x - w).abs() / amax.max(1e-30));
            }
        }
        assert!(worst > 0.0, "the FP8 rounding must be visible");
    }
}

#[test]
fn fp8_weights_without_scales_are_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = "model.layers.0.self_attn.kv_b_proj.weight";
    write_fp8_dropping(&fixture("deepseek_v3").join("hf"), &tmp.path().join("hf"), [128, 128], Some(missing));
    let err = convert(tmp.path().join("hf"), tmp.path().join("c"), &ConvertOptions::new(QuantPreset::F32))
        .unwrap_err()
        .to_string();
    assert!(err.contains(missing) && err.contains("block scales"), "{err}");
}
