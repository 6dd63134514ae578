//! Nothing converted as something it is not: every committed checkpoint
//! converts, and one whose config.json or tensors its family does not know
//! is refused by name before anything is written, unless each unknown key
//! is allowed by name.

mod common;

use std::path::{Path, PathBuf};

use safetensors::tensor::Dtype;
use serde_json::{Value, json};
use strata_format::checkpoint::read_safetensors_header;
use strata_format::{ConvertOptions, ConvertReport, QuantPreset, convert};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn f32_options() -> ConvertOptions {
    ConvertOptions::new(QuantPreset::F32)
}

/// `family`'s `hf/` fixture copied to `dir`, its config.json edited by
/// `edit`, and a zero tensor of shape [1] for each of `extra` stored in a
/// second shard.
fn edited_fixture(family: &str, dir: &Path, edit: impl FnOnce(&mut Value), extra: &[&str]) -> PathBuf {
    let extra: Vec<(&str, &[usize])> = extra.iter().map(|name| (*name, &[1usize][..])).collect();
    edited_fixture_with(family, dir, edit, &extra)
}

/// [`edited_fixture`] with zero tensors of the given shapes.
fn edited_fixture_with(family: &str, dir: &Path, edit: impl FnOnce(&mut Value), extra: &[(&str, &[usize])]) -> PathBuf {
    let source = testdata().join(family).join("hf");
    std::fs::create_dir_all(dir).unwrap();
    let mut config: Value = serde_json::from_slice(&std::fs::read(source.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (own, added) = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
    let weights = std::fs::read(source.join("model.safetensors")).unwrap();
    std::fs::write(dir.join(own), &weights).unwrap();
    let zeros: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = extra
        .iter()
        .map(|(name, shape)| {
            ((*name).to_owned(), shape.to_vec(), Dtype::F32, vec![0; 4 * shape.iter().product::<usize>()])
        })
        .collect();
    common::write_safetensors(&dir.join(added), &zeros);
    let mut weight_map = serde_json::Map::new();
    for tensor in read_safetensors_header(&weights, &source).unwrap() {
        weight_map.insert(tensor.name, json!(own));
    }
    for (name, _) in extra {
        weight_map.insert((*name).to_owned(), json!(added));
    }
    std::fs::write(dir.join("model.safetensors.index.json"), json!({"weight_map": weight_map}).to_string()).unwrap();
    dir.to_path_buf()
}

fn refused(hf: &Path, out: &Path, options: &ConvertOptions) -> String {
    let err = convert(hf, out, options).unwrap_err().to_string();
    assert!(!out.exists(), "nothing is written: {err}");
    err
}

#[test]
fn every_committed_fixture_converts_leaving_only_known_tensors_unread() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = vec![testdata().join("../models/demo")];
    for family in std::fs::read_dir(testdata()).unwrap() {
        let Ok(inside) = std::fs::read_dir(family.unwrap().path()) else { continue };
        dirs.extend(inside.map(|dir| dir.unwrap().path()));
    }
    let weighed =
        |dir: &PathBuf| dir.join("model.safetensors").is_file() || dir.join("model.safetensors.index.json").is_file();
    let checkpoints: Vec<PathBuf> = dirs.into_iter().filter(weighed).collect();
    assert!(checkpoints.len() >= 19, "{checkpoints:?}");
    for (i, dir) in checkpoints.iter().enumerate() {
        let out = tmp.path().join(i.to_string());
        let report: ConvertReport =
            convert(dir, &out, &f32_options()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        // Their fixtures (and Kimi K2.5's MTP twin, its checkpoint linked)
        // carry a vision tower, known and not read.
        let vision = ["kimi_k25", "kimi_k25_mtp", "glm5_next"].iter().any(|f| dir.starts_with(testdata().join(f)));
        // So does qwen4_exp's: the PLE's int64 hash buffers, derived from the config.
        let derived = |name: &String| name.contains(".ple.ple_embedding.") && !name.contains("ngram_embedding");
        let known = report.ignored_tensors.iter().all(derived);
        assert!(known || vision, "{}: {:?}", dir.display(), report.ignored_tensors);
    }
}

#[test]
fn deepseek_v3_configs_it_does_not_describe_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let edits = [
        ("mla_use_output_gate", json!(true)),
        ("use_sliding_window", json!(true)),
        ("attn_logit_softcapping", json!(30)),
    ];
    for (key, value) in edits {
        let hf = edited_fixture("deepseek_v3", &tmp.path().join(key), |c| c[key] = value, &[]);
        let out = tmp.path().join(format!("{key}-out"));
        let err = refused(&hf, &out, &f32_options());
        assert!(
            err.contains(&format!("deepseek_v3 does not know {key}:")) && err.contains("--allow-unknown-config"),
            "{err}"
        );
        // The explicit opt-out names the key.
        let options = ConvertOptions { allow_unknown_config: vec![key.to_owned()], ..f32_options() };
        convert(&hf, &out, &options).unwrap();
    }
}

#[test]
fn a_k3_style_kimi_config_is_refused_naming_its_extra_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let k3 = |c: &mut Value| {
        c["text_config"]["mla_use_output_gate"] = json!(true);
        c["text_config"]["moe_latent_dim"] = json!(16);
        c["text_config"]["attention_residuals"] = json!(true);
    };
    let hf = edited_fixture("kimi_k25", &tmp.path().join("hf"), k3, &[]);
    let err = refused(&hf, &tmp.path().join("out"), &f32_options());
    let named = "text_config.attention_residuals, text_config.mla_use_output_gate, text_config.moe_latent_dim";
    assert!(err.contains(named), "{err}");
}

#[test]
fn a_deepseek_v4_1_checkpoint_is_refused_in_one_line_even_with_its_keys_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let v4_1 = |c: &mut Value| {
        c["engram_layer_ids"] = json!([1]);
        c["kv_source_layers"] = json!([0, 0, 1, 2]);
    };
    let hf = edited_fixture("deepseek_v4", &tmp.path().join("hf"), v4_1, &[]);
    let allowed = vec!["engram_layer_ids".to_owned(), "kv_source_layers".to_owned()];
    for options in [f32_options(), ConvertOptions { allow_unknown_config: allowed, ..f32_options() }] {
        let err = refused(&hf, &tmp.path().join("out"), &options);
        assert_eq!(err.lines().count(), 1, "{err}");
        for named in ["V4.1", "engram", "compressed-KV", "two-level"] {
            assert!(err.contains(named), "names {named}: {err}");
        }
    }
}

#[test]
fn a_tensor_no_block_reads_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = "model.layers.1.self_attn.o_gate.weight";
    let hf = edited_fixture("deepseek_v3", &tmp.path().join("gate"), |_| {}, &[gate, "model.layers.1.attn_res.weight"]);
    let err = refused(&hf, &tmp.path().join("gate-out"), &f32_options());
    assert!(err.contains(&format!("no block reads model.layers.1.attn_res.weight, {gate}:")), "{err}");
    assert!(err.contains("deepseek_v3 checkpoint"), "{err}");
}

#[test]
fn tensors_the_family_knows_to_be_unused_are_left_out_without_a_word() {
    let tmp = tempfile::tempdir().unwrap();
    // The fixture has 3 decoder layers: a fourth is its MTP module, whose
    // copy of the embedding is not read (the model's own is).
    let known = ["model.layers.3.embed_tokens.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"];
    let hf = edited_fixture("deepseek_v3", &tmp.path().join("hf"), |_| {}, &known);
    let report = convert(&hf, tmp.path().join("out"), &f32_options()).unwrap();
    assert_eq!(
        report.ignored_tensors,
        ["model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.3.embed_tokens.weight"]
    );
    // A tensor without elements computes nothing (transformers saves
    // n_shared_experts: 0 as shared experts of width 0).
    let empty = "model.layers.0.mlp.shared_experts.gate_proj.weight";
    let hf = edited_fixture_with("mixtral", &tmp.path().join("empty"), |_| {}, &[(empty, &[0, 64])]);
    let report = convert(&hf, tmp.path().join("empty-out"), &f32_options()).unwrap();
    assert_eq!(report.ignored_tensors, [empty]);
    // Past the last layer is known only where the family appends MTP layers.
    let hf = edited_fixture("mixtral", &tmp.path().join("mixtral"), |_| {}, &["model.layers.2.eh_proj.weight"]);
    let err = refused(&hf, &tmp.path().join("mixtral-out"), &f32_options());
    assert!(err.contains("no block reads model.layers.2.eh_proj.weight"), "{err}");
}
