//! The seam through which structured outputs steer decoding: a per-sequence
//! constraint on which tokens may come next (a JSON schema, a forced tool
//! call). The decode step asks it for the tokens allowed before sampling and
//! tells it the token chosen after; a sequence without one samples exactly
//! as before (same logits, same draws).

use crate::Result;

/// Which tokens may come next in one sequence.
pub trait Constraint: Send {
    /// Sets the logit of every token not allowed next to `-inf`. `logits` is
    /// the model's row (`[vocab]`); tokens past the constraint's own
    /// vocabulary are disallowed. Errs when nothing is allowed (the grammar
    /// cannot continue), never leaving a row without a finite logit.
    fn mask(&mut self, logits: &mut [f32]) -> Result<()>;

    /// Advances past `token`, which `mask` allowed.
    fn accept(&mut self, token: u32) -> Result<()>;

    /// Whether the constrained output is complete: generation ends here
    /// (finish reason stop), as at an end-of-sequence token.
    fn is_finished(&self) -> bool;

    /// The shortest tokens this constraint knows that complete its output
    /// once `next` (tokens not yet accepted, which it allows) are accepted:
    /// accepted in order after them, they leave it finished. `None` where
    /// it knows no way out, or none within its bounds. The decode step asks
    /// near the length limit only, and forces them once the tokens left come
    /// down to their count (`closing`), so that a constrained reply ends
    /// complete rather than cut; without one it is cut at the limit.
    fn closing(&mut self, next: &[u32]) -> Result<Option<Vec<u32>>> {
        let _ = next;
        Ok(None)
    }
}
