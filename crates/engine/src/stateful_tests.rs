//! The engine's paths over a cache with a recurrent state (truncation,
//! reopening, all-or-nothing passes), on a toy model whose one layer keeps
//! rows and another a state, in place of the opened model: no family here
//! has recurrent layers yet.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_format::{ConvertOptions, CoreSpec, QuantPreset};
use strata_kv::{LayerLayout, StatePart};
use strata_models::SeqBatch;

use super::*;
use crate::speculate::{SpeculateMode, Speculation};
use crate::{EngineOptions, GenerateOptions};

/// Layer 0 keeps a row per token, layer 1 a state that every token folds
/// into; the logits depend on both, so a wrong state or a missing row
/// changes the tokens.
struct Toy {
    spec: CoreSpec,
    probes: Arc<ToyProbes>,
    /// Its MTP layer drafts the stack's own choice, made wrong at every
    /// draft-cache position that is a multiple of this (0: never).
    wrong_draft_every: usize,
}

/// What a test sets in a [`Toy`] and reads back from it.
struct ToyProbes {
    /// A pass that would commit past this length fails after staging its
    /// state (a fault in the middle of a forward pass).
    fail_past_tokens: AtomicUsize,
    /// The most rows one call of its MTP layer took.
    draft_rows_max: AtomicUsize,
}

/// A stand-in MTP layer's draft cache: a float a row, so that its length
/// follows the drafts (the stand-ins here and in `rollback_tests` draft
/// without attending).
pub(super) fn one_row_draft_cache(capacity_tokens: usize) -> SequenceState {
    SequenceState::with_layers(vec![LayerLayout::new(vec![StatePart::Rows { dim: 1 }])], capacity_tokens)
}

/// A toy hidden row: the state after the token, then the sum of the rows
/// it attended to; the rest of the row is zero.
const TOY_STATE: usize = 4;

impl Toy {
    /// The logits after a token whose state is `state` and rows sum to
    /// `attended`.
    fn logits_of(&self, state: &[f32], attended: f32) -> impl Iterator<Item = f32> {
        let state_sum: f32 = state.iter().sum();
        (0..self.spec.vocab_size).map(move |v| ((state_sum + attended) * (v as f32 + 1.0)).sin())
    }

    /// The stack's hidden row after `token`, from the row before it.
    fn fold(&self, before: &[f32], token: u32) -> Vec<f32> {
        let mut row = before.to_vec();
        for (j, s) in row[..TOY_STATE].iter_mut().enumerate() {
            *s = *s * 0.9 + (token as f32 + j as f32) * 0.01;
        }
        row[TOY_STATE] += token as f32 * 0.001 + 1.0;
        row
    }
}

impl Toy {
    fn pass(&self, tokens: &[u32], cache: &mut SequenceState, which: Logits) -> strata_models::Result<Vec<f32>> {
        Ok(self.pass_hidden(tokens, cache, which)?.0)
    }

    /// [`Toy::pass`], with each token's hidden row.
    fn pass_hidden(
        &self,
        tokens: &[u32],
        cache: &mut SequenceState,
        which: Logits,
    ) -> strata_models::Result<(Vec<f32>, Vec<f32>)> {
        let mut hidden = Vec::new();
        cache.reserve(tokens.len())?;
        let start = cache.len();
        let rows: Vec<f32> = tokens.iter().flat_map(|&t| [t as f32 * 0.001, 1.0]).collect();
        cache.write(0, 0, &rows);
        let mut out = Vec::new();
        for (i, &token) in tokens.iter().enumerate() {
            let state = cache.stage_state(1, 0);
            for (j, s) in state.iter_mut().enumerate() {
                *s = *s * 0.9 + (token as f32 + j as f32) * 0.01;
            }
            let state = state.to_vec();
            let attended: f32 = cache.rows(0, 0, start + i + 1).iter().sum();
            if which == Logits::All || i + 1 == tokens.len() {
                out.extend(self.logits_of(&state, attended));
            }
            let mut row = vec![0.0; self.spec.hidden_size];
            row[..TOY_STATE].copy_from_slice(&state);
            row[TOY_STATE] = attended;
            hidden.extend(row);
        }
        if start + tokens.len() > self.probes.fail_past_tokens.load(Ordering::Relaxed) {
            return Err(strata_models::Error::Unsupported("injected fault".into()));
        }
        cache.advance(tokens.len());
        Ok((out, hidden))
    }
}

impl CausalLm for Toy {
    fn core(&self) -> &CoreSpec {
        &self.spec
    }

    fn new_cache(&self, capacity_tokens: usize) -> SequenceState {
        let layouts = vec![
            LayerLayout::new(vec![StatePart::Rows { dim: 2 }]),
            LayerLayout::new(vec![StatePart::Fixed { floats: 4 }]),
        ];
        SequenceState::with_layers(layouts, capacity_tokens)
    }

    fn forward(
        &self,
        _: &Runtime<'_>,
        tokens: &[u32],
        cache: &mut SequenceState,
        which: Logits,
    ) -> strata_models::Result<Vec<f32>> {
        self.pass(tokens, cache, which)
    }

    fn forward_batch(&self, _: &Runtime<'_>, seqs: &mut [SeqBatch<'_>]) -> strata_models::Result<Vec<Vec<f32>>> {
        seqs.iter_mut().map(|seq| self.pass(seq.tokens, seq.cache, Logits::Last)).collect()
    }

    fn forward_hidden(
        &self,
        _: &Runtime<'_>,
        tokens: &[u32],
        cache: &mut SequenceState,
    ) -> strata_models::Result<(Vec<f32>, Vec<f32>)> {
        self.pass_hidden(tokens, cache, Logits::All)
    }

    fn mtp_layers(&self) -> usize {
        1
    }

    fn new_draft_cache(&self, capacity_tokens: usize) -> SequenceState {
        one_row_draft_cache(capacity_tokens)
    }

    /// Folds each next token into its hidden row as the stack would: the
    /// draft is the stack's own choice, unless its position is made wrong.
    fn draft(
        &self,
        _: &Runtime<'_>,
        hidden: &[f32],
        next: &[u32],
        cache: &mut SequenceState,
        first_row: usize,
        which: Logits,
    ) -> strata_models::Result<strata_models::Draft> {
        cache.reserve(next.len())?;
        self.probes.draft_rows_max.fetch_max(next.len(), Ordering::Relaxed);
        let (mut logits, mut out) = (Vec::new(), Vec::new());
        for (row, &token) in hidden.chunks_exact(self.spec.hidden_size).zip(next) {
            let folded = self.fold(row, token);
            let mut row_logits: Vec<f32> = self.logits_of(&folded[..TOY_STATE], folded[TOY_STATE]).collect();
            let position = first_row + cache.len() + out.len() / self.spec.hidden_size;
            if self.wrong_draft_every > 0 && position.is_multiple_of(self.wrong_draft_every) {
                let best = crate::sampler::argmax(&row_logits) as usize;
                row_logits[best] = f32::MIN;
            }
            logits.extend(row_logits);
            out.extend(folded);
        }
        cache.write(0, 0, &vec![0.0; next.len()]);
        cache.advance(next.len());
        if which == Logits::Last {
            logits.drain(..logits.len() - self.spec.logits_width());
        }
        Ok(strata_models::Draft { logits, hidden: out })
    }
}

/// An engine over the olmoe test checkpoint with the toy model in place of
/// its own, feeding at most `chunk` tokens a pass, and the toy's fault
/// threshold.
fn toy_engine(dir: &Path, chunk: usize) -> (Engine, Arc<ToyProbes>) {
    toy_drafting_engine(dir, chunk, 0)
}

/// [`toy_engine`] whose MTP layer drafts wrong at every position that is a
/// multiple of `wrong_draft_every` (0: never).
fn toy_drafting_engine(dir: &Path, chunk: usize, wrong_draft_every: usize) -> (Engine, Arc<ToyProbes>) {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/olmoe/hf");
    let model = dir.join("olmoe");
    if !model.exists() {
        strata_format::convert(&hf, &model, &ConvertOptions::new(QuantPreset::Q8)).unwrap();
    }
    let options = EngineOptions { threads: 1, prefill_chunk_tokens: Some(chunk), ..EngineOptions::default() };
    let mut engine = Engine::open(&model, &options).unwrap();
    let spec = engine.core().clone();
    let probes =
        Arc::new(ToyProbes { fail_past_tokens: AtomicUsize::new(usize::MAX), draft_rows_max: AtomicUsize::new(0) });
    engine.model = Box::new(Toy { spec, probes: Arc::clone(&probes), wrong_draft_every });
    (engine, probes)
}

fn greedy(session: &mut Session<'_>, prompt: &[u32], n: usize) -> Vec<u32> {
    let options = GenerateOptions { max_new_tokens: n, ignore_eos: true, ..GenerateOptions::default() };
    session.generate(prompt, &options, |_| ControlFlow::Continue(())).unwrap().tokens
}

const PROMPT: [u32; 7] = [3, 1, 4, 1, 5, 9, 2];

#[test]
fn a_stateful_sequence_split_differently_gives_the_tokens_of_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let whole = greedy(&mut toy_engine(dir.path(), 64).0.session(), &PROMPT, 12);
    // In pieces of 3 (the snapshot before them is at 0, free).
    let (engine, _) = toy_engine(dir.path(), 3);
    let mut session = engine.session();
    assert_eq!(greedy(&mut session, &PROMPT, 12), whole);

    // Cut back into the answer: the state resumes from the snapshot at the
    // end of the prompt and the gap is run again.
    session.truncate(PROMPT.len() + 4).unwrap();
    assert_eq!(session.tokens().len(), PROMPT.len() + 4);
    assert_eq!(greedy(&mut session, &whole[4..5], 7), whole[5..]);

    // Rewinding goes back only as far as a snapshot; feeding the rest with
    // the prompt gives the same tokens (chat's and serve's prefix reuse).
    // The snapshots now are those of the last turn: the end of its prompt
    // (`whole[4]`, at PROMPT.len() + 5) and of its answer.
    let kept = session.rewind(PROMPT.len() + 7);
    assert_eq!(kept, PROMPT.len() + 5, "the latest snapshot at or below the cut");
    assert_eq!(greedy(&mut session, &whole[5..7], 5), whole[7..]);
}

#[test]
fn a_stateful_session_reopens_at_its_snapshot_and_continues_as_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let kv = dir.path().join("kv");
    let (engine, _) = toy_engine(dir.path(), 64);
    let whole = greedy(&mut engine.session(), &PROMPT, 10);
    let (mut session, _) = engine.open_session(&kv, "s").unwrap();
    let mut got = greedy(&mut session, &PROMPT, 5);
    drop(session);
    let (mut session, report) = engine.open_session(&kv, "s").unwrap();
    assert_eq!((report.reopened_tokens, report.rerun_tokens), (PROMPT.len() + 5, 0), "no re-prefill");
    got.extend(greedy(&mut session, &[], 5));
    assert_eq!(got, whole);

    // Cut inside the answer, before every snapshot the session holds (those
    // at the ends of the two answers): the cut runs the tokens again but the
    // last and saves a snapshot there, so reopening runs nothing.
    session.truncate(PROMPT.len() + 3).unwrap();
    drop(session);
    let (mut session, report) = engine.open_session(&kv, "s").unwrap();
    assert_eq!((report.reopened_tokens, report.rerun_tokens), (PROMPT.len() + 3, 0));
    assert_eq!(greedy(&mut session, &[], 3), whole[3..6]);
}

#[test]
fn a_failed_pass_over_a_stateful_cache_leaves_it_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, toy) = toy_engine(dir.path(), 3);
    let mut session = engine.session();
    greedy(&mut session, &PROMPT, 2);
    let (tokens, kv_bytes) = (session.tokens().to_vec(), session.kv_bytes());
    // The cache holds 8 tokens, the 9th is unfed. Pieces of 3 of which the
    // third fails; then a one-piece pass that fails after staging.
    for (fed, fail_past) in [(8, 14), (1, 8)] {
        toy.fail_past_tokens.store(fail_past, Ordering::Relaxed);
        assert!(session.feed(&vec![7; fed]).is_err());
        assert_eq!(session.tokens(), tokens, "fed {fed}");
        assert!(session.kv_bytes() <= kv_bytes + 4 * 4 * 2, "fed {fed}: the rows are gone, a snapshot at most added");
    }
    toy.fail_past_tokens.store(usize::MAX, Ordering::Relaxed);
    let mut fresh = engine.session();
    greedy(&mut fresh, &PROMPT, 2);
    assert_eq!(greedy(&mut session, &[], 4), greedy(&mut fresh, &[], 4), "the session goes on as if nothing failed");
}

/// Drafts accepted, partly or wholly, over a recurrent state: the tokens
/// stay plain greedy decoding's, the rejected ones taken back by the
/// state's undo and the kept ones run again.
#[test]
fn speculation_over_a_recurrent_state_gives_plain_greedy_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let plain = greedy(&mut toy_engine(dir.path(), 64).0.session(), &PROMPT, 20);
    for wrong_draft_every in [0, 2, 3] {
        let (mut engine, _) = toy_drafting_engine(dir.path(), 64, wrong_draft_every);
        for draft_tokens in 1..=3 {
            engine.speculation = Some(Speculation { mode: SpeculateMode::On, draft_tokens });
            let options = GenerateOptions { max_new_tokens: 20, ignore_eos: true, ..GenerateOptions::default() };
            let report = engine.session().generate(&PROMPT, &options, |_| ControlFlow::Continue(())).unwrap();
            let stats = report.stats.speculation.expect("the toy drafts");
            let what = format!("wrong every {wrong_draft_every}, {draft_tokens} drafted: {stats:?}");
            assert_eq!(report.tokens, plain, "{what}");
            assert!(stats.accepted > 0, "{what}");
            // Right drafts all stand.
            assert_eq!(stats.accepted == stats.drafted, wrong_draft_every == 0, "{what}");
            // A token from the prompt's pass, then the verify passes' (and a
            // plain step where one token was left to generate).
            assert_eq!(1 + stats.verified_tokens + stats.plain_steps, 20, "{what}");
        }
    }
}

/// `auto` with a drafter that is always wrong: the tokens stay plain
/// greedy decoding's, and drafting stops after its probes (at most
/// `PROBE_PASSES` verify passes after the first plain steps, then a probe
/// per 32 plain steps: 8 of 60 steps here).
#[test]
fn auto_with_a_drafter_that_never_stands_drafts_only_its_probes() {
    let dir = tempfile::tempdir().unwrap();
    let plain = greedy(&mut toy_engine(dir.path(), 64).0.session(), &PROMPT, 60);
    let (mut engine, _) = toy_drafting_engine(dir.path(), 64, 1);
    engine.speculation = Some(Speculation { mode: SpeculateMode::Auto, draft_tokens: 2 });
    let options = GenerateOptions { max_new_tokens: 60, ignore_eos: true, ..GenerateOptions::default() };
    let report = engine.session().generate(&PROMPT, &options, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(report.tokens, plain);
    let stats = report.stats.speculation.unwrap();
    assert_eq!(stats.accepted, 0, "{stats:?}");
    assert!(stats.verify_passes <= 2 * crate::speculate::PROBE_PASSES, "{stats:?}");
    // Sampled, auto keeps no drafter: the tokens would depend on the clock.
    let sampling = crate::SamplingOptions { temperature: 0.8, seed: 5, ..crate::SamplingOptions::default() };
    let report = engine
        .session()
        .generate(&PROMPT, &GenerateOptions { sampling, ..options }, |_| ControlFlow::Continue(()))
        .unwrap();
    assert!(report.stats.speculation.is_none(), "auto leaves sampled decoding plain");
}

/// `auto`'s drafter catches up on at most `draft_tokens + 1` rows, however
/// long the prompt or the plain stretch before a probe, restarting its
/// cache over the most recent ones; `on`'s takes every row. Either way the
/// tokens are plain greedy decoding's, and right drafts stand.
#[test]
fn autos_drafter_catches_up_over_a_window_of_recent_rows() {
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 50).collect();
    let plain = greedy(&mut toy_engine(dir.path(), 64).0.session(), &prompt, 40);
    for mode in [SpeculateMode::Auto, SpeculateMode::On] {
        let (mut engine, toy) = toy_drafting_engine(dir.path(), 64, 0);
        let speculation = Speculation { mode, draft_tokens: 2 };
        engine.speculation = Some(speculation);
        let options = GenerateOptions { max_new_tokens: 40, ignore_eos: true, ..GenerateOptions::default() };
        let report = engine.session().generate(&prompt, &options, |_| ControlFlow::Continue(())).unwrap();
        assert_eq!(report.tokens, plain, "{mode}");
        let stats = report.stats.speculation.unwrap();
        assert!(stats.verify_passes > 0 && stats.accepted == stats.drafted, "{mode}: {stats:?}");
        let rows = toy.draft_rows_max.load(Ordering::Relaxed);
        match mode {
            SpeculateMode::Auto => assert!(rows <= speculation.draft_tokens + 1, "{rows} rows caught up"),
            _ => assert_eq!(rows, prompt.len(), "on catches up on the whole prompt"),
        }
    }
}
