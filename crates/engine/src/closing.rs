//! Constrained replies that end complete before their length limit. A
//! grammar lets a model write an unbounded string (or any long value) until
//! `max_tokens`, and a call cut there does not parse. Over the last steps
//! before the limit the decode step keeps the way out: the shortest tokens
//! the sequence's constraint knows that complete its output from where it
//! stands ([`Constraint::closing`]). A sampled token is kept while its own
//! way out still fits in the tokens left after it; one that would leave no
//! room is replaced by the first token of the way out known before it; and
//! once the tokens left come down to the way out's length, it is forced
//! token by token. Sampling is unchanged until then (the draw depends on
//! the seed and the position only), and a constraint that knows no way out,
//! or only one longer than [`CLOSING_TOKENS_MAX`], is cut at the limit as
//! before.

use std::collections::VecDeque;

use crate::{Constraint, Result};

/// The longest way out kept, in tokens: the decode step asks for it over
/// this many last steps before the limit, and no longer one is forced.
pub const CLOSING_TOKENS_MAX: usize = 128;

/// One constrained sequence's way out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Closing {
    /// The way out from the constraint's current state, once known near the
    /// limit; it always fits in the tokens left.
    reserve: Option<VecDeque<u32>>,
}

impl Closing {
    /// The next token of a sequence held by `constraint`, `tokens_left`
    /// before its length limit (this one included), accepted by it:
    /// `sample`d from the masked `logits`, or the way out's next token.
    pub(crate) fn next_token(
        &mut self,
        constraint: &mut dyn Constraint,
        logits: &mut [f32],
        tokens_left: usize,
        sample: impl FnOnce(&[f32]) -> u32,
    ) -> Result<u32> {
        assert!(tokens_left > 0, "a step past the length limit");
        if tokens_left > CLOSING_TOKENS_MAX {
            constraint.mask(logits)?;
            let token = sample(logits);
            constraint.accept(token)?;
            return Ok(token);
        }
        if self.reserve.is_none() {
            self.reserve = fitting(constraint.closing(&[])?, tokens_left);
        }
        let forced = self.reserve.as_mut().filter(|reserve| reserve.len() == tokens_left).and_then(VecDeque::pop_front);
        let token = match forced {
            Some(token) => token,
            None => {
                constraint.mask(logits)?;
                let sampled = sample(logits);
                match fitting(constraint.closing(&[sampled])?, tokens_left - 1) {
                    Some(after) => {
                        self.reserve = Some(after);
                        sampled
                    }
                    // No room for the sampled token's way out: the way out
                    // known before it goes on instead, its rest the reserve.
                    None => match self.reserve.as_mut().and_then(VecDeque::pop_front) {
                        Some(token) => token,
                        None => sampled,
                    },
                }
            }
        };
        constraint.accept(token)?;
        Ok(token)
    }
}

/// `closing` as the reserve, when it fits in `tokens` (and the bound).
fn fitting(closing: Option<Vec<u32>>, tokens: usize) -> Option<VecDeque<u32>> {
    closing.filter(|c| c.len() <= tokens.min(CLOSING_TOKENS_MAX)).map(VecDeque::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: u32 = 1;
    const CLOSE: u32 = 2;
    const FILLER: u32 = 3;

    /// Brackets: output is complete when every `OPEN` is closed, after at
    /// least one; the way out is a `CLOSE` per open bracket (when it knows
    /// one at all).
    struct Brackets {
        depth: usize,
        opened: bool,
        knows_way_out: bool,
    }

    impl Brackets {
        fn new(knows_way_out: bool) -> Brackets {
            Brackets { depth: 0, opened: false, knows_way_out }
        }

        fn depth_after(&self, tokens: &[u32]) -> (usize, bool) {
            tokens.iter().fold((self.depth, self.opened), |(depth, opened), &t| match t {
                OPEN => (depth + 1, true),
                CLOSE => (depth - 1, opened),
                _ => (depth, opened),
            })
        }
    }

    impl Constraint for Brackets {
        fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
            if self.depth == 0 {
                logits[CLOSE as usize] = f32::NEG_INFINITY;
            }
            Ok(())
        }

        fn accept(&mut self, token: u32) -> Result<()> {
            (self.depth, self.opened) = self.depth_after(&[token]);
            Ok(())
        }

        fn is_finished(&self) -> bool {
            self.opened && self.depth == 0
        }

        fn closing(&mut self, next: &[u32]) -> Result<Option<Vec<u32>>> {
            let (depth, opened) = self.depth_after(next);
            let closing = if opened { vec![CLOSE; depth] } else { vec![OPEN, CLOSE] };
            Ok(self.knows_way_out.then_some(closing))
        }
    }

    /// Runs `constraint` over a model that always prefers `preferred`
    /// (greedy), up to `max_tokens` or until it is finished.
    fn run(constraint: &mut Brackets, preferred: &[u32], max_tokens: usize) -> Vec<u32> {
        let mut closing = Closing::default();
        let mut out = Vec::new();
        while out.len() < max_tokens && !constraint.is_finished() {
            let mut logits = vec![0.0f32; 4];
            logits[preferred[out.len() % preferred.len()] as usize] = 5.0;
            let argmax = |logits: &[f32]| (0..4).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            out.push(closing.next_token(constraint, &mut logits, max_tokens - out.len(), argmax).unwrap());
        }
        out
    }

    #[test]
    fn a_constrained_reply_that_would_run_on_closes_at_its_length_limit() {
        let free = run(&mut Brackets::new(false), &[OPEN, FILLER], 10);
        assert_eq!(free, [OPEN, FILLER, OPEN, FILLER, OPEN, FILLER, OPEN, FILLER, OPEN, FILLER]);
        let mut brackets = Brackets::new(true);
        let out = run(&mut brackets, &[OPEN, FILLER], 10);
        // As sampled until a fourth bracket would leave no room to close
        // them all; then the way out, with a sampled token where it fits.
        assert_eq!(out, [OPEN, FILLER, OPEN, FILLER, OPEN, FILLER, CLOSE, FILLER, CLOSE, CLOSE]);
        assert!(brackets.is_finished());
        for max_tokens in 2..=12 {
            let mut brackets = Brackets::new(true);
            let out = run(&mut brackets, &[OPEN, FILLER], max_tokens);
            assert!(brackets.is_finished(), "{max_tokens}: {out:?}");
        }
        // One token cannot hold the shortest output.
        let mut brackets = Brackets::new(true);
        assert_eq!(run(&mut brackets, &[OPEN], 1), [OPEN]);
        assert!(!brackets.is_finished());
    }

    #[test]
    fn a_constraint_without_a_way_out_is_cut_at_the_limit() {
        let mut brackets = Brackets::new(false);
        assert_eq!(run(&mut brackets, &[OPEN, FILLER], 6), [OPEN, FILLER, OPEN, FILLER, OPEN, FILLER]);
        assert!(!brackets.is_finished());
    }

    #[test]
    fn far_from_the_limit_sampling_is_unchanged() {
        let max_tokens = CLOSING_TOKENS_MAX * 2;
        let mut brackets = Brackets::new(true);
        let out = run(&mut brackets, &[OPEN], max_tokens);
        assert!(out[..max_tokens / 2].iter().all(|&t| t == OPEN), "{out:?}");
        assert!(brackets.is_finished(), "{out:?}");
        assert_eq!(out.len(), max_tokens);
    }
}
