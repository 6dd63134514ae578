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
        if self.options.temperature <= 0.0 {
            return argmax(logits);
        }
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
        let sum: f64 = self.candidates.iter().map(|c| f64::from(c.1)).sum();
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
}
