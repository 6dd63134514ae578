//! Peak memory of conversion: streaming must keep the working set to one
//! row block / one expert, far below the size of the largest tensor in f32.
//!
//! Alone in its own test binary so no other test allocates concurrently.

mod common;

use safetensors::tensor::Dtype;
use serde_json::json;
use strata_format::{CHUNK_ELEMS, Container, ConvertOptions, QuantPreset, convert, names};

/// (VmRSS, VmHWM) of this process in bytes.
fn rss_and_peak() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[test]
fn conversion_streams_in_bounded_memory() {
    // One big tensor: a 32768 x 1024 embedding, 128 MiB in f32, 64 MiB as
    // stored bf16: eight CHUNK_ELEMS row blocks.
    let config = json!({
        "model_type": "olmoe", "vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
        "num_experts": 2, "num_experts_per_tok": 1, "tie_word_embeddings": true
    });
    let spec = strata_format::ModelSpec::from_config_value(&config).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    let mut rng = common::Rng(3);
    let mut stored = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| 0.1 * rng.uniform()).collect();
        let bits = strata_kernels::quant::f32_to_bf16_bits(&values);
        stored.push((name, shape, Dtype::BF16, bytemuck::cast_slice::<u16, u8>(&bits).to_vec()));
    };
    for d in names::dense_tensors(&spec.arch()) {
        add(d.name, d.shape);
    }
    for e in 0..2 {
        for (name, shape) in
            names::expert_names(&spec.arch().core, 0, e).into_iter().zip(names::expert_shapes(&spec.arch()))
        {
            add(name, shape.to_vec());
        }
    }
    common::write_safetensors(&hf.join("model.safetensors"), &stored);
    let checkpoint_bytes = std::fs::metadata(hf.join("model.safetensors")).unwrap().len();
    let embed_f32_bytes = 32768u64 * 1024 * 4;
    assert!(embed_f32_bytes > 4 * (CHUNK_ELEMS as u64) * 4, "several row blocks");
    drop(stored);

    // Reset the high-water mark to the current RSS (Linux >= 4.0).
    if std::fs::write("/proc/self/clear_refs", "5").is_err() {
        eprintln!("cannot reset VmHWM here; skipping the memory assertion");
        return;
    }
    let Some((rss_before, _)) = rss_and_peak() else {
        eprintln!("no /proc/self/status; skipping");
        return;
    };
    let out = tmp.path().join("c");
    convert(&hf, &out, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    let (_, peak_after) = rss_and_peak().unwrap();
    let growth = peak_after.saturating_sub(rss_before);
    eprintln!(
        "peak RSS growth {:.1} MiB (checkpoint {:.1} MiB mapped, embedding {:.1} MiB in f32)",
        growth as f64 / 1048576.0,
        checkpoint_bytes as f64 / 1048576.0,
        embed_f32_bytes as f64 / 1048576.0
    );
    // The mapped checkpoint pages count toward RSS once touched; on top of
    // that only one row block (16 MiB f32 + its q8 bytes) plus the scales of
    // the tensor should be live. Holding the embedding in f32 would add 128 MiB.
    let working_set_bytes = growth.saturating_sub(checkpoint_bytes);
    assert!(working_set_bytes < 64 << 20, "working set {working_set_bytes} bytes beyond the mapped checkpoint");
    Container::open(&out).unwrap();
}
