//! Multi-token-prediction layers: kept at convert where the checkpoint
//! holds them (DeepSeek-V3's layer `num_hidden_layers`, Inkling's
//! `model.mtp.`, Qwen3-Next's and Qwen3.5's `mtp.`), their experts in an
//! expert file of their own and their dense matrices never below q8, and
//! left out on request.

use std::path::{Path, PathBuf};

use strata_format::test_util::inkling_hub_with_mtp;
use strata_format::{Container, ConvertOptions, MtpForm, MtpOutputNorm, QuantPreset, convert, export};
use strata_kernels::QuantFormat;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// The deepseek_v3 fixture with its MTP layer (layer 3) added.
fn with_mtp() -> PathBuf {
    testdata().join("deepseek_v3_mtp/hf")
}

/// Each expert file's layer and the format of its components.
fn expert_formats(container: &Container) -> Vec<(usize, QuantFormat)> {
    let layers = &container.manifest().expert_layers;
    let format = |ordinal| QuantFormat::from_ordinal(ordinal).unwrap();
    layers
        .iter()
        .map(|l| {
            assert!(l.components.iter().all(|c| c.format == l.components[0].format), "one format a record");
            (l.layer, format(l.components[0].format))
        })
        .collect()
}

#[test]
fn convert_keeps_the_mtp_layer_with_its_experts_never_below_q8() {
    let tmp = tempfile::tempdir().unwrap();
    let report = convert(with_mtp(), tmp.path().join("q4"), &ConvertOptions::new(QuantPreset::Q4)).unwrap();
    // Its copies of the embedding and lm head are not in the shard: nothing is unread.
    assert!(report.ignored_tensors.is_empty(), "{:?}", report.ignored_tensors);
    let container = Container::open(tmp.path().join("q4")).unwrap();
    let arch = container.arch();
    assert_eq!((arch.layers.len(), arch.mtp.len()), (3, 1));
    assert_eq!(arch.expert_layers(), [1, 2, 3]);
    assert_eq!(expert_formats(&container), [(1, QuantFormat::Q4), (2, QuantFormat::Q4), (3, QuantFormat::Q8)]);
    for name in ["eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight", "mlp.gate.weight"] {
        let name = format!("model.layers.3.{name}");
        assert!(container.manifest().tensors.iter().any(|t| t.name == name), "{name} kept");
    }
    container.expert_layout(3).unwrap();
}

#[test]
fn drop_mtp_leaves_the_mtp_layer_out_as_a_checkpoint_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let options = ConvertOptions { drop_mtp: true, ..ConvertOptions::new(QuantPreset::Q8) };
    let report = convert(with_mtp(), tmp.path().join("dropped"), &options).unwrap();
    assert!(report.ignored_tensors.contains(&"model.layers.3.eh_proj.weight".to_owned()));
    let container = Container::open(tmp.path().join("dropped")).unwrap();
    assert!(container.arch().mtp.is_empty());
    assert_eq!(expert_formats(&container), [(1, QuantFormat::Q8), (2, QuantFormat::Q8)]);
    // The fixture's config declares the layer its checkpoint lacks.
    convert(testdata().join("deepseek_v3/hf"), tmp.path().join("plain"), &ConvertOptions::new(QuantPreset::Q8))
        .unwrap();
    assert!(Container::open(tmp.path().join("plain")).unwrap().arch().mtp.is_empty());
}

#[test]
fn an_exported_container_keeps_its_mtp_layer() {
    let tmp = tempfile::tempdir().unwrap();
    convert(with_mtp(), tmp.path().join("c"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    export(tmp.path().join("c"), tmp.path().join("hf")).unwrap();
    convert(tmp.path().join("hf"), tmp.path().join("again"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let again = Container::open(tmp.path().join("again")).unwrap();
    assert_eq!(again.arch().mtp.len(), 1);
}

/// Inkling's hub checkpoint with two MTP layers (the second sliding) and
/// the chain norm converts at q4 with every MTP tensor in the container
/// under its canonical name (layer 4 and 5 of the 4-layer stack, the chain
/// norm its own), shaped as the hub stores it, its matrices at q8 and its
/// dense gate and up the even and odd rows of the hub's `w13_dn`; nothing
/// of the checkpoint is left unread, and the layers add no expert file.
#[test]
fn inklings_hub_mtp_layers_convert_under_their_canonical_names() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = tmp.path().join("hub");
    std::fs::create_dir(&hub).unwrap();
    let stored = inkling_hub_with_mtp(&hub, &[false, true], true);
    let report = convert(&hub, tmp.path().join("q4"), &ConvertOptions::new(QuantPreset::Q4)).unwrap();
    assert!(report.ignored_tensors.is_empty(), "{:?}", report.ignored_tensors);
    let container = Container::open(tmp.path().join("q4")).unwrap();
    let arch = container.arch();
    assert_eq!((arch.layers.len(), arch.mtp.len()), (4, 2));
    assert_eq!(arch.mtp_form, MtpForm { hidden_first: true, output_norm: MtpOutputNorm::Chain });
    assert_eq!(arch.expert_layers(), [1, 2, 3], "the MTP layers' MLPs are dense");
    let stack: Vec<String> =
        strata_format::names::dense_tensors(&arch.clone().without_mtp()).into_iter().map(|d| d.name).collect();
    let kept: Vec<_> = container.manifest().tensors.iter().filter(|t| !stack.contains(&t.name)).collect();
    // Every hub tensor is one canonical tensor, but the pair `w13_dn`: two.
    assert_eq!(kept.len(), stored.len() + 2, "{:?}", kept.iter().map(|t| &t.name).collect::<Vec<_>>());
    let shape = |name: &str| container.dense_entry(name).unwrap().shape.clone();
    let format = |name: &str| QuantFormat::from_ordinal(container.dense_entry(name).unwrap().format).unwrap();
    assert_eq!(shape("model.layers.4.eh_proj.weight"), [48, 96]);
    assert_eq!(shape("model.layers.4.self_attn.q_proj.weight"), [32, 48], "full: 4 heads x 8");
    assert_eq!(shape("model.layers.5.self_attn.q_proj.weight"), [36, 48], "sliding: 6 heads x 6");
    assert_eq!(shape("model.layers.5.self_attn.rel_logits_proj.proj"), [4, 6], "the window's distances");
    assert_eq!(shape("model.mtp.chain_norm.weight"), [48]);
    for name in ["model.layers.4.eh_proj.weight", "model.layers.5.mlp.down_proj.weight"] {
        assert_eq!(format(name), QuantFormat::Q8, "{name}");
    }
    // The dense gate and up: the even and odd rows of the hub's pair.
    let checkpoint = strata_format::Checkpoint::open(&hub).unwrap();
    let pair = checkpoint.rows_f32("model.mtp.layers.1.transformer_block.mlp.w13_dn.weight", 0, 128).unwrap();
    let mut gate = vec![0.0f32; 64 * 48];
    container.dense_rows("model.layers.5.mlp.gate_proj.weight", &(0..64).collect::<Vec<_>>(), &mut gate).unwrap();
    for (r, (row, paired)) in gate.chunks(48).zip(pair.chunks(96)).enumerate() {
        let amax = paired[..48].iter().fold(0f32, |m, x| m.max(x.abs()));
        for (x, want) in row.iter().zip(&paired[..48]) {
            assert!((x - want).abs() <= amax / 127.0, "gate row {r}: {x} for {want}");
        }
    }
    assert_eq!(
        container.dense_vec("model.layers.4.hnorm.weight").unwrap(),
        checkpoint.rows_f32("model.mtp.layers.0.hidden_norm.weight", 0, 1).unwrap()
    );
}

/// Without the chain norm no output norm is stored; exported and converted
/// again, the MTP layer and its form are the same; dropped on request, the
/// hub's `model.mtp.` tensors are left unread and the model has none.
#[test]
fn inklings_mtp_layers_without_the_chain_norm_and_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = tmp.path().join("hub");
    std::fs::create_dir(&hub).unwrap();
    let stored = inkling_hub_with_mtp(&hub, &[false], false);
    convert(&hub, tmp.path().join("kept"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let kept = Container::open(tmp.path().join("kept")).unwrap();
    assert_eq!(kept.arch().mtp_form.output_norm, MtpOutputNorm::Unnormed);
    assert!(kept.manifest().tensors.iter().all(|t| !t.name.contains("chain_norm") && !t.name.contains("shared_head")));
    // Exported (canonical names, the form in config.json) and converted again.
    export(tmp.path().join("kept"), tmp.path().join("exported")).unwrap();
    convert(tmp.path().join("exported"), tmp.path().join("again"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let again = Container::open(tmp.path().join("again")).unwrap();
    assert_eq!((&again.arch().mtp, again.arch().mtp_form), (&kept.arch().mtp, kept.arch().mtp_form));
    let options = ConvertOptions { drop_mtp: true, ..ConvertOptions::new(QuantPreset::F32) };
    let report = convert(&hub, tmp.path().join("dropped"), &options).unwrap();
    let unread: Vec<&String> = stored.iter().map(|(name, _)| name).collect();
    assert_eq!(report.ignored_tensors.iter().collect::<Vec<_>>(), {
        let mut u = unread;
        u.sort();
        u
    });
    assert!(Container::open(tmp.path().join("dropped")).unwrap().arch().mtp.is_empty());
}

/// Qwen3-Next's and Qwen3.5's hub `mtp.` module (testdata/FAMILY_mtp: the
/// family's 4-layer fixture plus the module, Qwen3.5's in the multimodal
/// layout) converts at q4 as layer 4 under canonical names, its shared
/// join and norm as the layer's `eh_proj`, `enorm`, `hnorm` and
/// `shared_head.norm`, its experts q8 in an expert file of their own, with
/// nothing of the checkpoint unread; exported and converted again it is
/// the same; dropped, `mtp.*` is left unread.
#[test]
fn qwens_hub_mtp_modules_convert_as_layer_num_hidden_layers() {
    for (family, prefix) in [("qwen3_next", "model."), ("qwen3_5_moe", "model.language_model.")] {
        let tmp = tempfile::tempdir().unwrap();
        let hub = testdata().join(format!("{family}_mtp/hf"));
        let report = convert(&hub, tmp.path().join("q4"), &ConvertOptions::new(QuantPreset::Q4)).unwrap();
        let unread: Vec<&String> = report.ignored_tensors.iter().filter(|n| !n.contains("visual")).collect();
        assert!(unread.is_empty(), "{family}: {unread:?}");
        let container = Container::open(tmp.path().join("q4")).unwrap();
        let arch = container.arch();
        assert_eq!((arch.layers.len(), arch.mtp.len(), arch.mtp_form), (4, 1, MtpForm::DEEPSEEK_V3), "{family}");
        assert_eq!(arch.mtp[0].mixer, arch.layers.iter().find(|l| l.state_floats() == 0).unwrap().mixer, "{family}");
        assert_eq!(expert_formats(&container).last(), Some(&(4, QuantFormat::Q8)), "{family}");
        let format = |name: &str| QuantFormat::from_ordinal(container.dense_entry(name).unwrap().format).unwrap();
        assert_eq!(format(&format!("{prefix}layers.4.eh_proj.weight")), QuantFormat::Q8, "{family}");
        let checkpoint = strata_format::Checkpoint::open(&hub).unwrap();
        for (canonical, stored) in [("enorm", "mtp.pre_fc_norm_embedding"), ("shared_head.norm", "mtp.norm")] {
            let kept = container.dense_vec(&format!("{prefix}layers.4.{canonical}.weight")).unwrap();
            assert_eq!(kept, checkpoint.rows_f32(&format!("{stored}.weight"), 0, 1).unwrap(), "{family} {canonical}");
        }
        export(tmp.path().join("q4"), tmp.path().join("exported")).unwrap();
        convert(tmp.path().join("exported"), tmp.path().join("again"), &ConvertOptions::new(QuantPreset::F32)).unwrap();
        let again = Container::open(tmp.path().join("again")).unwrap();
        assert_eq!((&again.arch().mtp, again.arch().mtp_form), (&arch.mtp, arch.mtp_form), "{family}");
        let options = ConvertOptions { drop_mtp: true, ..ConvertOptions::new(QuantPreset::F32) };
        let report = convert(&hub, tmp.path().join("dropped"), &options).unwrap();
        assert!(report.ignored_tensors.contains(&"mtp.fc.weight".to_owned()), "{family}");
        assert!(Container::open(tmp.path().join("dropped")).unwrap().arch().mtp.is_empty(), "{family}");
    }
}

/// A Qwen3-Next MTP layer k has the MLP the stack's layer k has (vLLM
/// builds it by the stack's rule at index k): with `mlp_only_layers: [0]`
/// the first of two is dense, the second MoE; a module with its own
/// embedding table (`mtp_use_dedicated_embeddings`) is not kept, and more
/// MTP layers than stack layers are refused.
#[test]
fn qwen3_next_mtp_layer_k_has_the_stack_layer_ks_mlp() {
    let text = std::fs::read_to_string(testdata().join("qwen3_next_mtp/hf/config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    let arch = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = config.clone();
        edit(&mut c);
        strata_format::ModelArch::from_config_value(&c)
    };
    let two = arch(&|c| {
        c["mtp_num_hidden_layers"] = 2.into();
        c["mlp_only_layers"] = serde_json::json!([0]);
    })
    .unwrap();
    let kinds: Vec<_> = two.mtp.iter().map(|l| l.ffn.kind()).collect();
    assert_eq!(kinds, [strata_format::FfnKind::Dense, strata_format::FfnKind::Moe]);
    assert_eq!(two.layers[0].ffn.kind(), strata_format::FfnKind::Dense);
    assert!(arch(&|c| c["mtp_use_dedicated_embeddings"] = true.into()).unwrap().mtp.is_empty());
    let err = arch(&|c| c["mtp_num_hidden_layers"] = 5.into()).unwrap_err().to_string();
    assert!(err.contains("mtp_num_hidden_layers"), "{err}");
}
