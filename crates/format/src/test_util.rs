//! What the tests of this crate and of the crates above it share (the
//! `test-util` feature): never part of a build that ships.

/// A pid no process has: a child's, once it has been waited for (the
/// owner of a temporary left by a killed process).
pub fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().expect("spawning `true`");
    let pid = child.id();
    child.wait().expect("waiting for `true`");
    pid
}

/// An Inkling checkpoint as the hub names it, with multi-token-prediction
/// layers, written to `dir`: testdata/inkling/hf_bf16's tensors (stored
/// under the hub's names) and its text config inside the hub's wrapper,
/// whose `mtp_config` declares one MTP layer per entry of `sliding`
/// (`local_layer_ids`: those true) and the chain norm where `chain_norm`;
/// the MTP layers' tensors under the hub's `model.mtp.` names (the inverse
/// of transformers 5.23's `MtpModel` conversion mapping: each layer's own
/// norms and projection, its block under `transformer_block.` with the
/// stack's hub names, dense gate and up paired in `w13_dn`), bf16, seeded.
/// Returns the MTP tensors' names and shapes.
pub fn inkling_hub_with_mtp(dir: &std::path::Path, sliding: &[bool], chain_norm: bool) -> Vec<(String, Vec<usize>)> {
    use rand::{Rng, SeedableRng};
    use safetensors::tensor::{Dtype, TensorView};
    use serde_json::{Value, json};

    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling/hf_bf16");
    let text = std::fs::read_to_string(fixture.join("config.json")).expect("the fixture's config");
    let mut text: Value = serde_json::from_str(&text).expect("the fixture's config is JSON");
    let dim = |key: &str| text[key].as_u64().and_then(|n| usize::try_from(n).ok()).expect(key);
    let (h, kernel, d_rel, dense) =
        (dim("hidden_size"), dim("sconv_kernel_size"), dim("d_rel"), dim("dense_intermediate_size"));
    let full = (dim("num_attention_heads"), dim("num_key_value_heads"), dim("head_dim"), dim("rel_extent"));
    let swa = (
        dim("swa_num_attention_heads"),
        dim("swa_num_key_value_heads"),
        dim("swa_head_dim"),
        dim("sliding_window_size"),
    );
    // The wrapper's `mtp_config` speaks only where the text model is silent.
    for key in ["num_mtp_layers", "chain_hidden_post_norm", "mtp_local_layer_ids"] {
        text.as_object_mut().expect("an object").remove(key);
    }
    let local: Vec<usize> = (0..sliding.len()).filter(|&k| sliding[k]).collect();
    let config = json!({
        "architectures": ["InklingForConditionalGeneration"],
        "model_type": "inkling_mm_model",
        "mtp_config": {"num_nextn_predict_layers": sliding.len(), "chain_hidden_post_norm": chain_norm,
            "local_layer_ids": local},
        "text_config": text,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("writing config.json");

    let mut mtp: Vec<(String, Vec<usize>)> = Vec::new();
    for (k, &slides) in sliding.iter().enumerate() {
        let (heads, kv_heads, head_dim, extent) = if slides { swa } else { full };
        let (q, kv) = (heads * head_dim, kv_heads * head_dim);
        let own = |suffix: &str| format!("model.mtp.layers.{k}.{suffix}");
        let block = |suffix: &str| format!("model.mtp.layers.{k}.transformer_block.{suffix}");
        mtp.extend([
            (own("hidden_norm.weight"), vec![h]),
            (own("embed_norm.weight"), vec![h]),
            (own("input_proj.weight"), vec![h, 2 * h]),
            (block("attn_norm.weight"), vec![h]),
            (block("attn.wq_du.weight"), vec![q, h]),
            (block("attn.wk_dv.weight"), vec![kv, h]),
            (block("attn.wv_dv.weight"), vec![kv, h]),
            (block("attn.wr_du.weight"), vec![heads * d_rel, h]),
            (block("attn.wo_ud.weight"), vec![h, q]),
            (block("attn.q_norm.weight"), vec![head_dim]),
            (block("attn.k_norm.weight"), vec![head_dim]),
            (block("attn.k_sconv.weight"), vec![kv, 1, kernel]),
            (block("attn.v_sconv.weight"), vec![kv, 1, kernel]),
            (block("attn.rel_logits_proj.proj"), vec![d_rel, extent]),
            (block("attn_sconv.weight"), vec![h, 1, kernel]),
            (block("mlp_norm.weight"), vec![h]),
            (block("mlp.w13_dn.weight"), vec![2 * dense, h]),
            (block("mlp.w2_md.weight"), vec![h, dense]),
            (block("mlp.global_scale"), vec![1]),
            (block("mlp_sconv.weight"), vec![h, 1, kernel]),
        ]);
    }
    if chain_norm {
        mtp.push(("model.mtp.chain_norm.weight".to_owned(), vec![h]));
    }

    let bytes = std::fs::read(fixture.join("model.safetensors")).expect("the fixture's tensors");
    let stack = safetensors::SafeTensors::deserialize(&bytes).expect("the fixture's safetensors");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(34);
    // The fixture's magnitudes: norms and scales near 1, weights N(0, 0.15)-like.
    let values = |name: &str, n: usize, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u8> {
        let near_one = name.contains("norm") || name.ends_with("global_scale");
        (0..n)
            .flat_map(|_| {
                let u: f32 = rng.random_range(-1.0..1.0);
                let v = if near_one { 1.0 + 0.2 * u } else { 0.25 * u };
                half::bf16::from_f32(v).to_le_bytes()
            })
            .collect()
    };
    let added: Vec<(String, Vec<usize>, Vec<u8>)> = mtp
        .iter()
        .map(|(name, shape)| (name.clone(), shape.clone(), values(name, shape.iter().product(), &mut rng)))
        .collect();
    let views = stack.tensors().into_iter().chain(added.iter().map(|(name, shape, data)| {
        (name.clone(), TensorView::new(Dtype::BF16, shape.clone(), data).expect("a consistent tensor"))
    }));
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).expect("writing model.safetensors");
    mtp
}
