//! Tests of config.json parsing: both spellings of each family (field sets
//! taken from published Hub configs and from transformers 5.23's
//! `to_json_string(use_diff=False)`), defaults, and error messages.

use super::*;

/// allenai/OLMoE-1B-7B-0924 (transformers 4.x era).
const OLMOE_4X: &str = r#"{
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
  "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 64,
  "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
  "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": true,
  "vocab_size": 50304
}"#;

/// OlmoeConfig as transformers 5.23 saves it.
const OLMOE_5X: &str = r#"{
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": null, "clip_qkv": 8.0, "dtype": "bfloat16", "eos_token_id": 50279,
  "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 32,
  "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": false,
  "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "output_router_logits": false, "pad_token_id": 1,
  "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "router_aux_loss_coef": 0.01, "tie_word_embeddings": false, "transformers_version": "5.23.0",
  "use_cache": true, "vocab_size": 128
}"#;

/// Qwen/Qwen3-30B-A3B (transformers 4.51).
const QWEN_4X: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
}"#;

/// Qwen3MoeConfig as transformers 5.23 saves it: `num_local_experts`
/// (attribute_map alias), `rope_parameters`, `dtype`.
const QWEN_5X: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": null, "decoder_sparse_step": 2, "dtype": "bfloat16", "eos_token_id": [1, 2],
  "head_dim": 16, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
  "intermediate_size": 96, "max_position_embeddings": 32768, "mlp_only_layers": [3],
  "model_type": "qwen3_moe", "moe_intermediate_size": 24, "norm_topk_prob": true,
  "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
  "num_key_value_heads": 2, "num_local_experts": 8, "output_router_logits": false,
  "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": true,
  "transformers_version": "5.23.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 64
}"#;

/// mistralai/Mixtral-8x7B-v0.1 (transformers 4.36).
const MIXTRAL_4X: &str = r#"{
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000
}"#;

/// MixtralConfig as transformers 5.23 saves it (`head_dim: null`).
const MIXTRAL_5X: &str = r#"{
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "head_dim": null, "hidden_act": "silu",
  "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
  "max_position_embeddings": 131072, "model_type": "mixtral", "num_attention_heads": 4,
  "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "num_local_experts": 4, "output_router_logits": false, "pad_token_id": null,
  "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 4.0},
  "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true,
  "vocab_size": 64
}"#;

fn parse(text: &str) -> ModelSpec {
    ModelSpec::from_config_json(text).unwrap_or_else(|e| panic!("{e}"))
}

/// Parses `base` with `edit` applied to its JSON object.
fn parse_edited(base: &str, edit: impl FnOnce(&mut Map<String, Value>)) -> Result<ModelSpec> {
    let mut v: Value = serde_json::from_str(base).unwrap();
    edit(v.as_object_mut().unwrap());
    ModelSpec::from_config_value(&v)
}

#[test]
fn olmoe_4x() {
    let s = parse(OLMOE_4X);
    assert_eq!(s.family, Family::Olmoe);
    assert_eq!((s.vocab_size, s.hidden_size, s.num_layers), (50304, 2048, 16));
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (16, 16, 128));
    assert_eq!(s.moe, MoeSpec { num_experts: 64, top_k: 8, intermediate_size: 1024, norm_topk_prob: false });
    assert_eq!(s.qk_norm, QkNorm::Full);
    assert_eq!(s.clip_qkv, None);
    assert_eq!(s.rope, RopeSpec { theta: 10000.0, scaling: RopeScaling::None, rotary_dim: 128 });
    assert_eq!(s.rms_norm_eps, 1e-5);
    assert_eq!(s.layers, vec![FfnKind::Moe; 16]);
    assert_eq!((s.bos_token_id, s.eos_token_ids.as_slice()), (None, &[50279][..]));
    assert!(!s.tie_word_embeddings && !s.attention_bias);
    assert_eq!(s.sliding_window, None);
}

#[test]
fn olmoe_5x() {
    let s = parse(OLMOE_5X);
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (4, 2, 16));
    assert_eq!(s.clip_qkv, Some(8.0));
    assert_eq!(s.moe.intermediate_size, 32);
    assert_eq!(s.rope.theta, 10000.0);
    assert_eq!(s.q_dim(), 64);
    assert_eq!(s.kv_dim(), 32);
}

#[test]
fn qwen3_moe_4x() {
    let s = parse(QWEN_4X);
    assert_eq!(s.family, Family::Qwen3Moe);
    // head_dim is explicit and differs from hidden/heads = 64.
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (32, 4, 128));
    assert_eq!(s.moe, MoeSpec { num_experts: 128, top_k: 8, intermediate_size: 768, norm_topk_prob: true });
    // No layer is dense: the flat spec, made from the layers, keeps no
    // dense width (`intermediate_size` 6144 is used by no block).
    assert_eq!(s.dense_intermediate_size, 0);
    assert_eq!(s.qk_norm, QkNorm::PerHead);
    assert_eq!(s.rope.theta, 1e6);
    assert_eq!(s.rms_norm_eps, 1e-6);
    assert_eq!(s.max_position_embeddings, 40960);
    assert_eq!(s.layers, vec![FfnKind::Moe; 48]);
    assert_eq!((s.bos_token_id, s.eos_token_ids.as_slice()), (Some(151643), &[151645][..]));
    assert_eq!(s.sliding_window, None);
}

#[test]
fn qwen3_moe_5x_dense_layers_and_aliases() {
    let s = parse(QWEN_5X);
    assert_eq!(s.moe.num_experts, 8, "num_local_experts alias");
    // step 2: layers 1 and 3 are sparse, but 3 is in mlp_only_layers.
    assert_eq!(s.layers, vec![FfnKind::Dense, FfnKind::Moe, FfnKind::Dense, FfnKind::Dense]);
    assert_eq!(s.moe_layers(), vec![1]);
    assert!(s.is_moe(1) && !s.is_moe(0) && !s.is_moe(99));
    assert_eq!(s.dense_intermediate_size, 96);
    assert_eq!(s.moe.intermediate_size, 24);
    assert_eq!(s.eos_token_ids, vec![1, 2]);
    assert_eq!(s.bos_token_id, None);
    assert!(s.tie_word_embeddings);
    assert_eq!(s.rope.theta, 1e6);
}

#[test]
fn qwen3_moe_sliding_window_needs_use_sliding_window() {
    let off = parse_edited(QWEN_5X, |m| {
        m.insert("sliding_window".into(), json!(128));
    })
    .unwrap();
    assert_eq!(off.sliding_window, None);
    let on = parse_edited(QWEN_5X, |m| {
        m.insert("sliding_window".into(), json!(128));
        m.insert("use_sliding_window".into(), json!(true));
    })
    .unwrap();
    assert_eq!(on.sliding_window, Some(128));
}

#[test]
fn mixtral_4x() {
    let s = parse(MIXTRAL_4X);
    assert_eq!(s.family, Family::Mixtral);
    assert_eq!((s.num_heads, s.num_kv_heads, s.head_dim), (32, 8, 128));
    assert_eq!(s.moe, MoeSpec { num_experts: 8, top_k: 2, intermediate_size: 14336, norm_topk_prob: true });
    assert_eq!(s.qk_norm, QkNorm::None);
    assert_eq!(s.rope.theta, 1e6);
    assert_eq!(s.sliding_window, None);
    assert_eq!((s.bos_token_id, s.eos_token_ids.as_slice()), (Some(1), &[2][..]));
}

#[test]
fn mixtral_5x_linear_rope_and_null_head_dim() {
    let s = parse(MIXTRAL_5X);
    assert_eq!(s.head_dim, 8, "null head_dim falls back to hidden/heads");
    assert_eq!(s.rope.scaling, RopeScaling::Linear { factor: 4.0 });
    assert_eq!(s.rope.theta, 1e6);
    assert_eq!(s.sliding_window, Some(4096));
    assert_eq!(s.moe.num_experts, 4);
}

#[test]
fn legacy_rope_scaling_spellings() {
    // 4.x: {"type": "linear"} next to a top-level rope_theta.
    let s = parse_edited(MIXTRAL_4X, |m| {
        m.insert("rope_scaling".into(), json!({"type": "linear", "factor": 2.0}));
    })
    .unwrap();
    assert_eq!(s.rope.scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(s.rope.theta, 1e6);
    // rope_type "default" and a missing theta: the family default.
    let s = parse_edited(OLMOE_4X, |m| {
        m.remove("rope_theta");
        m.insert("rope_scaling".into(), json!({"rope_type": "default"}));
    })
    .unwrap();
    assert_eq!((s.rope.theta, s.rope.scaling), (10000.0, RopeScaling::None));
    let s = parse_edited(MIXTRAL_4X, |m| {
        m.remove("rope_theta");
    })
    .unwrap();
    assert_eq!(s.rope.theta, 1e6, "MixtralConfig.default_theta");
}

#[test]
fn unsupported_rope_type_is_named() {
    let err = parse_edited(QWEN_4X, |m| {
        m.insert(
            "rope_scaling".into(),
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
        );
    })
    .unwrap_err();
    assert!(matches!(&err, Error::UnsupportedRope { rope_type } if rope_type == "yarn"), "{err}");
    assert!(err.to_string().contains("unsupported rope_type \"yarn\""), "{err}");
    let err = parse_edited(QWEN_4X, |m| {
        m.insert("rope_scaling".into(), json!({"rope_type": "linear"}));
    })
    .unwrap_err();
    assert!(err.to_string().contains("rope_scaling.factor"), "{err}");
}

#[test]
fn unknown_model_type_lists_supported() {
    let err = parse_edited(OLMOE_4X, |m| {
        m.insert("model_type".into(), json!("llama"));
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\"llama\"") && msg.contains("olmoe, qwen3_moe, mixtral"), "{msg}");
    let err = parse_edited(OLMOE_4X, |m| {
        m.remove("model_type");
    })
    .unwrap_err();
    assert!(err.to_string().contains("model_type"), "{err}");
}

#[test]
fn missing_fields_are_named() {
    for (base, field) in [
        (OLMOE_4X, "hidden_size"),
        (OLMOE_4X, "num_experts"),
        (QWEN_4X, "moe_intermediate_size"),
        (QWEN_4X, "vocab_size"),
        (MIXTRAL_4X, "num_local_experts"),
        (MIXTRAL_4X, "num_experts_per_tok"),
        (MIXTRAL_4X, "intermediate_size"),
    ] {
        let err = parse_edited(base, |m| {
            m.remove(field);
        })
        .unwrap_err();
        assert!(matches!(&err, Error::MissingField { field: f } if f == field), "{field}: {err}");
        assert!(err.to_string().contains(field));
    }
}

#[test]
fn invalid_fields_are_named() {
    type Edit = Box<dyn FnOnce(&mut Map<String, Value>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            OLMOE_4X,
            Box::new(|m| {
                m.insert("hidden_size".into(), json!("big"));
            }),
            "hidden_size",
        ),
        (
            OLMOE_4X,
            Box::new(|m| {
                m.insert("num_key_value_heads".into(), json!(5));
            }),
            "num_key_value_heads",
        ),
        (
            OLMOE_4X,
            Box::new(|m| {
                m.insert("num_experts_per_tok".into(), json!(65));
            }),
            "num_experts_per_tok",
        ),
        (
            OLMOE_4X,
            Box::new(|m| {
                m.insert("head_dim".into(), json!(64));
            }),
            "head_dim",
        ),
        (
            OLMOE_4X,
            Box::new(|m| {
                m.insert("hidden_act".into(), json!("gelu"));
            }),
            "hidden_act",
        ),
        (
            OLMOE_4X,
            Box::new(|m| {
                m.insert("num_hidden_layers".into(), json!(-1));
            }),
            "num_hidden_layers",
        ),
        (
            QWEN_4X,
            Box::new(|m| {
                m.insert("decoder_sparse_step".into(), json!(0));
            }),
            "decoder_sparse_step",
        ),
        (
            QWEN_4X,
            Box::new(|m| {
                m.insert("mlp_only_layers".into(), json!([48]));
            }),
            "mlp_only_layers",
        ),
        (
            QWEN_4X,
            Box::new(|m| {
                m.insert("num_local_experts".into(), json!(64));
            }),
            "num_experts",
        ),
        (
            QWEN_4X,
            Box::new(|m| {
                m.insert("eos_token_id".into(), json!([1, -2]));
            }),
            "eos_token_id",
        ),
        (
            MIXTRAL_4X,
            Box::new(|m| {
                m.insert("rope_scaling".into(), json!(3));
            }),
            "rope_scaling",
        ),
        (
            MIXTRAL_4X,
            Box::new(|m| {
                m.insert("rms_norm_eps".into(), json!(0.0));
            }),
            "rms_norm_eps",
        ),
    ];
    for (base, edit, field) in cases {
        let err = parse_edited(base, edit).unwrap_err();
        assert!(matches!(&err, Error::InvalidField { field: f, .. } if f == field), "{field}: {err}");
    }
}

#[test]
fn malformed_json_is_an_error() {
    for text in ["", "{", "[1, 2]", "null", "{\"model_type\": 3}"] {
        assert!(ModelSpec::from_config_json(text).is_err(), "{text:?}");
    }
}

#[test]
fn kv_heads_defaults_follow_transformers() {
    // null -> num_attention_heads (every __post_init__).
    let s = parse_edited(MIXTRAL_4X, |m| {
        m.insert("num_key_value_heads".into(), Value::Null);
    })
    .unwrap();
    assert_eq!(s.num_kv_heads, 32);
    // absent -> class default: None (= heads) for olmoe, 8 for mixtral.
    let s = parse_edited(OLMOE_4X, |m| {
        m.remove("num_key_value_heads");
    })
    .unwrap();
    assert_eq!(s.num_kv_heads, 16);
    let s = parse_edited(MIXTRAL_4X, |m| {
        m.remove("num_key_value_heads");
    })
    .unwrap();
    assert_eq!(s.num_kv_heads, 8);
}

#[test]
fn defaults_for_optional_scalars() {
    let s = parse_edited(QWEN_4X, |m| {
        for k in [
            "rms_norm_eps",
            "max_position_embeddings",
            "norm_topk_prob",
            "tie_word_embeddings",
            "attention_bias",
            "bos_token_id",
            "eos_token_id",
            "decoder_sparse_step",
            "mlp_only_layers",
        ] {
            m.remove(k);
        }
    })
    .unwrap();
    assert_eq!(s.rms_norm_eps, 1e-6);
    assert_eq!(s.max_position_embeddings, 32768);
    assert!(!s.moe.norm_topk_prob && !s.tie_word_embeddings && !s.attention_bias);
    assert_eq!((s.bos_token_id, s.eos_token_ids.len()), (None, 0));
    assert_eq!(s.layers, vec![FfnKind::Moe; 48]);
}

#[test]
fn config_json_round_trips() {
    for text in [OLMOE_4X, OLMOE_5X, QWEN_4X, QWEN_5X, MIXTRAL_4X, MIXTRAL_5X] {
        let spec = parse(text);
        let exported = spec.to_config_json();
        assert_eq!(exported["dtype"], "float32");
        assert!(exported.get("rope_parameters").is_some());
        let back = ModelSpec::from_config_value(&exported).unwrap();
        assert_eq!(back, spec);
        // The manifest stores the spec through serde.
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<ModelSpec>(&json).unwrap(), spec);
    }
    let exported = parse(OLMOE_4X).to_config_json();
    assert_eq!(exported["rms_norm_eps"], json!(1e-5));
}

#[test]
fn family_names() {
    for f in Family::ALL {
        assert_eq!(f.model_type().parse::<Family>().unwrap(), f);
        assert_eq!(f.to_string(), f.model_type());
        assert_eq!(serde_json::to_value(f).unwrap(), json!(f.model_type()));
    }
}

/// Every size a config.json declares has a documented maximum, refused at
/// once naming the field: `num_hidden_layers` 10^7 used to grow conversion
/// to 15.6 GB, and 10^18 positions were accepted.
#[test]
fn absurd_sizes_are_refused_at_once_naming_the_field() {
    let cases = [
        ("num_hidden_layers", json!(10_000_000u64)),
        ("num_hidden_layers", json!(1_000_000_000_000_000_000u64)),
        ("num_hidden_layers", json!(MAX_LAYERS + 1)),
        ("max_position_embeddings", json!(1_000_000_000_000_000_000u64)),
        ("vocab_size", json!(1u64 << 40)),
        ("hidden_size", json!(1u64 << 40)),
        ("num_experts", json!(1u64 << 20)),
        ("intermediate_size", json!(1u64 << 30)),
    ];
    for (field, value) in cases {
        let mut config: Value = serde_json::from_str(OLMOE_4X).unwrap();
        config[field] = value.clone();
        let started = std::time::Instant::now();
        let err = ModelSpec::from_config_value(&config).unwrap_err().to_string();
        assert!(started.elapsed().as_secs_f64() < 1.0, "{field} {value}: refused at once");
        assert!(err.contains(field) && err.contains("at most"), "{field} {value}: {err}");
    }
    // Heads, the MLA families and a manifest's spec (validate) too.
    let mut config: Value = serde_json::from_str(OLMOE_4X).unwrap();
    config["num_attention_heads"] = json!(MAX_HEADS * 2);
    config["num_key_value_heads"] = json!(MAX_HEADS * 2);
    config["hidden_size"] = json!(MAX_HEADS * 2);
    let err = ModelSpec::from_config_value(&config).unwrap_err().to_string();
    assert!(err.contains("num_attention_heads") && err.contains("at most"), "{err}");
    let mut spec = parse(OLMOE_4X);
    spec.max_position_embeddings = MAX_POSITIONS + 1;
    let err = spec.validate().unwrap_err().to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
    // The largest accepted values parse (up to the checks between fields).
    let mut config: Value = serde_json::from_str(OLMOE_4X).unwrap();
    config["max_position_embeddings"] = json!(MAX_POSITIONS);
    config["num_hidden_layers"] = json!(MAX_LAYERS);
    assert_eq!(ModelSpec::from_config_value(&config).unwrap().layers.len(), MAX_LAYERS);
}

/// A manifest's or config's special token ids are bounded: a list of 10^5
/// end-of-sequence ids, or an id no vocabulary can have, is refused; an id
/// past this model's vocabulary is accepted (transformers accepts it).
#[test]
fn special_token_ids_are_bounded() {
    for (field, value) in [
        ("eos_token_id", json!(vec![1; MAX_EOS_TOKENS + 1])),
        ("eos_token_id", json!(MAX_VOCAB)),
        ("bos_token_id", json!(u32::MAX)),
    ] {
        let mut config: Value = serde_json::from_str(OLMOE_4X).unwrap();
        config[field] = value;
        let err = ModelSpec::from_config_value(&config).unwrap_err().to_string();
        assert!(err.contains("token_id") && err.contains("at most"), "{field}: {err}");
    }
    let mut config: Value = serde_json::from_str(OLMOE_4X).unwrap();
    config["eos_token_id"] = json!([1, 50279]);
    assert_eq!(ModelSpec::from_config_value(&config).unwrap().eos_token_ids, [1, 50279]);
}

/// OLMoE's two layers with hyper-connections of `streams` streams.
fn hyper_connected(streams: usize, head: HyperHead) -> ModelArch {
    let mut arch = ModelArch::from_config_json(OLMOE_5X).unwrap();
    for layer in &mut arch.layers {
        layer.residual = ResidualKind::HyperConnections { streams, sinkhorn_iters: 20, eps: 1e-6, head };
    }
    arch
}

#[test]
fn every_layer_must_carry_the_same_residual_streams() {
    let mut arch = hyper_connected(4, HyperHead::Mean);
    arch.validate().unwrap();
    arch.layers[1].residual = ResidualKind::Plain;
    let err = arch.validate().unwrap_err().to_string();
    assert!(err.contains("hc_mult") && err.contains("same residual streams"), "{err}");
    arch.layers[1].residual =
        ResidualKind::HyperConnections { streams: 2, sinkhorn_iters: 20, eps: 1e-6, head: HyperHead::Mean };
    assert!(arch.validate().is_err(), "2 streams after 4");
}

#[test]
fn hyper_connection_streams_rounds_and_eps_are_bounded() {
    let cases = [
        (
            ResidualKind::HyperConnections { streams: 0, sinkhorn_iters: 20, eps: 1e-6, head: HyperHead::Mean },
            "hc_mult",
        ),
        (
            ResidualKind::HyperConnections {
                streams: MAX_STREAMS + 1,
                sinkhorn_iters: 20,
                eps: 1e-6,
                head: HyperHead::Mean,
            },
            "hc_mult",
        ),
        (
            ResidualKind::HyperConnections {
                streams: 4,
                sinkhorn_iters: MAX_SINKHORN_ITERS + 1,
                eps: 1e-6,
                head: HyperHead::Mean,
            },
            "hc_sinkhorn_iters",
        ),
        (
            ResidualKind::HyperConnections { streams: 4, sinkhorn_iters: 20, eps: f32::NAN, head: HyperHead::Mean },
            "hc_eps",
        ),
        (
            ResidualKind::HyperConnections { streams: 4, sinkhorn_iters: 20, eps: -1e-6, head: HyperHead::Mean },
            "hc_eps",
        ),
    ];
    for (residual, field) in cases {
        let mut arch = hyper_connected(4, HyperHead::Mean);
        arch.layers.iter_mut().for_each(|layer| layer.residual = residual);
        let err = arch.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{residual:?}: {err}");
    }
}

#[test]
fn a_swiglu_limit_must_be_finite_and_not_negative() {
    for limit in [-1.0, f32::NAN, f32::INFINITY] {
        let mut arch = ModelArch::from_config_json(OLMOE_5X).unwrap();
        let FfnSpec::Moe(moe) = &mut arch.layers[0].ffn else { panic!("olmoe layers are MoE") };
        moe.swiglu = SwiGlu::Limited { limit };
        let err = arch.validate().unwrap_err().to_string();
        assert!(err.contains("swiglu_limit"), "{limit}: {err}");
        arch.layers[0].ffn =
            FfnSpec::Dense { intermediate_size: 8, swiglu: SwiGlu::Limited { limit }, global_scale: false };
        let err = arch.validate().unwrap_err().to_string();
        assert!(err.contains("swiglu_limit"), "dense, {limit}: {err}");
    }
    let mut arch = ModelArch::from_config_json(OLMOE_5X).unwrap();
    let FfnSpec::Moe(moe) = &mut arch.layers[0].ffn else { panic!("olmoe layers are MoE") };
    moe.swiglu = SwiGlu::Limited { limit: 0.0 };
    arch.validate().unwrap();
}

#[test]
fn hyper_connection_weights_are_f32_tensors_of_every_layer_and_the_sigmoid_head() {
    let streams = 3;
    let arch = hyper_connected(streams, HyperHead::Sigmoid);
    let h = arch.core.hidden_size;
    let hyper: Vec<_> = crate::names::dense_tensors(&arch)
        .into_iter()
        .filter(|t| t.kind == crate::TensorKind::HyperConnection)
        .collect();
    let shape = |name: &str| hyper.iter().find(|t| t.name == name).map(|t| t.shape.clone());
    for layer in 0..arch.layers.len() {
        for block in ["attn", "ffn"] {
            let name = |part: &str| format!("model.layers.{layer}.hc_{block}_{part}");
            assert_eq!(shape(&name("fn")), Some(vec![15, streams * h]), "(2 + 3) · 3 rows");
            assert_eq!(shape(&name("base")), Some(vec![15]));
            assert_eq!(shape(&name("scale")), Some(vec![3]));
        }
    }
    assert_eq!(shape("model.hc_head_fn"), Some(vec![streams, streams * h]));
    assert_eq!(shape("model.hc_head_base"), Some(vec![streams]));
    assert_eq!(shape("model.hc_head_scale"), Some(vec![1]));
    assert_eq!(hyper.len(), 6 * arch.layers.len() + 3);
    assert!(!crate::TensorKind::HyperConnection.is_matrix(), "never quantized");
    let mean = hyper_connected(streams, HyperHead::Mean);
    let head = crate::names::dense_tensors(&mean).into_iter().filter(|t| t.name.contains("hc_head")).count();
    assert_eq!(head, 0, "the mean head has no weights");
}

#[test]
fn strata_info_names_a_layers_streams_and_swiglu_limit() {
    let mut arch = hyper_connected(4, HyperHead::Mean);
    let FfnSpec::Moe(moe) = &mut arch.layers[0].ffn else { panic!("olmoe layers are MoE") };
    moe.swiglu = SwiGlu::Limited { limit: 10.0 };
    let line = arch.layers[0].describe();
    assert!(line.contains(", swiglu limit 10;") && line.ends_with("; 4 hyper-connection streams"), "{line}");
    let plain = ModelArch::from_config_json(OLMOE_5X).unwrap().layers[0].describe();
    assert!(!plain.contains("swiglu") && !plain.contains("streams"), "{plain}");
}

/// OLMoE's two layers with gated residual streams (Qwen3.8-Flash-Next's).
fn gated_streams(streams: usize, lowrank: usize) -> ModelArch {
    let mut arch = ModelArch::from_config_json(OLMOE_5X).unwrap();
    arch.layers.iter_mut().for_each(|layer| layer.residual = ResidualKind::GatedStreams { streams, lowrank });
    arch
}

#[test]
fn gated_residual_weights_are_named_as_the_hub_names_every_blocks_and_the_final_mixers() {
    let (streams, lowrank) = (4, 5);
    let arch = gated_streams(streams, lowrank);
    arch.validate().unwrap();
    let width = streams * arch.core.hidden_size;
    let gated: Vec<_> = crate::names::dense_tensors(&arch)
        .into_iter()
        .filter(|t| t.kind == crate::TensorKind::HyperConnection)
        .collect();
    let shape = |name: &str| gated.iter().find(|t| t.name == name).map(|t| t.shape.clone());
    for layer in 0..arch.layers.len() {
        for block in ["attn", "mlp"] {
            let name = |part: &str| format!("model.layers.{layer}.{block}_hyper_connection.{part}.weight");
            assert_eq!(shape(&name("hc_norm")), Some(vec![width]));
            assert_eq!(shape(&name("input_mix_weight_down")), Some(vec![lowrank, width]));
            assert_eq!(shape(&name("input_mix_weight_up")), Some(vec![width, lowrank]));
            assert_eq!(shape(&name("block_inject_weight")), Some(vec![streams, width]));
        }
    }
    assert_eq!(shape("model.hyper_connection_mixer.hc_norm.weight"), Some(vec![width]));
    assert_eq!(shape("model.hyper_connection_mixer.input_mix_weight_down.weight"), Some(vec![lowrank, width]));
    assert_eq!(shape("model.hyper_connection_mixer.input_mix_weight_up.weight"), Some(vec![width, lowrank]));
    assert_eq!(gated.len(), 8 * arch.layers.len() + 3, "no inject on the final mixer");
    assert_eq!(arch.residual().streams(), streams);
    assert!(arch.layers[0].describe().contains("4 gated residual streams"), "{}", arch.layers[0].describe());
}

#[test]
fn gated_residual_streams_and_low_rank_are_bounded() {
    for (streams, lowrank, field) in [
        (0, 5, "hc_count"),
        (MAX_STREAMS + 1, 5, "hc_count"),
        (4, 0, "hc_lowrank"),
        (4, MAX_INTERMEDIATE + 1, "hc_lowrank"),
    ] {
        let err = gated_streams(streams, lowrank).validate().unwrap_err().to_string();
        assert!(err.contains(field), "{streams} streams, rank {lowrank}: {err}");
    }
}

/// OLMoE's two layers with Attention Residuals (Kimi K3's).
fn attention_residuals(block_size: usize) -> ModelArch {
    let mut arch = ModelArch::from_config_json(OLMOE_5X).unwrap();
    arch.layers.iter_mut().for_each(|layer| layer.residual = ResidualKind::AttentionResiduals { block_size });
    arch
}

#[test]
fn attention_residual_mixes_are_named_as_kimi_k3_names_every_blocks_and_the_heads() {
    let arch = attention_residuals(2);
    arch.validate().unwrap();
    let hidden = arch.core.hidden_size;
    let mixes: Vec<_> = crate::names::dense_tensors(&arch)
        .into_iter()
        .filter(|t| t.kind == crate::TensorKind::HyperConnection)
        .collect();
    let shape = |name: &str| mixes.iter().find(|t| t.name == name).map(|t| t.shape.clone());
    for layer in 0..arch.layers.len() {
        for block in ["self_attention", "mlp"] {
            assert_eq!(shape(&format!("model.layers.{layer}.{block}_res_norm.weight")), Some(vec![hidden]));
            assert_eq!(shape(&format!("model.layers.{layer}.{block}_res_proj.weight")), Some(vec![1, hidden]));
        }
    }
    assert_eq!(shape("model.output_attn_res_norm.weight"), Some(vec![hidden]));
    assert_eq!(shape("model.output_attn_res_proj.weight"), Some(vec![1, hidden]));
    assert_eq!(mixes.len(), 4 * arch.layers.len() + 2);
    assert_eq!(arch.residual().streams(), 1, "the snapshots are not streams");
    assert!(
        arch.layers[0].describe().ends_with("; attention residuals every 2 layers"),
        "{}",
        arch.layers[0].describe()
    );
}

#[test]
fn an_attention_residuals_block_size_is_positive_and_bounded() {
    for block_size in [0, MAX_LAYERS + 1] {
        let err = attention_residuals(block_size).validate().unwrap_err().to_string();
        assert!(err.contains("attn_res_block_size"), "{block_size}: {err}");
    }
}
