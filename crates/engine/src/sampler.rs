//! Choosing the next token from logits: greedy, or temperature → top-k →
//! top-p sampling from a seeded generator.

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
    pub fn sample(&mut self, logits: &[f32], position: usize) -> u32 {
        assert!(!logits.is_empty(), "logits over an empty vocabulary");
        if self.options.temperature <= 0.0 {
            return argmax(logits);
        }
        let o = self.options;
        self.candidates.clear();
        self.candidates.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l / o.temperature)));
        // Descending by logit, ties to the lower id, so the order is total.
        self.candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if o.top_k > 0 {
            self.candidates.truncate(o.top_k);
        }
        let max = self.candidates[0].1;
        let mut sum = 0.0f64;
        for c in &mut self.candidates {
            c.1 = (c.1 - max).exp();
            sum += f64::from(c.1);
        }
        if o.top_p < 1.0 {
            let mut kept_mass = 0.0f64;
            let mut keep = self.candidates.len();
            for (i, c) in self.candidates.iter().enumerate() {
                kept_mass += f64::from(c.1) / sum;
                if kept_mass >= f64::from(o.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            self.candidates.truncate(keep);
            sum = self.candidates.iter().map(|c| f64::from(c.1)).sum();
        }
        self.rng.set_stream(position as u64);
        self.rng.set_word_pos(0);
        let mut target = self.rng.random::<f64>() * sum;
        for &(token, weight) in &self.candidates {
            target -= f64::from(weight);
            if target <= 0.0 {
                return token;
            }
        }
        self.candidates.last().expect("at least one candidate").0
    }
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
    fn top_p_keeps_only_the_head_of_the_distribution() {
        let logits = [10.0, 9.0, -10.0, -10.0];
        let mut s = Sampler::new(SamplingOptions { temperature: 1.0, top_k: 0, top_p: 0.5, seed: 1 });
        assert!((0..100).all(|p| s.sample(&logits, p) == 0));
    }
}
