//! glm5_next's config.json as transformers writes GLM-5.3-Flash (the
//! multimodal wrapper, `text_config`) and flat, its layer pattern, pooled
//! indexers, bounded KDA gate, hyper-connections and clamp, and its tensor
//! names.

use serde_json::{Value, json};
use strata_format::names::dense_tensors;
use strata_format::{
    FfnKind, FfnSpec, GdnProjections, HyperHead, IndexerKind, MixerSpec, ModelArch, ResidualKind, SwiGlu,
};

fn testdata(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A tiny wrapper config: eight layers, the text fields nested.
fn nested() -> Value {
    json!({
        "model_type": "glm5_next",
        "architectures": ["Glm5NextForConditionalGeneration"],
        "image_token_id": 60,
        "vision_config": {"depth": 1, "hidden_size": 16},
        "text_config": {
            "model_type": "glm5_next_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 8,
            "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16, "q_lora_rank": 12,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 0, "v_head_dim": 8, "intermediate_size": 48,
            "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "index_head_dim": 16,
            "index_n_heads": 8, "index_topk": 8, "index_kpool": 4, "linear_num_heads": 2, "linear_head_dim": 8,
            "hc_mult": 2, "swiglu_limit": 7.0, "rms_norm_eps": 1e-5
        }
    })
}

fn parse(config: &Value) -> ModelArch {
    ModelArch::from_config_value(config).unwrap()
}

fn error(config: &Value) -> String {
    ModelArch::from_config_value(config).unwrap_err().to_string()
}

#[test]
fn a_wrapper_config_reads_the_pattern_pools_gate_streams_and_clamp() {
    let arch = parse(&nested());
    assert_eq!(arch.layer_kinds()[..4], [FfnKind::Dense, FfnKind::Dense, FfnKind::Dense, FfnKind::Moe]);
    for (l, layer) in arch.layers.iter().enumerate() {
        match &layer.mixer {
            MixerSpec::Mla(mla) => {
                assert_eq!(l % 4, 3, "every fourth layer is MLA");
                assert_eq!((mla.rope, mla.latent_norm_eps), (None, 1e-5));
                let ix = mla.indexer.unwrap();
                assert_eq!(
                    (ix.kind, ix.topk, ix.head_dim, ix.n_heads, ix.pool),
                    (IndexerKind::Full, 8, 16, 8, Some(4))
                );
            }
            MixerSpec::GatedDeltaNet(gdn) => {
                assert_eq!(
                    (gdn.dims.projections, gdn.dims.num_v_heads, gdn.dims.head_k_dim),
                    (GdnProjections::Kimi, 2, 8)
                );
                assert_eq!(gdn.gate_lower_bound, Some(-5.0));
            }
            other => panic!("layer {l}: {other:?}"),
        }
        let swiglu = match layer.ffn {
            FfnSpec::Dense { swiglu, .. } => swiglu,
            FfnSpec::Moe(moe) => moe.swiglu,
        };
        assert_eq!(swiglu, SwiGlu::Limited { limit: 7.0 });
        assert_eq!(
            layer.residual,
            ResidualKind::HyperConnections { streams: 2, sinkhorn_iters: 20, eps: 1e-6, head: HyperHead::Mean }
        );
    }
    let exported = arch.to_config_json_from(&nested());
    assert_eq!(exported["vision_config"], nested()["vision_config"], "the wrapper comes back");
    assert_eq!(parse(&exported), arch);
}

/// Glm5NextTextConfig's default pad id (154820) lies outside a small
/// vocabulary, where transformers refuses to build the embedding: an
/// export keeps the source's pad id, or names none.
#[test]
fn an_exported_config_keeps_the_sources_pad_id() {
    let mut config = nested();
    config["text_config"]["pad_token_id"] = json!(0);
    let arch = parse(&config);
    assert_eq!(arch.to_config_json_from(&config)["text_config"]["pad_token_id"], json!(0));
    assert_eq!(arch.to_config_json_from(&nested())["text_config"]["pad_token_id"], Value::Null);
}

#[test]
fn a_flat_config_and_linear_attn_config_read_as_the_class_does() {
    let mut flat = nested()["text_config"].clone();
    flat["model_type"] = json!("glm5_next");
    flat["linear_attn_config"] = json!({"num_heads": 4, "gate_lower_bound": -3.0});
    let arch = parse(&flat);
    let gdn = arch.first_gdn().unwrap();
    assert_eq!((gdn.dims.num_v_heads, gdn.gate_lower_bound), (4, Some(-3.0)));
    // `safe_gate` restores the default bound where none is given.
    flat["linear_attn_config"] = json!({"gate_lower_bound": null});
    assert_eq!(parse(&flat).first_gdn().unwrap().gate_lower_bound, Some(-5.0));
    flat["linear_attn_config"] = json!({"gate_lower_bound": null, "safe_gate": false});
    assert!(error(&flat).contains("linear_lower_bound"));
}

#[test]
fn a_shared_indexer_needs_a_full_mla_layer_right_before_it() {
    let mut config = nested();
    let text = &mut config["text_config"];
    text["layer_types"] = json!(["linear_attention", "indexed_attention", "full_attention", "linear_attention"]);
    text["num_hidden_layers"] = json!(4);
    text["indexer_types"] = json!(["full", "full", "shared", "full"]);
    let arch = parse(&config);
    let MixerSpec::Mla(shared) = &arch.layers[2].mixer else { panic!("layer 2 is MLA") };
    assert_eq!(shared.indexer.unwrap().kind, IndexerKind::Shared);
    // After a KDA layer (which passes no selection on), as transformers
    // raises too.
    config["text_config"]["indexer_types"] = json!(["full", "shared", "full", "full"]);
    let err = error(&config);
    assert!(err.contains("indexer_types") && err.contains("layer 1"), "{err}");
}

#[test]
fn what_glm5_next_does_not_compute_is_refused() {
    for (key, value, named) in [
        ("index_kpool_always_select_tail", json!(false), "index_kpool_always_select_tail"),
        ("index_topk", json!(6), "index_kpool"),
        ("qk_rope_head_dim", json!(8), "qk_rope_head_dim"),
        ("layer_types", json!(vec!["dense"; 8]), "layer_types"),
    ] {
        let mut config = nested();
        config["text_config"][key] = value;
        let err = error(&config);
        assert!(err.contains(named), "{key}: {err}");
    }
}

/// The class defaults, which describe GLM-5.3-Flash, as transformers 5.23
/// writes them (`Glm5NextConfig().to_diff_dict()`).
#[test]
fn the_published_shape_parses_and_costs_what_its_state_says() {
    let arch = ModelArch::from_config_json(&testdata("glm5_next_hub/GLM-5.3-Flash/config.json")).unwrap();
    let mla = arch.layers.iter().filter(|l| matches!(l.mixer, MixerSpec::Mla(_))).count();
    assert_eq!((arch.layers.len(), mla), (45, 11));
    // 512 latent floats and a 128-float key per 16 tokens, per MLA layer.
    assert_eq!(arch.kv_bytes_per_token(), 11 * (512 + 8) * 4);
    let kda_state = 64 * 128 * 128 + 3 * 64 * 128 * 3;
    let open_pool = 2 * 15 * 128;
    assert_eq!(arch.state_bytes_per_sequence(), (34 * kda_state + 11 * open_pool) * 4);
}

#[test]
fn tensors_are_named_as_the_hub_names_them() {
    let arch = parse(&nested());
    let tensors = dense_tensors(&arch);
    let shape = |name: &str| tensors.iter().find(|t| t.name == name).map(|t| t.shape.clone());
    let layer = |l: usize, suffix: &str| format!("model.language_model.layers.{l}.{suffix}");
    assert_eq!(shape(&layer(0, "self_attn.A_log")), Some(vec![2]), "the bounded gate's A_log is per head");
    assert_eq!(shape(&layer(0, "self_attn.q_conv1d.weight")), Some(vec![16, 1, 4]));
    assert_eq!(shape(&layer(3, "self_attn.indexer.index_kpool_compress_gate")), Some(vec![16, 32]));
    assert_eq!(shape(&layer(3, "self_attn.indexer.index_kpool_compress_ape")), Some(vec![4, 16]));
    assert_eq!(shape(&layer(3, "self_attn.indexer.wk.weight")), Some(vec![16, 32]));
    assert_eq!(shape(&layer(3, "mlp.experts.1.gate_proj.weight")), None, "experts live in the expert file");
    assert!(shape("lm_head.weight").is_some());
}
