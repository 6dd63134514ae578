use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;
use crate::spec::fields::looked_up;
use crate::synth::LIKE;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// Every committed config.json: each family's `hf*/` fixtures, the
/// `*_hub` configs as published, and the demo model's.
fn committed_configs() -> Vec<(PathBuf, Value)> {
    let mut dirs = vec![testdata().join("../models/demo")];
    for family in std::fs::read_dir(testdata()).unwrap() {
        let Ok(inside) = std::fs::read_dir(family.unwrap().path()) else { continue };
        dirs.extend(inside.map(|dir| dir.unwrap().path()));
    }
    let mut found = Vec::new();
    for dir in dirs {
        let config = dir.join("config.json");
        if let Ok(text) = std::fs::read_to_string(&config) {
            found.push((config, serde_json::from_str(&text).unwrap()));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(found.len() >= 20, "{found:?}");
    found
}

fn fixture(family: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(testdata().join(family).join("hf/config.json")).unwrap()).unwrap()
}

fn refusal(config: &Value, allowed: &[&str]) -> String {
    let allowed: Vec<String> = allowed.iter().map(|k| (*k).to_owned()).collect();
    check_config_keys(config, &allowed).unwrap_err().to_string()
}

#[test]
fn every_committed_config_and_synth_shape_is_known_to_its_family() {
    let likes = LIKE.iter().map(|(name, text)| (PathBuf::from(name), serde_json::from_str(text).unwrap()));
    for (path, config) in committed_configs().into_iter().chain(likes) {
        check_config_keys(&config, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn deepseek_v3_edits_that_change_the_model_are_refused_naming_the_key() {
    for (key, value) in [
        ("mla_use_output_gate", json!(true)),
        ("use_sliding_window", json!(true)),
        ("attn_logit_softcapping", json!(30)),
    ] {
        let mut config = fixture("deepseek_v3");
        config[key] = value;
        let err = refusal(&config, &[]);
        assert!(err.contains(&format!("deepseek_v3 does not know {key}:")), "{err}");
        assert!(err.contains("--allow-unknown-config KEY"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn a_k3_style_config_is_refused_naming_every_extra_key() {
    let mut config = fixture("kimi_k25");
    for key in ["mla_use_output_gate", "moe_latent_dim", "attention_residuals"] {
        config["text_config"][key] = json!(true);
    }
    let err = refusal(&config, &[]);
    assert!(
        err.contains("kimi_k25 does not know text_config.attention_residuals, text_config.mla_use_output_gate, text_config.moe_latent_dim:"),
        "{err}"
    );
    // A nested object the family reads is checked key by key too.
    let mut config = fixture("kimi_k25");
    config["text_config"]["rope_parameters"]["llama_4_scaling_beta"] = json!(0.1);
    let err = refusal(&config, &[]);
    assert!(err.contains("does not know text_config.rope_parameters.llama_4_scaling_beta:"), "{err}");
}

/// Kimi K3's text config still says `kimi_linear`, with gated MLA,
/// attention residuals, a latent MoE and SiTU-GLU that transformers'
/// kimi_linear does not implement: its keys make it kimi_k3's, whose table
/// knows each of them, and never kimi_linear's.
#[test]
fn a_k3_style_kimi_linear_config_is_checked_as_kimi_k3() {
    let text = std::fs::read_to_string(testdata().join("kimi_linear/hf_bf16/config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    check_config_keys(&config, &[]).unwrap();
    for (key, value) in [
        ("mla_use_output_gate", json!(true)),
        ("attn_res_block_size", json!(12)),
        ("routed_expert_hidden_size", json!(3584)),
        ("activation_situ_beta", json!(4.0)),
        ("activation_situ_linear_beta", json!(25.0)),
    ] {
        config[key] = value;
    }
    config["linear_attn_config"]["gate_lower_bound"] = json!(-5.0);
    check_config_keys(&config, &[]).unwrap();
    config["moe_latent_dim"] = json!(16);
    let err = refusal(&config, &[]);
    assert!(err.contains("kimi_k3 does not know moe_latent_dim:"), "{err}");
}

#[test]
fn allow_unknown_config_lets_exactly_the_named_keys_through() {
    let mut config = fixture("deepseek_v3");
    config["mla_use_output_gate"] = json!(true);
    config["attn_logit_softcapping"] = json!(30);
    check_config_keys(&config, &["mla_use_output_gate".into(), "attn_logit_softcapping".into()]).unwrap();
    let err = refusal(&config, &["mla_use_output_gate"]);
    assert!(err.contains("does not know attn_logit_softcapping:"), "{err}");
}

#[test]
fn multimodal_rope_sections_are_known_to_qwen3_5_moe_only() {
    let mrope = |config: &mut Value| {
        config["mrope_section"] = json!([11, 11, 10]);
        config["mrope_interleaved"] = json!(true);
    };
    let mut qwen35 = fixture("qwen3_5_moe");
    mrope(&mut qwen35["text_config"]["rope_parameters"]);
    check_config_keys(&qwen35, &[]).unwrap();
    let mut next = fixture("qwen3_next");
    mrope(&mut next["rope_parameters"]);
    let err = refusal(&next, &[]);
    assert!(err.contains("rope_parameters.mrope_interleaved, rope_parameters.mrope_section:"), "{err}");
}

#[test]
fn a_tower_the_family_does_not_load_is_inert_as_a_whole() {
    let mut config = fixture("kimi_k25");
    config["vision_config"]["anything_at_all"] = json!(1);
    check_config_keys(&config, &[]).unwrap();
}

/// Where a looked-up key belongs: (`text_config`, key) for the text model
/// of a wrapper, (`rope`, key) for the rope object wherever it sits, else
/// ("", key).
fn owner(looked_up: &str) -> (&str, &str) {
    for rope in ["rope_parameters.", "rope_scaling."] {
        if let Some(key) = looked_up.strip_prefix(rope) {
            return ("rope", key);
        }
    }
    for object in ["text_config", "linear_attn_config", "mtp_config"] {
        if let Some(key) = looked_up.strip_prefix(object).and_then(|k| k.strip_prefix('.')) {
            // An object in the text config (glm5_next's hub spelling of
            // linear_attn_config) is checked against its own table.
            return match owner(key) {
                ("", _) => (object, key),
                inner => inner,
            };
        }
    }
    ("", looked_up)
}

/// `object.key`, or `key` at the top level.
fn path(object: &str, key: &str) -> String {
    if object.is_empty() { key.to_owned() } else { format!("{object}.{key}") }
}

/// A config of each shape the readers branch on that no committed config
/// has, so that every key a table lists as read is looked up by one.
fn variants() -> Vec<Value> {
    // kimi_linear with rope scaling, which its parser reads (the latent
    // layers then leave it unused), as the hub spells it and as
    // save_pretrained does.
    let kimi_linear = json!({
        "model_type": "kimi_linear", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16, "q_lora_rank": null,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
        "moe_renormalize": true, "num_expert_group": 1, "topk_group": 1, "model_max_length": 128,
        "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "rms_norm_eps": 1e-5,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0}, "original_max_position_embeddings": 64,
        "linear_attn_config": {"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4,
            "kda_layers": [1, 2, 4], "full_attn_layers": [3]}
    });
    let mut kimi_linear_saved = kimi_linear.clone();
    kimi_linear_saved.as_object_mut().unwrap().remove("linear_attn_config");
    kimi_linear_saved["layer_types"] =
        json!(["linear_attention", "linear_attention", "full_attention", "linear_attention"]);
    kimi_linear_saved["mlp_layer_types"] = json!(["dense", "sparse", "sparse", "sparse"]);
    for (key, value) in [("linear_head_dim", 8), ("linear_num_heads", 2), ("linear_conv_kernel_dim", 4)] {
        kimi_linear_saved[key] = json!(value);
    }
    let mut sliding = fixture("qwen3_moe");
    sliding["use_sliding_window"] = json!(true);
    let mut by_interval = fixture("qwen3_next");
    by_interval.as_object_mut().unwrap().remove("layer_types");
    let mut linear = fixture("olmoe");
    linear["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0});
    let mut glm = fixture("glm_moe_dsa");
    glm.as_object_mut().unwrap().remove("indexer_types");
    let mut glm_yarn = fixture("glm_moe_dsa");
    glm_yarn["rope_parameters"] = fixture("deepseek_v3")["rope_parameters"].clone();
    let mut qwen4_by_interval = fixture("qwen4_exp");
    let text = qwen4_by_interval["text_config"].as_object_mut().unwrap();
    text.remove("layer_types");
    text.insert("full_attention_interval".into(), json!(2));
    let (k3_hub, k3_saved) = kimi_k3_configs();
    vec![
        k3_hub,
        k3_saved,
        sliding,
        by_interval,
        linear,
        glm,
        glm_yarn,
        kimi_linear,
        kimi_linear_saved,
        glm5_next_flat(),
        qwen4_by_interval,
    ]
}

/// kimi_k3 as the hub nests it (the KDA dimensions and pattern in
/// `linear_attn_config`, the special ids and tying on the wrapper), and
/// with the pattern and dimensions as `KimiLinearConfig` fields and a rope
/// object: every key its parser may read is looked up.
fn kimi_k3_configs() -> (Value, Value) {
    let text = json!({
        "model_type": "kimi_linear", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 2, "kv_lora_rank": 16, "q_lora_rank": 12,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
        "moe_renormalize": true, "num_expert_group": 1, "topk_group": 1, "model_max_length": 128,
        "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "rms_norm_eps": 1e-5,
        "routed_expert_hidden_size": 32, "attn_res_block_size": 2, "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0, "mla_use_output_gate": true,
        "linear_attn_config": {"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4,
            "kda_layers": [1, 2, 4], "full_attn_layers": [3], "gate_lower_bound": -5.0}
    });
    let hub = json!({"model_type": "kimi_k3", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
        "text_config": text});
    let mut saved = hub.clone();
    let text = saved["text_config"].as_object_mut().unwrap();
    text.remove("linear_attn_config");
    text.insert(
        "layer_types".into(),
        json!(["linear_attention", "linear_attention", "full_attention", "linear_attention"]),
    );
    text.insert("mlp_layer_types".into(), json!(["dense", "sparse", "sparse", "sparse"]));
    for (key, value) in [("linear_head_dim", 8), ("linear_num_heads", 2), ("linear_conv_kernel_dim", 4)] {
        text.insert(key.into(), json!(value));
    }
    text.insert("rope_scaling".into(), json!({"rope_type": "yarn", "factor": 2.0}));
    text.insert("original_max_position_embeddings".into(), json!(64));
    (hub, saved)
}

/// glm5_next flat (the text fields at the top, as `Glm5NextConfig` reads
/// them too), its KDA dimensions in `linear_attn_config`, no layer or
/// indexer lists and a rope object (which transformers ignores; the MLA
/// reader checks it): every key its parser may read is looked up.
fn glm5_next_flat() -> Value {
    json!({
        "model_type": "glm5_next", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 2, "kv_lora_rank": 16, "q_lora_rank": 12, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 0, "v_head_dim": 8, "intermediate_size": 48, "moe_intermediate_size": 16,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "index_head_dim": 16, "index_n_heads": 2,
        "index_topk": 8, "index_kpool": 4, "hc_mult": 2, "original_max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
        "linear_attn_config": {"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0, "safe_gate": true}
    })
}

/// The tables cannot drift from the parsers: every key a family's parser
/// looks up over the committed configs is in its table, and every key its
/// table says it reads is looked up by one of them (a key listed as read
/// but never read would let a config through whose key changes nothing
/// Strata computes, though transformers reads it).
#[test]
fn each_family_table_lists_exactly_the_keys_its_parser_reads() {
    let likes = LIKE.iter().map(|(_, text)| serde_json::from_str::<Value>(text).unwrap());
    let configs: Vec<Value> = committed_configs().into_iter().map(|(_, c)| c).chain(likes).chain(variants()).collect();
    for family in Family::ALL {
        let own = &family.def().known().config;
        let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
        for config in
            configs.iter().filter(|c| c["model_type"].as_str().and_then(|t| t.parse::<Family>().ok()) == Some(family))
        {
            let keys = looked_up::during(|| {
                crate::spec::ModelArch::from_config_value(config).unwrap();
            });
            let flat_text = config["model_type"].as_str() != Some(family.model_type());
            // A text model saved on its own is looked up for a wrapper's
            // text_config first.
            for key in keys.iter().filter(|k| !(flat_text && *k == "text_config")) {
                let (object, key) = owner(key);
                let object = if flat_text && object.is_empty() { "text_config" } else { object };
                seen.insert((object.to_owned(), key.to_owned()));
            }
        }
        assert!(!seen.is_empty(), "{family}: no committed config");
        let tables = [
            ("", Some(own)),
            ("text_config", own.nested_table("text_config")),
            ("linear_attn_config", own.nested_table("linear_attn_config")),
            ("mtp_config", own.nested_table("mtp_config")),
            ("rope", Some(&ROPE)),
        ];
        for (object, table) in tables {
            let Some(table) = table else { continue };
            let listed: BTreeSet<&str> = table.read_keys().chain(table.inert_keys()).collect();
            for (_, key) in seen.iter().filter(|(o, _)| o == object) {
                let nested = table.nested_table(key).is_some();
                assert!(
                    listed.contains(key.as_str()) || nested,
                    "{family}: {} is read but not listed",
                    path(object, key)
                );
            }
            if object == "rope" {
                continue;
            }
            for key in table.read_keys() {
                // The wrapper's own ids are merged into the text model's.
                let read = seen.contains(&(object.to_owned(), key.to_owned()))
                    || (object == "text_config" && seen.contains(&(String::new(), key.to_owned())));
                assert!(read, "{family}: {} is listed as read but no parse looks it up", path(object, key));
            }
        }
    }
}

#[test]
fn a_star_matches_any_run_and_nothing_else_does() {
    assert!(matches("vision_tower.*", "vision_tower.encoder.blocks.0.weight"));
    assert!(matches("*rotary_emb.inv_freq", "model.layers.3.self_attn.rotary_emb.inv_freq"));
    assert!(!matches("vision_tower.*", "model.vision_tower"));
    assert!(!matches("mtp.*", "model.mtp.0"));
    assert!(past_last_layer("model.layers.3.mlp.gate.weight", "model.", 3));
    assert!(!past_last_layer("model.layers.2.mlp.gate.weight", "model.", 3));
    assert!(!past_last_layer("model.layers.x.mlp", "model.", 3));
}

/// `keys` sorted, deduplicated and in backticks.
fn ticked<'a>(keys: impl Iterator<Item = &'a str>) -> String {
    let keys: BTreeSet<&str> = keys.collect();
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

/// One table's lines for docs/FORMAT.md: what it reads, what else it knows
/// (beyond [`HF_INERT`]), and its nested objects.
fn table_lines(name: &str, table: &ConfigKeys, indent: &str, out: &mut Vec<String>) {
    out.push(format!("{indent}* {name} reads {}", ticked(table.read_keys())));
    let inert = ticked(table.inert_keys().filter(|k| !HF_INERT.contains(k)));
    if !inert.is_empty() {
        out.push(format!("{indent}  and knows {inert} not to change the computation"));
    }
    for (key, nested) in table.nested {
        match *key {
            "rope_parameters" => {
                let inert = ticked(nested.inert_keys());
                if !inert.is_empty() {
                    out.push(format!("{indent}  and knows {inert} in the rope object not to change the computation"));
                }
            }
            "rope_scaling" | "quantization_config" => {}
            _ => table_lines(&format!("`{key}`"), nested, &format!("{indent}  "), out),
        }
    }
}

/// The lists docs/FORMAT.md gives, generated from the tables.
fn format_md_lists() -> String {
    let mut out = vec![
        format!("Every family knows {} not to change the computation.", ticked(HF_INERT.iter().copied())),
        format!("The rope object (`rope_parameters`, or `rope_scaling`) may hold {}.", ticked(ROPE.read_keys())),
        format!(
            "`quantization_config` may hold {} (read) and {}.",
            ticked(QUANTIZATION.read_keys()),
            ticked(QUANTIZATION.inert_keys())
        ),
        format!("Every family leaves {} unread.", ticked(UNUSED_EVERYWHERE.iter().copied())),
        String::new(),
    ];
    for family in Family::ALL {
        let known = family.def().known();
        table_lines(&format!("`{family}`"), &known.config, "", &mut out);
        let mut unused: Vec<String> = known.unused_tensors.iter().map(|p| format!("`{p}`")).collect();
        if known.extra_layers_unused {
            unused.push("decoder layers past `num_hidden_layers` (multi-token prediction)".to_owned());
        }
        if !unused.is_empty() {
            out.push(format!("  and leaves {} unread", unused.join(", ")));
        }
    }
    out.join("\n")
}

#[test]
fn format_md_lists_every_family_table_as_the_code_has_it() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/FORMAT.md")).unwrap();
    let (begin, end) = ("<!-- known keys: begin -->\n", "\n<!-- known keys: end -->");
    let start = doc.find(begin).expect("FORMAT.md has the known keys' begin marker") + begin.len();
    let stop = doc[start..].find(end).expect("and the end marker") + start;
    let want = format_md_lists();
    assert!(doc[start..stop] == want, "docs/FORMAT.md's lists differ from the tables; they are:\n{want}");
}
