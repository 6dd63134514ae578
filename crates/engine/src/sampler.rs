//! Choosing the next token from logits: greedy, or temperature → top-k →
//! top-p sampling from a seeded generator.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingOptions {
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

/// Sampling defaults: the model's `generation_config.json` where it has
/// them (as transformers' `generate` and vLLM use them), else OpenAI's
/// (temperature 1, top-p 1, no top-k). `chat` and `serve` both start here.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SamplingDefaults {
    /// f64 so `/info` shows 0.8, not 0.800000011920929.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
}

impl SamplingDefaults {
    pub fn from_dir(dir: &Path) -> SamplingDefaults {
        let mut defaults = SamplingDefaults { temperature: 1.0, top_p: 1.0, top_k: 0 };
        let Ok(text) = std::fs::read_to_string(dir.join("generation_config.json")) else { return defaults };
        let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else { return defaults };
        if let Some(t) = config.get("temperature").and_then(serde_json::Value::as_f64) {
            defaults.temperature = t;
        }
        if let Some(p) = config.get("top_p").and_then(serde_json::Value::as_f64) {
            defaults.top_p = p;
        }
        if let Some(k) = config.get("top_k").and_then(serde_json::Value::as_u64) {
            defaults.top_k = k as usize;
        }
        if config.get("do_sample") == Some(&serde_json::Value::Bool(false)) {
            defaults.temperature = 0.0;
        }
        defaults
    }
}

impl SamplingOptions {
    /// Refuses settings that sample garbage instead of failing: a
    /// temperature that is not a finite number >= 0 (NaN picked the same
    /// token every time), a top_p outside [0, 1] (the API's range).
    pub fn check(&self) -> crate::Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(crate::Error::InvalidOption {
                option: "temperature",
                reason: format!("{} is not a finite number >= 0", self.temperature),
            });
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(crate::Error::InvalidOption {
                option: "top-p",
                reason: format!("{} is not between 0 and 1", self.top_p),
            });
        }
        Ok(())
    }
}

/// A token chooser whose randomness is a function of the seed and the
/// token's position only: the same seed gives the same tokens, and a
/// conversation stopped and resumed (even in another process) samples
/// exactly as one that never stopped.
#[derive(Debug, Clone)]
pub struct Sampler {
    options: SamplingOptions,
    rng: ChaCha8Rng,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(options: SamplingOptions) -> Self {
        Self { options, rng: ChaCha8Rng::seed_from_u64(options.seed), candidates: Vec::new() }
    }

    /// The token at sequence position `position` for `logits` (`[vocab]`).
    ///
    /// Only as much of the vocabulary is sorted as the truncation needs:
    /// top-k selects its k first; top-p sorts a growing head until it holds
    /// the mass; with neither, nothing is sorted. (A full sort of a 152k
    /// vocabulary per token would cost more than a small model's forward.)
    pub fn sample(&mut self, logits: &[f32], position: usize) -> u32 {
        assert!(!logits.is_empty(), "logits over an empty vocabulary");
        if self.is_greedy() {
            return argmax(logits);
        }
        self.weigh(logits);
        let sum: f64 = self.candidates.iter().map(|c| f64::from(c.1)).sum();
        let mut target = self.uniform(position, SAMPLE_WORD) * sum;
        for &(token, weight) in &self.candidates {
            target -= f64::from(weight);
            if target <= 0.0 {
                return token;
            }
        }
        self.candidates.last().expect("at least one candidate").0
    }

    /// Whether this sampler always takes the argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.options.temperature <= 0.0
    }

    /// The distribution [`Self::sample`] draws from for `logits`, dense over
    /// the vocabulary and summing to 1: temperature, top-k and top-p
    /// applied (greedy: all on the argmax). Speculative decoding compares
    /// the draft's and the stack's through it, so both see the same
    /// truncation.
    pub fn distribution(&mut self, logits: &[f32]) -> Vec<f64> {
        assert!(!logits.is_empty(), "logits over an empty vocabulary");
        let mut probabilities = vec![0.0; logits.len()];
        if self.is_greedy() {
            probabilities[argmax(logits) as usize] = 1.0;
            return probabilities;
        }
        self.weigh(logits);
        let sum: f64 = self.candidates.iter().map(|c| f64::from(c.1)).sum();
        for &(token, weight) in &self.candidates {
            probabilities[token as usize] = f64::from(weight) / sum;
        }
        probabilities
    }

    /// A draft token at sequence position `position` from the draft's
    /// distribution `q` ([`Self::distribution`] of the draft's logits),
    /// from the seed and the position only, as [`Self::sample`]'s.
    pub fn draft(&mut self, q: &[f64], position: usize) -> u32 {
        let u = self.uniform(position, DRAFT_WORD);
        draw(q, u)
    }

    /// The standard rule of speculative sampling (Leviathan et al. 2023,
    /// Chen et al. 2023): `draft`, drawn from `q`, stands with probability
    /// min(1, p/q); else the token is drawn from max(0, p - q), normalized.
    /// The token that results follows `p` exactly, whatever `q` is. Greedy
    /// (one-hot `p` and `q`): the draft stands where it is the argmax.
    pub fn verify(&mut self, p: &[f64], q: &[f64], draft: u32, position: usize) -> Verdict {
        assert_eq!(p.len(), q.len(), "the draft's and the stack's vocabularies");
        let (p_draft, q_draft) = (p[draft as usize], q[draft as usize]);
        assert!(q_draft > 0.0, "a draft drawn from q has q > 0");
        // u < p/q, without the division.
        if self.uniform(position, ACCEPT_WORD) * q_draft < p_draft {
            return Verdict::Accepted;
        }
        let residual: Vec<f64> = p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect();
        let sum: f64 = residual.iter().sum();
        let u = self.uniform(position, SAMPLE_WORD);
        // p > q somewhere whenever p(draft) < q(draft); a sum lost to
        // rounding falls back on p itself.
        Verdict::Replaced(if sum > 0.0 { draw(&residual, u * sum) } else { draw(p, u) })
    }

    /// A uniform draw in [0, 1) at word `word` of position `position`'s
    /// stream: a function of the seed, the position and the use only.
    fn uniform(&mut self, position: usize, word: u128) -> f64 {
        self.rng.set_stream(position as u64);
        self.rng.set_word_pos(word);
        self.rng.random::<f64>()
    }

    /// Fills the candidates with the weights `sample` draws from:
    /// temperature, top-k, exp, then top-p (unnormalized).
    fn weigh(&mut self, logits: &[f32]) {
        let o = self.options;
        self.candidates.clear();
        self.candidates.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l / o.temperature)));
        if o.top_k > 0 && o.top_k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(o.top_k - 1, descending);
            self.candidates.truncate(o.top_k);
        }
        let max = self.candidates.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        for c in &mut self.candidates {
            c.1 = (c.1 - max).exp();
        }
        if o.top_p < 1.0 {
            self.keep_nucleus(o.top_p);
        }
    }

    /// Keeps the smallest head of the candidates (by weight, descending;
    /// ties to the lower id) whose share of the total weight reaches
    /// `top_p`, sorted. The head is found by sorting the first 64, then
    /// 256, ... candidates, so a peaked distribution sorts few.
    fn keep_nucleus(&mut self, top_p: f32) {
        let total: f64 = self.candidates.iter().map(|c| f64::from(c.1)).sum();
        let want = f64::from(top_p) * total;
        let len = self.candidates.len();
        let mut head = NUCLEUS_FIRST_HEAD.min(len);
        loop {
            if head < len {
                self.candidates.select_nth_unstable_by(head - 1, descending);
            }
            self.candidates[..head].sort_unstable_by(descending);
            let mut kept = 0.0f64;
            for i in 0..head {
                kept += f64::from(self.candidates[i].1);
                if kept >= want {
                    self.candidates.truncate(i + 1);
                    return;
                }
            }
            if head == len {
                return;
            }
            head = (head * 4).min(len);
        }
    }
}

/// What [`Sampler::verify`] decided about a draft token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The draft stands.
    Accepted,
    /// The draft is rejected; this token takes its place.
    Replaced(u32),
}

/// Where in a position's stream each use draws (in 32-bit words; a draw
/// takes 2): the token's own sample (or the residual's, in its place), the
/// draft's, and the acceptance test's. Distinct, so the uses are independent.
const SAMPLE_WORD: u128 = 0;
const DRAFT_WORD: u128 = 16;
const ACCEPT_WORD: u128 = 32;

/// The index that `target` (in [0, sum of `weights`)) falls on, walking
/// the cumulative weights; the last with weight on rounding.
fn draw(weights: &[f64], mut target: f64) -> u32 {
    let mut last = 0;
    for (token, &weight) in weights.iter().enumerate() {
        if weight <= 0.0 {
            continue;
        }
        if target < weight {
            return token as u32;
        }
        target -= weight;
        last = token;
    }
    last as u32
}

/// How many candidates the nucleus search sorts first.
const NUCLEUS_FIRST_HEAD: usize = 64;

/// A total order on (token, logit or weight): larger value first, ties to
/// the lower id.
fn descending(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The index of the largest logit (the first, on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax() {
        let mut s = Sampler::new(SamplingOptions::default());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], 0), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let opts = SamplingOptions { temperature: 0.9, top_k: 20, top_p: 0.9, seed: 7 };
        let a: Vec<u32> = {
            let mut s = Sampler::new(opts);
            (0..32).map(|p| s.sample(&logits, p)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(opts);
            (0..32).rev().map(|p| s.sample(&logits, p)).collect::<Vec<_>>().into_iter().rev().collect()
        };
        assert!(a.iter().any(|&t| t != a[0]), "positions draw differently");
        assert_eq!(a, b);
        let mut one = Sampler::new(SamplingOptions { top_k: 1, ..opts });
        assert_eq!(one.sample(&logits, 3), argmax(&logits));
    }

    #[test]
    fn top_p_over_a_large_vocabulary_keeps_exactly_the_nucleus() {
        // 1000 tokens, weights falling slowly: the nucleus is far beyond the
        // first sorted head, so the search must widen it.
        let logits: Vec<f32> = (0..1000).map(|i| -(i as f32) * 0.002).collect();
        let weights: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut prefix = 0.0;
        let nucleus = weights.iter().take_while(|&&w| {
            let inside = prefix < 0.7 * total;
            prefix += w;
            inside
        });
        let nucleus = nucleus.count();
        assert!(nucleus > NUCLEUS_FIRST_HEAD * 4, "the test needs a wide nucleus ({nucleus})");
        let mut s = Sampler::new(SamplingOptions { temperature: 1.0, top_k: 0, top_p: 0.7, seed: 3 });
        let drawn: Vec<u32> = (0..2000).map(|p| s.sample(&logits, p)).collect();
        assert!(drawn.iter().all(|&t| (t as usize) < nucleus), "a token outside the nucleus");
        assert!(drawn.iter().any(|&t| t as usize >= nucleus - 40), "the nucleus's tail is reachable");
    }

    #[test]
    fn draws_follow_the_softmax() {
        let logits = [1.0f32, 0.0, -1.0, 2.0];
        let weights: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut s = Sampler::new(SamplingOptions { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 9 });
        let draws = 20_000;
        let mut counts = [0usize; 4];
        for p in 0..draws {
            counts[s.sample(&logits, p) as usize] += 1;
        }
        for (count, w) in counts.iter().zip(&weights) {
            let want = w / total;
            let got = *count as f64 / draws as f64;
            // Four standard deviations of a binomial share.
            let tolerance = 4.0 * (want * (1.0 - want) / draws as f64).sqrt();
            assert!((got - want).abs() < tolerance, "share {got} vs {want}");
        }
    }

    #[test]
    fn top_p_keeps_only_the_head_of_the_distribution() {
        let logits = [10.0, 9.0, -10.0, -10.0];
        let mut s = Sampler::new(SamplingOptions { temperature: 1.0, top_k: 0, top_p: 0.5, seed: 1 });
        assert!((0..100).all(|p| s.sample(&logits, p) == 0));
    }

    /// Speculative sampling's tokens follow the stack's distribution (after
    /// temperature, top-k and top-p), not the draft's: over many seeded
    /// positions, each token's share is within 4.5 standard deviations of
    /// p's, for a draft that is far from p and one that is near it.
    #[test]
    fn speculative_sampling_keeps_the_target_distribution() {
        let stack = [2.0f32, 0.5, 1.0, -1.0, 0.0, 1.5];
        let drafts = [[0.0f32, 2.5, 0.0, 1.0, 0.5, -1.0], [1.8, 0.6, 1.1, -1.0, 0.1, 1.2]];
        let settings = [
            SamplingOptions { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 11 },
            SamplingOptions { temperature: 0.7, top_k: 4, top_p: 0.9, seed: 12 },
        ];
        let runs = 40_000;
        for options in settings {
            for draft_logits in &drafts {
                let mut s = Sampler::new(options);
                let p = s.distribution(&stack);
                let q = s.distribution(draft_logits);
                let mut counts = [0usize; 6];
                for position in 0..runs {
                    let draft = s.draft(&q, position);
                    let token = match s.verify(&p, &q, draft, position) {
                        Verdict::Accepted => draft,
                        Verdict::Replaced(token) => token,
                    };
                    counts[token as usize] += 1;
                }
                for (token, (&count, &want)) in counts.iter().zip(&p).enumerate() {
                    let got = count as f64 / runs as f64;
                    let tolerance = 4.5 * (want * (1.0 - want) / runs as f64).sqrt();
                    assert!(
                        (got - want).abs() <= tolerance,
                        "{options:?}, draft {draft_logits:?}: token {token}'s share {got} vs p's {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn greedy_verification_accepts_exactly_the_argmax() {
        let mut s = Sampler::new(SamplingOptions::default());
        let p = s.distribution(&[0.0, 3.0, 1.0]);
        let q = s.distribution(&[5.0, 0.0, 1.0]);
        assert_eq!(s.draft(&q, 4), 0);
        assert_eq!(s.verify(&p, &q, 0, 4), Verdict::Replaced(1));
        assert_eq!(s.verify(&p, &p, 1, 4), Verdict::Accepted);
    }
}
