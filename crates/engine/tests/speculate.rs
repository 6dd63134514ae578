//! Speculative decoding is a mode of the one decode loop: with the MTP
//! layer drafting, greedy decoding gives exactly plain greedy decoding's
//! tokens, through `Session::generate` and the batcher alike, every `--io`,
//! a cache holding every expert and one holding almost none, 1 to 3 drafted
//! tokens a pass; sampled decoding with `--speculate on` gives a seed's
//! tokens alone and batched alike. Every family with MTP layers runs both
//! checks ([`fixtures!`]): DeepSeek-V3's (latent attention: rejected rows
//! cut back in place), GLM-5's (the same, its MTP layer selecting with a
//! DSA indexer of its own) and Kimi K2.5's (DeepSeek-V3's text model under
//! the multimodal wrapper's names), Qwen3-Next's and Qwen3.5's (hybrid
//! stacks: their Gated DeltaNet states undone and the kept tokens run
//! again) and Inkling's (its short convolutions and rings undone alike, and
//! its MTP layer's convolution states restored from a snapshot after each
//! draft).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_engine::{
    BatchLimits, Batcher, Engine, EngineOptions, Event, GenerateOptions, IoBackend, Job, SamplingOptions, SpeculateMode,
};
use strata_format::{ConvertOptions, QuantPreset};

const NEW_TOKENS: usize = 24;

/// One module of both checks per family with an MTP fixture
/// (`testdata/FAMILY_mtp`, from xtask/fixtures/mtp_ref.py), and whether
/// its MTP layer was trained to draft the stack's tokens (`distil`), so
/// that some drafts must stand and the rollback of the rest after them is
/// checked too (a random layer's never stand); each check takes one to
/// three seconds in the debug profile.
macro_rules! fixtures {
    ($($family:ident: $drafts_stand:literal),+) => {$(
        mod $family {
            #[test]
            fn greedy_speculation_gives_plain_greedy_tokens_every_io_and_cache() {
                super::greedy_speculation_gives_plain_greedy_tokens(stringify!($family), $drafts_stand);
            }

            #[test]
            fn the_batcher_drafts_per_sequence_and_gives_each_its_tokens_alone() {
                super::batched_drafts_give_each_sequence_its_tokens_alone(stringify!($family));
            }
        }
    )+};
}

fixtures!(
    deepseek_v3: false,
    glm_moe_dsa: false,
    kimi_k25: false,
    qwen3_next: true,
    qwen3_5_moe: true,
    inkling: false
);

/// `family`'s MTP fixture converted at q8, and its reference prompt.
fn model(family: &str, tmp: &tempfile::TempDir) -> (PathBuf, Vec<u32>) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(format!("{family}_mtp"));
    let text = std::fs::read_to_string(fixture.join("mtp_reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt: Vec<u32> = json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let dir = tmp.path().join("model");
    strata_format::convert(fixture.join("hf"), &dir, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    (dir, prompt)
}

fn greedy() -> GenerateOptions {
    GenerateOptions { max_new_tokens: NEW_TOKENS, ignore_eos: true, ..GenerateOptions::default() }
}

fn greedy_speculation_gives_plain_greedy_tokens(family: &str, drafts_stand: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, prompt) = model(family, &tmp);
    let mut accepted = 0;
    for io in [IoBackend::Pread, IoBackend::Direct, IoBackend::Uring, IoBackend::Mmap] {
        for expert_cache_bytes in [1 << 30, 16 << 10] {
            let options = |speculate, draft_tokens| EngineOptions {
                threads: 2,
                io,
                expert_cache_bytes: Some(expert_cache_bytes),
                speculate,
                draft_tokens,
                ..EngineOptions::default()
            };
            let plain_engine = Engine::open(&dir, &options(SpeculateMode::Off, 1)).unwrap();
            assert!(plain_engine.speculation().is_none());
            let plain = plain_engine.session().generate(&prompt, &greedy(), |_| ControlFlow::Continue(())).unwrap();
            assert!(plain.stats.speculation.is_none(), "off drafts nothing");
            drop(plain_engine);
            for draft_tokens in 1..=3 {
                let engine = Engine::open(&dir, &options(SpeculateMode::On, draft_tokens)).unwrap();
                let spec = engine.session().generate(&prompt, &greedy(), |_| ControlFlow::Continue(())).unwrap();
                let what = format!("{family}: {io:?}, cache {expert_cache_bytes}, {draft_tokens} drafted");
                assert_eq!(spec.tokens, plain.tokens, "{what}");
                let stats = spec.stats.speculation.expect("on drafts");
                eprintln!("{what}: {stats:?}, {:.2} tokens a verify pass", stats.tokens_per_verify_pass());
                assert_eq!(stats.accepted, stats.accepted_at.iter().sum::<usize>(), "{what}");
                accepted += stats.accepted;
                assert!(stats.accepted <= stats.drafted && stats.drafted <= draft_tokens * stats.verify_passes);
                // A token from the prompt's pass, then the verify passes'
                // (and a plain step where one token was left to generate).
                assert_eq!(1 + stats.verified_tokens + stats.plain_steps, NEW_TOKENS, "{what}");
            }
        }
    }
    assert!(accepted > 0 || !drafts_stand, "{family}: no draft stood");
}

/// The batcher drafts per sequence inside the batch: each job's tokens are
/// those it gets alone, greedy (plain decoding's) and sampled with `on`.
fn batched_drafts_give_each_sequence_its_tokens_alone(family: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, prompt) = model(family, &tmp);
    let options = EngineOptions { threads: 2, sessions: 3, speculate: SpeculateMode::On, ..EngineOptions::default() };
    let engine = Arc::new(Engine::open(&dir, &options).unwrap());
    let sampled = |seed| GenerateOptions {
        sampling: SamplingOptions { temperature: 0.8, top_k: 20, top_p: 0.95, seed },
        ..greedy()
    };
    let jobs = [(prompt.clone(), greedy()), (prompt[1..].to_vec(), sampled(3)), (prompt[..3].to_vec(), sampled(4))];
    let alone: Vec<Vec<u32>> = jobs
        .iter()
        .map(|(p, o)| engine.session().generate(p, o, |_| ControlFlow::Continue(())).unwrap().tokens)
        .collect();
    let plain = Engine::open(&dir, &EngineOptions { threads: 2, speculate: SpeculateMode::Off, ..options }).unwrap();
    let greedy_plain = plain.session().generate(&prompt, &greedy(), |_| ControlFlow::Continue(())).unwrap().tokens;
    assert_eq!(alone[0], greedy_plain, "greedy drafted is plain");
    let limits = BatchLimits { max_batch: 3, prefill_chunk_tokens: 4, queue_jobs_max: 3 };
    let (batcher, thread) = Batcher::spawn(Arc::clone(&engine), limits, Arc::new(())).unwrap();
    let events: Vec<_> = jobs
        .iter()
        .map(|(p, o)| {
            let job = Job { prompt: p.clone(), options: o.clone(), constraint: None, request_id: None };
            batcher.submit(job).unwrap()
        })
        .collect();
    for (events, alone) in events.iter().zip(&alone) {
        let mut tokens = Vec::new();
        while let Some(Event::Token(token)) = events.recv() {
            tokens.push(token);
        }
        assert_eq!(&tokens, alone);
    }
    drop(batcher);
    thread.join().unwrap();
}
