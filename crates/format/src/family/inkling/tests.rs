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
