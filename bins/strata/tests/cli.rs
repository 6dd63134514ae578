//! The `strata` command line as a user drives it: the contract commands on a
//! fixture, and bad input answered by one clear line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("strata runs")
}

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family)
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Fails unless the command failed with exactly one line on stderr that
/// mentions `needle`, and did not panic.
fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
}

#[test]
fn convert_info_generate_logits_export_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("olmoe-q4");
    let out = strata(&["convert", path(&fixture("olmoe").join("hf")), path(&model), "--quant", "q4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let info = strata(&["info", path(&model), "--verify"]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success() && text.contains("olmoe"), "{text}");

    let gen_out = strata(&["generate", path(&model), "--tokens", "1,2,3", "--max-new-tokens", "5", "--json"]);
    assert!(gen_out.status.success(), "{}", String::from_utf8_lossy(&gen_out.stderr));
    let stdout = String::from_utf8_lossy(&gen_out.stdout);
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let tokens = last["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty() && tokens.len() <= 5, "{last}");
    // The model fits the default budget, so every expert was read at open:
    // its first tokens find them all cached.
    assert!(last["stats"]["expert_hits"].as_u64().unwrap() > 0, "{last}");
    assert_eq!(last["stats"]["expert_misses"].as_u64(), Some(0), "{last}");

    let npy = dir.path().join("logits.npy");
    let out = strata(&["logits", path(&model), "--tokens", "4,5,6", "--out", path(&npy), "--expert-cache", "16KiB"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (shape, logits) = strata_format::npy::read_f32(&npy).unwrap();
    assert_eq!(shape[0], 3);
    assert_eq!(logits.len(), shape[0] * shape[1]);

    let hf = dir.path().join("exported");
    let out = strata(&["export", path(&model), path(&hf)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(hf.join("config.json").exists() && hf.join("model.safetensors").exists());
}

/// A checkpoint's MXFP4 experts are kept as it stores them, which `info`
/// says; `--dequantize-mxfp4` stores them in `--quant`'s format instead.
#[test]
fn mxfp4_experts_are_kept_unless_convert_is_told_to_dequantize_them() {
    let dir = tempfile::tempdir().unwrap();
    let hub = fixture("gpt_oss").join("hf_mxfp4");
    for (flag, kept) in [(None, true), (Some("--dequantize-mxfp4"), false)] {
        let model = dir.path().join(if kept { "kept" } else { "dequantized" });
        let mut args = vec!["convert", path(&hub), path(&model), "--quant", "q4"];
        args.extend(flag);
        let out = strata(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let info = strata(&["info", path(&model)]);
        let text = String::from_utf8_lossy(&info.stdout);
        assert!(info.status.success(), "{text}");
        assert_eq!(text.contains("experts       mxfp4 (as the checkpoint stores them)"), kept, "{flag:?}: {text}");
    }
}

/// `--device gpu`: without the GPU backend built in, one line saying how to
/// build it; with it (`--features gpu`), on this machine's adapter, the
/// CPU's tokens, and a line at start saying what runs where.
#[test]
fn generate_on_the_gpu_gives_the_cpus_tokens_or_says_how_to_build_it() {
    generate_on_a_device_gives_the_cpus_tokens("gpu", cfg!(feature = "gpu"), "STRATA_GPU_TESTS", "no GPU", "GPU ");
}

/// `--device cuda`: the same through CUDA; where the driver, the device or
/// NVRTC is missing, one line saying which.
#[test]
fn generate_on_cuda_gives_the_cpus_tokens_or_says_what_is_missing() {
    generate_on_a_device_gives_the_cpus_tokens("cuda", cfg!(feature = "cuda"), "STRATA_CUDA_TESTS", "CUDA", "(cuda:0)");
}

/// `strata generate --device DEVICE` on the q4 OLMoE fixture: built without
/// the feature, one line naming it; without a device (`absent` in the one
/// line), skipped unless `require_var` is `require`; else the CPU's tokens
/// and a line at start naming the device (`named`) and what runs where.
fn generate_on_a_device_gives_the_cpus_tokens(device: &str, built: bool, require_var: &str, absent: &str, named: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("olmoe-q4");
    let out = strata(&["convert", path(&fixture("olmoe").join("hf")), path(&model), "--quant", "q4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let generate = |device: &str| {
        strata(&[
            "generate",
            path(&model),
            "--tokens",
            "1,2,3",
            "--max-new-tokens",
            "5",
            "--seed",
            "7",
            "--json",
            "--device",
            device,
        ])
    };
    let on_device = generate(device);
    if !built {
        assert_clean_failure(&on_device, &format!("--features {device}"));
        return;
    }
    let stderr = String::from_utf8_lossy(&on_device.stderr);
    if !on_device.status.success() && !std::env::var(require_var).is_ok_and(|v| v == "require") {
        assert_clean_failure(&on_device, absent);
        eprintln!("{device} test skipped: {stderr}");
        return;
    }
    assert!(
        on_device.status.success()
            && stderr.contains(named)
            && stderr.contains("routed experts in")
            && stderr.contains("; on the CPU:"),
        "{stderr}"
    );
    let tokens = |out: &Output| {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        last["tokens"].clone()
    };
    assert_eq!(tokens(&on_device), tokens(&generate("cpu")));
}

/// `demo` names the built-in model wherever a model is named: its
/// checkpoint can be exported without finding its folder in the cache.
#[test]
fn export_takes_the_demo_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("demo-hf");
    let cache = dir.path().join("cache");
    let out = strata(&["--cache-dir", path(&cache), "export", "demo", path(&hf)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(hf.join("config.json").exists() && hf.join("model.safetensors").exists());
}

#[test]
fn sampled_generation_is_reproducible_with_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    assert!(strata(&["convert", path(&fixture("mixtral").join("hf")), path(&model), "--quant", "q8"]).status.success());
    let run = || {
        let out = strata(&[
            "generate",
            path(&model),
            "--tokens",
            "7,8",
            "--max-new-tokens",
            "8",
            "--temperature",
            "0.8",
            "--top-k",
            "40",
            "--top-p",
            "0.9",
            "--seed",
            "42",
            "--ignore-eos",
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        v["tokens"].clone()
    };
    let first = run();
    assert_eq!(first.as_array().unwrap().len(), 8);
    assert_eq!(first, run());
}

/// `strata generate` samples as `chat` and `serve` do: the model's
/// generation_config.json (the demo's: temperature 0.8, top-k 40, top-p
/// 0.95) unless a flag says otherwise, a random seed printed once so the
/// run can be repeated, and greedy (`--temperature 0`) with no seed at all.
#[test]
fn generate_samples_like_chat_with_a_random_printed_seed() {
    let dir = tempfile::tempdir().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let model = dir.path().join("demo");
    let out = strata(&["convert", path(&demo), path(&model), "--quant", "q8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = |extra: &[&str]| -> (serde_json::Value, String) {
        let args = ["generate", path(&model), "--tokens", "1,2,3", "--max-new-tokens", "12", "--ignore-eos", "--json"];
        let out = strata(&[&args[..], extra].concat());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let line = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
        (line, stderr)
    };

    let (first, first_stderr) = run(&[]);
    let (second, second_stderr) = run(&[]);
    assert_eq!(first["sampling"], serde_json::json!({ "temperature": 0.8, "top_k": 40, "top_p": 0.95 }));
    for (line, stderr) in [(&first, &first_stderr), (&second, &second_stderr)] {
        let seed = line["seed"].as_u64().unwrap();
        assert_eq!(stderr, &format!("strata: seed {seed} (--seed {seed} repeats this)\n"), "one line, the seed");
    }
    assert_ne!(first["seed"], second["seed"], "a fresh seed each run");

    let seed = first["seed"].to_string();
    let (repeated, stderr) = run(&["--seed", &seed]);
    assert_eq!(repeated["tokens"], first["tokens"], "the printed seed repeats the run");
    assert_eq!(repeated["seed"], first["seed"]);
    assert_eq!(stderr, "", "a given seed is not printed again");

    let (greedy, stderr) = run(&["--temperature", "0"]);
    assert_eq!(greedy["sampling"]["temperature"], 0.0);
    assert_eq!(stderr, "", "a greedy run needs no seed");
    let (flags, _) = run(&["--temperature", "0.5", "--top-k", "5", "--top-p", "1", "--seed", "1"]);
    assert_eq!(flags["sampling"], serde_json::json!({ "temperature": 0.5, "top_k": 5, "top_p": 1.0 }));
}

#[test]
fn missing_model_directory_is_one_clear_line() {
    let out = strata(&["info", "/nonexistent/strata-model"]);
    assert_clean_failure(&out, "/nonexistent/strata-model");
}

#[test]
fn malformed_token_list_is_rejected() {
    let out = strata(&["generate", "/tmp", "--tokens", "1,x,3"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"x\" is not a token id") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unknown_family_names_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(hf.join("config.json"), r#"{"model_type": "llama", "hidden_size": 8}"#).unwrap();
    let out = strata(&["convert", path(&hf), path(&dir.path().join("out")), "--quant", "f32"]);
    assert_clean_failure(&out, "olmoe");
    assert!(!dir.path().join("out").exists(), "no container left behind");
}

#[test]
fn a_config_key_the_family_does_not_know_is_refused_unless_allowed_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    let source = fixture("deepseek_v3").join("hf");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("config.json")).unwrap()).unwrap();
    config["attn_logit_softcapping"] = 30.into();
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(source.join("model.safetensors"), hf.join("model.safetensors")).unwrap();
    let (out, cache) = (dir.path().join("out"), dir.path().join("cache"));
    let refused = "deepseek_v3 does not know attn_logit_softcapping: Strata would run another model than the one \
                   described (--allow-unknown-config KEY";
    assert_clean_failure(&strata(&["convert", path(&hf), path(&out), "--quant", "f32"]), refused);
    assert!(!out.exists(), "no container left behind");
    // The same for a checkpoint given as the model, converted on first use.
    assert_clean_failure(&strata(&["info", "--model", path(&hf), "--cache-dir", path(&cache)]), refused);
    let allowed = ["--allow-unknown-config", "attn_logit_softcapping"];
    let converted = strata(&[&["convert", path(&hf), path(&out), "--quant", "f32"][..], &allowed].concat());
    assert!(converted.status.success(), "{}", String::from_utf8_lossy(&converted.stderr));
    let info = strata(&[&["info", "--model", path(&hf), "--cache-dir", path(&cache)][..], &allowed].concat());
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
}

#[test]
fn out_of_vocabulary_token_is_an_error_not_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    assert!(
        strata(&["convert", path(&fixture("qwen3_moe").join("hf")), path(&model), "--quant", "f32"]).status.success()
    );
    let out =
        strata(&["generate", path(&model), "--tokens", "1,999999", "--max-new-tokens", "2", "--temperature", "0"]);
    assert_clean_failure(&out, "999999");
}

#[test]
fn truncated_expert_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    assert!(
        strata(&["convert", path(&fixture("mixtral").join("hf")), path(&model), "--quant", "f32"]).status.success()
    );
    let experts = std::fs::read_dir(model.join("experts")).unwrap().next().unwrap().unwrap().path();
    std::fs::OpenOptions::new().write(true).open(&experts).unwrap().set_len(100).unwrap();
    let out = strata(&[
        "generate",
        path(&model),
        "--tokens",
        "1,2,3",
        "--max-new-tokens",
        "2",
        "--expert-cache",
        "0",
        "--temperature",
        "0",
    ]);
    assert_clean_failure(&out, experts.file_name().unwrap().to_str().unwrap());
}

#[test]
fn a_closed_pipe_ends_output_quietly() {
    use std::process::{Command, Stdio};
    let model = tempfile::tempdir().unwrap();
    let out = model.path().join("mixtral");
    let converted = strata(&["convert", path(&fixture("mixtral").join("hf")), path(&out), "--quant", "q8"]);
    assert!(converted.status.success(), "{}", String::from_utf8_lossy(&converted.stderr));
    // `strata info … | head -c0`: the reader is gone before anything is printed.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["info", path(&out)])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
    assert_ne!(output.status.code(), Some(101), "no panic exit");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef strata"), ("fish", "complete -c strata")] {
        let out = strata(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(marker) && text.contains("generate"), "{shell}: {text}");
    }
}

#[test]
fn an_error_says_its_cause_once() {
    let out = strata(&["trace", "replay", "/nonexistent/run.trace", "--expert-cache", "1MiB"]);
    assert_clean_failure(&out, "/nonexistent/run.trace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("No such file or directory").count(), 1, "{stderr}");
}

#[test]
fn the_model_is_named_as_in_chat_and_serve_too() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("mixtral");
    let out = strata(&["convert", path(&fixture("mixtral").join("hf")), path(&model), "--quant", "q8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let positional = strata(&["info", path(&model)]);
    let flag = strata(&["info", "--model", path(&model)]);
    assert!(flag.status.success(), "{}", String::from_utf8_lossy(&flag.stderr));
    assert_eq!(flag.stdout, positional.stdout);
    let generated = strata(&["generate", "--model", path(&model), "--tokens", "1,2", "--max-tokens", "3", "--json"]);
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
}

/// `strata mirror stage` on a tmpfs (a different filesystem, where the
/// machine has one), then `generate --mirror`: the same tokens, bytes served
/// by the mirror counted; a mirror without a receipt is refused in one line.
#[test]
fn a_staged_mirror_serves_reads_and_changes_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("olmoe-q4");
    let out = strata(&["convert", path(&fixture("olmoe").join("hf")), path(&model), "--quant", "q4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shm = Path::new("/dev/shm");
    let mirror_root = if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() };
    let mirror = mirror_root.path().join("m");

    let bare =
        strata(&["generate", path(&model), "--tokens", "1,2,3", "--max-new-tokens", "6", "--mirror", path(&mirror)]);
    assert_clean_failure(&bare, "strata mirror stage");

    let out = strata(&["mirror", "stage", path(&mirror), "--model", path(&model), "--reserve", "0B"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("receipt published"));
    let verify = strata(&["mirror", "verify", path(&mirror), "--model", path(&model)]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));

    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["generate", path(&model), "--tokens", "1,2,3", "--max-new-tokens", "6", "--json"];
        args.extend_from_slice(&["--expert-cache", "0B", "--temperature", "0"]);
        args.extend_from_slice(extra);
        let out = strata(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap()
    };
    let without = run(&[]);
    let spec = format!("{}=1TiB", mirror.display());
    let with = run(&["--mirror", &spec]);
    assert_eq!(without["tokens"], with["tokens"]);
    assert_eq!(without["stats"]["mirror_bytes_read"], serde_json::json!([]));
    assert!(with["stats"]["mirror_bytes_read"][0].as_u64().unwrap() > 0, "{with}");
}

/// What a hybrid model costs per session: `info` on a folder holding only
/// the published config gives the attention cache per token and the fixed
/// recurrent state, as the issue's figures for Qwen3.6-35B-A3B and
/// Qwen3-Next-80B-A3B.
#[test]
fn info_reports_kv_per_token_and_fixed_state_of_the_hybrid_configs() {
    for (like, kv_bytes_per_token, state_bytes) in
        [("qwen3.6-35b-a3b", 40 << 10, 65_863_680), ("qwen3-next-80b-a3b", 48 << 10, 79_036_416)]
    {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), strata_format::like_config(like, None).unwrap()).unwrap();
        let out = strata(&["info", path(dir.path())]);
        assert!(out.status.success(), "{like}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(&format!("kv bytes/token {kv_bytes_per_token} ")), "{like}:\n{text}");
        assert!(text.contains(&format!("state bytes/session {state_bytes} ")), "{like}:\n{text}");
    }
}

/// What an Inkling session costs: `info` on the Hub config's shapes (and
/// on `synth --like inkling`'s, the same) gives the 11 full layers' keys
/// and values per token, and per sequence the 55 sliding rings and every
/// layer's four short-convolution states; and the hub's MTP layer.
#[test]
fn info_reports_inkling_rows_per_token_and_rings_and_convolutions_per_session() {
    let synth = tempfile::tempdir().unwrap();
    std::fs::write(synth.path().join("config.json"), strata_format::like_config("inkling", None).unwrap()).unwrap();
    for dir in [fixture("inkling_hub").join("inkling"), synth.path().to_path_buf()] {
        let out = strata(&["info", path(&dir)]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("kv bytes/token 90112 (88.00 KiB)"), "{text}");
        assert!(text.contains("state bytes/session 474079232 "), "{text}");
        assert!(text.contains("55 x layer inkling 64 q / 16 kv heads x 128, window 512"), "{text}");
    }
    // The hub's `mtp_config` declares one full MTP layer (synth leaves it out).
    let out = strata(&["info", path(&fixture("inkling_hub").join("inkling"))]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("mtp layers    1 ([hidden, embedding] joined, no output norm)"), "{text}");
    assert!(text.contains("   1 x mtp layer inkling 64 q / 8 kv heads x 128, bias 1024 back x 16, conv 4"), "{text}");
}

/// Kimi-Linear-48B-A3B-Instruct as published (testdata/kimi_linear_hub):
/// `info` on its config alone names its KDA layers and gives what a bf16
/// checkpoint of it holds, dense and in experts, counted here tensor by
/// tensor from the published dimensions, and what a session keeps.
#[test]
fn info_reports_bytes_and_state_of_the_published_kimi_linear_config() {
    let dir = fixture("kimi_linear_hub").join("Kimi-Linear-48B-A3B-Instruct");
    let out = strata(&["info", path(&dir)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (hidden, vocab, kda, latent, heads) = (2304u64, 163_840u64, 32 * 128u64, 512u64, 32u64);
    let norms = 2 * hidden;
    // q, k, v with their convolutions, the forget gate (f_a, f_b, dt_bias,
    // A_log), b_proj, the output gate (g_a, g_b), its norm, o_proj.
    let kda_layer = 3 * kda * hidden
        + 3 * kda * 4
        + (128 * hidden + kda * 128 + kda + 32)
        + 32 * hidden
        + (128 * hidden + kda * 128)
        + 128
        + hidden * kda;
    // q_proj, kv_a_proj_with_mqa, its norm, kv_b_proj, o_proj.
    let mla_layer =
        heads * 192 * hidden + (latent + 64) * hidden + latent + heads * 256 * latent + hidden * heads * 128;
    let dense_mlp = 3 * 9216 * hidden;
    // Router, its correction bias, one shared expert.
    let moe_layer = 256 * hidden + 256 + 3 * 1024 * hidden;
    let params = 2 * vocab * hidden + hidden + 27 * norms + 20 * kda_layer + 7 * mla_layer + dense_mlp + 26 * moe_layer;
    let per_expert = 3 * 1024 * hidden * 2;
    for line in [
        "   1 x layer kimi delta attention 32 heads x 128, conv 4; dense 9216;".to_owned(),
        "  19 x layer kimi delta attention 32 heads x 128, conv 4; moe 256 experts top-8 x 1024 + shared 1024;"
            .to_owned(),
        format!("bytes dense   {} ", 2 * params),
        format!("bytes/expert  {per_expert} "),
        format!("bytes experts {} ", per_expert * 26 * 256),
        format!("kv bytes/token {} ", 7 * (512 + 64) * 4),
        format!("state bytes/session {} ", 20 * (32 * 128 * 128 + 3 * 3 * kda) * 4),
    ] {
        assert!(text.contains(&line), "{line:?} in:\n{text}");
    }
}

/// GLM-5.3-Flash as transformers 5.23 writes it (testdata/glm5_next_hub):
/// `info` on its config alone gives its three layer kinds and what a bf16
/// checkpoint of it holds, dense and in experts, counted here tensor by
/// tensor from the published dimensions, and what a session keeps: the
/// latent and a pooled indexer key per 16 tokens on the MLA layers, the KDA
/// state and each indexer's open pool per sequence.
#[test]
fn info_reports_bytes_and_state_of_the_published_glm5_next_config() {
    let dir = fixture("glm5_next_hub").join("GLM-5.3-Flash");
    let out = strata(&["info", path(&dir)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let (hidden, vocab, heads, head_dim) = (4096u64, 154_880u64, 64u64, 128u64);
    let kda = heads * head_dim;
    // q, k, v with their convolutions, the forget gate (f_a, f_b, dt_bias,
    // A_log), b_proj, the output gate (g_a, g_b), its norm, o_proj.
    let kda_layer = 3 * kda * hidden
        + 3 * kda * 4
        + (head_dim * hidden + kda * head_dim + kda + heads)
        + heads * hidden
        + (head_dim * hidden + kda * head_dim)
        + head_dim
        + hidden * kda;
    // q_a_proj, its norm, q_b_proj, kv_a_proj_with_mqa (no rope part), its
    // norm, kv_b_proj, o_proj; the indexer's wq_b, wk, k_norm (weight and
    // bias), weights_proj, pool position bias and gate.
    let mla_layer = 1536 * hidden
        + 1536
        + heads * 256 * 1536
        + 512 * hidden
        + 512
        + heads * 512 * 512
        + hidden * heads * 256
        + (32 * 128 * 1536 + 128 * hidden + 2 * 128 + 32 * hidden + 16 * 128 + 128 * hidden);
    // Two norms and two hyper-connections (fn, base, scale) of 4 streams.
    let per_layer = 2 * hidden + 2 * (24 * 4 * hidden + 24 + 3);
    let dense_mlp = 3 * 12_288 * hidden;
    // Router, its correction bias, one shared expert.
    let moe_layer = 288 * hidden + 288 + 3 * 2048 * hidden;
    let params =
        2 * vocab * hidden + hidden + 45 * per_layer + 34 * kda_layer + 11 * mla_layer + 3 * dense_mlp + 42 * moe_layer;
    let per_expert = 3 * 2048 * hidden * 2;
    let kda_state = heads * head_dim * head_dim + 3 * kda * 3;
    let open_pool = 2 * 15 * 128;
    for line in [
        "   3 x layer kimi delta attention 64 heads x 128, conv 4; dense 12288, swiglu limit 10;".to_owned(),
        "  11 x layer mla 64 heads, 512 latent, no rope, 128 index-key top-2048 in pools of 16;".to_owned(),
        format!("bytes dense   {} ", 2 * params),
        format!("bytes/expert  {per_expert} "),
        format!("bytes experts {} ", per_expert * 42 * 288),
        format!("kv bytes/token {} ", 11 * (512 + 128 / 16) * 4),
        format!("state bytes/session {} ", (34 * kda_state + 11 * open_pool) * 4),
    ] {
        assert!(text.contains(&line), "{line:?} in:\n{text}");
    }
}

/// Qwen3.8-Flash-Next's published shapes (`synth --like
/// qwen3.8-flash-next`): `info` on the config alone gives its three layer
/// kinds, the n-gram PLE table's bytes at bf16 (16 heads' primes from 20 M,
/// padded to 128 rows, x 160: 51 B parameters) read by row from disk, and
/// per session the 12 QSA layers' keys, values and raw index keys and the
/// PLE layer's token id per token, the 36 DeltaNet states and the PLE's
/// dilated convolution rows.
#[test]
fn info_reports_the_ple_table_on_disk_and_state_of_the_published_qwen3_8_flash_next_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let config = strata_format::like_config("qwen3.8-flash-next", None).unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let out = strata(&["info", path(dir.path())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let is_prime = |n: u64| n > 1 && (2..).take_while(|d| d * d <= n).all(|d| !n.is_multiple_of(d));
    let primes: u64 = (20_000_000u64..).filter(|&n| is_prime(n)).take(16).sum();
    let table_rows = primes.div_ceil(128) * 128;
    let (hidden, streams) = (2560u64, 4u64);
    let gdn_state = 48 * 128 * 128 + (2 * 16 * 128 + 48 * 128) * 3;
    let ple_conv = (4 - 1) * 3 * streams * hidden;
    for line in [
        "  12 x layer gqa 24 q / 2 kv heads x 256, rope 64, gated, qsa 4 heads x 128, 2048 tokens in blocks of 4;"
            .to_owned(),
        "n-gram PLE 16 heads x 160 (3-grams), conv 4 dilated 3".to_owned(),
        format!("bytes ple     {} ", table_rows * 160 * 2),
        format!("kv bytes/token {} ", 12 * (2 * 2 * 256 + 128) * 4 + 4),
        format!("state bytes/session {} ", (36 * gdn_state + ple_conv) * 4),
    ] {
        assert!(text.contains(&line), "{line:?} in:\n{text}");
    }
    assert!(table_rows * 160 > 51_000_000_000, "the 51 B-parameter table");
}

/// `generate --prompt` and `perplexity` on a model without a tokenizer
/// opened the model first (a synthetic 18 GiB model read its experts for 23
/// s) and then named a `--tokenizer` flag they do not have. They now refuse
/// before opening it: here a budget the model cannot open in would be
/// refused otherwise.
#[test]
fn a_prompt_without_a_tokenizer_is_refused_before_the_model_opens() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("olmoe-q8");
    let out = strata(&["convert", path(&fixture("olmoe").join("hf")), path(&model), "--quant", "q8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!model.join("tokenizer.json").exists(), "the fixture has no tokenizer");
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "some text to score").unwrap();
    let tiny_budget = ["--ram-budget", "1KiB"];
    let generate = strata(&[&["generate", path(&model), "--prompt", "hi"][..], &tiny_budget].concat());
    assert_clean_failure(&generate, "no tokenizer.json, which --prompt needs");
    assert!(String::from_utf8_lossy(&generate.stderr).contains("--tokens"), "says what to give instead");
    let perplexity = strata(&[&["perplexity", path(&model), "--text", path(&text)][..], &tiny_budget].concat());
    assert_clean_failure(&perplexity, "no tokenizer.json, which perplexity needs");
}

/// A malformed tokenizer.json was copied by `convert` without a word, and
/// failed only when the converted model started. `convert` now refuses it
/// first, in one line naming the file, and converts nothing.
#[test]
fn a_malformed_tokenizer_is_refused_at_convert_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    for entry in std::fs::read_dir(fixture("olmoe").join("hf")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), hf.join(entry.file_name())).unwrap();
    }
    std::fs::write(hf.join("tokenizer.json"), r#"{"version": "1.0", "model": {"type": "BPE", "vocab": "#).unwrap();
    let model = dir.path().join("model");
    let out = strata(&["convert", path(&hf), path(&model), "--quant", "q8"]);
    assert_clean_failure(&out, "tokenizer.json");
    assert!(!model.exists(), "nothing converted");
}

/// A chat template that loops without end (ten billion iterations) was
/// copied by `convert` and shown by `info` without a word, then hung every
/// binary that loaded it. Both now refuse it in one line naming the file
/// and the limit. (`timeout` ends the run that used to hang.)
#[test]
fn a_chat_template_that_never_ends_is_refused_at_convert_and_info() {
    const ENDLESS: &str = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let within_a_minute = |args: &[&str]| {
        let out = Command::new("timeout").arg("60").arg(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap();
        assert_ne!(out.status.code(), Some(124), "strata {args:?} ran for a minute");
        out
    };
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    for entry in std::fs::read_dir(fixture("olmoe").join("hf")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), hf.join(entry.file_name())).unwrap();
    }
    std::fs::write(hf.join("chat_template.jinja"), ENDLESS).unwrap();
    let model = dir.path().join("model");
    let out = within_a_minute(&["convert", path(&hf), path(&model), "--quant", "q8"]);
    assert_clean_failure(&out, "chat_template.jinja");
    assert_clean_failure(&out, "instructions");
    assert!(!model.exists(), "nothing converted");

    std::fs::remove_file(hf.join("chat_template.jinja")).unwrap();
    assert!(strata(&["convert", path(&hf), path(&model), "--quant", "q8"]).status.success());
    let info = within_a_minute(&["info", path(&model)]);
    assert!(String::from_utf8_lossy(&info.stdout).contains("chat template none"), "{info:?}");
    std::fs::write(model.join("chat_template.jinja"), ENDLESS).unwrap();
    assert_clean_failure(&within_a_minute(&["info", path(&model)]), "instructions");
}

/// A container keeping Inkling's MTP layer (converted from the hub's
/// names, `model.mtp.`): `info` names the layer and its form and counts its
/// tensors; `generate --speculate on` drafts with it, giving plain greedy
/// decoding's tokens and the run's counts in `--json`. Two chained MTP
/// layers do not draft: `on` is refused saying why, in one line, and the
/// default (`auto`) says so once and generates without drafting.
#[test]
fn inklings_mtp_layer_is_counted_by_info_and_drafts_where_it_is_one() {
    let tmp = tempfile::tempdir().unwrap();
    let convert_hub = |name: &str, sliding: &[bool]| {
        let hub = tmp.path().join(format!("{name}_hub"));
        std::fs::create_dir(&hub).unwrap();
        let stored = strata_format::test_util::inkling_hub_with_mtp(&hub, sliding, false);
        let model = tmp.path().join(name);
        let out = strata(&["convert", path(&hub), path(&model), "--quant", "q8"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (model, stored)
    };
    let (model, stored) = convert_hub("one", &[false]);
    let info = strata(&["info", path(&model)]);
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    let text = String::from_utf8(info.stdout).unwrap();
    assert!(text.contains("mtp layers    1 ([hidden, embedding] joined, no output norm)"), "{text}");
    assert!(text.contains("   1 x mtp layer inkling 4 q / 2 kv heads x 8"), "{text}");
    // The hub's pair `w13_dn` is two tensors, gate and up.
    assert!(text.contains(&format!(": {} tensors, ", stored.len() + 1)), "{text}");
    let generate = |model: &Path, extra: &[&str]| {
        let args = ["generate", path(model), "--tokens", "1,2,3", "--max-new-tokens", "8", "--ignore-eos"];
        strata(&[&args[..], &["--temperature", "0", "--json"], extra].concat())
    };
    let json = |out: &Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap()
    };
    let drafted = json(&generate(&model, &["--speculate", "on", "--draft-tokens", "3"]));
    let plain = json(&generate(&model, &["--speculate", "off"]));
    assert_eq!(drafted["tokens"], plain["tokens"], "greedy drafted is plain");
    let speculation = &drafted["stats"]["speculation"];
    eprintln!("--speculate on: {speculation}");
    assert!(speculation["verify_passes"].as_u64().unwrap() > 0, "{drafted}");
    assert!(plain["stats"]["speculation"].is_null(), "off drafts nothing");
    let (chained, _) = convert_hub("two", &[false, true]);
    assert_clean_failure(&generate(&chained, &["--speculate", "on"]), "2 MTP layers: Strata drafts with one");
    let auto = generate(&chained, &[]);
    assert!(auto.status.success(), "{}", String::from_utf8_lossy(&auto.stderr));
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert_eq!(stderr.matches("speculation off").count(), 1, "{stderr}");
}
