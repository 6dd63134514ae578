//! The MLA families (deepseek_v3, glm_moe_dsa, kimi_k25) through the format
//! crate: their oracle fixtures (written by transformers) parse to the
//! intended spec in both config spellings, convert, export and convert back
//! to the same container, and the KV size is the latent's.

use std::path::{Path, PathBuf};

use serde_json::json;
use strata_format::{
    Container, ConvertOptions, Family, FfnKind, IndexerKind, ModelSpec, QuantPreset, RopeScaling, ScoringFunc, convert,
    export,
};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family)
}

fn spec_of(dir: &Path) -> ModelSpec {
    ModelSpec::from_config_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn both_config_spellings_give_the_same_spec() {
    for family in ["deepseek_v3", "glm_moe_dsa", "kimi_k25"] {
        let five = spec_of(&fixture(family).join("hf"));
        let four = spec_of(&fixture(family).join("hf_bf16"));
        assert_eq!(five, four, "{family}");
        assert_eq!(five.family.model_type(), family);
        // And the exported config parses back to it.
        assert_eq!(ModelSpec::from_config_value(&five.to_config_json()).unwrap(), five, "{family}");
    }
}

#[test]
fn fixture_specs_hold_the_mla_details() {
    let ds = spec_of(&fixture("deepseek_v3").join("hf"));
    let mla = ds.mla.unwrap();
    assert_eq!((mla.q_lora_rank, mla.kv_lora_rank, mla.rope_interleave), (None, 32, false));
    assert_eq!(ds.head_dim, 32);
    assert_eq!(ds.rope.rotary_dim, 16);
    assert!(matches!(ds.rope.scaling, RopeScaling::Yarn { factor: 4.0, original_max_position_embeddings: 64, .. }));
    assert_eq!(ds.router.scoring, ScoringFunc::Sigmoid);
    assert_eq!((ds.router.n_group, ds.router.topk_group, ds.moe.top_k), (4, 2, 3));
    assert_eq!(ds.shared_intermediate_size, Some(24));
    assert_eq!(ds.layers, vec![FfnKind::Dense, FfnKind::Moe, FfnKind::Moe]);
    assert_eq!(ds.kv_bytes_per_token(), ds.num_layers * (32 + 16) * 4);

    let glm = spec_of(&fixture("glm_moe_dsa").join("hf"));
    let dsa = glm.dsa.clone().unwrap();
    assert_eq!(dsa.indexer_types, vec![IndexerKind::Full, IndexerKind::Shared, IndexerKind::Full]);
    assert_eq!((dsa.index_topk, dsa.index_head_dim, dsa.index_n_heads), (4, 16, 4));
    assert!(glm.mla.unwrap().rope_interleave);
    assert_eq!(glm.kv_bytes_per_token(), glm.num_layers * (32 + 8 + 16) * 4);

    let kimi = spec_of(&fixture("kimi_k25").join("hf"));
    assert_eq!(kimi.family, Family::KimiK25);
    assert_eq!(kimi.mla.unwrap().q_lora_rank, Some(48));
    assert_eq!(kimi.router.routed_scaling_factor, 2.827);
    assert!(!kimi.tie_word_embeddings);
}

#[test]
fn glm5_published_dims_cache_576_latent_floats_plus_index_keys() {
    // zai-org/GLM-5 config.json (dims only).
    let config = json!({
        "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
        "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64,
        "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_rope_head_dim": 64,
        "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1, "norm_topk_prob": true,
        "first_k_dense_replace": 3, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32,
        "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "rope_theta": 1000000, "rope_scaling": null
    });
    let spec = ModelSpec::from_config_value(&config).unwrap();
    assert_eq!(spec.mla.unwrap().latent_dim(), 576);
    assert_eq!(spec.kv_bytes_per_token(), spec.num_layers * (576 + 128) * 4);
    assert_eq!(spec.layers.iter().filter(|&&k| k == FfnKind::Dense).count(), 3);
    assert!(spec.dsa.unwrap().indexer_types.iter().all(|&k| k == IndexerKind::Full));
}

#[test]
fn convert_export_convert_is_the_identity() {
    let tmp = tempfile::tempdir().unwrap();
    for family in ["deepseek_v3", "glm_moe_dsa", "kimi_k25"] {
        let dir = tmp.path().join(family);
        let first =
            convert(fixture(family).join("hf"), dir.join("c1"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
        // Only Kimi's vision tower and projector are left out.
        for name in &first.ignored_tensors {
            assert!(family == "kimi_k25" && !name.starts_with("language_model."), "{family}: ignored {name}");
        }
        if family == "kimi_k25" {
            assert!(!first.ignored_tensors.is_empty());
        }
        export(dir.join("c1"), dir.join("hf-export")).unwrap();
        let second = convert(dir.join("hf-export"), dir.join("c2"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
        assert!(second.ignored_tensors.is_empty(), "{family}: {:?}", second.ignored_tensors);
        let (a, b) = (Container::open(dir.join("c1")).unwrap(), Container::open(dir.join("c2")).unwrap());
        assert_eq!(a.arch(), b.arch(), "{family}");
        let hashes = |c: &Container| {
            c.manifest().files.iter().filter(|f| f.path.ends_with(".bin")).map(|f| f.sha256.clone()).collect::<Vec<_>>()
        };
        assert_eq!(hashes(&a), hashes(&b), "{family}: the exported weights differ");
    }
}
