//! Speculative decoding with the model's own MTP layer, as a mode of the
//! one decode loop ([`crate::Session::generate`] and the
//! [`crate::Batcher`]): draft `draft_tokens` tokens ahead, verify them and
//! the token before them in one pass of the stack (each MoE layer's expert
//! union read once for all), keep the drafts by the rule of speculative
//! sampling ([`crate::Sampler::verify`]) and take the rest back. Greedy
//! decoding gives exactly plain decoding's tokens (a draft stands where it
//! is the stack's argmax, and a pass over several tokens gives each the
//! logits it gets alone); sampled decoding draws from the stack's
//! distribution, though not the same tokens for a seed as plain decoding.
//!
//! Rejected tokens are taken back through the cache's own rule
//! (`SequenceState::truncate`): latent and key/value rows are cut back in
//! place; a recurrent state is undone to before the verify pass (its undo of
//! the last pass) and the kept tokens are run again. Recomputing the kept
//! tokens costs a pass only where a model has recurrent layers, and needs no
//! snapshot per drafted token.
//!
//! The MTP layer's own cache (the draft cache) goes back after every draft
//! to its committed rows, those of the stack's tokens. Where its layer
//! keeps a fixed state (Inkling's short convolutions and a sliding
//! window's ring), the drafter snapshots it there before drafting past
//! them and restores the snapshot after: a copy of one layer's state per
//! verify pass, where recomputation would run the MTP layer again over
//! the convolutions' and the window's rows.
//!
//! `--speculate auto` ([`Policy`]) measures what a plain step and a verify
//! pass cost per token as the run goes, and drafts only while drafting
//! gives tokens faster; it drafts for greedy decoding only, since sampled
//! tokens would then depend on the clock. `on` drafts sampled decoding too:
//! a seed gives the same tokens alone or batched, but not plain decoding's.

use std::time::Duration;

use serde::Serialize;
use strata_kv::SequenceState;
use strata_models::{CausalLm, Logits, Runtime};

use crate::{Error, Result, Sampler};

/// When the decode loop drafts (`--speculate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculateMode {
    Off,
    /// Every step drafts (where the model has an MTP layer).
    On,
    /// Drafts while it measures faster than plain steps ([`Policy`]).
    Auto,
}

impl SpeculateMode {
    pub const ALL: [SpeculateMode; 3] = [SpeculateMode::Off, SpeculateMode::On, SpeculateMode::Auto];

    pub fn name(self) -> &'static str {
        match self {
            SpeculateMode::Off => "off",
            SpeculateMode::On => "on",
            SpeculateMode::Auto => "auto",
        }
    }
}

impl std::fmt::Display for SpeculateMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SpeculateMode {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let wanted = text.trim().to_ascii_lowercase();
        SpeculateMode::ALL
            .into_iter()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| format!("unknown speculation mode {text:?} (expected off, on or auto)"))
    }
}

/// How a model's sessions draft: resolved at open (`None` there where the
/// mode is off or the model has no MTP layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    pub mode: SpeculateMode,
    /// Tokens drafted ahead per verify pass (at least 1; past the model's
    /// MTP layers, the last one drafts from its own output).
    pub draft_tokens: usize,
}

/// Counts of speculative decoding over a run (`generate --json`'s
/// `speculation`, serve's /metrics, chat's /stats).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpeculationStats {
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens that stood.
    pub accepted: usize,
    /// `accepted_at[i]`: verify passes whose draft i (from 0) stood.
    pub accepted_at: Vec<usize>,
    /// Passes of the stack that verified drafts.
    pub verify_passes: usize,
    /// Tokens the verify passes gave: each pass's own and its accepted drafts.
    pub verified_tokens: usize,
    /// Time drafting and verifying, in milliseconds.
    pub speculative_ms: f64,
    /// Steps decoded without drafts, and their time in milliseconds.
    pub plain_steps: usize,
    pub plain_ms: f64,
}

impl SpeculationStats {
    /// Tokens each verify pass gave: its own and the drafts it accepted.
    pub fn tokens_per_verify_pass(&self) -> f64 {
        self.verified_tokens as f64 / self.verify_passes.max(1) as f64
    }

    /// Drafted tokens that stood, as a share of those drafted.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Milliseconds per token of the speculative passes (drafting included).
    pub fn ms_per_speculative_token(&self) -> f64 {
        self.speculative_ms / self.verified_tokens.max(1) as f64
    }

    /// Milliseconds per token of plain steps.
    pub fn ms_per_plain_token(&self) -> f64 {
        self.plain_ms / self.plain_steps.max(1) as f64
    }

    /// Adds a verify pass that drafted `drafted` tokens, the first
    /// `accepted` of which stood, and gave `tokens` tokens in `elapsed`.
    pub(crate) fn add_verify_pass(&mut self, drafted: usize, accepted: usize, tokens: usize, elapsed: Duration) {
        assert!(accepted <= drafted && tokens <= accepted + 1, "a pass gives its accepted drafts and one token");
        if self.accepted_at.len() < drafted {
            self.accepted_at.resize(drafted, 0);
        }
        self.accepted_at[..accepted].iter_mut().for_each(|n| *n += 1);
        self.drafted += drafted;
        self.accepted += accepted;
        self.verify_passes += 1;
        self.verified_tokens += tokens;
        self.speculative_ms += elapsed.as_secs_f64() * 1e3;
    }

    pub(crate) fn add_plain_step(&mut self, elapsed: Duration) {
        self.plain_steps += 1;
        self.plain_ms += elapsed.as_secs_f64() * 1e3;
    }

    /// Adds another run's counts (serve's totals).
    pub fn add(&mut self, other: &SpeculationStats) {
        if self.accepted_at.len() < other.accepted_at.len() {
            self.accepted_at.resize(other.accepted_at.len(), 0);
        }
        for (total, n) in self.accepted_at.iter_mut().zip(&other.accepted_at) {
            *total += n;
        }
        self.drafted += other.drafted;
        self.accepted += other.accepted;
        self.verify_passes += other.verify_passes;
        self.verified_tokens += other.verified_tokens;
        self.speculative_ms += other.speculative_ms;
        self.plain_steps += other.plain_steps;
        self.plain_ms += other.plain_ms;
    }
}

/// When `auto` drafts. Plain steps are measured first; then drafting is
/// tried and kept while its time per token is below a plain step's and its
/// drafts stand. Every pass is timed, a probe's first too: `auto`'s drafter
/// catches up on no more rows than a pass of drafting leaves
/// ([`Drafter`]), so a first pass costs what any pass does. A probe stops
/// at the first pass that is slower than a plain step, and after
/// [`PROBE_PASSES`] if no draft stood. Turned off, drafting is tried again
/// after [`PROBE_INTERVAL_STEPS`] plain steps, twice as many after each
/// probe that did not pay (up to [`PROBE_INTERVAL_STEPS_MAX`]), and never
/// sooner than [`PROBE_WAIT_PER_STEP_LOST`] plain steps for each plain
/// step's time the drafting lost: on a disk-bound host a pass reads the
/// union of its tokens' experts and the MTP layer's, several plain steps'
/// time, so there a probe comes as rarely as keeps its cost under 2% of the
/// steps. A drafter whose drafts never stand costs `PROBE_PASSES` passes
/// per interval.
#[derive(Debug, Clone)]
pub struct Policy {
    mode: SpeculateMode,
    /// Plain steps measured since the last verify pass, and their mean time.
    plain_steps: usize,
    plain_ms_per_token: Option<f64>,
    /// Verify passes since drafting (re)started, and the recent time per
    /// token and accepted drafts of those passes (moving averages).
    passes: usize,
    speculative_ms_per_token: f64,
    accepted_per_pass: f64,
    drafting: bool,
    /// Time the verify passes since drafting (re)started took over the
    /// plain steps that would have given their tokens, in milliseconds.
    drafting_lost_ms: f64,
    /// Probes since drafting last paid (0: it paid, or was never tried).
    probes_failed: u32,
    /// Plain steps before drafting is tried again.
    wait_steps: usize,
}

/// Plain steps measured before drafting is first tried.
pub const PLAIN_STEPS_FIRST: usize = 4;
/// Verify passes a probe runs before it decides.
pub const PROBE_PASSES: usize = 4;
/// Plain steps between probes, at first and at most. A probe that does not
/// pay costs a few plain steps' time (a pass over k + 1 tokens costs the
/// demo MTP pair about three plain steps: bench `speculation`), so the
/// first interval keeps that under a few percent of the steps.
pub const PROBE_INTERVAL_STEPS: usize = 128;
pub const PROBE_INTERVAL_STEPS_MAX: usize = 1024;
/// Plain steps a probe that did not pay waits for each plain step's time
/// it lost (so its cost stays under 1/50 of the steps between probes), up
/// to [`PROBE_WAIT_STEPS_MAX`].
pub const PROBE_WAIT_PER_STEP_LOST: f64 = 50.0;
pub const PROBE_WAIT_STEPS_MAX: usize = 16_384;
/// Weight of the newest measurement in the moving averages.
const RECENT_WEIGHT: f64 = 0.25;

impl Policy {
    pub fn new(mode: SpeculateMode) -> Self {
        Self {
            mode,
            plain_steps: 0,
            plain_ms_per_token: None,
            passes: 0,
            speculative_ms_per_token: 0.0,
            accepted_per_pass: 0.0,
            drafting: mode == SpeculateMode::On,
            drafting_lost_ms: 0.0,
            probes_failed: 0,
            wait_steps: PLAIN_STEPS_FIRST,
        }
    }

    /// Whether the next step drafts.
    pub fn drafts(&self) -> bool {
        match self.mode {
            SpeculateMode::Off => false,
            SpeculateMode::On => true,
            SpeculateMode::Auto => self.drafting,
        }
    }

    /// A plain step took `elapsed`.
    pub fn plain_step(&mut self, elapsed: Duration) {
        let ms = elapsed.as_secs_f64() * 1e3;
        self.plain_steps += 1;
        self.plain_ms_per_token = Some(match self.plain_ms_per_token {
            None => ms,
            Some(mean) => mean + (ms - mean) * RECENT_WEIGHT,
        });
        if self.mode == SpeculateMode::Auto && self.plain_steps >= self.wait_steps {
            self.drafting = true;
            self.passes = 0;
            self.drafting_lost_ms = 0.0;
        }
    }

    /// A verify pass, drafting included, gave `tokens` tokens with
    /// `accepted` drafts standing, in `elapsed`.
    pub fn verify_pass(&mut self, tokens: usize, accepted: usize, elapsed: Duration) {
        let elapsed_ms = elapsed.as_secs_f64() * 1e3;
        let ms_per_token = elapsed_ms / tokens.max(1) as f64;
        if let Some(plain) = self.plain_ms_per_token {
            self.drafting_lost_ms += elapsed_ms - tokens as f64 * plain;
        }
        self.passes += 1;
        if self.passes == 1 {
            self.speculative_ms_per_token = ms_per_token;
            self.accepted_per_pass = accepted as f64;
        } else {
            self.speculative_ms_per_token += (ms_per_token - self.speculative_ms_per_token) * RECENT_WEIGHT;
            self.accepted_per_pass += (accepted as f64 - self.accepted_per_pass) * RECENT_WEIGHT;
        }
        if self.mode != SpeculateMode::Auto {
            return;
        }
        let slower = self.plain_ms_per_token.is_some_and(|plain| self.speculative_ms_per_token >= plain);
        // A pass that accepts nothing ran a plain step and drafting: never
        // faster, whatever the clock says through other work's noise.
        let never_stands = self.passes >= PROBE_PASSES && self.accepted_per_pass == 0.0;
        if slower || never_stands {
            self.drafting = false;
            self.plain_steps = 0;
            self.probes_failed = self.probes_failed.saturating_add(1);
            // Shifted at most 10 places: past the cap already, never overflowing.
            let doubling = (PROBE_INTERVAL_STEPS << (self.probes_failed - 1).min(10)).min(PROBE_INTERVAL_STEPS_MAX);
            let steps_lost = self.plain_ms_per_token.map_or(0.0, |plain| self.drafting_lost_ms / plain);
            // NaN (no time measured at all) and losses below zero wait nothing more.
            let by_cost = (steps_lost.max(0.0) * PROBE_WAIT_PER_STEP_LOST).min(PROBE_WAIT_STEPS_MAX as f64);
            self.wait_steps = doubling.max(by_cost as usize);
        } else if self.passes >= PROBE_PASSES {
            self.probes_failed = 0;
        }
    }
}

/// A drafted token and the distribution it was drawn from (the sampler's
/// [`Sampler::distribution`] of the MTP layer's logits).
#[derive(Debug, Clone)]
pub struct Drafted {
    pub token: u32,
    pub q: Vec<f64>,
}

/// One sequence's MTP layer: its cache (row r took the stack's row
/// `first_row + r`, and is position `first_row + r + 1`) and the stack's
/// hidden rows it has not taken yet (rows `first_row + cache.len()..` the
/// stack's length).
///
/// `auto`'s drafter, which may not draft for a thousand steps, catches up
/// on at most `draft_tokens + 1` rows, the most a pass of drafting leaves
/// (its accepted drafts and its own token): a longer tail restarts the
/// cache at its most recent rows, and the MTP layer then attends over
/// those and the ones after them, not over the whole sequence. That
/// changes drafts, never the tokens (verify passes decide); it makes a
/// probe's first pass cost what any pass of drafting costs, so that
/// [`Policy`] can time it, where catching up on every row since the last
/// probe cost the demo pair about a plain step a row; and it bounds the
/// tail held between probes. `on` keeps every row.
pub(crate) struct Drafter {
    cache: SequenceState,
    first_row: usize,
    hidden_tail: Vec<f32>,
    hidden_size: usize,
    catch_up_rows_max: Option<usize>,
}

impl Drafter {
    pub(crate) fn new(model: &dyn CausalLm, capacity_tokens: usize, speculation: Speculation) -> Self {
        let catch_up_rows_max = speculation.draft_tokens.checked_add(1).expect("a draft of a few tokens");
        Self {
            cache: model.new_draft_cache(capacity_tokens),
            first_row: 0,
            hidden_tail: Vec::new(),
            hidden_size: model.core().hidden_size,
            catch_up_rows_max: (speculation.mode == SpeculateMode::Auto).then_some(catch_up_rows_max),
        }
    }

    /// The stack ran rows whose hidden states are `hidden`.
    pub(crate) fn extend(&mut self, hidden: &[f32]) {
        let h = self.hidden_size;
        assert_eq!(hidden.len() % h, 0, "whole hidden rows");
        self.hidden_tail.extend_from_slice(hidden);
        let tail_rows = self.hidden_tail.len() / h;
        if let Some(max) = self.catch_up_rows_max.filter(|&max| tail_rows > max) {
            let dropped = tail_rows - max;
            self.first_row += self.cache.len() + dropped;
            let kept = self.cache.truncate(0);
            assert_eq!(kept, 0, "an empty cache is always reached");
            self.hidden_tail.drain(..dropped * h);
        }
    }

    /// The stack was cut back to `stack_tokens`. Below the rows the MTP
    /// layer took, the hidden state of the position before the cut is gone
    /// with the stack's: its row is redrafted from zeros, which changes
    /// drafts only, never the tokens (and a cut before the cache's first
    /// row restarts it there).
    pub(crate) fn truncate(&mut self, stack_tokens: usize) {
        let taken = self.first_row + self.cache.len();
        if stack_tokens >= taken {
            self.hidden_tail.truncate((stack_tokens - taken) * self.hidden_size);
            return;
        }
        let last_row = stack_tokens.saturating_sub(1);
        if last_row < self.first_row {
            self.first_row = last_row;
        }
        let kept = self.cache.truncate(last_row - self.first_row);
        self.hidden_tail = vec![0.0; (stack_tokens - self.first_row - kept) * self.hidden_size];
    }

    /// Drafts `k` tokens after `tokens` (the stack's and one unfed after
    /// them), each drawn by `sampler` at its position: the MTP layer first
    /// takes the stack's rows it lacks (ending with the unfed token's),
    /// then drafts from its own output; its rows past the stack's are
    /// taken back after.
    pub(crate) fn draft(
        &mut self,
        model: &dyn CausalLm,
        rt: &Runtime<'_>,
        tokens: &[u32],
        k: usize,
        sampler: &mut Sampler,
    ) -> Result<Vec<Drafted>> {
        if k == 0 {
            return Err(Error::InvalidRequest("a draft of no tokens".into()));
        }
        let known = self.first_row + self.cache.len();
        let h = self.hidden_size;
        assert_eq!(known + self.hidden_tail.len() / h + 1, tokens.len(), "the MTP layer's rows and the stack's");
        let vocab = model.core().logits_width();
        let next = &tokens[known + 1..];
        let mut draft = model.draft(rt, &self.hidden_tail, next, &mut self.cache, self.first_row, Logits::Last)?;
        self.hidden_tail.clear();
        let committed = self.cache.len();
        // Rows are cut back in place, a fixed state is not (module doc):
        // kept as of the committed rows, to restore after drafting past
        // them (a single draft adds no row to take back).
        if k > 1 {
            self.cache.snapshot();
        }
        let mut drafts: Vec<Drafted> = Vec::with_capacity(k);
        loop {
            assert_eq!(draft.logits.len(), vocab, "the last row's logits");
            let q = sampler.distribution(&draft.logits);
            let token = sampler.draft(&q, tokens.len() + drafts.len());
            drafts.push(Drafted { token, q });
            if drafts.len() == k {
                break;
            }
            let last = draft.hidden[draft.hidden.len() - h..].to_vec();
            draft = model.draft(rt, &last, &[token], &mut self.cache, self.first_row, Logits::Last)?;
        }
        let kept = self.cache.truncate(committed);
        assert_eq!(kept, committed, "the MTP layer's rows cut back, its state restored");
        Ok(drafts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Drives `policy` over `tokens` tokens with passes that accept
    /// `accepted` of `k` drafts, a plain step costing 1 ms and a verify pass
    /// `verify_ms`; returns the verify passes run.
    fn run(policy: &mut Policy, tokens: usize, k: usize, accepted: usize, verify_ms: u64) -> usize {
        let (mut made, mut passes) = (0, 0);
        while made < tokens {
            if policy.drafts() {
                policy.verify_pass(accepted + 1, accepted.min(k), MS * verify_ms as u32);
                made += accepted + 1;
                passes += 1;
            } else {
                policy.plain_step(MS);
                made += 1;
            }
        }
        passes
    }

    #[test]
    fn auto_stops_drafting_with_a_drafter_that_never_pays() {
        // Verify passes measured cheaper than a plain step (the clock's
        // noise under other work): acceptance alone must decide.
        let mut policy = Policy::new(SpeculateMode::Auto);
        let tokens = 4096;
        let passes = run(&mut policy, tokens, 3, 0, 0);
        assert!(!policy.drafts(), "auto ends up off");
        // Probes of PROBE_PASSES passes after 4, 128, 256, 512, then every
        // 1024 plain steps: 7 probes in 4096 tokens, under 1% of the steps.
        assert!(passes <= 7 * PROBE_PASSES, "{passes} verify passes");
        assert!(passes * 100 <= tokens, "{passes} verify passes of {tokens} steps");
    }

    #[test]
    fn a_slower_probe_stops_at_its_first_pass_and_a_paying_one_goes_on() {
        let mut paying = Policy::new(SpeculateMode::Auto);
        (0..PLAIN_STEPS_FIRST).for_each(|_| paying.plain_step(MS));
        assert!(paying.drafts());
        (0..PROBE_PASSES * 2).for_each(|_| paying.verify_pass(3, 2, MS * 2));
        assert!(paying.drafts(), "three tokens in 2 ms against 1 ms a token");
        let mut slower = Policy::new(SpeculateMode::Auto);
        (0..PLAIN_STEPS_FIRST).for_each(|_| slower.plain_step(MS));
        slower.verify_pass(2, 1, MS * 3);
        assert!(!slower.drafts(), "1.5 ms a token against 1 ms stops the probe at its first pass");
    }

    /// A probe whose pass lost 20 plain steps' time (a disk-bound host's
    /// reads) waits 50 steps for each before the next: its cost stays a
    /// fiftieth of the steps, where the doubling schedule alone would
    /// have spent a sixth of them on the second probe.
    #[test]
    fn a_costly_probe_waits_until_its_cost_is_a_small_share_of_the_steps_between() {
        let mut policy = Policy::new(SpeculateMode::Auto);
        (0..PLAIN_STEPS_FIRST).for_each(|_| policy.plain_step(MS * 2));
        policy.verify_pass(2, 1, MS * 44);
        assert!(!policy.drafts());
        let waited = (0..).take_while(|_| {
            policy.plain_step(MS * 2);
            !policy.drafts()
        });
        let waited = waited.count() + 1;
        assert!((999..=1001).contains(&waited), "{waited} plain steps before the next probe");
        // A probe that lost nothing keeps the schedule.
        let mut cheap = Policy::new(SpeculateMode::Auto);
        (0..PLAIN_STEPS_FIRST).for_each(|_| cheap.plain_step(MS * 2));
        cheap.verify_pass(2, 0, MS * 4);
        let waited = (0..).take_while(|_| {
            cheap.plain_step(MS * 2);
            !cheap.drafts()
        });
        assert_eq!(waited.count() + 1, PROBE_INTERVAL_STEPS);
    }

    #[test]
    fn auto_keeps_drafting_where_it_pays_and_stops_where_passes_cost_more() {
        let mut paying = Policy::new(SpeculateMode::Auto);
        let passes = run(&mut paying, 1000, 3, 2, 2);
        assert!(paying.drafts());
        assert!(passes * 3 >= 1000 - 3 * PLAIN_STEPS_FIRST, "{passes} passes");
        // Two tokens a pass at 3 ms each: 1.5 ms a token, slower than plain.
        let mut slow = Policy::new(SpeculateMode::Auto);
        run(&mut slow, 1000, 3, 1, 3);
        assert!(!slow.drafts());
    }

    #[test]
    fn on_and_off_never_change_their_mind() {
        let mut on = Policy::new(SpeculateMode::On);
        assert_eq!(run(&mut on, 100, 2, 0, 5), 100);
        let mut off = Policy::new(SpeculateMode::Off);
        assert_eq!(run(&mut off, 100, 2, 2, 1), 0);
    }
}
