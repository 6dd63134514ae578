use serde_json::{Value, json};

use super::*;
use crate::spec::LayerSpec;

/// The Hub's wrapper config with `InklingTextConfig`'s defaults (the 975B
/// model's shapes).
fn hub() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling_hub/inkling/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn attention(layer: &LayerSpec) -> &InklingAttention {
    match &layer.mixer {
        MixerSpec::Inkling(ink) => ink,
        other => panic!("{other:?}"),
    }
}

/// A small flat text config (as `save_pretrained` writes it): sliding and
/// full layers, a dense first layer, log scaling.
fn small_text() -> Value {
    json!({
        "model_type": "inkling_text", "vocab_size": 96, "unpadded_vocab_size": 90, "hidden_size": 32,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "swa_num_attention_heads": 6, "swa_num_key_value_heads": 3, "swa_head_dim": 6, "sliding_window_size": 5,
        "d_rel": 4, "rel_extent": 7, "log_scaling_n_floor": 3, "log_scaling_alpha": 0.25,
        "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "conv_kernel_size": 3,
        "intermediate_size": 40, "moe_intermediate_size": 12, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 2, "route_scale": 2.5, "logits_mup_width_multiplier": 3.0, "rms_norm_eps": 1e-5
    })
}

fn parse(config: &Value) -> Result<ModelArch> {
    ModelArch::from_config_value(config)
}

#[test]
fn the_hub_config_slides_five_layers_of_six_with_their_own_heads_and_window() {
    let arch = parse(&hub()).unwrap();
    assert_eq!(arch.core.family, Family::Inkling);
    assert_eq!(arch.layers.len(), 66);
    for (l, layer) in arch.layers.iter().enumerate() {
        let ink = attention(layer);
        if (l + 1) % 6 == 0 {
            assert_eq!((ink.num_heads, ink.num_kv_heads, ink.head_dim, ink.sliding_window), (64, 8, 128, None));
            assert_eq!(ink.rel_extent, 1024, "layer {l}");
        } else {
            assert_eq!((ink.num_heads, ink.num_kv_heads, ink.sliding_window), (64, 16, Some(512)), "layer {l}");
            assert_eq!(ink.rel_extent, 512, "a sliding layer's bias spans its window");
        }
        assert_eq!((ink.d_rel, ink.conv_kernel, ink.log_scaling), (16, 4, None));
        assert_eq!(layer.ffn_output_conv, Some(ShortConv { kernel: 4, channels: 6144 }));
    }
    let FfnSpec::Moe(moe) = &arch.layers[0].ffn else { panic!("dense_mlp_idx 0: every layer is MoE") };
    // With dense_intermediate_size, intermediate_size is the experts' width.
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate_size), (256, 6, 3072));
    assert_eq!(moe.shared, SharedExperts::Sink { count: 2, intermediate_size: 3072 });
    assert_eq!(moe.router, RouterKind::SharedExpertSink { route_scale: 8.0 });
    assert_eq!(moe.router_rows(), 258);
    let core = &arch.core;
    assert_eq!((core.unpadded_vocab_size, core.logits_mup_divisor), (Some(200_058), Some(24.0)));
    assert_eq!(core.embed_norm, Some(NormKind::Weight { eps: 1e-6 }));
    assert!(!core.tie_word_embeddings);
}

/// `strata info`'s figures for the published shapes (docs/inkling.md):
/// 11 full layers' keys and values per token; per sequence the sliding
/// rings and four short-convolution states per layer.
#[test]
fn the_hub_config_keeps_88_kib_per_token_and_452_mib_per_sequence() {
    let arch = parse(&hub()).unwrap();
    assert_eq!(arch.kv_bytes_per_token(), 11 * 2 * 8 * 128 * 4);
    assert_eq!(arch.kv_bytes_per_token(), 88 << 10);
    let rings = 55 * 512 * 2 * 16 * 128;
    let sliding_convs = 55 * 3 * (2 * 16 * 128 + 2 * 6144);
    let full_convs = 11 * 3 * (2 * 8 * 128 + 2 * 6144);
    assert_eq!(sliding_convs + full_convs, 55 * (48 << 10) + 11 * (42 << 10));
    assert_eq!(arch.state_bytes_per_sequence(), 4 * (rings + sliding_convs + full_convs));
}

#[test]
fn a_saved_text_config_reads_its_layer_lists_and_scales_full_layers_only() {
    let arch = parse(&small_text()).unwrap();
    let sliding = attention(&arch.layers[0]);
    assert_eq!((sliding.num_heads, sliding.num_kv_heads, sliding.head_dim), (6, 3, 6));
    assert_eq!((sliding.sliding_window, sliding.rel_extent, sliding.log_scaling), (Some(5), 5, None));
    let full = attention(&arch.layers[1]);
    assert_eq!((full.num_heads, full.num_kv_heads, full.head_dim, full.rel_extent), (4, 2, 8, 7));
    assert_eq!(full.log_scaling, Some(LogScaling { n_floor: 3, alpha: 0.25 }));
    assert_eq!(arch.layers[0].ffn, FfnSpec::Dense { intermediate_size: 40, swiglu: SwiGlu::Plain, global_scale: true });
    assert!(matches!(arch.layers[1].ffn, FfnSpec::Moe(MoeBlock { intermediate_size: 12, .. })));
}

#[test]
fn the_exported_config_parses_back_to_the_same_model() {
    for config in [small_text(), hub()] {
        let arch = parse(&config).unwrap();
        let exported = arch.to_config_json();
        assert_eq!(exported["model_type"], "inkling_text");
        assert_eq!(parse(&exported).unwrap(), arch, "{exported}");
    }
}

#[test]
fn local_layer_ids_and_dense_mlp_idx_stand_in_for_the_lists() {
    let mut config = small_text();
    let map = config.as_object_mut().unwrap();
    map.remove("layer_types");
    map.remove("mlp_layer_types");
    map.insert("local_layer_ids".into(), json!([1, 2]));
    map.insert("dense_mlp_idx".into(), json!(2));
    let arch = parse(&config).unwrap();
    let slides: Vec<bool> = arch.layers.iter().map(|l| attention(l).sliding_window.is_some()).collect();
    assert_eq!(slides, [false, true, true, false]);
    assert_eq!(arch.layer_kinds(), [FfnKind::Dense, FfnKind::Dense, FfnKind::Moe, FfnKind::Moe]);
}

#[test]
fn a_kernel_spelled_twice_must_agree() {
    let mut config = small_text();
    config["sconv_kernel_size"] = json!(4);
    let err = parse(&config).unwrap_err().to_string();
    assert!(err.contains("conv_kernel_size = 3 contradicts sconv_kernel_size = 4"), "{err}");
    config["sconv_kernel_size"] = json!(3);
    parse(&config).unwrap();
}

#[test]
fn out_of_range_inkling_sizes_are_refused_naming_the_field() {
    for (key, value, field) in [
        ("conv_kernel_size", json!(1), "conv_kernel_size"),
        ("conv_kernel_size", json!(65), "conv_kernel_size"),
        ("d_rel", json!(0), "d_rel"),
        ("rel_extent", json!((1u64 << 24) + 1), "rel_extent"),
        ("swa_num_key_value_heads", json!(4), "num_key_value_heads"),
        ("n_shared_experts", json!(0), "n_shared_experts"),
        ("unpadded_vocab_size", json!(97), "unpadded_vocab_size"),
        ("log_scaling_n_floor", json!(0), "log_scaling_n_floor"),
        ("logits_mup_width_multiplier", json!(0.0), "logits_mup_width_multiplier"),
    ] {
        let mut config = small_text();
        config[key] = value;
        let err = parse(&config).unwrap_err().to_string();
        assert!(err.contains(field), "{key}: {err}");
    }
}

#[test]
fn the_sink_router_and_its_shared_experts_come_together() {
    let arch = parse(&small_text()).unwrap();
    let mut lone = arch.clone();
    let FfnSpec::Moe(moe) = &mut lone.layers[1].ffn else { panic!() };
    moe.shared = SharedExperts::None;
    let err = lone.validate().unwrap_err().to_string();
    assert!(err.contains("sink"), "{err}");
    let mut plain = arch;
    let FfnSpec::Moe(moe) = &mut plain.layers[1].ffn else { panic!() };
    moe.router = RouterKind::SoftmaxTopK { renormalize: false };
    assert!(plain.validate().is_err());
}

/// The hub's wrapper declares its MTP layer in `mtp_config` (one, no
/// sliding one, no chain norm): a full-attention Inkling layer whose MLP is
/// dense, as wide as `dense_intermediate_size` (`InklingMLP` reads
/// `intermediate_size`, which that key overrides) with its `global_scale`,
/// and the form `MtpModel` gives Inkling: the hidden state first, no
/// output norm.
#[test]
fn the_hub_wrappers_mtp_config_declares_one_full_layer_with_a_dense_mlp() {
    let arch = parse(&hub()).unwrap();
    let [mtp] = arch.mtp.as_slice() else { panic!("{:?}", arch.mtp) };
    let ink = attention(mtp);
    assert_eq!((ink.num_heads, ink.num_kv_heads, ink.head_dim, ink.sliding_window), (64, 8, 128, None));
    assert_eq!((ink.rel_extent, ink.conv_kernel), (1024, 4));
    assert_eq!(mtp.ffn, FfnSpec::Dense { intermediate_size: 24576, swiglu: SwiGlu::Plain, global_scale: true });
    assert_eq!(mtp.ffn_output_conv, Some(ShortConv { kernel: 4, channels: 6144 }));
    assert_eq!(arch.mtp_form, MtpForm { hidden_first: true, output_norm: MtpOutputNorm::Unnormed });
    assert_eq!(arch.expert_layers().len(), 66, "the MTP layer has no expert file");
}

/// `InklingConfig.__post_init__` only `setdefault`s the text model's MTP
/// keys from `mtp_config`: a key the text model has wins, null included.
#[test]
fn the_text_models_own_mtp_keys_win_over_the_wrappers_null_included() {
    let mut config = hub();
    config["mtp_config"] =
        json!({"num_nextn_predict_layers": 2, "chain_hidden_post_norm": true, "local_layer_ids": [1]});
    let arch = parse(&config).unwrap();
    let slides: Vec<bool> = arch.mtp.iter().map(|l| attention(l).sliding_window.is_some()).collect();
    assert_eq!(slides, [false, true]);
    assert_eq!(attention(&arch.mtp[1]).rel_extent, 512, "a sliding MTP layer's bias spans its window");
    assert_eq!(arch.mtp_form.output_norm, MtpOutputNorm::Chain);
    config["text_config"]["chain_hidden_post_norm"] = json!(false);
    config["text_config"]["mtp_local_layer_ids"] = json!([0]);
    let arch = parse(&config).unwrap();
    assert_eq!(arch.mtp_form.output_norm, MtpOutputNorm::Unnormed);
    assert!(attention(&arch.mtp[0]).sliding_window.is_some() && attention(&arch.mtp[1]).sliding_window.is_none());
    config["text_config"]["num_mtp_layers"] = json!(null);
    assert!(parse(&config).unwrap().mtp.is_empty(), "the text model's null wins");
}

/// A saved text model's own keys: every form `MtpModel` builds for
/// Inkling, each exported and read back as it was.
#[test]
fn a_saved_text_configs_mtp_keys_give_the_form_and_export_back() {
    for (hidden_first, chain) in [(true, false), (false, true)] {
        let mut config = small_text();
        config["num_mtp_layers"] = json!(2);
        config["mtp_local_layer_ids"] = json!([0, 5]);
        config["mtp_hidden_states_first"] = json!(hidden_first);
        config["chain_hidden_post_norm"] = json!(chain);
        let arch = parse(&config).unwrap();
        let output_norm = if chain { MtpOutputNorm::Chain } else { MtpOutputNorm::Unnormed };
        assert_eq!(arch.mtp_form, MtpForm { hidden_first, output_norm });
        assert_eq!(attention(&arch.mtp[0]).num_heads, 6, "sliding: the swa heads");
        assert_eq!(attention(&arch.mtp[1]).log_scaling, Some(LogScaling { n_floor: 3, alpha: 0.25 }));
        assert_eq!(
            arch.mtp[1].ffn,
            FfnSpec::Dense { intermediate_size: 40, swiglu: SwiGlu::Plain, global_scale: true }
        );
        assert_eq!(parse(&arch.to_config_json()).unwrap(), arch);
    }
}

#[test]
fn mtp_layers_past_the_limit_are_refused_naming_the_key_that_declares_them() {
    let mut config = small_text();
    config["num_mtp_layers"] = json!(MAX_MTP_LAYERS + 1);
    let err = parse(&config).unwrap_err().to_string();
    assert!(err.contains("num_mtp_layers") && err.contains("at most"), "{err}");
    let mut config = hub();
    config["mtp_config"]["num_nextn_predict_layers"] = json!(u64::MAX);
    let err = parse(&config).unwrap_err().to_string();
    assert!(err.contains("num_nextn_predict_layers"), "{err}");
}

/// The MTP layers' tensors: the canonical names are the stack's layers
/// `num_hidden_layers + k` (and the chain norm's own), each found under
/// the hub's `model.mtp.` name; no per-layer head norm in Inkling's form.
#[test]
fn the_mtp_tensors_are_the_hubs_model_mtp_ones() {
    let mut config = small_text();
    config["num_mtp_layers"] = json!(2);
    config["chain_hidden_post_norm"] = json!(true);
    let arch = parse(&config).unwrap();
    let names: Vec<String> = crate::names::dense_tensors(&arch).into_iter().map(|d| d.name).collect();
    let hub_of = |name: &str| {
        assert!(names.iter().any(|n| n == name), "{name} is not a tensor of the model");
        crate::names::aliases(&arch, name)
    };
    for (canonical, hub) in [
        ("model.layers.4.hnorm.weight", "model.mtp.layers.0.hidden_norm.weight"),
        ("model.layers.4.enorm.weight", "model.mtp.layers.0.embed_norm.weight"),
        ("model.layers.5.eh_proj.weight", "model.mtp.layers.1.input_proj.weight"),
        ("model.layers.5.self_attn.q_proj.weight", "model.mtp.layers.1.transformer_block.attn.wq_du.weight"),
        ("model.layers.4.self_attn.k_sconv.conv1d.weight", "model.mtp.layers.0.transformer_block.attn.k_sconv.weight"),
        ("model.layers.4.input_layernorm.weight", "model.mtp.layers.0.transformer_block.attn_norm.weight"),
        ("model.layers.4.mlp.down_proj.weight", "model.mtp.layers.0.transformer_block.mlp.w2_md.weight"),
        // Read from the pair `mlp.w13_dn` (checkpoint/paired.rs).
        ("model.layers.4.mlp.gate_proj.weight", "model.mtp.layers.0.transformer_block.mlp.gate_proj.weight"),
        ("model.layers.5.mlp.global_scale", "model.mtp.layers.1.transformer_block.mlp.global_scale"),
        ("model.layers.5.mlp_sconv.conv1d.weight", "model.mtp.layers.1.transformer_block.mlp_sconv.weight"),
    ] {
        assert!(hub_of(canonical).iter().any(|n| n == hub), "{canonical}: {:?}", hub_of(canonical));
    }
    assert!(names.iter().any(|n| n == "model.mtp.chain_norm.weight"));
    assert!(!names.iter().any(|n| n.contains("shared_head")), "no per-layer norm");
    assert!(hub_of("model.layers.3.self_attn.q_proj.weight").iter().all(|n| !n.contains("mtp")), "a stack layer");
    config["chain_hidden_post_norm"] = json!(false);
    let unnormed = crate::names::dense_tensors(&parse(&config).unwrap());
    assert!(unnormed.iter().all(|d| !d.name.contains("chain_norm")));
}
