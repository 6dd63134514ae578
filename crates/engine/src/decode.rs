//! One decode step, the one every generation loop stands on
//! ([`Session::generate`], `Chat::say` through it, and the [`crate::Batcher`]):
//! sample the next token of a sequence from its logits (through its
//! [`Constraint`], if any), append it, and say whether generation ends
//! there, and why ([`Finish`]).

use std::ops::ControlFlow;

use crate::closing::Closing;
use crate::sampler::Verdict;
use crate::speculate::Drafted;
use crate::{Constraint, GenerateOptions, Result, Sampler, Session};

/// Why generation ended: the one answer of every loop (the CLI's, chat's,
/// the batcher's); serve maps it to OpenAI's and Anthropic's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its answer: an end-of-sequence token, or the
    /// sequence's constraint is complete.
    Stop,
    /// The stop string at this index (of those asked for) matched. Stop
    /// strings are text, matched where the text is (chat, serve).
    StopString(usize),
    /// `max_new_tokens` were generated.
    Length,
    /// The caller broke off, or nobody listens any more.
    Cancelled,
}

/// What one [`Generation::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The token appended to the sequence (not yet run through the model).
    pub token: u32,
    /// `Some` when generation ends at this token.
    pub finish: Option<Finish>,
}

/// One sequence's generation: its sampler, its end-of-sequence
/// ids and how far it is from its length limit.
#[derive(Debug, Clone)]
pub struct Generation {
    sampler: Sampler,
    /// Ids that end generation (the model's and the caller's); empty when
    /// end-of-sequence tokens are to be generated through.
    eos_token_ids: Vec<u32>,
    max_new_tokens: usize,
    generated_tokens: usize,
    /// The constrained output's way out near the length limit.
    closing: Closing,
}

impl Generation {
    /// The generation of `options` for a model whose own end-of-sequence ids
    /// are `model_eos_token_ids`.
    pub fn new(options: &GenerateOptions, model_eos_token_ids: &[u32]) -> Self {
        let eos_token_ids = if options.ignore_eos {
            Vec::new()
        } else {
            model_eos_token_ids.iter().chain(&options.extra_eos_token_ids).copied().collect()
        };
        Self {
            sampler: Sampler::new(options.sampling),
            eos_token_ids,
            max_new_tokens: options.max_new_tokens,
            generated_tokens: 0,
            closing: Closing::default(),
        }
    }

    /// Tokens generated so far, the end-of-sequence one included.
    pub fn generated_tokens(&self) -> usize {
        self.generated_tokens
    }

    /// Samples the token after `session`'s sequence from `logits` (the row
    /// after its last token; masked by `constraint` first, which then
    /// accepts the token, and near the length limit held to room for its
    /// way out: `closing`), hands it to `emit` with whether it is an
    /// end-of-sequence token that ends generation (`ControlFlow::Break`
    /// there cancels), and appends it to the sequence, unfed: the next feed
    /// runs it. At the end of generation the session takes a snapshot
    /// before that last token (a turn boundary; saved before it, so that a
    /// session file cut back to here keeps the snapshot).
    ///
    /// The draw depends on the sampler's seed and the token's position
    /// only, so a sequence decodes the same alone, batched or resumed.
    pub fn step(
        &mut self,
        session: &mut Session<'_>,
        logits: &mut [f32],
        mut constraint: Option<&mut (dyn Constraint + '_)>,
        emit: impl FnOnce(u32, bool) -> ControlFlow<()>,
    ) -> Result<Step> {
        assert!(self.generated_tokens < self.max_new_tokens, "a step past the length limit");
        let position = session.tokens().len();
        let token = match constraint.as_deref_mut() {
            Some(constraint) => {
                let tokens_left = self.max_new_tokens - self.generated_tokens;
                let sampler = &mut self.sampler;
                self.closing.next_token(constraint, logits, tokens_left, |logits| sampler.sample(logits, position))?
            }
            None => self.sampler.sample(logits, position),
        };
        let constraint_finished = constraint.is_some_and(|c| c.is_finished());
        let finish = self.count(token, constraint_finished, emit);
        if finish.is_some() {
            session.snapshot();
        }
        session.push_unfed(token, finish.is_some());
        Ok(Step { token, finish })
    }

    /// Counts `token` as generated, hands it to `emit`, and says whether
    /// generation ends there.
    fn count(
        &mut self,
        token: u32,
        constraint_finished: bool,
        emit: impl FnOnce(u32, bool) -> ControlFlow<()>,
    ) -> Option<Finish> {
        self.generated_tokens += 1;
        let is_eos = self.eos_token_ids.contains(&token);
        if emit(token, is_eos).is_break() {
            Some(Finish::Cancelled)
        } else if is_eos || constraint_finished {
            Some(Finish::Stop)
        } else if self.generated_tokens == self.max_new_tokens {
            Some(Finish::Length)
        } else {
            None
        }
    }

    /// Drafts tokens after `session`'s unfed one for a verify pass: at
    /// most one fewer than the tokens left to generate (the pass gives
    /// one of its own), none where there is no room.
    pub(crate) fn draft(&mut self, session: &mut Session<'_>) -> Result<Vec<Drafted>> {
        let tokens_left = self.max_new_tokens - self.generated_tokens;
        session.draft(&mut self.sampler, tokens_left.saturating_sub(1))
    }

    /// The other half of a speculative step: `rows` (`[drafts + 1, vocab]`)
    /// are the stack's logits after the unfed token and each of `drafts`,
    /// which [`Session::verify`] ran. Each draft stands or is replaced by
    /// [`crate::Sampler::verify`]; after the last that stands comes a token
    /// of the stack's own (drawn from the next row), unless generation
    /// ended. Every token goes to `emit` as in [`Self::step`]; the last
    /// becomes the sequence's unfed token and those past it are taken back.
    pub(crate) fn step_drafted(
        &mut self,
        session: &mut Session<'_>,
        rows: &[f32],
        drafts: &[Drafted],
        mut emit: impl FnMut(u32, bool) -> ControlFlow<()>,
    ) -> Result<DraftedStep> {
        assert_eq!(rows.len() % (drafts.len() + 1), 0, "a row per draft and one after them");
        let vocab = rows.len() / (drafts.len() + 1);
        // The first draft's position: the verify pass appended the drafts.
        let first = session.tokens().len() - drafts.len();
        let mut step = DraftedStep { tokens: Vec::new(), accepted: 0, finish: None };
        for (i, row) in rows.chunks_exact(vocab).enumerate() {
            let position = first + i;
            let draft = drafts.get(i);
            let verdict = draft.map(|d| {
                let p = self.sampler.distribution(row);
                self.sampler.verify(&p, &d.q, d.token, position)
            });
            let token = match (draft, verdict) {
                (Some(d), Some(Verdict::Accepted)) => {
                    step.accepted += 1;
                    d.token
                }
                (_, Some(Verdict::Replaced(token))) => token,
                _ => self.sampler.sample(row, position),
            };
            step.tokens.push(token);
            step.finish = self.count(token, false, &mut emit);
            if step.finish.is_some() || verdict != Some(Verdict::Accepted) {
                break;
            }
        }
        let last = *step.tokens.last().expect("a verify pass gives a token");
        session.take_back_to(first + step.tokens.len() - 1)?;
        if step.finish.is_some() {
            session.snapshot();
        }
        session.push_unfed(last, step.finish.is_some());
        Ok(step)
    }
}

/// What one [`Generation::step_drafted`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DraftedStep {
    /// The tokens generated: the drafts that stood and, unless generation
    /// ended at one of them, the stack's own.
    pub tokens: Vec<u32>,
    /// Drafts that stood.
    pub accepted: usize,
    /// `Some` when generation ends at the last token.
    pub finish: Option<Finish>,
}
