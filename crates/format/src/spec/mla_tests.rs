//! Config parsing of the MLA families: defaults, both spellings, and errors
//! that name the field.

use serde_json::{Map, Value, json};

use super::*;

/// deepseek-ai/DeepSeek-V3 config.json as published (4.x spelling), sizes
/// as released.
fn deepseek_v3() -> Value {
    serde_json::from_str(
        r#"{
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
        "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
        "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3,
        "norm_topk_prob": true, "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-06, "rope_theta": 10000, "num_nextn_predict_layers": 1,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false, "attention_bias": false,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]}
    }"#,
    )
    .unwrap()
}

fn edited(base: Value, edit: impl FnOnce(&mut Map<String, Value>)) -> Result<ModelSpec> {
    let mut v = base;
    edit(v.as_object_mut().unwrap());
    ModelSpec::from_config_value(&v)
}

fn error(base: Value, edit: impl FnOnce(&mut Map<String, Value>)) -> String {
    edited(base, edit).unwrap_err().to_string()
}

#[test]
fn deepseek_v3_as_published() {
    let s = ModelSpec::from_config_value(&deepseek_v3()).unwrap();
    let mla = s.mla.unwrap();
    assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim(), mla.v_head_dim), (Some(1536), 512, 192, 128));
    assert!(mla.rope_interleave, "DeepseekV3Config.rope_interleave defaults to true");
    assert_eq!((s.head_dim, s.num_kv_heads, s.rope.rotary_dim), (192, 128, 64));
    assert_eq!(
        s.rope.scaling,
        RopeScaling::Yarn {
            factor: 40.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            mscale_all_dim: 1.0,
            attention_factor: None,
            truncate: true,
        }
    );
    assert_eq!(s.rope.scaling.attention_factor(), 1.0);
    let m = 0.1 * 40f64.ln() + 1.0;
    assert_eq!(s.rope.scaling.softmax_scale_factor(), m * m);
    assert_eq!(s.router.scoring, ScoringFunc::Sigmoid);
    assert_eq!((s.router.n_group, s.router.topk_group, s.router.routed_scaling_factor), (8, 4, 2.5));
    assert!(s.router.score_correction_bias && s.moe.norm_topk_prob);
    assert_eq!((s.moe.num_experts, s.moe.intermediate_size, s.shared_intermediate_size), (256, 2048, Some(2048)));
    assert_eq!(s.layers.iter().filter(|&&k| k == FfnKind::Dense).count(), 3);
    assert!(s.dsa.is_none());
    assert_eq!(s.kv_bytes_per_token(), s.num_layers * (576) * 4);
    let back = ModelSpec::from_config_value(&s.to_config_json()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn deepseek_defaults_and_spellings() {
    // No q_lora_rank (DeepSeek-V2-Lite style), default n_group/topk_group.
    let s = edited(deepseek_v3(), |m| {
        m.insert("q_lora_rank".into(), Value::Null);
        for k in ["n_group", "topk_group", "routed_scaling_factor", "rope_scaling", "first_k_dense_replace"] {
            m.remove(k);
        }
    })
    .unwrap();
    assert_eq!(s.mla.unwrap().q_lora_rank, None);
    assert_eq!((s.router.n_group, s.router.topk_group, s.router.routed_scaling_factor), (8, 4, 2.5));
    assert_eq!(s.rope.scaling, RopeScaling::None);
    assert_eq!(s.layers[..4], [FfnKind::Dense, FfnKind::Dense, FfnKind::Dense, FfnKind::Moe]);
    // YaRN without a factor takes max / original positions; beta 0 means default.
    let s = edited(deepseek_v3(), |m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "yarn", "rope_theta": 5e4, "original_max_position_embeddings": 4096, "beta_fast": 0}),
        );
        m.remove("rope_scaling");
    })
    .unwrap();
    let RopeScaling::Yarn { factor, beta_fast, mscale, .. } = s.rope.scaling else { panic!("{:?}", s.rope) };
    assert_eq!((factor, beta_fast, mscale, s.rope.theta), (40.0, 32.0, 0.0, 5e4));
    assert_eq!(s.rope.scaling.attention_factor(), 0.1 * 40f64.ln() + 1.0);
    assert_eq!(s.rope.scaling.softmax_scale_factor(), 1.0);
    assert_eq!(ModelSpec::from_config_value(&s.to_config_json()).unwrap(), s);
}

#[test]
fn mla_errors_name_the_field() {
    for (edit, field) in [
        (Box::new(|m: &mut Map<String, Value>| drop(m.remove("q_lora_rank"))) as Box<dyn Fn(&mut _)>, "q_lora_rank"),
        (Box::new(|m: &mut Map<String, Value>| drop(m.remove("kv_lora_rank"))), "kv_lora_rank"),
        (
            Box::new(|m: &mut Map<String, Value>| drop(m.insert("num_key_value_heads".into(), json!(8)))),
            "num_key_value_heads",
        ),
        (
            Box::new(|m: &mut Map<String, Value>| drop(m.insert("scoring_func".into(), json!("softmax")))),
            "scoring_func",
        ),
        (Box::new(|m: &mut Map<String, Value>| drop(m.insert("n_group".into(), json!(7)))), "n_group"),
        (Box::new(|m: &mut Map<String, Value>| drop(m.insert("n_group".into(), json!(256)))), "n_group"),
        (Box::new(|m: &mut Map<String, Value>| drop(m.insert("topk_group".into(), json!(9)))), "topk_group"),
        (
            Box::new(|m: &mut Map<String, Value>| drop(m.insert("num_experts_per_tok".into(), json!(200)))),
            "num_experts_per_tok",
        ),
        (
            Box::new(|m: &mut Map<String, Value>| drop(m.insert("qk_rope_head_dim".into(), json!(7)))),
            "qk_rope_head_dim",
        ),
        (
            Box::new(|m: &mut Map<String, Value>| drop(m.insert("partial_rotary_factor".into(), json!(0.5)))),
            "qk_rope_head_dim",
        ),
    ] {
        let err = error(deepseek_v3(), edit);
        assert!(err.contains(field), "{field}: {err}");
    }
}

fn glm() -> Value {
    json!({
        "model_type": "glm_moe_dsa", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 12, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 8, "index_head_dim": 16, "index_n_heads": 2
    })
}

#[test]
fn glm_indexer_schedules() {
    let s = ModelSpec::from_config_value(&glm()).unwrap();
    let dsa = s.dsa.clone().unwrap();
    assert_eq!(dsa.index_topk, 2048);
    assert_eq!(dsa.indexer_types, vec![IndexerKind::Full; 4]);
    assert_eq!(s.layers, vec![FfnKind::Dense, FfnKind::Dense, FfnKind::Dense, FfnKind::Moe]);
    assert_eq!((s.router.n_group, s.rms_norm_eps, s.max_position_embeddings), (1, 1e-5, 202_752));
    assert_eq!(s.kv_bytes_per_token(), s.num_layers * (16 + 8 + 16) * 4);
    let full_shared = |pattern: &str| -> Vec<IndexerKind> {
        pattern.chars().map(|c| if c == 'F' { IndexerKind::Full } else { IndexerKind::Shared }).collect()
    };
    let s = edited(glm(), |m| drop(m.insert("index_topk_pattern".into(), json!("FSSF")))).unwrap();
    assert_eq!(s.dsa.unwrap().indexer_types, full_shared("FSSF"));
    // GLM-5.2 IndexShare: full iff max(l - offset + 1, 0) % freq == 0.
    let s = edited(glm(), |m| {
        m.insert("index_topk_freq".into(), json!(2));
        m.insert("index_skip_topk_offset".into(), json!(2));
    })
    .unwrap();
    assert_eq!(s.dsa.clone().unwrap().indexer_types, full_shared("FFSF"));
    assert_eq!(ModelSpec::from_config_value(&s.to_config_json()).unwrap(), s);
    let err = error(glm(), |m| drop(m.insert("indexer_types".into(), json!(["shared", "full", "full", "full"]))));
    assert!(err.contains("indexer_types"), "{err}");
    let err = error(glm(), |m| drop(m.insert("q_lora_rank".into(), Value::Null)));
    assert!(err.contains("q_lora_rank"), "{err}");
    let err = error(glm(), |m| drop(m.insert("index_head_dim".into(), json!(4))));
    assert!(err.contains("index_head_dim"), "{err}");
}

#[test]
fn kimi_reads_its_nested_text_config() {
    let mut text = deepseek_v3();
    text["model_type"] = json!("kimi_k2");
    let kimi = json!({"model_type": "kimi_k25", "text_config": text, "eos_token_id": 7,
                      "vision_config": {"hidden_size": 1152}});
    let s = ModelSpec::from_config_value(&kimi).unwrap();
    assert_eq!(s.family, Family::KimiK25);
    assert_eq!(s.mla, ModelSpec::from_config_value(&deepseek_v3()).unwrap().mla);
    // Kimi_K25Config ties by default; the top level wins for special ids.
    assert!(s.tie_word_embeddings);
    assert_eq!((s.bos_token_id, s.eos_token_ids.clone()), (Some(0), vec![7]));
    assert_eq!(ModelSpec::from_config_value(&s.to_config_json()).unwrap(), s);
    let err = error(kimi.clone(), |m| drop(m.remove("text_config")));
    assert!(err.contains("text_config"), "{err}");
    let err =
        error(kimi, |m| drop(m["text_config"].as_object_mut().unwrap().insert("model_type".into(), json!("llama"))));
    assert!(err.contains("text_config.model_type"), "{err}");
}

#[test]
fn gqa_families_reject_mla_only_features() {
    let mut spec = ModelSpec::from_config_value(&glm()).unwrap();
    spec.family = Family::Qwen3Moe;
    spec.qk_norm = QkNorm::PerHead;
    assert!(spec.validate().unwrap_err().to_string().contains("qwen3_moe has no MLA"));
}

#[test]
fn mla_sizes_have_maxima_too() {
    let err = error(deepseek_v3(), |m| {
        m.insert("num_hidden_layers".into(), json!(10_000_000u64));
    });
    assert!(err.contains("num_hidden_layers") && err.contains("at most"), "{err}");
    let err = error(deepseek_v3(), |m| {
        m.insert("kv_lora_rank".into(), json!(1u64 << 30));
    });
    assert!(err.contains("kv_lora_rank") && err.contains("at most"), "{err}");
}

/// DeepSeek-V3's layers with `edit` applied to each latent attention block.
fn deepseek_v3_mla_edited(edit: impl Fn(&mut MlaAttention)) -> Result<()> {
    let mut arch = ModelArch::from_config_value(&deepseek_v3()).unwrap();
    for layer in &mut arch.layers {
        let MixerSpec::Mla(mla) = &mut layer.mixer else { panic!("{layer:?}") };
        edit(mla);
    }
    arch.validate()
}

#[test]
fn mla_without_rope_is_valid_with_or_without_a_rope_part() {
    deepseek_v3_mla_edited(|mla| mla.rope = None).unwrap();
    deepseek_v3_mla_edited(|mla| {
        mla.rope = None;
        mla.dims.qk_rope_head_dim = 0;
    })
    .unwrap();
    let arch = ModelArch::from_config_value(&deepseek_v3()).unwrap();
    let MixerSpec::Mla(mla) = &arch.layers[0].mixer else { panic!() };
    assert_eq!((mla.latent_norm_eps, arch.layers[0].mixer.rope().map(|r| r.rotary_dim)), (1e-6, Some(64)));
}

#[test]
fn mla_with_rope_needs_rope_dimensions() {
    let err = deepseek_v3_mla_edited(|mla| {
        mla.dims.qk_rope_head_dim = 0;
        mla.rope.as_mut().unwrap().rotary_dim = 0;
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("qk_rope_head_dim") && err.contains("> 0"), "{err}");
}

#[test]
fn a_latent_norm_eps_of_zero_is_refused() {
    let err = deepseek_v3_mla_edited(|mla| mla.latent_norm_eps = 0.0).unwrap_err().to_string();
    assert!(err.contains("latent norms' eps"), "{err}");
}

#[test]
fn deepseek_mtp_layers_are_moe_layers_after_the_stack_within_their_limit() {
    let arch = ModelArch::from_config_value(&deepseek_v3()).unwrap();
    assert_eq!((arch.layers.len(), arch.mtp.len()), (61, 1));
    assert_eq!(arch.mtp[0], arch.layers[60], "the MTP block is a MoE decoder layer like the last");
    assert_eq!(arch.expert_layers().last(), Some(&61));
    let mut config = deepseek_v3();
    let root = config.as_object_mut().unwrap();
    root.remove("num_nextn_predict_layers");
    root.insert("num_mtp_layers".into(), json!(2));
    assert_eq!(ModelArch::from_config_value(&config).unwrap().mtp.len(), 2, "transformers 5.x's spelling");
    let err = error(deepseek_v3(), |c| {
        c.insert("num_nextn_predict_layers".into(), json!(limits::MAX_MTP_LAYERS + 1));
    });
    assert!(err.contains("num_nextn_predict_layers") && err.contains("at most 16"), "{err}");
}

#[test]
fn glm5_mtp_layers_are_kept_as_moe_layers_with_their_own_indexer() {
    let mut config = glm();
    let root = config.as_object_mut().unwrap();
    root.insert("num_nextn_predict_layers".into(), json!(1));
    // The last stack layer shares its selection; the MTP layer cannot.
    root.insert("indexer_types".into(), json!(["full", "shared", "full", "shared"]));
    let arch = ModelArch::from_config_value(&config).unwrap();
    assert_eq!((arch.layers.len(), arch.mtp.len()), (4, 1));
    let MixerSpec::Mla(mla) = &arch.mtp[0].mixer else { panic!("the MTP layer is latent attention") };
    assert_eq!(mla.indexer.map(|i| i.kind), Some(IndexerKind::Full));
    assert_eq!(arch.expert_layers().last(), Some(&4), "the MTP layer routes, first_k_dense_replace aside");
    assert_eq!(ModelArch::from_config_value(&arch.to_config_json()).unwrap(), arch, "kept through export");
}

/// GLM-5.3-Flash's indexer over pools of `pool` tokens, keeping `topk`.
fn pooled_indexer(kind: IndexerKind, pool: usize, topk: usize) -> Option<IndexerSpec> {
    Some(IndexerSpec { kind, topk, head_dim: 64, n_heads: 4, pool: Some(pool) })
}

/// GLM-5's layers (whose family has an indexer) with `edit` applied to
/// each latent attention block.
fn glm_mla_edited(edit: impl Fn(&mut MlaAttention)) -> Result<()> {
    let mut arch = ModelArch::from_config_value(&glm()).unwrap();
    for layer in &mut arch.layers {
        let MixerSpec::Mla(mla) = &mut layer.mixer else { panic!("{layer:?}") };
        edit(mla);
    }
    arch.validate()
}

#[test]
fn a_pooled_indexer_needs_a_whole_number_of_pools_and_no_rope() {
    glm_mla_edited(|mla| {
        mla.rope = None;
        mla.indexer = pooled_indexer(IndexerKind::Full, 4, 8);
    })
    .unwrap();
    for (pool, topk) in [(4, 6), (0, 8), (16, 8)] {
        let err = glm_mla_edited(|mla| {
            mla.rope = None;
            mla.indexer = pooled_indexer(IndexerKind::Full, pool, topk);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("index_kpool") && err.contains("divide index_topk"), "pool {pool}, top-{topk}: {err}");
    }
    let err = glm_mla_edited(|mla| mla.indexer = pooled_indexer(IndexerKind::Full, 4, 8)).unwrap_err();
    assert!(err.to_string().contains("no RoPE"), "{err}");
}

#[test]
fn a_pooled_indexer_keeps_a_key_per_pool_and_its_open_pool() {
    let mut arch = ModelArch::from_config_value(&deepseek_v3()).unwrap();
    let latent = 512 + 64;
    let cases = [
        (IndexerKind::Full, latent + 64 / 4, 2 * 3 * 64, "64 index-key top-8 in pools of 4"),
        (IndexerKind::Shared, latent, 0, "shared index"),
    ];
    for (kind, per_token, state, said) in cases {
        let MixerSpec::Mla(mla) = &mut arch.layers[0].mixer else { panic!("latent attention") };
        mla.indexer = pooled_indexer(kind, 4, 8);
        assert_eq!((arch.layers[0].cache_floats_per_token(), arch.layers[0].state_floats()), (per_token, state));
        let line = arch.layers[0].describe();
        assert!(line.contains(said), "{line}");
    }
}
