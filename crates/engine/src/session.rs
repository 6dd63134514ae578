//! A conversation: its KV cache, the tokens so far, and generation.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use strata_format::RowReads;
use strata_kv::{Persist, SequenceState, SessionFile};
use strata_models::{Logits, SeqBatch};
use strata_sched::LayerStats;
use strata_tier::{DeviceTierStats, StoreStats};

use crate::decode::Generation;
use crate::engine::check_logits;
use crate::speculate::{Drafted, Drafter, Policy, SpeculateMode, SpeculationStats};
use crate::{Constraint, Engine, Error, Finish, Result, Sampler, SamplingOptions};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingOptions,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Ids that end generation besides the model's `eos_token_ids` (e.g. an
    /// end-of-turn token listed only in generation_config.json).
    pub extra_eos_token_ids: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 128,
            sampling: SamplingOptions::default(),
            ignore_eos: false,
            extra_eos_token_ids: Vec::new(),
        }
    }
}

/// Timings and expert-store counters of one run (names documented in
/// docs/FORMAT.md, "generate --json").
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub decode_tokens_per_s: f64,
    pub prefill_tokens_per_s: f64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_hit_rate: f64,
    pub bytes_read: u64,
    /// Time spent waiting for expert loads.
    pub stall_ms: f64,
    /// Time spent computing routed experts.
    pub expert_compute_ms: f64,
    pub expert_cache_bytes: u64,
    /// How experts were read (`--io`, `auto` resolved).
    pub io: String,
    /// Hit rate of each decoder layer (`null` for layers without experts or accesses).
    pub layer_hit_rates: Vec<Option<f64>>,
    /// The memory budget in force, and the process's peak resident memory
    /// (`VmHWM`) at the end of the run.
    pub ram_budget_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    /// Look-ahead prefetch: whether it ran, reads started, prefetched
    /// records a demand then used, bytes of those dropped unused.
    pub prefetch: bool,
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub prefetch_wasted_bytes: u64,
    /// Per decoder layer, the share of its demanded experts that the
    /// look-ahead guess (made one layer earlier) named (`null` where no
    /// guess was made).
    pub layer_prefetch_recall: Vec<Option<f64>>,
    /// Speculative decoding's counts (`None`: the engine does not draft).
    pub speculation: Option<SpeculationStats>,
    /// Rows read from the PLE tables kept on disk (Qwen3.8-Flash-Next's
    /// n-gram rows, one per head and token of a PLE layer) and their bytes;
    /// no row cache stands before them, so every row is a read.
    pub ple_rows_read: u64,
    pub ple_bytes_read: u64,
    /// The tier of routed experts in VRAM (`--device gpu`; zeros without):
    /// lookups it held and did not, bytes of experts copied to the device,
    /// the time those copies took, and uploads refused for want of memory.
    pub vram_expert_hits: u64,
    pub vram_expert_misses: u64,
    pub vram_bytes_uploaded: u64,
    pub vram_upload_stall_ms: f64,
    pub vram_refused_uploads: u64,
    /// One entry per forward pass: the prompt's prefill, then each decoded token.
    pub per_token: Vec<StepStats>,
}

/// Counters of one forward pass.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepStats {
    pub tokens: usize,
    pub ms: f64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub bytes_read: u64,
    pub stall_ms: f64,
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
}

impl RunStats {
    /// Generated tokens per second of decoding.
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_ms > 0.0 { self.generated_tokens as f64 / (self.decode_ms / 1e3) } else { 0.0 }
    }

    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        if self.prefill_ms > 0.0 { self.prompt_tokens as f64 / (self.prefill_ms / 1e3) } else { 0.0 }
    }
}

/// Engine counters at one instant, to difference around a step or a run.
struct Counters {
    at: Instant,
    store: StoreStats,
    pipeline: LayerStats,
    ple: RowReads,
    vram: DeviceTierStats,
}

impl Counters {
    fn take(engine: &Engine) -> Self {
        Self {
            at: Instant::now(),
            store: engine.store_stats(),
            pipeline: engine.pipeline_stats(),
            ple: engine.ple_row_reads(),
            vram: engine.vram_stats().experts,
        }
    }

    fn step_since(&self, engine: &Engine, tokens: usize) -> StepStats {
        let now = Counters::take(engine);
        StepStats {
            tokens,
            ms: ms(now.at - self.at),
            expert_hits: now.store.hits - self.store.hits,
            expert_misses: now.store.misses - self.store.misses,
            bytes_read: now.store.bytes_read - self.store.bytes_read,
            stall_ms: (now.pipeline.stall_ns - self.pipeline.stall_ns) as f64 / 1e6,
            prefetch_issued: now.store.prefetch_issued - self.store.prefetch_issued,
            prefetch_used: now.store.prefetch_used - self.store.prefetch_used,
        }
    }

    fn fill_run(&self, engine: &Engine, stats: &mut RunStats) {
        let now = Counters::take(engine);
        stats.expert_hits = now.store.hits - self.store.hits;
        stats.expert_misses = now.store.misses - self.store.misses;
        let accesses = stats.expert_hits + stats.expert_misses;
        stats.expert_hit_rate = if accesses > 0 { stats.expert_hits as f64 / accesses as f64 } else { 0.0 };
        stats.bytes_read = now.store.bytes_read - self.store.bytes_read;
        stats.ple_rows_read = now.ple.rows - self.ple.rows;
        stats.ple_bytes_read = now.ple.bytes - self.ple.bytes;
        stats.stall_ms = (now.pipeline.stall_ns - self.pipeline.stall_ns) as f64 / 1e6;
        stats.expert_compute_ms = (now.pipeline.compute_ns - self.pipeline.compute_ns) as f64 / 1e6;
        stats.expert_cache_bytes = engine.expert_cache_bytes() as u64;
        stats.io = engine.io().name().to_owned();
        stats.layer_hit_rates = (0..now.store.layer_hits.len())
            .map(|l| {
                let hits = now.store.layer_hits[l] - self.store.layer_hits[l];
                let misses = now.store.layer_misses[l] - self.store.layer_misses[l];
                (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64)
            })
            .collect();
        stats.prefetch = engine.prefetching();
        stats.prefetch_issued = now.store.prefetch_issued - self.store.prefetch_issued;
        stats.prefetch_used = now.store.prefetch_used - self.store.prefetch_used;
        stats.prefetch_wasted_bytes = now.store.prefetch_wasted_bytes - self.store.prefetch_wasted_bytes;
        stats.layer_prefetch_recall = (0..now.store.layer_predicted_lookups.len())
            .map(|l| {
                let lookups = now.store.layer_predicted_lookups[l] - self.store.layer_predicted_lookups[l];
                let hits = now.store.layer_predicted_hits[l] - self.store.layer_predicted_hits[l];
                (lookups > 0).then(|| hits as f64 / lookups as f64)
            })
            .collect();
        stats.vram_expert_hits = now.vram.hits - self.vram.hits;
        stats.vram_expert_misses = now.vram.misses - self.vram.misses;
        stats.vram_bytes_uploaded = now.vram.bytes_uploaded - self.vram.bytes_uploaded;
        stats.vram_upload_stall_ms = (now.vram.upload_stall_ns - self.vram.upload_stall_ns) as f64 / 1e6;
        stats.vram_refused_uploads = now.vram.refused_uploads - self.vram.refused_uploads;
        stats.ram_budget_bytes = engine.budget().total_bytes;
        stats.peak_rss_bytes = strata_tier::peak_rss_bytes();
        stats.decode_tokens_per_s = stats.decode_tokens_per_s();
        stats.prefill_tokens_per_s = stats.prefill_tokens_per_s();
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The outcome of [`Session::generate`].
#[derive(Debug, Clone)]
pub struct GenerateReport {
    /// Generated ids only, in order.
    pub tokens: Vec<u32>,
    /// Why generation ended ([`Finish::Length`] when no token was asked for).
    pub finish: Finish,
    pub stats: RunStats,
}

/// One sequence being extended.
pub struct Session<'e> {
    engine: &'e Engine,
    cache: SequenceState,
    tokens: Vec<u32>,
    /// Logits after the last fed token, not yet consumed by sampling.
    pending_logits: Option<Vec<f32>>,
    /// The last generated token: part of the sequence, not yet run through
    /// the model (running it is only needed if the sequence continues).
    unfed: Option<u32>,
    /// The session file every change is saved to (see `crate::persist`).
    persist: Option<Persist>,
    /// Warnings not yet taken, e.g. that saving stopped on a full disk.
    warnings: Vec<String>,
    /// The MTP layer's side of the sequence, where the engine drafts
    /// (`None` too for a session reopened from its file: its hidden rows
    /// are not saved).
    drafter: Option<Drafter>,
    /// When this sequence drafts.
    policy: Policy,
}

impl<'e> Session<'e> {
    pub(crate) fn new(engine: &'e Engine, cache: SequenceState) -> Self {
        let speculation = engine.speculation();
        let drafter = speculation.map(|s| Drafter::new(engine.model(), cache.capacity_tokens(), s));
        Self {
            engine,
            cache,
            tokens: Vec::new(),
            pending_logits: None,
            unfed: None,
            persist: None,
            warnings: Vec::new(),
            drafter,
            policy: Policy::new(speculation.map_or(SpeculateMode::Off, |s| s.mode)),
        }
    }

    /// A session read back from its file by [`Engine::open_session`].
    pub(crate) fn restored(
        engine: &'e Engine,
        cache: SequenceState,
        tokens: Vec<u32>,
        unfed: Option<u32>,
        persist: Option<Persist>,
    ) -> Self {
        Self { tokens, unfed, persist, drafter: None, ..Self::new(engine, cache) }
    }

    /// Warnings since the last call, e.g. that the session file stopped
    /// being written (a full disk); the session itself went on.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Whether every change is still being saved to a session file.
    pub fn is_persisted(&self) -> bool {
        self.persist.as_ref().is_some_and(Persist::is_active)
    }

    /// Saves what the sequence gained to the session file, if any. A failure
    /// there stops the saving, with a warning, never the session.
    fn persist_new(&mut self) {
        if let Some(warning) = self.persist.as_mut().and_then(|p| p.sync(&self.tokens, &self.cache)) {
            self.warnings.push(warning);
        }
    }

    /// Cuts the session file to the sequence's first `len_tokens` tokens.
    fn persist_truncate(&mut self, len_tokens: usize) {
        if let Some(warning) = self.persist.as_mut().and_then(|p| p.truncate(len_tokens)) {
            self.warnings.push(warning);
        }
    }

    /// Writes the whole sequence to a new session file at `path` (refused
    /// if it exists), durable when this returns, and leaves the session as
    /// it was: the file is a copy that nothing done later changes.
    /// [`Engine::read_session_copy`] reads it back. Returns the tokens
    /// written; on failure nothing is left at `path`.
    pub fn write_copy(&self, path: &Path) -> Result<usize> {
        let header = self.engine.session_header(&self.cache)?;
        let mut file = SessionFile::create(path, &header)?;
        // `sync` appends every token and fsyncs once. A file this call
        // created but could not fill is removed, not left half-written.
        if let Err(e) = file.sync(&self.tokens, &self.cache) {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e.into());
        }
        Ok(self.tokens.len())
    }

    /// Bytes of KV cache the sequence fills now: its rows, and the fixed
    /// state of recurrent layers with its copies (staged, snapshots).
    pub fn kv_bytes(&self) -> u64 {
        (self.cache.len() * self.cache.bytes_per_token() + self.cache.state_bytes_held()) as u64
    }

    /// The most tokens this session can hold.
    pub fn context_tokens(&self) -> usize {
        self.cache.capacity_tokens()
    }

    /// Every token of the sequence so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets the sequence.
    pub fn reset(&mut self) {
        self.cache.truncate(0);
        if let Some(drafter) = &mut self.drafter {
            drafter.truncate(0);
        }
        self.tokens.clear();
        self.pending_logits = None;
        self.unfed = None;
        self.persist_truncate(0);
    }

    /// Keeps only the first `len_tokens` tokens of the sequence. A cache
    /// with a recurrent state resumes from the longest prefix it holds a
    /// snapshot of, and the tokens from there are run again but the last,
    /// which is left to the next feed with a snapshot before it, as at the
    /// end of an answer, so that a session file cut here reopens without
    /// running anything (see [`Self::rewind`] to feed them with more
    /// instead). On error (running them failed) the sequence is the prefix
    /// the cache resumed from.
    pub fn truncate(&mut self, len_tokens: usize) -> Result<()> {
        if len_tokens >= self.tokens.len() {
            return Ok(());
        }
        let prefix = self.tokens[..len_tokens].to_vec();
        let kept = self.rewind(len_tokens);
        if kept < len_tokens {
            let (&last, gap) = prefix[kept..].split_last().expect("a token past the kept prefix");
            if !gap.is_empty() {
                self.feed(gap)?;
            }
            self.snapshot();
            self.tokens.push(last);
            self.unfed = Some(last);
            // As after a cut without a gap: nothing to sample from until
            // the next feed.
            self.pending_logits = None;
            self.persist_new();
        }
        Ok(())
    }

    /// Keeps at most the first `len_tokens` tokens of the sequence: as many
    /// as the cache can keep without running the model (all of them, unless
    /// it holds a recurrent state: then up to its latest snapshot at or
    /// below `len_tokens`), and returns how many. A new prompt that shares a
    /// prefix with the sequence is then fed from there rather than from
    /// scratch, the re-run tokens in the same pass as its own.
    pub fn rewind(&mut self, len_tokens: usize) -> usize {
        if len_tokens >= self.tokens.len() {
            return self.tokens.len();
        }
        // The sequence is the cache's tokens and at most one unfed one, so
        // `len_tokens` is within the cache.
        let kept = self.cache.truncate(len_tokens);
        assert!(kept <= len_tokens);
        if let Some(drafter) = &mut self.drafter {
            drafter.truncate(kept);
        }
        self.tokens.truncate(kept);
        self.unfed = None;
        self.pending_logits = None;
        self.persist_truncate(kept);
        kept
    }

    /// Records the recurrent state here, so that a later prompt sharing the
    /// sequence up to this point resumes without running it again (see
    /// [`SequenceState::snapshot`]; nothing for a cache without state), and saves
    /// it to the session file. Taken at turn boundaries: the end of a
    /// prompt, the end of an answer.
    pub fn snapshot(&mut self) {
        self.cache.snapshot();
        self.persist_new();
    }

    /// The length of the common prefix of the sequence and `tokens`.
    pub fn common_prefix_len(&self, tokens: &[u32]) -> usize {
        self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count()
    }

    /// Appends `tokens` and returns the logits after the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let batch: Vec<u32> = self.unfed.iter().chain(tokens).copied().collect();
        if batch.is_empty() {
            return Err(Error::InvalidRequest("no tokens to feed".into()));
        }
        let logits = self.forward(&batch, Logits::Last)?;
        self.unfed = None;
        self.tokens.extend_from_slice(tokens);
        self.pending_logits = Some(logits.clone());
        self.persist_new();
        Ok(logits)
    }

    /// Runs `batch` after the cache's tokens, handing the hidden rows to
    /// the drafter, if any.
    fn forward(&mut self, batch: &[u32], which: Logits) -> Result<Vec<f32>> {
        let mut hidden = Vec::new();
        let wants_hidden = self.drafter.is_some().then_some(&mut hidden);
        let logits = self.engine.forward_rows(batch, &mut self.cache, which, wants_hidden)?;
        if let Some(drafter) = &mut self.drafter {
            drafter.extend(&hidden);
        }
        Ok(logits)
    }

    /// Keeps the drafter for a generation sampled by `sampling` where it
    /// may draft, and drops it (and the hidden rows it would hold) where it
    /// may not: sampled, a seed's tokens depend on whether a step drafted
    /// (their distribution does not), so `auto`, which decides by the
    /// clock, drafts for greedy decoding only. A drafter comes back only on
    /// an empty sequence: the MTP layer needs every position's hidden row.
    pub(crate) fn prepare_drafter(&mut self, sampling: &SamplingOptions) {
        let Some(speculation) = self.engine.speculation() else { return };
        let by_clock = speculation.mode == SpeculateMode::Auto && sampling.temperature > 0.0;
        if by_clock {
            self.drafter = None;
        } else if self.drafter.is_none() && self.tokens.is_empty() {
            self.drafter = Some(Drafter::new(self.engine.model(), self.cache.capacity_tokens(), speculation));
        }
    }

    /// Whether the next step drafts: the engine drafts, the policy says
    /// so, and nothing constrains the tokens (drafts ignore a constraint).
    pub(crate) fn drafts_next(&self, constrained: bool) -> bool {
        self.drafter.is_some() && !constrained && self.policy.drafts()
    }

    /// Drafts up to `max_tokens` tokens after the unfed token with the MTP
    /// layer, each drawn by `sampler` (empty where none may be drafted).
    pub(crate) fn draft(&mut self, sampler: &mut Sampler, max_tokens: usize) -> Result<Vec<Drafted>> {
        let (Some(drafter), Some(speculation)) = (&mut self.drafter, self.engine.speculation()) else {
            return Ok(Vec::new());
        };
        // The pass runs the unfed token and the drafts: within the cache's
        // room, so drafting never fails where plain decoding would not.
        let room = self.cache.capacity_tokens().saturating_sub(self.cache.len() + 1);
        let k = speculation.draft_tokens.min(max_tokens).min(room);
        if k == 0 || self.unfed.is_none() {
            return Ok(Vec::new());
        }
        let tokens = &self.tokens;
        self.engine.run(|model, rt| drafter.draft(model, rt, tokens, k, sampler))
    }

    /// Runs the unfed token and `drafts` in one pass and appends the drafts
    /// (fed, not saved: [`Self::take_back_to`] saves what stands); the
    /// logits of every row, `[drafts + 1, vocab]`.
    pub(crate) fn verify(&mut self, drafts: &[u32]) -> Result<Vec<f32>> {
        let unfed = self.unfed.expect("a verify pass runs the token before its drafts");
        let batch: Vec<u32> = std::iter::once(unfed).chain(drafts.iter().copied()).collect();
        let logits = self.forward(&batch, Logits::All)?;
        self.unfed = None;
        self.tokens.extend_from_slice(drafts);
        self.pending_logits = None;
        Ok(logits)
    }

    /// Keeps the first `len_tokens` tokens, all fed, after a verify pass
    /// (those past it were run but not saved): the cache cuts its rows in
    /// place, and where a recurrent state cannot, it is undone to before
    /// the pass and the kept tokens are run again.
    pub(crate) fn take_back_to(&mut self, len_tokens: usize) -> Result<()> {
        assert!(self.unfed.is_none() && len_tokens <= self.tokens.len(), "a cut inside fed tokens");
        let kept = self.cache.truncate(len_tokens);
        if let Some(drafter) = &mut self.drafter {
            drafter.truncate(kept);
        }
        if kept < len_tokens {
            let gap = self.tokens[kept..len_tokens].to_vec();
            self.forward(&gap, Logits::Last)?;
        }
        self.tokens.truncate(len_tokens);
        self.pending_logits = None;
        self.persist_new();
        Ok(())
    }

    /// The policy that decides when this sequence drafts, to tell it
    /// what each step cost (the batcher's steps).
    pub(crate) fn policy_mut(&mut self) -> &mut Policy {
        &mut self.policy
    }

    /// Feeds several sessions of the same engine in one forward pass (the
    /// step of continuous batching): session `i` appends `tokens[i]` (after
    /// its unfed token, if any) and gets its logits after the last one.
    /// Every weight, and each MoE layer's expert union, is read once for all
    /// of them; each session's logits are bit-identical to feeding it alone.
    pub fn feed_batch(sessions: &mut [&mut Session<'e>], tokens: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let last = vec![Logits::Last; sessions.len()];
        Self::feed_batch_rows(sessions, tokens, &last)
    }

    /// [`Self::feed_batch`], with the logits of every new row for the
    /// sessions whose `which` is [`Logits::All`]: those verify drafts, which
    /// stay unsaved until [`Self::take_back_to`] keeps them.
    pub(crate) fn feed_batch_rows(
        sessions: &mut [&mut Session<'e>],
        tokens: &[&[u32]],
        which: &[Logits],
    ) -> Result<Vec<Vec<f32>>> {
        assert_eq!(sessions.len(), tokens.len(), "one token list per session");
        assert_eq!(sessions.len(), which.len(), "one choice of logits per session");
        let Some(first) = sessions.first() else { return Ok(Vec::new()) };
        let engine = first.engine;
        assert!(sessions.iter().all(|s| std::ptr::eq(s.engine, engine)), "sessions of one engine");
        let batches: Vec<Vec<u32>> =
            sessions.iter().zip(tokens).map(|(s, t)| s.unfed.iter().chain(*t).copied().collect()).collect();
        if batches.iter().any(Vec::is_empty) {
            return Err(Error::InvalidRequest("no tokens to feed".into()));
        }
        // All or nothing needs each cache back where it started on error:
        // the batched pass alone the cache can take back itself; with the
        // pieces run before it, a recurrent state needs a snapshot there
        // (see `Engine::forward`).
        // A long input runs all but its last piece alone first (bounded
        // activations; its logits there are not needed), so the batched
        // pass holds at most one piece per sequence.
        let chunk = engine.prefill_chunk_tokens();
        let starts: Vec<usize> = sessions.iter().map(|s| s.cache.len()).collect();
        let mut tails: Vec<&[u32]> = Vec::with_capacity(batches.len());
        let mut result = Ok(());
        for (session, batch) in sessions.iter_mut().zip(&batches) {
            // The pieces `feed` would make: all but the last go alone.
            let head = (batch.len() - 1) / chunk * chunk;
            if head > 0 && result.is_ok() {
                session.cache.snapshot();
                result = session.forward(&batch[..head], Logits::Last).map(drop);
            }
            tails.push(&batch[head..]);
        }
        let logits = result.and_then(|()| {
            let drafting = sessions.iter().any(|s| s.drafter.is_some());
            let mut seqs: Vec<SeqBatch<'_>> =
                sessions.iter_mut().zip(&tails).map(|(s, t)| SeqBatch { tokens: t, cache: &mut s.cache }).collect();
            let logits = if drafting {
                let rows = engine.run(|model, rt| model.forward_batch_rows(rt, &mut seqs, which))?;
                drop(seqs);
                rows.into_iter()
                    .zip(sessions.iter_mut())
                    .map(|(rows, session)| {
                        if let Some(drafter) = &mut session.drafter {
                            drafter.extend(&rows.hidden);
                        }
                        rows.logits
                    })
                    .collect()
            } else {
                assert!(which.iter().all(|&w| w == Logits::Last), "every row's logits only where sessions draft");
                engine.run(|model, rt| model.forward_batch(rt, &mut seqs))?
            };
            let vocab = engine.core().logits_width();
            for (session, row) in sessions.iter().zip(&logits) {
                let rows = row.len() / vocab.max(1);
                check_logits(row, vocab, session.cache.len() - rows)?;
            }
            Ok(logits)
        });
        let logits = match logits {
            Ok(logits) => logits,
            Err(e) => {
                // All or nothing: no session keeps rows of a failed step.
                for (session, &start) in sessions.iter_mut().zip(&starts) {
                    let kept = session.cache.truncate(start);
                    assert_eq!(kept, start, "a step is taken back to where it started");
                    if let Some(drafter) = &mut session.drafter {
                        drafter.truncate(start);
                    }
                }
                return Err(e);
            }
        };
        for (((session, new), logits), &which) in sessions.iter_mut().zip(tokens).zip(&logits).zip(which) {
            session.unfed = None;
            session.tokens.extend_from_slice(new);
            if which == Logits::Last {
                session.pending_logits = Some(logits.clone());
                session.persist_new();
            } else {
                session.pending_logits = None;
            }
        }
        Ok(logits)
    }

    /// Samples the token after the sequence from `logits`, and makes it part
    /// of the sequence (not yet run: the next feed runs it). This is the
    /// other half of a continuous-batching step.
    pub fn push_sampled(&mut self, sampler: &mut Sampler, logits: &[f32]) -> u32 {
        let token = sampler.sample(logits, self.tokens.len());
        self.push_unfed(token, true);
        token
    }

    /// Makes `token` the next of the sequence, not yet run (the next feed
    /// runs it). `persist`: save it now, as the last token of an answer;
    /// otherwise the feed that runs it saves it with its rows, in one
    /// record.
    pub(crate) fn push_unfed(&mut self, token: u32, persist: bool) {
        assert!(self.unfed.is_none(), "the previous token was fed");
        self.tokens.push(token);
        self.unfed = Some(token);
        // The logits of the last feed are not those after this token: a
        // later call must run it, not sample from them.
        self.pending_logits = None;
        if persist {
            self.persist_new();
        }
    }

    /// Feeds `prompt` (may be empty if the session already holds tokens),
    /// then generates up to `max_new_tokens`, calling `on_token` with each
    /// new id; `ControlFlow::Break` stops early.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerateReport> {
        self.generate_constrained(prompt, options, None, on_token)
    }

    /// [`Self::generate`], with `constraint` (if any) choosing which tokens
    /// may come next; a finished constraint ends generation ([`Finish::Stop`]).
    pub fn generate_constrained(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        mut constraint: Option<&mut (dyn Constraint + '_)>,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerateReport> {
        options.sampling.check()?;
        self.prepare_drafter(&options.sampling);
        let run_start = Counters::take(self.engine);
        let mut logits = match self.pending_logits.take() {
            Some(logits) if prompt.is_empty() => logits,
            _ if prompt.is_empty() && self.unfed.is_none() => {
                return Err(Error::InvalidRequest("empty prompt and nothing to continue from".into()));
            }
            _ => {
                let logits = self.feed(prompt)?;
                // A turn boundary: the end of a prompt (continuing an
                // answer is none, and would take a snapshot's place).
                if !prompt.is_empty() {
                    self.snapshot();
                }
                logits
            }
        };
        let mut report = GenerateReport { tokens: Vec::new(), finish: Finish::Length, stats: RunStats::default() };
        let prefill = run_start.step_since(self.engine, prompt.len());
        report.stats.prompt_tokens = prompt.len();
        report.stats.prefill_ms = prefill.ms;
        report.stats.per_token.push(prefill);
        let decode_started = Instant::now();
        let mut generation = Generation::new(options, &self.engine.core().eos_token_ids);
        let mut speculation = self.drafter.is_some().then(SpeculationStats::default);
        if options.max_new_tokens > 0 {
            let step = generation.step(self, &mut logits, constraint.as_deref_mut(), |token, _| on_token(token))?;
            report.tokens.push(step.token);
            let mut finish = step.finish;
            while finish.is_none() {
                let step_start = Counters::take(self.engine);
                let drafts = match self.drafts_next(constraint.is_some()) {
                    true => generation.draft(self)?,
                    false => Vec::new(),
                };
                if drafts.is_empty() {
                    logits = self.feed(&[])?;
                    let step =
                        generation.step(self, &mut logits, constraint.as_deref_mut(), |token, _| on_token(token))?;
                    report.tokens.push(step.token);
                    finish = step.finish;
                    let elapsed = step_start.at.elapsed();
                    self.policy.plain_step(elapsed);
                    speculation.iter_mut().for_each(|s| s.add_plain_step(elapsed));
                    report.stats.per_token.push(step_start.step_since(self.engine, 1));
                    continue;
                }
                let tokens: Vec<u32> = drafts.iter().map(|d| d.token).collect();
                let rows = self.verify(&tokens)?;
                let step = generation.step_drafted(self, &rows, &drafts, |token, _| on_token(token))?;
                let elapsed = step_start.at.elapsed();
                self.policy.verify_pass(step.tokens.len(), step.accepted, elapsed);
                if let Some(stats) = &mut speculation {
                    stats.add_verify_pass(drafts.len(), step.accepted, step.tokens.len(), elapsed);
                }
                report.tokens.extend(&step.tokens);
                finish = step.finish;
                report.stats.per_token.push(step_start.step_since(self.engine, drafts.len() + 1));
            }
            report.finish = finish.expect("the loop ends where generation does");
        }
        report.stats.speculation = speculation;
        report.stats.generated_tokens = report.tokens.len();
        report.stats.decode_ms = ms(decode_started.elapsed());
        run_start.fill_run(self.engine, &mut report.stats);
        self.warnings.extend(self.engine.persist_learning_or_warn());
        Ok(report)
    }
}
