//! The tiered store through the engine: limited memory changes speed, never
//! the logits; a batch reads each distinct expert once; learned usage and
//! routing traces are written; disk failures are clear errors.

mod families;

use std::path::{Path, PathBuf};

use strata_engine::{Engine, EngineOptions, IoBackend, PolicyKind, RamBudget};
use strata_format::{Container, ConvertOptions, QuantPreset, names};
use strata_tier::test_util::WarningLog;

/// The GQA families (gpt-oss: biased experts, a window's ring), the
/// hybrid ones (recurrent state beside the streamed experts), DeepSeek V4
/// (a window's ring and its compressors' open windows), Inkling (rings
/// and convolution states, shared experts weighed by the router) and
/// Qwen3.8-Flash-Next (QSA's raw keys beside gated residual streams).
const FAMILIES: [&str; 11] = [
    "olmoe",
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
    "qwen3_next",
    "qwen3_5_moe",
    "kimi_linear",
    "glm5_next",
    "deepseek_v4",
    "inkling",
    "qwen4_exp",
];

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family)
}

fn prompt(family: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(fixture(family).join("reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn convert(family: &str, preset: QuantPreset) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    strata_format::convert(fixture(family).join("hf"), dir.path().join("model"), &ConvertOptions::new(preset)).unwrap();
    dir
}

/// Options whose expert reads are all on demand: these tests count and
/// check the reads a pass makes, which a model that fits its budget would
/// otherwise do at open (`preload_experts`; logit_hashes.rs runs it).
fn options(dir: &tempfile::TempDir) -> EngineOptions {
    EngineOptions {
        usage_file: Some(dir.path().join("usage.json")),
        preload_experts: false,
        ..EngineOptions::default()
    }
}

fn open(dir: &tempfile::TempDir, options: &EngineOptions) -> Engine {
    Engine::open(&dir.path().join("model"), options).unwrap()
}

#[test]
fn logits_are_bit_identical_for_every_cache_policy_io_and_thread_count() {
    for family in FAMILIES {
        let prompt = prompt(family);
        let dir = convert(family, QuantPreset::Q4);
        let reference = open(&dir, &options(&dir)).logits(&prompt).unwrap();
        for policy in PolicyKind::ALL {
            for io in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap] {
                for (expert_cache_bytes, threads) in [(None, 2), (Some(16 << 10), 1), (Some(64 << 10), 2)] {
                    let opts = EngineOptions { cache_policy: policy, io, expert_cache_bytes, threads, ..options(&dir) };
                    let engine = open(&dir, &opts);
                    // Twice: the second pass runs on a warm (and, for the
                    // small caches, churned) store.
                    for pass in 0..2 {
                        let got = engine.logits(&prompt).unwrap();
                        let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{family} {policy} {io} {expert_cache_bytes:?} threads {threads} pass {pass}");
                    }
                }
            }
        }
    }
}

/// Stages every expert file of the model in `dir` into a mirror: on a tmpfs
/// (a different filesystem, as a fast drive) where `tmpfs` asks for one and
/// the machine has it, else beside the model (O_DIRECT needs a filesystem
/// that supports it, which tmpfs is not).
fn staged_mirror(dir: &tempfile::TempDir, tmpfs: bool) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let mirror = match tmpfs && shm.is_dir() {
        true => tempfile::tempdir_in(shm).unwrap(),
        false => tempfile::tempdir_in(dir.path()).unwrap(),
    };
    let container = strata_format::Container::open(dir.path().join("model")).unwrap();
    let files = strata_engine::mirror::expert_files(&container).unwrap();
    let planned = strata_tier::mirror::plan(&files, &strata_tier::Usage::default(), u64::MAX);
    strata_tier::mirror::stage(&dir.path().join("model"), mirror.path(), container.content_hash(), &planned, 0)
        .unwrap();
    mirror
}

#[test]
fn tokens_are_identical_with_and_without_mirrors_even_when_a_copy_goes_bad() {
    let family = "olmoe";
    let prompt = prompt(family);
    let dir = convert(family, QuantPreset::Q4);
    let reference = open(&dir, &options(&dir)).logits(&prompt).unwrap();
    for io in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap] {
        let mirror = staged_mirror(&dir, !io.is_direct());
        // Far faster than the container's drive: nearly every read goes to it.
        let spec = format!("{}=1TiB", mirror.path().display()).parse().unwrap();
        let opts = EngineOptions { io, expert_cache_bytes: Some(0), mirrors: vec![spec], ..options(&dir) };
        let engine = open(&dir, &opts);
        let same = |got: Vec<f32>| got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same(engine.logits(&prompt).unwrap()), "{io}: with a mirror");
        let stats = engine.store_stats();
        assert!(stats.mirror_bytes_read[0] > 0 && stats.mirror_bytes_read[0] <= stats.bytes_read, "{io}: {stats:?}");
        assert_eq!(engine.failed_mirror_copies(), 0);
        // Every copy changed after open: each fails once, with one warning,
        // and the container serves the same bytes.
        for file in std::fs::read_dir(mirror.path().join("experts")).unwrap() {
            let path = file.unwrap().path();
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.iter_mut().step_by(4096).for_each(|b| *b ^= 0x5a);
            std::fs::write(&path, bytes).unwrap();
        }
        for pass in 0..2 {
            assert!(same(engine.logits(&prompt).unwrap()), "{io}: corrupted mirror, pass {pass}");
        }
        let failed = engine.failed_mirror_copies();
        let layers = engine.container().manifest().expert_layers.len() as u64;
        assert!(failed > 0 && failed <= layers, "{io}: {failed} copies failed");
        // Reopened, the changed copies are refused... only when read: their
        // sizes still match, so open succeeds and every read falls back.
        let engine = open(&dir, &opts);
        assert!(same(engine.logits(&prompt).unwrap()), "{io}: reopened on a corrupted mirror");
    }
}

#[test]
fn a_prefill_reads_each_distinct_expert_of_each_layer_once() {
    for family in FAMILIES {
        let dir = convert(family, QuantPreset::Q8);
        let trace = dir.path().join("trace.jsonl");
        let opts = EngineOptions { trace_file: Some(trace.clone()), ..options(&dir) };
        let engine = open(&dir, &opts);
        let vocab = engine.core().vocab_size as u32;
        let tokens: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab).collect();
        let mut session = engine.session();
        session.feed(&tokens).unwrap();
        engine.persist_learning().unwrap();
        let (_, events) = strata_tier::read_trace(&trace).unwrap();
        let stats = engine.store_stats();
        let record_bytes = engine.container().manifest().expert_layers[0].record_bytes;
        let mut distinct_total = 0;
        for (layer, misses) in stats.layer_misses.iter().enumerate() {
            let mut distinct: Vec<usize> =
                events.iter().filter(|e| e.layer == layer).flat_map(|e| e.experts.clone()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(*misses as usize, distinct.len(), "{family} layer {layer}: one read per distinct expert");
            distinct_total += distinct.len();
        }
        assert_eq!(stats.hits, 0, "{family}: a cold store has nothing to hit");
        assert_eq!(stats.bytes_read, distinct_total as u64 * record_bytes, "{family}: misses × record = bytes read");
    }
}

#[test]
fn usage_is_learned_and_bound_to_the_model() {
    let dir = convert("olmoe", QuantPreset::Q8);
    let engine = open(&dir, &options(&dir));
    let mut session = engine.session();
    let generate = strata_engine::GenerateOptions { max_new_tokens: 4, ..Default::default() };
    session.generate(&prompt("olmoe"), &generate, |_| std::ops::ControlFlow::Continue(())).unwrap();
    let text = std::fs::read_to_string(dir.path().join("usage.json")).unwrap();
    assert!(text.contains(engine.container().content_hash()), "usage file names its model");
    // Another model ignores it, with a warning.
    let other = convert("mixtral", QuantPreset::Q8);
    let opts = EngineOptions { usage_file: Some(dir.path().join("usage.json")), ..EngineOptions::default() };
    let (engine, warnings) = logged_warnings(|| Engine::open(&other.path().join("model"), &opts).unwrap());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("ignoring usage file"), "{warnings:?}");
    drop(engine);
}

#[test]
fn a_budget_too_small_is_refused_with_what_it_needs() {
    let dir = convert("qwen3_moe", QuantPreset::F32);
    let opts = EngineOptions { ram_budget: RamBudget::Bytes(64 << 10), ..options(&dir) };
    let err = Engine::open(&dir.path().join("model"), &opts).err().unwrap().to_string();
    assert!(err.contains("too small") && err.contains("needs at least"), "{err}");
}

#[test]
fn the_budget_reserves_kv_for_every_session_held_at_once() {
    let dir = convert("qwen3_moe", QuantPreset::F32);
    let budget = RamBudget::Bytes(256 << 20);
    let one = open(&dir, &EngineOptions { ram_budget: budget, ..options(&dir) }).budget();
    let four = open(&dir, &EngineOptions { ram_budget: budget, sessions: 4, ..options(&dir) }).budget();
    assert!(one.kv_bytes > 0);
    assert_eq!(four.kv_bytes, 4 * one.kv_bytes);
    // The KV comes out of the same budget: the expert cache shrinks by it.
    assert_eq!(one.expert_cache_bytes - four.expert_cache_bytes, 3 * one.kv_bytes);
}

#[test]
fn batch_capacity_counts_the_per_token_working_sets_the_cache_holds() {
    let dir = convert("qwen3_moe", QuantPreset::F32);
    let engine = open(&dir, &options(&dir));
    let container = engine.container();
    let arch = engine.arch();
    let moe_layers: Vec<usize> = arch.moe_layers();
    let working_set_bytes: u64 = moe_layers
        .iter()
        .map(|&layer| container.expert_layout(layer).unwrap().record_bytes * arch.experts_per_token() as u64)
        .sum();
    assert!(working_set_bytes > 0);
    for (cache_bytes, streams) in [(0, 1), (working_set_bytes - 1, 1), (3 * working_set_bytes, 3)] {
        let opts = EngineOptions { expert_cache_bytes: Some(cache_bytes), ..options(&dir) };
        assert_eq!(open(&dir, &opts).batch_capacity(), streams, "cache of {cache_bytes} bytes");
    }
}

#[test]
fn the_embedding_and_ple_tables_stay_on_disk_out_of_the_budget() {
    for family in FAMILIES {
        let dir = convert(family, QuantPreset::Q8);
        let engine = open(&dir, &options(&dir));
        let container = Container::open(dir.path().join("model")).unwrap();
        let core = &container.arch().core;
        let file_bytes = std::fs::metadata(dir.path().join("model/dense.bin")).unwrap().len();
        // A table's bytes leave; a CRC32C per row stays.
        let on_disk =
            |t: &strata_format::container::TensorEntry| t.length_bytes + t.scale_length_bytes - 4 * t.shape[0] as u64;
        let table = container.dense_entry(&names::embedding_name(core)).unwrap();
        let embedding = if core.tie_word_embeddings { 0 } else { on_disk(table) };
        // Qwen3.8-Flash-Next's n-gram PLE tables leave too.
        let ple: u64 = container.manifest().tensors.iter().filter(|t| names::is_ple_table(&t.name)).map(on_disk).sum();
        let resident_bytes = file_bytes - embedding - ple;
        assert_eq!(engine.budget().dense_bytes, resident_bytes, "{family}");
    }
}

#[test]
fn an_embedding_row_changed_while_running_is_an_error_not_garbage() {
    let dir = convert("olmoe", QuantPreset::Q8);
    let engine = open(&dir, &options(&dir));
    let container = Container::open(dir.path().join("model")).unwrap();
    let table = container.dense_entry(&names::embedding_name(&container.arch().core)).unwrap();
    let row_bytes = table.length_bytes / container.arch().core.vocab_size as u64;
    let token = prompt("olmoe")[0];
    let at = table.offset_bytes + u64::from(token) * row_bytes;
    use std::os::unix::fs::FileExt;
    let dense = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("model/dense.bin")).unwrap();
    let mut byte = [0u8];
    dense.read_exact_at(&mut byte, at).unwrap();
    dense.write_all_at(&[byte[0] ^ 0x40], at).unwrap();
    let err = engine.logits(&prompt("olmoe")).unwrap_err().to_string();
    assert!(err.contains(&format!("row {token}")) && err.contains("dense.bin"), "{err}");
}

#[test]
fn an_expert_file_truncated_while_running_is_an_error_not_garbage() {
    let dir = convert("mixtral", QuantPreset::F32);
    let opts = EngineOptions { expert_cache_bytes: Some(0), ..options(&dir) };
    let engine = open(&dir, &opts);
    let experts = dir.path().join("model/experts");
    let file = std::fs::read_dir(&experts).unwrap().next().unwrap().unwrap().path();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(100).unwrap();
    let err = engine.logits(&prompt("mixtral")).unwrap_err().to_string();
    assert!(err.contains(file.file_name().unwrap().to_str().unwrap()), "{err}");
}

#[test]
fn an_expert_file_that_is_missing_or_unreadable_fails_at_open() {
    let dir = convert("olmoe", QuantPreset::F32);
    let experts = dir.path().join("model/experts");
    let file = std::fs::read_dir(&experts).unwrap().next().unwrap().unwrap().path();
    std::fs::remove_file(&file).unwrap();
    let err = Engine::open(&dir.path().join("model"), &options(&dir)).err().unwrap().to_string();
    assert!(err.contains(file.file_name().unwrap().to_str().unwrap()), "{err}");
    // A directory where the file should be cannot be read as one.
    std::fs::create_dir(&file).unwrap();
    let err = Engine::open(&dir.path().join("model"), &options(&dir)).err().unwrap().to_string();
    assert!(err.contains(file.file_name().unwrap().to_str().unwrap()), "{err}");
}

const ALL_FAMILIES: &[&str] = families::CHECKED;

/// A look-ahead guess moves bytes, never results: with a 16 KiB cache, so
/// that guesses are made for every layer and read, cancelled, dropped or
/// waited for as the timing falls, the logits (bit for bit) and the
/// generated tokens are those of a run without prefetch. (Whether a guess's
/// read starts before its demand cancels it is timing; the store's tests
/// pin each case down.)
#[test]
fn tokens_are_identical_with_prefetch_on_and_off_for_every_family_and_io() {
    use strata_engine::{GenerateOptions, Prefetch};
    let generate = GenerateOptions { max_new_tokens: 6, ignore_eos: true, ..GenerateOptions::default() };
    for &family in ALL_FAMILIES {
        let prompt = prompt(family);
        let dir = convert(family, QuantPreset::Q4);
        for io in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap] {
            let run = |prefetch| {
                let opts = EngineOptions { io, expert_cache_bytes: Some(16 << 10), prefetch, ..options(&dir) };
                let engine = open(&dir, &opts);
                let logits = engine.logits(&prompt).unwrap();
                let report =
                    engine.session().generate(&prompt, &generate, |_| std::ops::ControlFlow::Continue(())).unwrap();
                (logits.iter().map(|l| l.to_bits()).collect::<Vec<_>>(), report.tokens, engine.store_stats())
            };
            let (logits_off, tokens_off, off) = run(Prefetch::Off);
            let (logits_on, tokens_on, on) = run(Prefetch::On);
            assert!(logits_on == logits_off, "{family} {io}: logits differ with prefetch");
            assert_eq!(tokens_on, tokens_off, "{family} {io}: tokens differ with prefetch");
            assert_eq!(off.prefetch_issued, 0, "{family} {io}");
            assert!(on.layer_predicted_lookups.iter().sum::<u64>() > 0, "{family} {io}: no guess was made: {on:?}");
            // Layer 0, which no layer runs before, is guessed too when it has experts.
            let layer0_routed = off.layer_hits[0] + off.layer_misses[0] > 0;
            assert_eq!(on.layer_predicted_lookups[0] > 0, layer0_routed, "{family} {io}: layer 0's guess");
            assert!(on.prefetch_used <= on.prefetch_issued, "{family} {io}: {on:?}");
            // `auto` reads ahead only when the cache cannot hold every expert.
            let auto = |expert_cache_bytes| {
                let opts = EngineOptions { io, expert_cache_bytes, prefetch: Prefetch::Auto, ..options(&dir) };
                open(&dir, &opts).prefetching()
            };
            assert!(auto(Some(16 << 10)) && !auto(None), "{family} {io}: auto");
        }
    }
}

/// `Engine::set_record_check(false)` exists only so the bench can measure
/// what the check costs: it must really skip the check (else the A/B
/// measures nothing), and an engine as opened must really check.
#[test]
fn record_check_is_on_by_default_and_off_only_when_asked() {
    let prompt = prompt("olmoe");
    let dir = convert("olmoe", QuantPreset::Q4);
    let model = dir.path().join("model");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("manifest.json")).unwrap()).unwrap();
    let layer = &manifest["expert_layers"][0];
    let record_bytes = layer["record_bytes"].as_u64().unwrap() as usize;
    let file = model.join(layer["file"].as_str().unwrap());
    let mut bytes = std::fs::read(&file).unwrap();
    // One bit in every record's first weights: a quantized code, so the
    // floats stay finite and only the CRC32C can see it.
    for expert in 0..layer["num_experts"].as_u64().unwrap() as usize {
        bytes[expert * record_bytes] ^= 0x10;
    }
    std::fs::write(&file, bytes).unwrap();
    let err = open(&dir, &options(&dir)).logits(&prompt).unwrap_err().to_string();
    assert!(err.contains("CRC32C mismatch"), "{err}");
    let engine = open(&dir, &options(&dir));
    engine.set_record_check(false);
    engine.logits(&prompt).unwrap();
}

/// What `run` returns, and the warnings it logged on its own thread.
fn logged_warnings<T>(run: impl FnOnce() -> T) -> (T, Vec<String>) {
    let log = WarningLog::default();
    let out = tracing::subscriber::with_default(log.subscriber(), run);
    (out, log.lines())
}
