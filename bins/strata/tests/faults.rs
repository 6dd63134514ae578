//! The fault matrix, end to end: real files, real OS errors. Each test
//! injects one fault a user or the machine can cause and checks that the
//! answer is either intact or refused with one line naming what went wrong,
//! never lost after it was made and never silently wrong.
//!
//! Faults that need root (a read-only bind mount, a full tmpfs) are injected
//! for real where the process may mount (CI runs as root) and skipped with
//! the reason printed otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("strata runs")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family).join("hf")
}

fn convert(family: &str, quant: &str, out: &Path) {
    let done = strata(&["convert", path(&fixture(family)), path(out), "--quant", quant]);
    assert!(done.status.success(), "{family}: {}", String::from_utf8_lossy(&done.stderr));
}

/// Fails unless the command failed with exactly one line on stderr that
/// holds every needle, and did not panic.
fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    // The first run of a container without checksums says so first.
    let failure_lines = stderr.trim_end().lines().filter(|line| !line.contains(MISSING_CHECKSUMS)).count();
    assert_eq!(failure_lines, 1, "one line: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    }
}

/// What the notice of a container without checksums says.
const MISSING_CHECKSUMS: &str = "written without checksums";

const GENERATE: [&str; 6] = ["--tokens", "1,2,3", "--max-new-tokens", "6", "--ignore-eos", "--json"];
/// Greedy, so runs compare token for token and no drawn seed is printed to
/// the stderr a test counts lines of.
const GREEDY: [&str; 2] = ["--temperature", "0"];

/// `strata generate --json` that must succeed: its tokens, and its stderr.
fn generate_json(model: &Path, extra: &[&str]) -> (Vec<u64>, String) {
    let mut args = vec!["generate", path(model)];
    args.extend(GENERATE);
    args.extend(GREEDY);
    args.extend(extra);
    let out = strata(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "strata {args:?} failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line: Value = serde_json::from_str(stdout.lines().last().unwrap_or("null")).unwrap();
    let tokens = line["tokens"].as_array().unwrap_or_else(|| panic!("no tokens in {stdout}"));
    (tokens.iter().map(|t| t.as_u64().unwrap()).collect(), stderr)
}

/// Checks that `stderr` holds warnings only, exactly one of them that the
/// usage was not saved.
fn assert_one_usage_warning(stderr: &str) {
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert!(lines.iter().all(|l| l.contains("warning")), "warnings only: {stderr}");
    let unsaved = lines.iter().filter(|l| l.contains("usage not saved")).count();
    assert_eq!(unsaved, 1, "one warning that the usage was not saved: {stderr}");
}

/// A mount made for one test, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    /// Runs `mount args… target`; `None` (with the reason printed) where
    /// this process may not mount.
    fn new(args: &[&str], target: &Path) -> Option<Self> {
        let out = Command::new("mount").args(args).arg(target).output();
        match out {
            Ok(out) if out.status.success() => Some(Self(target.to_path_buf())),
            Ok(out) => {
                eprintln!("skipped: mount {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Learning is an optimisation: the usage file's directory deleted (ENOENT)
/// or the usage path taken by a directory (EISDIR) costs one warning, never
/// the answer or the exit status.
#[test]
fn an_unwritable_usage_file_costs_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    convert("olmoe", "q8", &model);
    let (reference, _) = generate_json(&model, &[]);

    let gone = dir.path().join("gone").join("usage.json");
    let (tokens, stderr) = generate_json(&model, &["--usage-file", path(&gone)]);
    assert_eq!(tokens, reference);
    assert_one_usage_warning(&stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");

    // (Reading it is a warning of its own: two lines.)
    let taken = dir.path().join("taken");
    std::fs::create_dir_all(taken.join("inside")).unwrap();
    let (tokens, stderr) = generate_json(&model, &["--usage-file", path(&taken)]);
    assert_eq!(tokens, reference);
    assert_one_usage_warning(&stderr);

    // Without --json the streamed answer is printed and the exit is 0 too.
    let plain = ["--tokens", "1,2,3", "--max-new-tokens", "6", "--ignore-eos", "--usage-file", path(&gone)];
    let out = strata(&[&["generate", path(&model)], &plain[..], &GREEDY].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<u64> = String::from_utf8_lossy(&out.stdout).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(printed, reference);
}

/// A model on a read-only volume (Docker `:ro`, NFS, another user's
/// directory): a real EROFS from a read-only bind mount.
#[test]
fn a_read_only_model_directory_answers_with_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    convert("olmoe", "q8", &model);
    let (reference, _) = generate_json(&model, &[]);
    let usage_before = std::fs::read(model.join("usage.json")).unwrap();
    let mounted = dir.path().join("ro");
    std::fs::create_dir(&mounted).unwrap();
    let Some(_bind) = Mount::new(&["--bind", path(&model)], &mounted) else { return };
    // The same mount made read-only: `_bind` unmounts it.
    let remounted = Command::new("mount").args(["-o", "remount,bind,ro"]).arg(&mounted).status();
    if !remounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot remount {} read-only", mounted.display());
        return;
    }
    let (tokens, stderr) = generate_json(&mounted, &[]);
    assert_eq!(tokens, reference);
    assert_one_usage_warning(&stderr);
    assert!(stderr.contains("Read-only file system"), "the OS's reason is shown: {stderr}");
    assert_eq!(std::fs::read(model.join("usage.json")).unwrap(), usage_before, "nothing written");
}

/// A full disk: the model on a tmpfs whose free space is taken by a file,
/// so writing usage.json fails with a real ENOSPC.
#[test]
fn a_full_model_volume_answers_with_one_warning() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    convert("olmoe", "q8", &model);
    let (reference, _) = generate_json(&model, &[]);
    std::fs::remove_file(model.join("usage.json")).unwrap();
    let volume = dir.path().join("tmpfs");
    std::fs::create_dir(&volume).unwrap();
    let Some(_tmpfs) = Mount::new(&["-t", "tmpfs", "-o", "size=16m", "tmpfs"], &volume) else { return };
    let copy = volume.join("m");
    copy_dir(&model, &copy);
    fill(&volume.join("filler"));
    let (tokens, stderr) = generate_json(&copy, &[]);
    assert_eq!(tokens, reference);
    assert_one_usage_warning(&stderr);
    assert!(stderr.contains("No space left"), "the OS's reason is shown: {stderr}");
}

/// Writes to `file` until the volume is full.
fn fill(file: &Path) {
    use std::io::Write;
    let mut out = std::fs::File::create(file).unwrap();
    let block = vec![0u8; 64 << 10];
    loop {
        match out.write(&block) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling {}: {e}", file.display()),
        }
    }
}

/// The demo model converted to q8 under `dir`.
fn demo_q8(dir: &Path) -> std::path::PathBuf {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let model = dir.join("demo");
    let done = strata(&["convert", path(&demo), path(&model), "--quant", "q8"]);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    model
}

/// `kv_bytes_per_token × context × sessions` is checked: a product that
/// wrapped let `--context 2^51` run at 175 MiB against a 4 MiB budget.
#[test]
fn an_overflowing_context_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_q8(dir.path());
    let run = |context: &str| {
        strata(&[
            "generate",
            path(&model),
            "--tokens",
            "1,2",
            "--max-new-tokens",
            "2",
            "--context",
            context,
            "--ram-budget",
            "4MiB",
        ])
    };
    assert_clean_failure(&run("2251799813685248"), &["context", "2251799813685248"]);
    assert_clean_failure(&run(&u64::MAX.to_string()), &["context"]);
}

/// A context past the positions the model was trained for (the demo's 256)
/// is refused, not run into text that degrades without a word.
#[test]
fn a_context_past_max_position_embeddings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_q8(dir.path());
    let run = |context: &str| {
        strata(&["generate", path(&model), "--tokens", "1,2", "--max-new-tokens", "2", "--context", context])
    };
    assert_clean_failure(&run("257"), &["257 tokens is beyond the 256 positions", "max_position_embeddings"]);
    assert!(run("256").status.success());
}

/// `--max-new-tokens` past the context is refused before generating, with
/// the largest value that fits, not after filling the context.
#[test]
fn max_new_tokens_past_the_context_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_q8(dir.path());
    let run = |max_new: &str| {
        let args = ["--tokens", "1,2,3", "--max-new-tokens", max_new, "--context", "16", "--json"];
        strata(&[&["generate", path(&model)][..], &args].concat())
    };
    let refused = run("14");
    assert_clean_failure(&refused, &["--max-new-tokens 13 or less", "context of 16"]);
    assert!(refused.stdout.is_empty(), "nothing was generated");
    assert!(run("13").status.success());
}

/// The manifest entry of dense tensor `name` in `model`.
fn tensor_entry(model: &Path, name: &str) -> Value {
    let manifest: Value = serde_json::from_slice(&std::fs::read(model.join("manifest.json")).unwrap()).unwrap();
    let tensors = manifest["tensors"].as_array().unwrap();
    tensors.iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no tensor {name}")).clone()
}

/// Writes `values` as f32s at byte `offset` of `file`, in place.
fn poke_f32s(file: &Path, offset: u64, values: &[f32]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    f.write_all(&bytes).unwrap();
}

/// A NaN or infinite quantization scale on disk used to give token `[0]`
/// (or "2626…") with exit 0. Now: one line naming the tensor, or the file,
/// layer and expert, and no tokens.
#[test]
fn a_non_finite_scale_is_an_error_naming_where_not_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    convert("olmoe", "q8", &good);
    // Damage a CRC32C cannot see: a container written before checksums
    // (`a_flipped_bit_is_an_error_naming_where` has them).
    strip_checksums(&good);
    let generate = |model: &Path| {
        let mut args = vec!["generate", path(model), "--expert-cache", "0"];
        args.extend(GENERATE);
        args.extend(GREEDY);
        strata(&args)
    };

    // A dense matrix's scale.
    let model = dir.path().join("dense-nan");
    copy_dir(&good, &model);
    let q = tensor_entry(&model, "model.layers.0.self_attn.q_proj.weight");
    poke_f32s(&model.join("dense.bin"), q["scale_offset_bytes"].as_u64().unwrap(), &[f32::NAN]);
    assert_clean_failure(
        &generate(&model),
        &["model.layers.0.self_attn.q_proj.weight", "non-finite scale", "dense.bin"],
    );

    // A scale of the embedding table, which stays on disk while the model
    // runs and is checked when it opens.
    let model = dir.path().join("embedding-nan");
    copy_dir(&good, &model);
    let table = tensor_entry(&model, "model.embed_tokens.weight");
    poke_f32s(&model.join("dense.bin"), table["scale_offset_bytes"].as_u64().unwrap() + 4 * 70, &[f32::NAN]);
    assert_clean_failure(&generate(&model), &["model.embed_tokens.weight", "non-finite scale", "dense.bin"]);

    // The first scale of every expert's down matrix in layer 1: whichever
    // expert is routed, its read is refused.
    let model = dir.path().join("expert-inf");
    copy_dir(&good, &model);
    let manifest: Value = serde_json::from_slice(&std::fs::read(model.join("manifest.json")).unwrap()).unwrap();
    let layer = &manifest["expert_layers"][1];
    let record_bytes = layer["record_bytes"].as_u64().unwrap();
    let down_scales = layer["components"][2]["scale_offset_bytes"].as_u64().unwrap();
    let file = model.join(layer["file"].as_str().unwrap());
    for expert in 0..layer["num_experts"].as_u64().unwrap() {
        poke_f32s(&file, expert * record_bytes + down_scales, &[f32::INFINITY]);
    }
    let out = generate(&model);
    assert_clean_failure(&out, &["non-finite scale", "of layer 1, down matrix", "layer_001.bin"]);
}

/// Finite weights that overflow (a final norm of f32::MAX) make infinite or
/// NaN logits: sampling from them used to pick garbage with exit 0.
#[test]
fn a_non_finite_logit_is_an_error_not_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    convert("olmoe", "q8", &model);
    // Finite weights the container vouches for: no checksum to catch them.
    strip_checksums(&model);
    let norm = tensor_entry(&model, "model.norm.weight");
    let count = norm["length_bytes"].as_u64().unwrap() as usize / 4;
    poke_f32s(&model.join("dense.bin"), norm["offset_bytes"].as_u64().unwrap(), &vec![f32::MAX; count]);
    let mut args = vec!["generate", path(&model)];
    args.extend(GENERATE);
    let out = strata(&[&args[..], &GREEDY].concat());
    assert_clean_failure(&out, &["non-finite logit", "position 2"]);
    assert!(out.stdout.is_empty(), "no tokens: {}", String::from_utf8_lossy(&out.stdout));
    // Sampled too (the NaN compared false with everything).
    args.extend(["--temperature", "0.8", "--seed", "3"]);
    assert_clean_failure(&strata(&args), &["non-finite logit"]);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A container written before checksums existed ran with no word of what
/// it could not check. `info` says so, and so does its first run (later
/// runs, which find the usage it learned, do not repeat it).
#[test]
fn a_container_without_checksums_says_so_in_info_and_on_its_first_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    convert("olmoe", "q8", &model);
    let info = |model: &Path| String::from_utf8(strata(&["info", path(model)]).stdout).unwrap();
    assert!(!info(&model).contains(MISSING_CHECKSUMS), "{}", info(&model));
    strip_checksums(&model);
    let text = info(&model);
    assert!(text.contains(MISSING_CHECKSUMS) && text.contains("model settings"), "{text}");
    let (first, first_stderr) = generate_json(&model, &[]);
    assert!(first_stderr.contains(MISSING_CHECKSUMS), "{first_stderr}");
    let (second, second_stderr) = generate_json(&model, &[]);
    assert!(!second_stderr.contains(MISSING_CHECKSUMS), "{second_stderr}");
    assert_eq!(first, second);
}

/// Removes the CRC32Cs and the manifest's own checksum from a container's
/// manifest, as a container written before they existed.
fn strip_checksums(model: &Path) {
    let path = model.join("manifest.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for tensor in manifest["tensors"].as_array_mut().unwrap() {
        tensor.as_object_mut().unwrap().remove("crc32c");
    }
    for layer in manifest["expert_layers"].as_array_mut().unwrap() {
        layer.as_object_mut().unwrap().remove("record_crc32c");
    }
    manifest.as_object_mut().unwrap().remove(strata_format::container::SEAL_FIELD);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// Integrity on read: one flipped bit in an expert record used to change
/// nothing visible (or the answer, silently). Its CRC32C is checked when the
/// record is read from disk: one line naming the file, layer and expert. A
/// flipped bit in dense.bin is refused at open naming the tensor.
#[test]
fn a_flipped_bit_is_an_error_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    convert("olmoe", "q4", &good);
    let (reference, _) = generate_json(&good, &[]);
    let flip = |file: &Path, offset: u64| {
        let mut bytes = std::fs::read(file).unwrap();
        bytes[offset as usize] ^= 0x04;
        std::fs::write(file, bytes).unwrap();
    };

    let model = dir.path().join("expert-bit");
    copy_dir(&good, &model);
    let manifest: Value = serde_json::from_slice(&std::fs::read(model.join("manifest.json")).unwrap()).unwrap();
    let layer = &manifest["expert_layers"][0];
    let record_bytes = layer["record_bytes"].as_u64().unwrap();
    let file = model.join(layer["file"].as_str().unwrap());
    for expert in 0..layer["num_experts"].as_u64().unwrap() {
        flip(&file, expert * record_bytes + 100);
    }
    for io in ["pread", "mmap"] {
        let mut args = vec!["generate", path(&model), "--expert-cache", "0", "--io", io];
        args.extend(GENERATE);
        args.extend(GREEDY);
        assert_clean_failure(&strata(&args), &["CRC32C mismatch", "of layer 0", "layer_000.bin"]);
    }

    // A dense tensor, and the embedding table, which stays on disk while
    // the model runs and is checked at open all the same.
    for (name, at) in [("model.layers.0.self_attn.o_proj.weight", 5), ("model.embed_tokens.weight", 333)] {
        let model = dir.path().join(format!("dense-bit-{at}"));
        copy_dir(&good, &model);
        flip(&model.join("dense.bin"), tensor_entry(&model, name)["offset_bytes"].as_u64().unwrap() + at);
        let mut args = vec!["generate", path(&model)];
        args.extend(GENERATE);
        args.extend(GREEDY);
        assert_clean_failure(&strata(&args), &["CRC32C mismatch", name, "dense.bin"]);
    }

    // Undamaged, the checks change nothing.
    let (tokens, stderr) = generate_json(&good, &["--expert-cache", "0"]);
    assert_eq!(tokens, reference, "{stderr}");
}

/// `--temperature nan` used to give the same token every time and
/// `--top-p 5` was taken silently: both are refused before anything runs.
#[test]
fn nonsense_sampling_flags_are_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    convert("olmoe", "q8", &model);
    for (flag, needle) in [
        ("--temperature=nan", "temperature"),
        ("--temperature=inf", "temperature"),
        ("--top-p=5", "top-p"),
        ("--top-p=-1", "top-p"),
    ] {
        let mut args = vec!["generate", path(&model), flag];
        args.extend(GENERATE);
        let out = strata(&args);
        assert_clean_failure(&out, &[needle]);
        assert!(out.stdout.is_empty(), "{flag}: nothing generated");
    }
}
