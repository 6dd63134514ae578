//! Greedy speculative decoding with the MTP layer gives exactly plain
//! greedy decoding's tokens: every `--io`, a cache holding every expert and
//! one holding almost none, 1 to 3 drafted tokens a pass.

use std::ops::ControlFlow;
use std::path::Path;

use strata_engine::{Engine, EngineOptions, GenerateOptions, IoBackend, SpeculativeOptions};
use strata_format::{ConvertOptions, QuantPreset};

const NEW_TOKENS: usize = 24;

#[test]
fn greedy_speculation_gives_plain_greedy_tokens_every_io_and_cache() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/deepseek_v3_mtp");
    let text = std::fs::read_to_string(fixture.join("mtp_reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt: Vec<u32> = json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    strata_format::convert(fixture.join("hf"), &dir, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    let plain_options = GenerateOptions { max_new_tokens: NEW_TOKENS, ignore_eos: true, ..GenerateOptions::default() };
    for io in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap] {
        for expert_cache_bytes in [1 << 30, 16 << 10] {
            let options = EngineOptions {
                threads: 2,
                io,
                expert_cache_bytes: Some(expert_cache_bytes),
                ..EngineOptions::default()
            };
            let engine = Engine::open(&dir, &options).unwrap();
            let plain = engine.session().generate(&prompt, &plain_options, |_| ControlFlow::Continue(())).unwrap();
            for draft_tokens in 1..=3 {
                let options = SpeculativeOptions { max_new_tokens: NEW_TOKENS, draft_tokens, ignore_eos: true };
                let spec = engine.generate_speculative(&prompt, &options).unwrap();
                let what = format!("{io:?}, cache {expert_cache_bytes}, {draft_tokens} drafted");
                assert_eq!(spec.tokens, plain.tokens, "{what}");
                let stats = &spec.stats;
                eprintln!("{what}: {stats:?}, {:.2} tokens a verify pass", stats.tokens_per_verify_pass());
                assert_eq!(stats.accepted, stats.accepted_at.iter().sum::<usize>(), "{what}");
                assert!(stats.accepted <= stats.drafted && stats.drafted <= draft_tokens * stats.verify_passes);
                // A token from the prompt's pass, then one a verify pass with
                // its accepted drafts (but none after drafts that end the run).
                let passes_and_drafts = stats.verify_passes + stats.accepted;
                assert!((NEW_TOKENS - 1..=NEW_TOKENS).contains(&passes_and_drafts), "{what}");
            }
        }
    }
}
