//! Speculative decoding over Inkling takes back exactly what it drafted
//! past: a verify pass over the stack the rows it rejected and the state
//! its layers keep (the k, v and output short convolutions, the sliding
//! layers' rings), which rows cut back would not undo; the drafter its MTP
//! layer's rows and convolution states past the committed ones.
//!
//! For the stack, the opened model verifies drafts that a stand-in MTP
//! layer takes from plain greedy decoding's own tokens, some made wrong,
//! so that passes keep some drafts and take the rest back.

use std::ops::ControlFlow;
use std::path::Path;

use strata_format::{ConvertOptions, CoreSpec, MixerSpec, QuantPreset};
use strata_models::{Draft, Rows};

use super::*;
use crate::speculate::{Drafter, SpeculateMode, Speculation};
use crate::{EngineOptions, GenerateOptions, Sampler, SamplingOptions};

/// The opened model, whose MTP layer drafts `sequence` (plain greedy
/// decoding's prompt and tokens): the token after position p is
/// `sequence[p + 1]`, made wrong where p + 1 is a multiple of `wrong_every`
/// (0: never).
struct Foreseeing {
    stack: Box<dyn CausalLm>,
    sequence: Vec<u32>,
    wrong_every: usize,
}

impl CausalLm for Foreseeing {
    fn core(&self) -> &CoreSpec {
        self.stack.core()
    }

    fn new_cache(&self, capacity_tokens: usize) -> SequenceState {
        self.stack.new_cache(capacity_tokens)
    }

    fn forward(
        &self,
        rt: &Runtime<'_>,
        tokens: &[u32],
        cache: &mut SequenceState,
        logits: Logits,
    ) -> strata_models::Result<Vec<f32>> {
        self.stack.forward(rt, tokens, cache, logits)
    }

    fn forward_batch(&self, rt: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> strata_models::Result<Vec<Vec<f32>>> {
        self.stack.forward_batch(rt, seqs)
    }

    fn forward_hidden(
        &self,
        rt: &Runtime<'_>,
        tokens: &[u32],
        cache: &mut SequenceState,
    ) -> strata_models::Result<(Vec<f32>, Vec<f32>)> {
        self.stack.forward_hidden(rt, tokens, cache)
    }

    fn forward_batch_rows(
        &self,
        rt: &Runtime<'_>,
        seqs: &mut [SeqBatch<'_>],
        which: &[Logits],
    ) -> strata_models::Result<Vec<Rows>> {
        self.stack.forward_batch_rows(rt, seqs, which)
    }

    fn mtp_layers(&self) -> usize {
        1
    }

    fn new_draft_cache(&self, capacity_tokens: usize) -> SequenceState {
        super::stateful_tests::one_row_draft_cache(capacity_tokens)
    }

    fn draft(
        &self,
        _: &Runtime<'_>,
        _: &[f32],
        next: &[u32],
        cache: &mut SequenceState,
        first_row: usize,
        which: Logits,
    ) -> strata_models::Result<Draft> {
        let (vocab, h) = (self.core().logits_width(), self.core().hidden_size);
        cache.reserve(next.len())?;
        let mut logits = vec![0.0f32; next.len() * vocab];
        for (i, row) in logits.chunks_exact_mut(vocab).enumerate() {
            // Draft-cache row r is position first_row + r + 1; its draft
            // the token after.
            let after = first_row + cache.len() + i + 2;
            let right = self.sequence.get(after).map_or(0, |&t| t as usize);
            let wrong = self.wrong_every > 0 && after.is_multiple_of(self.wrong_every);
            row[if wrong { (right + 1) % vocab } else { right }] = 1.0;
        }
        cache.write(0, 0, &vec![0.0; next.len()]);
        cache.advance(next.len());
        if which == Logits::Last {
            logits.drain(..logits.len() - vocab);
        }
        Ok(Draft { logits, hidden: vec![0.0; next.len() * h] })
    }
}

const NEW_TOKENS: usize = 20;

#[test]
fn verify_passes_over_inklings_convolutions_and_rings_take_back_exactly_what_they_reject() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling");
    let text = std::fs::read_to_string(fixture.join("reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt: Vec<u32> = json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("inkling");
    strata_format::convert(fixture.join("hf"), &model, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    let open = || Engine::open(&model, &EngineOptions { threads: 1, ..EngineOptions::default() }).unwrap();
    let options = GenerateOptions { max_new_tokens: NEW_TOKENS, ignore_eos: true, ..GenerateOptions::default() };
    let plain_engine = open();
    let plain = plain_engine.session().generate(&prompt, &options, |_| ControlFlow::Continue(())).unwrap().tokens;
    // Past the sliding layers' window: their rings have wrapped.
    let windows = plain_engine.arch().layers.iter().filter_map(|l| match &l.mixer {
        MixerSpec::Inkling(attention) => attention.sliding_window,
        _ => None,
    });
    let window = windows.max().expect("sliding layers");
    assert!(prompt.len() + NEW_TOKENS > 2 * window);
    let sequence: Vec<u32> = prompt.iter().chain(&plain).copied().collect();
    for wrong_every in [0, 3, 5] {
        for draft_tokens in [1, 3] {
            let mut engine = open();
            let stack = open().model;
            engine.model = Box::new(Foreseeing { stack, sequence: sequence.clone(), wrong_every });
            engine.speculation = Some(Speculation { mode: SpeculateMode::On, draft_tokens });
            let report = engine.session().generate(&prompt, &options, |_| ControlFlow::Continue(())).unwrap();
            let stats = report.stats.speculation.expect("it drafts");
            let what = format!("wrong every {wrong_every}, {draft_tokens} drafted: {stats:?}");
            assert_eq!(report.tokens, plain, "{what}");
            // Right drafts all stand; wrong ones make passes keep some and
            // take the rest back.
            assert_eq!(stats.accepted == stats.drafted, wrong_every == 0, "{what}");
            assert!(stats.accepted > 0, "{what}");
        }
    }
}

/// Each pass's first draft comes from the MTP layer's committed rows
/// alone: whatever it drafted past them before (3 tokens a pass here), its
/// distribution is the teacher-forced one's (`Engine::draft_logits`, the
/// one checked against transformers), bit for bit, so the drafter restored
/// the convolutions' state it had.
#[test]
fn inklings_draft_cache_is_restored_to_its_committed_rows_after_every_draft() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling_mtp");
    let text = std::fs::read_to_string(fixture.join("mtp_reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt: Vec<u32> = json["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("inkling_mtp");
    strata_format::convert(fixture.join("hf"), &model, &ConvertOptions::new(QuantPreset::F32)).unwrap();
    let engine = Engine::open(&model, &EngineOptions { threads: 1, ..EngineOptions::default() }).unwrap();
    let teacher_forced = engine.draft_logits(&prompt).unwrap();
    let vocab = engine.core().logits_width();
    let sampling = SamplingOptions { temperature: 1.0, ..SamplingOptions::default() };
    let (mut sampler, mut want) = (Sampler::new(sampling), Sampler::new(sampling));
    engine.run(|model, rt| {
        let mut cache = model.new_cache(prompt.len());
        let mut drafter = Drafter::new(model, prompt.len(), Speculation { mode: SpeculateMode::On, draft_tokens: 3 });
        // The stack runs a token at a time after the first two; each step
        // drafts after the token it has not run yet.
        let (_, hidden) = model.forward_hidden(rt, &prompt[..1], &mut cache).unwrap();
        drafter.extend(&hidden);
        for unfed in 1..prompt.len() - 1 {
            let drafts = drafter.draft(model, rt, &prompt[..=unfed], 3, &mut sampler).unwrap();
            let row = &teacher_forced[(unfed - 1) * vocab..unfed * vocab];
            assert_eq!(drafts[0].q, want.distribution(row), "the draft after position {unfed}");
            let (_, hidden) = model.forward_hidden(rt, &prompt[unfed..=unfed], &mut cache).unwrap();
            drafter.extend(&hidden);
        }
    });
}
