//! Greedy speculative decoding with the model's own MTP layer: draft
//! `draft_tokens` tokens ahead, verify them and the token before them in one
//! pass of the stack (each MoE layer's expert union read once for all), keep
//! the drafts up to the first the stack would not have chosen, and take the
//! rest back. The tokens are exactly plain greedy decoding's: every token
//! kept is the stack's own argmax, and a pass over several tokens gives each
//! the logits it gets alone (`Engine::forward`'s invariant).
//!
//! Rejected tokens are taken back through the cache's own rule
//! (`SequenceState::truncate`): latent and key/value rows are cut back in
//! place; a recurrent state is undone to before the verify pass (its undo of
//! the last pass) and the kept tokens are run again. Recomputing the kept
//! tokens costs a pass only where a model has recurrent layers, and needs no
//! snapshot per drafted token.

use strata_kv::SequenceState;
use strata_models::{CausalLm, Runtime};

use crate::sampler::argmax;
use crate::{Engine, Error, Result};

/// What [`Engine::generate_speculative`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeOptions {
    pub max_new_tokens: usize,
    /// Tokens the MTP layer drafts ahead per verify pass (at least 1; past
    /// the model's MTP layers, the last one drafts from its own output).
    pub draft_tokens: usize,
    /// Generate through end-of-sequence tokens.
    pub ignore_eos: bool,
}

/// Counts of one speculative run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the stack agreed with.
    pub accepted: usize,
    /// `accepted_at[i]`: verify passes whose draft i (from 0) was accepted.
    pub accepted_at: Vec<usize>,
    /// Passes of the stack that verified drafts.
    pub verify_passes: usize,
}

impl SpeculationStats {
    /// Tokens each verify pass gave: its own and the drafts it accepted.
    pub fn tokens_per_verify_pass(&self) -> f64 {
        (self.verify_passes + self.accepted) as f64 / self.verify_passes.max(1) as f64
    }
}

/// The generated tokens and the counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeReport {
    pub tokens: Vec<u32>,
    pub stats: SpeculationStats,
}

/// The sequence as the loop holds it: the stack's cache, the MTP layer's
/// (row r is position r + 1), and the stack's hidden rows the draft cache
/// has not taken yet (positions `draft_cache.len()..cache.len()`).
struct Sequence {
    tokens: Vec<u32>,
    cache: SequenceState,
    draft_cache: SequenceState,
    hidden_tail: Vec<f32>,
}

impl Engine {
    /// Greedy decoding of `prompt` drafted by the model's MTP layer: the
    /// tokens of plain greedy decoding, in fewer passes of the stack where
    /// drafts are accepted.
    pub fn generate_speculative(&self, prompt: &[u32], options: &SpeculativeOptions) -> Result<SpeculativeReport> {
        if prompt.is_empty() || options.draft_tokens == 0 {
            return Err(Error::InvalidRequest("speculation needs a prompt and at least 1 draft token".into()));
        }
        let capacity = prompt.len().saturating_add(options.max_new_tokens).saturating_add(options.draft_tokens);
        let eos: &[u32] = if options.ignore_eos { &[] } else { &self.core().eos_token_ids };
        self.run(|model, rt| {
            if model.mtp_layers() == 0 {
                return Err(Error::InvalidRequest("the model has no MTP layer to draft with".into()));
            }
            let mut seq = Sequence {
                tokens: prompt.to_vec(),
                cache: model.new_cache(capacity),
                draft_cache: model.new_draft_cache(capacity),
                hidden_tail: Vec::new(),
            };
            let (logits, hidden) = model.forward_hidden(rt, prompt, &mut seq.cache)?;
            seq.hidden_tail = hidden;
            let vocab = self.core().vocab_size;
            let mut next_logits = logits[logits.len() - vocab..].to_vec();
            let mut report = SpeculativeReport { tokens: Vec::new(), stats: SpeculationStats::default() };
            report.stats.accepted_at = vec![0; options.draft_tokens];
            loop {
                let token = argmax(&next_logits);
                report.tokens.push(token);
                seq.tokens.push(token);
                if eos.contains(&token) || report.tokens.len() >= options.max_new_tokens {
                    return Ok(report);
                }
                let drafts = seq.draft(model, rt, options.draft_tokens, vocab)?;
                let verified: Vec<u32> = std::iter::once(token).chain(drafts.iter().copied()).collect();
                let (logits, hidden) = model.forward_hidden(rt, &verified, &mut seq.cache)?;
                report.stats.verify_passes += 1;
                report.stats.drafted += drafts.len();
                // Row i holds the stack's choice after draft i - 1: draft i
                // stands while it is that choice.
                let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
                let mut accepted = 0;
                while let Some(&draft) = drafts.get(accepted).filter(|&&d| argmax(rows[accepted]) == d) {
                    report.stats.accepted_at[accepted] += 1;
                    report.stats.accepted += 1;
                    accepted += 1;
                    report.tokens.push(draft);
                    seq.tokens.push(draft);
                    if eos.contains(&draft) || report.tokens.len() >= options.max_new_tokens {
                        return Ok(report);
                    }
                }
                next_logits = rows[accepted].to_vec();
                let h = self.core().hidden_size;
                seq.hidden_tail = hidden[..(accepted + 1) * h].to_vec();
                seq.take_back(model, rt, drafts.len() - accepted)?;
            }
        })
    }
}

impl Sequence {
    /// Drafts `k` tokens after the last one: the MTP layer first takes the
    /// stack's rows it lacks (ending with the last token's), then drafts from
    /// its own output; its rows past the stack's are taken back after.
    fn draft(&mut self, model: &dyn CausalLm, rt: &Runtime<'_>, k: usize, vocab: usize) -> Result<Vec<u32>> {
        let known = self.draft_cache.len();
        let next = &self.tokens[known + 1..];
        let mut draft = model.draft(rt, &self.hidden_tail, next, &mut self.draft_cache)?;
        self.hidden_tail.clear();
        let committed = self.draft_cache.len();
        let mut drafts = Vec::with_capacity(k);
        loop {
            let row = draft.logits.len() / vocab - 1;
            drafts.push(argmax(&draft.logits[row * vocab..]));
            if drafts.len() == k {
                break;
            }
            let h = draft.hidden.len() / (row + 1);
            let last = draft.hidden[row * h..].to_vec();
            draft = model.draft(rt, &last, &drafts[drafts.len() - 1..], &mut self.draft_cache)?;
        }
        let kept = self.draft_cache.truncate(committed);
        assert_eq!(kept, committed, "the MTP layer's rows cut back in place");
        Ok(drafts)
    }

    /// Takes the last `rejected` positions of the stack's cache back, running
    /// again what its rule could not keep (a recurrent state's undo goes back
    /// to before the whole verify pass).
    fn take_back(&mut self, model: &dyn CausalLm, rt: &Runtime<'_>, rejected: usize) -> Result<()> {
        let wanted = self.cache.len() - rejected;
        let kept = self.cache.truncate(wanted);
        if kept < wanted {
            // The tokens the cache holds are `self.tokens[..cache.len()]`.
            model.forward_hidden(rt, &self.tokens[kept..wanted], &mut self.cache)?;
        }
        debug_assert_eq!(self.cache.len(), self.tokens.len(), "the stack holds every token kept");
        Ok(())
    }
}
