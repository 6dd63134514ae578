//! kimi_k3's config.json as the hub nests it (`text_config`, `model_type:
//! kimi_linear` inside) and flat, told from Kimi-Linear's by its keys; its
//! blocks and its tensor names under `language_model.`; its hub's MXFP4
//! experts kept as stored, or dequantized by choice.

mod common;

use std::path::{Path, PathBuf};

use common::{expert_values, read_safetensors, stored_expert, weight_file_hashes, write_safetensors};
use serde_json::{Value, json};
use strata_format::names::{dense_tensors, expert_names, expert_shapes};
use strata_format::{
    Container, ConvertOptions, Error, Family, FfnSpec, GateRank, LatentMoe, MixerSpec, ModelArch, QuantPreset,
    ResidualKind, RouterKind, SharedExperts, SwiGlu, check_config_keys, convert,
};
use strata_kernels::QuantFormat;

fn fixture(checkpoint: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kimi_k3").join(checkpoint)
}

/// The reference's tiny text config (xtask/fixtures/kimi_k3_ref.py
/// `k3_config`): five layers, a block boundary mid-stack, a dense first
/// layer, KDA and MLA on both sides of it.
fn text_config() -> Value {
    json!({
        "model_type": "kimi_linear",
        "vocab_size": 48, "hidden_size": 32, "num_hidden_layers": 5, "intermediate_size": 40,
        "first_k_dense_replace": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 12,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "num_experts": 4,
        "num_experts_per_token": 2, "moe_intermediate_size": 32, "num_shared_experts": 1,
        "routed_expert_hidden_size": 32, "routed_scaling_factor": 2.5, "attn_res_block_size": 2,
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "mla_use_output_gate": true,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
        "linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3, 5], "num_heads": 2, "head_dim": 8,
                               "short_conv_kernel_size": 4, "gate_lower_bound": -4.0}
    })
}

/// The hub's wrapper around [`text_config`].
fn hub_config() -> Value {
    json!({"model_type": "kimi_k3", "architectures": ["KimiK3ForCausalLM"], "text_config": text_config()})
}

fn parse(config: &Value) -> ModelArch {
    ModelArch::from_config_value(config).unwrap()
}

fn refusal(config: &Value) -> String {
    ModelArch::from_config_value(config).unwrap_err().to_string()
}

#[test]
fn a_hub_config_reads_every_block_k3_adds() {
    let arch = parse(&hub_config());
    assert_eq!(arch.core.family, Family::KimiK3);
    let mut full = Vec::new();
    for (l, layer) in arch.layers.iter().enumerate() {
        assert_eq!(layer.residual, ResidualKind::AttentionResiduals { block_size: 2 });
        match &layer.mixer {
            MixerSpec::Mla(mla) => {
                full.push(l);
                assert_eq!((mla.rope, mla.output_gate, mla.latent_norm_eps), (None, true, 1e-5));
            }
            MixerSpec::GatedDeltaNet(gdn) => {
                assert_eq!((gdn.gate_lower_bound, gdn.output_gate_rank), (Some(-4.0), GateRank::Full));
                assert_eq!(gdn.a_log_padded_to, Some(8), "max(heads, head_dim)");
            }
            other => panic!("layer {l}: {other:?}"),
        }
    }
    assert_eq!(full, [2, 4]);
    let situ = SwiGlu::Situ { beta: 4.0, linear_beta: 25.0 };
    assert_eq!(arch.layers[0].ffn, FfnSpec::Dense { intermediate_size: 40, swiglu: situ, global_scale: false });
    let FfnSpec::Moe(moe) = arch.layers[1].ffn else { panic!("layer 1 is MoE") };
    assert_eq!((moe.num_experts, moe.top_k, moe.swiglu), (4, 2, situ));
    assert_eq!(moe.latent, Some(LatentMoe { width: 32, norm_eps: 1e-5 }));
    assert_eq!(moe.shared, SharedExperts::Plain { intermediate_size: 32 });
    let RouterKind::GroupedSigmoid { n_group, topk_group, scaling, .. } = moe.router else { panic!("{moe:?}") };
    assert_eq!((n_group, topk_group, scaling), (1, 1, 2.5));
}

#[test]
fn a_flat_kimi_linear_config_with_k3_keys_is_k3_and_without_them_kimi_linear() {
    assert_eq!(parse(&text_config()), parse(&hub_config()));
    let mut kimi_linear = text_config();
    let map = kimi_linear.as_object_mut().unwrap();
    for key in [
        "routed_expert_hidden_size",
        "attn_res_block_size",
        "activation_situ_beta",
        "activation_situ_linear_beta",
        "mla_use_output_gate",
    ] {
        map.remove(key);
    }
    map["linear_attn_config"].as_object_mut().unwrap().remove("gate_lower_bound");
    let arch = parse(&kimi_linear);
    assert_eq!(arch.core.family, Family::KimiLinear);
    assert!(arch.layers.iter().all(|l| l.residual == ResidualKind::Plain));
}

#[test]
fn a_k3_config_missing_what_only_k3_says_is_refused_naming_it() {
    for key in ["routed_expert_hidden_size", "attn_res_block_size", "routed_scaling_factor"] {
        let mut config = hub_config();
        config["text_config"].as_object_mut().unwrap().remove(key);
        let err = refusal(&config);
        assert!(err.contains(&format!("text_config.{key}")), "{key}: {err}");
    }
    let mut config = hub_config();
    config["text_config"]["model_type"] = json!("deepseek_v3");
    assert!(refusal(&config).contains("is not K3's text model"));
}

#[test]
fn mla_use_output_gate_false_drops_the_mla_gate_only() {
    let mut config = hub_config();
    config["text_config"]["mla_use_output_gate"] = json!(false);
    let arch = parse(&config);
    let names: Vec<String> = dense_tensors(&arch).into_iter().map(|t| t.name).collect();
    assert!(!names.contains(&"language_model.model.layers.2.self_attn.g_proj.weight".to_owned()));
    assert!(names.contains(&"language_model.model.layers.1.self_attn.g_proj.weight".to_owned()), "KDA's stays");
}

#[test]
fn to_config_json_parses_back_to_the_same_architecture() {
    let arch = parse(&hub_config());
    let written = arch.to_config_json();
    assert_eq!(written["model_type"], "kimi_k3");
    assert_eq!(written["text_config"]["model_type"], "kimi_linear");
    assert_eq!(parse(&written), arch);
}

#[test]
fn tensors_are_named_and_shaped_as_the_hub_spells_them() {
    let arch = parse(&hub_config());
    let tensors = dense_tensors(&arch);
    let shape = |name: &str| -> Vec<usize> {
        let full = format!("language_model.model.{name}");
        tensors.iter().find(|t| t.name == full).unwrap_or_else(|| panic!("no {full}")).shape.clone()
    };
    // KDA (layer 1): the full-rank gate, the padded A_log, no low-rank gate.
    assert_eq!(shape("layers.1.self_attn.g_proj.weight"), [16, 32]);
    assert_eq!(shape("layers.1.self_attn.A_log"), [8]);
    assert!(!tensors.iter().any(|t| t.name.contains("g_a_proj") || t.name.contains("g_b_proj")));
    // Gated MLA (layer 2): a gate per head's value.
    assert_eq!(shape("layers.2.self_attn.g_proj.weight"), [16, 32]);
    // The latent MoE (layer 1) and the residual mixes.
    assert_eq!(shape("layers.1.block_sparse_moe.routed_expert_down_proj.weight"), [32, 32]);
    assert_eq!(shape("layers.1.block_sparse_moe.routed_expert_up_proj.weight"), [32, 32]);
    assert_eq!(shape("layers.1.block_sparse_moe.routed_expert_norm.weight"), [32]);
    assert_eq!(shape("layers.1.block_sparse_moe.shared_experts.gate_proj.weight"), [32, 32]);
    assert_eq!(shape("layers.0.mlp.gate_proj.weight"), [40, 32]);
    assert_eq!(shape("layers.3.mlp_res_proj.weight"), [1, 32]);
    assert_eq!(shape("output_attn_res_norm.weight"), [32]);
    assert!(tensors.iter().any(|t| t.name == "language_model.lm_head.weight"));
    assert_eq!(
        expert_names(&arch.core, 1, 3),
        ["w1", "w3", "w2"].map(|w| format!("language_model.model.layers.1.block_sparse_moe.experts.3.{w}.weight"))
    );
}

#[test]
fn the_experts_records_are_sized_by_the_latent_width() {
    let mut config = hub_config();
    config["text_config"]["routed_expert_hidden_size"] = json!(64);
    let arch = parse(&config);
    assert_eq!(expert_shapes(&arch), [[32, 64], [32, 64], [64, 32]]);
    let tensors = dense_tensors(&arch);
    let down = tensors.iter().find(|t| t.name.ends_with("layers.1.block_sparse_moe.routed_expert_down_proj.weight"));
    assert_eq!(down.unwrap().shape, [64, 32]);
}

#[test]
fn situ_betas_that_are_not_positive_are_refused() {
    for (key, value) in [("activation_situ_beta", 0.0), ("activation_situ_linear_beta", -1.0)] {
        let mut config = hub_config();
        config["text_config"][key] = json!(value);
        assert!(refusal(&config).contains(key), "{key}");
    }
}

/// The compressed-tensors `quantization_config` of the hub's MXFP4 experts
/// (testdata/kimi_k3/quantization_config.json).
fn mxfp4_quantization() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kimi_k3/quantization_config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn compressed_tensors_mxfp4_quantization_is_accepted_on_the_wrapper_and_in_the_text_config() {
    let mut hub = hub_config();
    hub["quantization_config"] = mxfp4_quantization();
    assert_eq!(parse(&hub), parse(&hub_config()));
    check_config_keys(&hub, &[]).unwrap();
    let mut nested = hub_config();
    nested["text_config"]["quantization_config"] = mxfp4_quantization();
    assert_eq!(parse(&nested), parse(&hub_config()));
    check_config_keys(&nested, &[]).unwrap();
}

#[test]
fn a_quantization_config_asking_for_anything_but_mxfp4_weights_is_refused_naming_the_key() {
    let group = "/config_groups/group_0";
    let weights = "/config_groups/group_0/weights";
    let cases: [(&str, &str, Value, &str); 12] = [
        ("", "quant_method", json!("fp8"), "quantization_config.quant_method"),
        ("", "format", json!("nvfp4-pack-quantized"), "quantization_config.format"),
        ("", "quantization_status", json!("initialized"), "quantization_config.quantization_status"),
        ("", "kv_cache_scheme", json!({"num_bits": 8}), "quantization_config.kv_cache_scheme"),
        ("", "ignore", json!("lm_head"), "quantization_config.ignore"),
        (group, "format", json!("pack-quantized"), "quantization_config.config_groups.group_0.format"),
        (
            group,
            "input_activations",
            json!({"num_bits": 8}),
            "quantization_config.config_groups.group_0.input_activations",
        ),
        (group, "extra", json!(1), "quantization_config.config_groups.group_0.extra"),
        (weights, "num_bits", json!(8), "quantization_config.config_groups.group_0.weights.num_bits"),
        (weights, "type", json!("int"), "quantization_config.config_groups.group_0.weights.type"),
        (weights, "group_size", json!(16), "quantization_config.config_groups.group_0.weights.group_size"),
        (weights, "dynamic", json!(true), "quantization_config.config_groups.group_0.weights.dynamic"),
    ];
    for (at, key, value, named) in cases {
        let mut quant = mxfp4_quantization();
        quant.pointer_mut(at).unwrap()[key] = value;
        let mut hub = hub_config();
        hub["quantization_config"] = quant.clone();
        let err = refusal(&hub);
        assert!(err.contains(named), "{at}/{key}: {err}");
        let mut nested = hub_config();
        nested["text_config"]["quantization_config"] = quant;
        let err = refusal(&nested);
        assert!(err.contains(&format!("text_config.{named}")), "{at}/{key}: {err}");
    }
    for (at, key) in [("", "config_groups"), (weights, "num_bits"), (weights, "type"), (weights, "group_size")] {
        let mut missing = hub_config();
        missing["quantization_config"] = mxfp4_quantization();
        missing["quantization_config"].pointer_mut(at).unwrap().as_object_mut().unwrap().remove(key);
        let err = refusal(&missing);
        assert!(err.contains(&format!("quantization_config{}.{key}", at.replace('/', "."))), "{key}: {err}");
    }
}

/// The hub's packed experts (`weight_packed`/`weight_scale`) are kept as
/// `mxfp4` records, each matrix's codes and scales byte for byte, whatever
/// the preset (which still sets the dense part's format).
#[test]
fn packed_mxfp4_experts_are_kept_as_the_checkpoint_s_bytes_at_every_preset() {
    let stored: std::collections::HashMap<String, Vec<u8>> =
        read_safetensors(&fixture("hf_mxfp4")).into_iter().map(|(name, _, _, data)| (name, data)).collect();
    let tmp = tempfile::tempdir().unwrap();
    for preset in QuantPreset::ALL {
        let out = tmp.path().join(preset.name());
        convert(fixture("hf_mxfp4"), &out, &ConvertOptions::new(preset)).unwrap();
        let container = Container::open(&out).unwrap();
        let arch = container.arch();
        assert!(!arch.expert_layers().is_empty());
        for layer in arch.expert_layers() {
            for expert in 0..arch.num_experts() {
                let matrices = stored_expert(&container, layer, expert);
                for ((format, codes, scales), w) in matrices.into_iter().zip(["w1", "w3", "w2"]) {
                    let name = format!("language_model.model.layers.{layer}.block_sparse_moe.experts.{expert}.{w}");
                    assert_eq!(format, QuantFormat::Mxfp4, "{preset} {name}");
                    assert_eq!(codes, stored[&format!("{name}.weight_packed")], "{preset} {name}");
                    assert_eq!(scales, stored[&format!("{name}.weight_scale")], "{preset} {name}");
                }
            }
        }
    }
}

/// With `dequantize_mxfp4` the packed experts convert as today: as the f32
/// checkpoint's experts (the same values, on MXFP4's grid) in the preset's
/// format, every weight file the same bits but for the sign of zero.
#[test]
fn dequantized_mxfp4_experts_convert_as_the_f32_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    for preset in QuantPreset::ALL {
        let [f32_experts, packed] =
            common::f32_and_dequantized_mxfp4(&fixture(""), &tmp.path().join(preset.name()), preset);
        let (hashes, want) = (weight_file_hashes(&packed), weight_file_hashes(&f32_experts));
        match preset {
            // The reference's f32 experts hold -0.0 where its packing
            // wrote code 0 (+0), which q8 and q4 store alike.
            QuantPreset::F32 | QuantPreset::Bf16 => assert_eq!(hashes[0], want[0], "{preset}: dense.bin"),
            QuantPreset::Q8 | QuantPreset::Q4 => assert_eq!(hashes, want, "{preset}"),
        }
        for layer in packed.arch().expert_layers() {
            for expert in 0..packed.arch().num_experts() {
                let (got, want) = (expert_values(&packed, layer, expert), expert_values(&f32_experts, layer, expert));
                assert_eq!(got, want, "{preset} layer {layer} expert {expert}");
            }
        }
        assert_eq!(packed.expert_layout(1).unwrap().components[0].format, preset.expert_format());
    }
}

/// An E8M0 scale of 255 (OCP's NaN) is refused at convert, kept or
/// dequantized, naming the matrix and the first value of its block.
#[test]
fn a_nan_e8m0_scale_is_refused_naming_its_block() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = tmp.path().join("hub");
    std::fs::create_dir(&hub).unwrap();
    std::fs::copy(fixture("hf_mxfp4").join("config.json"), hub.join("config.json")).unwrap();
    let mut tensors = read_safetensors(&fixture("hf_mxfp4"));
    let scale = "language_model.model.layers.2.block_sparse_moe.experts.1.w3.weight_scale";
    let (_, shape, _, data) = tensors.iter_mut().find(|t| t.0 == scale).unwrap();
    // Row 3's block 0: value 3 · cols of the matrix.
    data[3 * shape[1]] = 0xFF;
    let cols = shape[1] * 32;
    write_safetensors(&hub.join("model.safetensors"), &tensors);
    let name = scale.replace("weight_scale", "weight");
    let kept = ConvertOptions::new(QuantPreset::Q8);
    let dequantized = ConvertOptions { dequantize_mxfp4: true, ..kept.clone() };
    for (how, options) in [("kept", kept), ("dequantized", dequantized)] {
        let refused = convert(&hub, tmp.path().join(how), &options).unwrap_err();
        // Dequantized, every value of the block is 0 · inf or ±inf.
        let named = matches!(&refused, Error::NonFinite { name: n, index, .. } if *n == name && *index == 3 * cols);
        assert!(named, "{how}: {refused}");
        assert!(!tmp.path().join(how).exists(), "{how}: nothing is published");
    }
}
