//! kimi_linear's config.json as the hub writes it (`linear_attn_config`,
//! the `attribute_map` spellings) and as transformers 5.x saves it, its
//! layer pattern and its tensor names.

use serde_json::{Value, json};
use strata_format::names::{self, dense_tensors};
use strata_format::{FfnKind, FfnSpec, GdnProjections, MixerSpec, ModelArch, RouterKind};

/// A tiny hub-style config: four layers, the third full, one dense layer.
fn hub_config() -> Value {
    json!({
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "num_experts": 8,
        "num_experts_per_token": 2,
        "num_shared_experts": 1,
        "moe_renormalize": true,
        "model_max_length": 128,
        "linear_attn_config": {
            "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4,
            "kda_layers": [1, 2, 4], "full_attn_layers": [3]
        }
    })
}

fn parse(config: &Value) -> ModelArch {
    ModelArch::from_config_value(config).unwrap()
}

#[test]
fn a_hub_config_reads_kimis_spellings_and_linear_attn_config() {
    let arch = parse(&hub_config());
    assert_eq!(arch.core.max_position_embeddings, 128);
    assert_eq!((arch.core.bos_token_id, arch.core.eos_token_ids.clone()), (Some(163_584), vec![163_586]));
    assert_eq!(arch.layer_kinds(), vec![FfnKind::Dense, FfnKind::Moe, FfnKind::Moe, FfnKind::Moe]);
    for (l, layer) in arch.layers.iter().enumerate() {
        match &layer.mixer {
            MixerSpec::Mla(mla) => {
                assert_eq!(l, 2, "only the third layer is full");
                assert_eq!((mla.rope, mla.dims.q_lora_rank), (None, None));
            }
            MixerSpec::GatedDeltaNet(gdn) => {
                let d = gdn.dims;
                assert_eq!((d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim, d.conv_kernel), (2, 2, 8, 8, 4));
                assert_eq!(d.projections, GdnProjections::Kimi);
                assert_eq!(gdn.eps, 1e-5);
            }
            other => panic!("layer {l}: {other:?}"),
        }
    }
    let FfnSpec::Moe(moe) = arch.layers[1].ffn else { panic!("layer 1 is MoE") };
    assert_eq!((moe.num_experts, moe.top_k), (8, 2));
    let RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, scaling } = moe.router else {
        panic!("{:?}", moe.router)
    };
    assert_eq!((n_group, topk_group, renormalize, scaling), (1, 1, true, 2.446));
}

#[test]
fn without_a_pattern_every_fourth_layer_after_the_first_is_full() {
    let mut config = hub_config();
    config["num_hidden_layers"] = json!(9);
    config["linear_attn_config"].as_object_mut().unwrap().retain(|k, _| !k.ends_with("_layers"));
    let full: Vec<usize> = parse(&config)
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| matches!(l.mixer, MixerSpec::Mla(_)))
        .map(|p| p.0)
        .collect();
    assert_eq!(full, vec![4, 8]);
}

#[test]
fn layer_types_overrides_linear_attn_config() {
    let mut config = hub_config();
    config["layer_types"] = json!(["full_attention", "linear_attention", "linear_attention", "linear_attention"]);
    assert!(matches!(parse(&config).layers[0].mixer, MixerSpec::Mla(_)));
}

#[test]
fn a_layer_in_neither_kda_list_is_refused() {
    let mut config = hub_config();
    config["linear_attn_config"]["kda_layers"] = json!([1, 2]);
    let err = ModelArch::from_config_value(&config).unwrap_err().to_string();
    assert!(err.contains("layer 4 is in neither list"), "{err}");
}

#[test]
fn both_spellings_of_a_field_must_agree() {
    let mut config = hub_config();
    config["num_experts_per_tok"] = json!(3);
    assert!(ModelArch::from_config_value(&config).is_err());
    config["num_experts_per_tok"] = json!(2);
    assert_eq!(parse(&config), parse(&hub_config()));
}

#[test]
fn the_saved_config_parses_back_to_the_same_model() {
    let arch = parse(&hub_config());
    let saved = arch.to_config_json();
    assert_eq!(saved["num_experts"], json!(8));
    assert_eq!(parse(&saved), arch);
}

#[test]
fn tensors_are_named_as_the_hub_names_them() {
    let arch = parse(&hub_config());
    let tensors = dense_tensors(&arch);
    let shape = |name: &str| -> Vec<usize> {
        tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no {name}")).shape.clone()
    };
    assert_eq!(shape("model.layers.0.self_attn.q_conv1d.weight"), vec![16, 1, 4]);
    assert_eq!(shape("model.layers.0.self_attn.A_log"), vec![1, 1, 2, 1]);
    assert_eq!(shape("model.layers.0.self_attn.dt_bias"), vec![16]);
    assert_eq!(shape("model.layers.0.self_attn.f_b_proj.weight"), vec![16, 8]);
    assert_eq!(shape("model.layers.0.mlp.gate_proj.weight"), vec![48, 32]);
    assert_eq!(shape("model.layers.2.self_attn.kv_b_proj.weight"), vec![2 * (8 + 8), 16]);
    assert_eq!(shape("model.layers.1.block_sparse_moe.gate.e_score_correction_bias"), vec![8]);
    assert_eq!(shape("model.layers.1.block_sparse_moe.shared_experts.down_proj.weight"), vec![32, 16]);
    let experts = names::expert_names(&arch.core, 1, 5);
    assert_eq!(
        experts.map(|n| n.rsplit("experts.5.").next().unwrap().to_owned()),
        ["w1.weight", "w3.weight", "w2.weight"]
    );
    // save_pretrained renames every `.mlp.` back to `.block_sparse_moe.`.
    assert_eq!(
        names::saved_name(&arch.core, "model.layers.0.mlp.gate_proj.weight"),
        "model.layers.0.block_sparse_moe.gate_proj.weight"
    );
}

#[test]
fn the_hub_switches_at_what_transformers_runs_change_nothing() {
    let mut config = hub_config();
    config["moe_router_activation_func"] = json!("sigmoid");
    config["mla_use_nope"] = json!(true);
    config["use_grouped_topk"] = json!(true);
    assert_eq!(parse(&config), parse(&hub_config()));
    // Without groups, routing over all experts is what a single group does.
    config["use_grouped_topk"] = json!(false);
    assert_eq!(parse(&config), parse(&hub_config()));
}

/// Moonshot's config class reads three switches transformers' does not:
/// a value asking for other arithmetic is refused naming the key, never
/// converted as the model transformers would run.
#[test]
fn a_hub_switch_asking_for_other_arithmetic_is_refused_naming_the_key() {
    let mut grouped = hub_config();
    grouped["num_expert_group"] = json!(2);
    grouped["topk_group"] = json!(1);
    for (base, key, value) in [
        (hub_config(), "moe_router_activation_func", json!("softmax")),
        (hub_config(), "mla_use_nope", json!(false)),
        (grouped, "use_grouped_topk", json!(false)),
    ] {
        let mut config = base;
        config[key] = value;
        let err = ModelArch::from_config_value(&config).unwrap_err().to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn kda_layers_are_described_as_kimi_delta_attention() {
    let arch = parse(&hub_config());
    let described = arch.layers[0].describe();
    assert!(described.starts_with("kimi delta attention 2 heads x 8, conv 4;"), "{described}");
}

/// The published Kimi-Linear-48B-A3B-Instruct config (testdata/kimi_linear_hub/README.md).
fn published() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/kimi_linear_hub/Kimi-Linear-48B-A3B-Instruct/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Kimi-Linear-48B-A3B-Instruct, every key of its config known: its 7
/// latent layers keep the 512 + 64 floats of each token; its 20 KDA layers
/// a 128 x 128 state per head of 32 and the convolution's last 3 inputs of
/// q, k and v.
#[test]
fn the_published_model_keeps_seven_latent_rows_per_token_and_twenty_kda_states() {
    let config = published();
    strata_format::check_config_keys(&config, &[]).unwrap();
    let arch = parse(&config);
    let latent = arch.layers.iter().filter(|l| matches!(l.mixer, MixerSpec::Mla(_))).count();
    assert_eq!((arch.layers.len(), latent), (27, 7));
    assert_eq!(arch.layer_kinds().iter().filter(|&&k| k == FfnKind::Moe).count(), 26);
    assert_eq!(arch.kv_bytes_per_token(), 7 * (512 + 64) * size_of::<f32>());
    let kda_floats = 32 * 128 * 128 + (4 - 1) * 3 * 32 * 128;
    assert_eq!(arch.state_bytes_per_sequence(), 20 * kda_floats * size_of::<f32>());
}

/// KimiLinearConfig defaults `pad_token_id` to 163839, outside a small
/// vocabulary, where transformers refuses to build the embedding: an
/// exported config keeps the source's pad id, else names none.
#[test]
fn the_saved_config_names_no_pad_id_outside_the_vocabulary() {
    let arch = parse(&hub_config());
    assert_eq!(arch.to_config_json()["pad_token_id"], Value::Null);
    let mut source = hub_config();
    source["pad_token_id"] = json!(0);
    assert_eq!(arch.to_config_json_from(&source)["pad_token_id"], json!(0));
}

/// A model of latent layers alone says so: without `layer_types`
/// transformers would take its default pattern, KDA but every fourth.
#[test]
fn a_model_of_latent_layers_alone_saves_its_pattern() {
    let mut config = hub_config();
    config["linear_attn_config"]["kda_layers"] = json!([]);
    config["linear_attn_config"]["full_attn_layers"] = json!([1, 2, 3, 4]);
    let arch = parse(&config);
    let saved = arch.to_config_json();
    assert_eq!(saved["layer_types"], json!(vec!["full_attention"; 4]));
    assert_eq!(parse(&saved), arch);
}
