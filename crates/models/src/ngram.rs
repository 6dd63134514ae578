//! The hashed n-gram ids of Qwen3.8-Flash-Next's Per-Layer Embedding, as
//! transformers' `Qwen4ExpTextNGramEmbedding` computes them
//! (models/qwen4_exp/modeling_qwen4_exp.py:1035-1177).
//!
//! For each n from 2 to `ngram_size`, a token's n-gram is itself and the
//! `n - 1` tokens before it in its EOS-delimited segment (EOS stands in for
//! tokens before the segment's start); the ids times per-position odd
//! multipliers (splitmix64 of the layer's seed) are XORed, and each of the
//! n-gram's `heads_per_ngram` heads takes that modulo its own prime (the
//! primes from `ngram_vocab_size_base` on, one per head of every PLE layer)
//! plus the head's offset in the layer's table.

use strata_format::spec::is_prime;

use crate::error::{Error, Result};

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const SPLITMIX_M1: u64 = 0xBF58_476D_1CE4_E5B9;
const SPLITMIX_M2: u64 = 0x94D0_49BB_1331_11EB;
/// Separates the PLE layers' seeds.
const LAYER_SEED_STRIDE: u64 = 10_007;

/// splitmix64's output for the state `value` (arithmetic mod 2^64).
fn splitmix64(value: u64) -> u64 {
    let mut z = value.wrapping_add(SPLITMIX_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(SPLITMIX_M1);
    z = (z ^ (z >> 27)).wrapping_mul(SPLITMIX_M2);
    z ^ (z >> 31)
}

/// The hashing of one PLE layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramHash {
    ngram_size: usize,
    heads_per_ngram: usize,
    eos: u32,
    /// One odd multiplier per position of the longest n-gram.
    multipliers: Vec<i64>,
    /// Each head's prime, `[(ngram_size - 1) · heads_per_ngram]`.
    head_vocab_sizes: Vec<i64>,
    /// Each head's first row in the layer's table.
    head_offsets: Vec<i64>,
}

/// The configuration a layer's hashing reads.
#[derive(Debug, Clone, Copy)]
pub struct NgramConfig {
    pub vocab_size: u64,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    /// The layer's place among `ple_layer_ids` (0-based).
    pub ple_layer_index: usize,
    pub seed: u64,
    pub ngram_vocab_size_base: u64,
    pub eos: u32,
}

impl NgramHash {
    pub fn new(config: &NgramConfig) -> Result<Self> {
        let bad = |what: &str| Error::Unsupported(format!("n-gram hashing: {what} in {config:?}"));
        if config.ngram_size < 2 || config.heads_per_ngram == 0 {
            return Err(bad("n-grams of at least 2 tokens and at least one head"));
        }
        let heads = (config.ngram_size - 1).checked_mul(config.heads_per_ngram).ok_or_else(|| bad("too many heads"))?;
        let primes_before = config.ple_layer_index.checked_mul(heads).ok_or_else(|| bad("too many heads"))?;
        // torch keeps the hash in an int64: each product stays below 2^63
        // for ids inside the vocabulary.
        let multiplier_max = i64::MAX as u64 / config.vocab_size.max(1);
        let half_bound = (multiplier_max / 2).max(1);
        let layer = u64::try_from(config.ple_layer_index).map_err(|_| bad("layer index"))?;
        let base_seed = config.seed.wrapping_add(LAYER_SEED_STRIDE.wrapping_mul(layer));
        let multipliers = (1..=config.ngram_size as u64)
            .map(|i| (2 * (splitmix64(base_seed.wrapping_add(SPLITMIX_GAMMA.wrapping_mul(i))) % half_bound) + 1) as i64)
            .collect();
        let first = config.ngram_vocab_size_base.max(1);
        let mut primes = (first..i64::MAX as u64).filter(|&p| is_prime(p)).skip(primes_before);
        let mut head_vocab_sizes = Vec::with_capacity(heads);
        let mut head_offsets = Vec::with_capacity(heads);
        let mut total: i64 = 0;
        for _ in 0..heads {
            let size = primes.next().ok_or_else(|| bad("no prime left"))? as i64;
            head_offsets.push(total);
            head_vocab_sizes.push(size);
            total = total.checked_add(size).ok_or_else(|| bad("table rows overflow"))?;
        }
        Ok(Self {
            ngram_size: config.ngram_size,
            heads_per_ngram: config.heads_per_ngram,
            eos: config.eos,
            multipliers,
            head_vocab_sizes,
            head_offsets,
        })
    }

    /// Heads per token: `(ngram_size - 1) · heads_per_ngram`.
    pub fn heads(&self) -> usize {
        self.head_vocab_sizes.len()
    }

    /// The tokens before a sequence's first: EOS, so the first n-grams
    /// start a segment.
    pub fn fresh_context(&self) -> Vec<u32> {
        vec![self.eos; self.ngram_size - 1]
    }

    /// The table rows of `tokens` (`[tokens, heads]`, each head's n-gram in
    /// order 2-gram heads first), after the `ngram_size - 1` tokens
    /// `context` (the state a sequence carries, [`Self::fresh_context`] at
    /// its start).
    pub fn rows(&self, context: &[u32], tokens: &[u32]) -> Vec<i64> {
        let span = self.ngram_size - 1;
        assert_eq!(context.len(), span, "the context is the last {span} tokens");
        let history: Vec<u32> = context.iter().chain(tokens).copied().collect();
        // Where each position's segment starts: after the last EOS before it.
        let mut segment_start = Vec::with_capacity(history.len());
        let mut start = 0;
        for (p, &token) in history.iter().enumerate() {
            segment_start.push(start);
            if token == self.eos {
                start = p + 1;
            }
        }
        let shifted = |p: usize, shift: usize| -> i64 {
            let id = if p >= segment_start[p] + shift { history[p - shift] } else { self.eos };
            i64::from(id)
        };
        let mut rows = Vec::with_capacity(tokens.len() * self.heads());
        for p in span..history.len() {
            for n in 2..=self.ngram_size {
                // torch's int64 products wrap: so do these.
                let mixed =
                    (0..n).fold(0i64, |acc, shift| acc ^ shifted(p, shift).wrapping_mul(self.multipliers[shift]));
                let heads = (n - 2) * self.heads_per_ngram..(n - 1) * self.heads_per_ngram;
                for h in heads {
                    rows.push(mixed.rem_euclid(self.head_vocab_sizes[h]) + self.head_offsets[h]);
                }
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use strata_format::npy::NpyData;

    use super::*;

    fn load(case: &Path, name: &str) -> Vec<i64> {
        let array =
            strata_format::npy::read(case.join(format!("{name}.npy"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        match array.data {
            NpyData::I64(values) => values,
            other => panic!("{name}: int64 expected, found {other:?}"),
        }
    }

    #[test]
    fn ngram_rows_are_transformers_ids_with_eos_inside_the_prompt_and_the_published_primes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/qwen4_exp/ngram");
        let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
            .map(|entry| entry.expect("listed").path())
            .collect();
        cases.sort();
        assert!(cases.len() >= 3, "small, four-gram and published configurations: {cases:?}");
        for case in cases {
            let c = load(&case, "config");
            let hash = NgramHash::new(&NgramConfig {
                vocab_size: c[0] as u64,
                ngram_size: c[1] as usize,
                heads_per_ngram: c[2] as usize,
                ple_layer_index: c[3] as usize,
                seed: c[4] as u64,
                ngram_vocab_size_base: c[5] as u64,
                eos: c[6] as u32,
            })
            .unwrap();
            assert_eq!(hash.head_vocab_sizes, load(&case, "head_vocab_sizes"), "{}: the heads' primes", case.display());
            let tokens: Vec<u32> = load(&case, "tokens").iter().map(|&v| v as u32).collect();
            assert_eq!(hash.rows(&hash.fresh_context(), &tokens), load(&case, "ids"), "{}", case.display());
        }
    }
}
