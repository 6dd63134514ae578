use serde_json::json;

use super::*;
use crate::spec::RopeScaling;

fn flash() -> Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deepseek_v4/flash_shape/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse(config: &Value) -> Result<ModelArch> {
    ModelArch::from_config_value(config)
}

fn attention(arch: &ModelArch, layer: usize) -> SharedKvAttention {
    let MixerSpec::SharedKv(sk) = arch.layers[layer].mixer else { panic!("layer {layer}: {:?}", arch.layers[layer]) };
    sk
}

fn router(arch: &ModelArch, layer: usize) -> RouterKind {
    let FfnSpec::Moe(moe) = arch.layers[layer].ffn else { panic!("layer {layer} is not MoE") };
    moe.router
}

/// The hub's spelling: `compress_ratios` (one entry past the last
/// layer, for MTP), `num_hash_layers`, a flat YaRN for the compressed
/// layers only, `qk_rope_head_dim`.
#[test]
fn the_hub_spelling_gives_each_layer_its_compression_rope_and_router() {
    let arch = parse(&flash()).unwrap();
    assert_eq!(arch.layers.len(), 43);
    let (sliding, csa, hca) = (attention(&arch, 0), attention(&arch, 2), attention(&arch, 3));
    assert_eq!(sliding.compression, None);
    assert_eq!(sliding.rope, RopeSpec { theta: 10_000.0, scaling: RopeScaling::None, rotary_dim: 64 });
    let indexer = CompressedIndexer { n_heads: 64, head_dim: 128, topk: 512 };
    assert_eq!(csa.compression, Some(Compression::Sparse { ratio: 4, indexer }));
    assert_eq!(hca.compression, Some(Compression::Heavy { ratio: 128 }));
    assert_eq!(csa.rope, hca.rope);
    assert_eq!(hca.rope.theta, 160_000.0);
    assert_eq!(hca.rope.rotary_dim, 64);
    let RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, .. } = hca.rope.scaling else {
        panic!("{:?}", hca.rope)
    };
    // __post_init__ forces YaRN's attention factor to 1 on compressed layers.
    assert_eq!((factor, original_max_position_embeddings, attention_factor), (16.0, 65_536, Some(1.0)));
    let counts = |kind: fn(&SharedKvAttention) -> bool| (0..43).filter(|&l| kind(&attention(&arch, l))).count();
    assert_eq!(counts(|a| a.compression.is_none()), 2);
    assert_eq!(counts(|a| matches!(a.compression, Some(Compression::Sparse { .. }))), 21);
    assert_eq!(counts(|a| matches!(a.compression, Some(Compression::Heavy { .. }))), 20);
    assert_eq!(router(&arch, 2), RouterKind::Hash { scaling: 1.5 });
    assert_eq!(router(&arch, 3), RouterKind::SqrtSoftplus { scaling: 1.5 });
    let FfnSpec::Moe(moe) = arch.layers[5].ffn else { unreachable!() };
    assert_eq!(moe.swiglu, SwiGlu::Limited { limit: 10.0 });
    assert_eq!(moe.shared, SharedExperts::Plain { intermediate_size: 2048 });
    assert_eq!(
        arch.layers[7].residual,
        ResidualKind::HyperConnections { streams: 4, sinkhorn_iters: 20, eps: 1e-6, head: HyperHead::Sigmoid }
    );
}

/// transformers' own spelling (`layer_types`, `mlp_layer_types`,
/// `compress_rates`, nested `main` / `compress` ropes), which export
/// writes, reads back to the same architecture.
#[test]
fn an_exported_config_reads_back_to_the_same_architecture() {
    let arch = parse(&flash()).unwrap();
    let exported = arch.to_config_json();
    assert!(exported["rope_parameters"]["compress"].is_object(), "{exported}");
    assert_eq!(exported["layer_types"][2], json!("compressed_sparse_attention"));
    assert_eq!(exported["mlp_layer_types"][2], json!("hash_moe"));
    assert_eq!(parse(&exported).unwrap(), arch);
    crate::check_config_keys(&exported, &[]).unwrap();
}

#[test]
fn legacy_compress_rate_scalars_win_over_compress_rates() {
    let mut config = flash();
    config["compress_rates"] = json!({"compressed_sparse_attention": 8, "heavily_compressed_attention": 64});
    config["compress_rate_hca"] = json!(32);
    let arch = parse(&config).unwrap();
    assert!(matches!(attention(&arch, 2).compression, Some(Compression::Sparse { ratio: 8, .. })));
    assert_eq!(attention(&arch, 3).compression, Some(Compression::Heavy { ratio: 32 }));
}

#[test]
fn without_layer_lists_the_class_defaults_apply() {
    let mut config = flash();
    let map = config.as_object_mut().unwrap();
    map.remove("compress_ratios");
    map.remove("num_hash_layers");
    let arch = parse(&config).unwrap();
    // Two HCA layers, then HCA and CSA alternating; three hash layers.
    let heavy = |l: usize| matches!(attention(&arch, l).compression, Some(Compression::Heavy { .. }));
    assert_eq!((0..5).map(heavy).collect::<Vec<_>>(), [true, true, true, false, true]);
    assert_eq!(router(&arch, 2), RouterKind::Hash { scaling: 1.5 });
    assert_eq!(router(&arch, 3), RouterKind::SqrtSoftplus { scaling: 1.5 });
}

#[test]
fn a_deepseek_v4_1_config_is_refused_naming_what_it_adds() {
    for key in ["engram_layer_ids", "kv_source_layers", "index_source_layers", "candidate_topk_blocks"] {
        let mut config = flash();
        config[key] = json!([1, 3]);
        let error = parse(&config).unwrap_err().to_string();
        assert!(error.contains(key) && error.contains("V4.1"), "{key}: {error}");
        for adds in ["engram", "compressed-KV", "two-level"] {
            assert!(error.contains(adds), "{key}: names {adds}: {error}");
        }
        assert_eq!(error.lines().count(), 1, "{error}");
    }
}

#[test]
fn what_the_v4_model_cannot_run_is_refused_naming_the_key() {
    let cases = [
        ("scoring_func", json!("softmax")),
        ("norm_topk_prob", json!(false)),
        ("num_key_value_heads", json!(2)),
        ("compress_ratios", json!([0, 0, 4, 1])),
        ("compress_ratios", json!([0, 4])),
        ("mlp_layer_types", json!(["moe", "dense"])),
        ("layer_types", json!(["full_attention"])),
        // transformers builds one shared expert whatever the count says.
        ("n_shared_experts", json!(0)),
        ("n_shared_experts", json!(2)),
    ];
    for (key, value) in cases {
        let mut config = flash();
        config[key] = value.clone();
        let error = parse(&config).unwrap_err().to_string();
        assert!(error.contains(key), "{key} = {value}: {error}");
    }
}

#[test]
fn the_mtp_module_is_known_unused_and_other_stray_tensors_are_not() {
    let arch = parse(&flash()).unwrap();
    let unread = ["mtp.0.attn.wq_a.weight", "model.layers.0.self_attn.stray.weight"].map(str::to_owned);
    let unknown = crate::family::unknown_tensors(&arch, &unread.into_iter().collect());
    assert_eq!(unknown, ["model.layers.0.self_attn.stray.weight"]);
}
