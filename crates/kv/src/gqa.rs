//! The standard cache of grouped-query attention: one key row and one value
//! row per layer per token.

use crate::{Error, Result};

/// Keys and values of every layer for the tokens seen so far.
///
/// Positions are written layer by layer during a forward pass and become part
/// of the sequence only when [`KvCache::advance`] commits them, so a failed
/// pass leaves the committed state untouched.
#[derive(Debug, Clone)]
pub struct KvCache {
    k_dim: usize,
    v_dim: usize,
    capacity_tokens: usize,
    len_tokens: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers holding at most `capacity_tokens`.
    /// Memory grows with use, up to `capacity_tokens * (k_dim + v_dim) * 4`
    /// bytes per layer.
    pub fn new(n_layers: usize, k_dim: usize, v_dim: usize, capacity_tokens: usize) -> Self {
        assert!(k_dim > 0 && v_dim > 0, "empty KV rows");
        Self {
            k_dim,
            v_dim,
            capacity_tokens,
            len_tokens: 0,
            keys: vec![Vec::new(); n_layers],
            values: vec![Vec::new(); n_layers],
        }
    }

    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len_tokens
    }

    /// Whether no token is committed.
    pub fn is_empty(&self) -> bool {
        self.len_tokens == 0
    }

    /// The most tokens the cache can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_tokens
    }

    /// Bytes one token occupies across all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.keys.len() * (self.k_dim + self.v_dim) * size_of::<f32>()
    }

    /// Fails unless `n_tokens` more tokens fit.
    pub fn reserve(&self, n_tokens: usize) -> Result<()> {
        let needed_tokens = self.len_tokens + n_tokens;
        if needed_tokens > self.capacity_tokens {
            return Err(Error::ContextFull { needed_tokens, capacity_tokens: self.capacity_tokens });
        }
        Ok(())
    }

    /// Stores the rows of `layer` for the uncommitted positions
    /// `len()..len() + n`, where `keys` is `[n, k_dim]` and `values` `[n, v_dim]`.
    pub fn write(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        let n_tokens = keys.len() / self.k_dim;
        assert_eq!(keys.len(), n_tokens * self.k_dim, "key rows");
        assert_eq!(values.len(), n_tokens * self.v_dim, "value rows");
        assert!(self.len_tokens + n_tokens <= self.capacity_tokens, "reserve() first");
        let k = &mut self.keys[layer];
        let v = &mut self.values[layer];
        k.truncate(self.len_tokens * self.k_dim);
        v.truncate(self.len_tokens * self.v_dim);
        k.extend_from_slice(keys);
        v.extend_from_slice(values);
    }

    /// Keys of `layer` for positions `0..n_tokens`, `[n_tokens, k_dim]`.
    pub fn keys(&self, layer: usize, n_tokens: usize) -> &[f32] {
        &self.keys[layer][..n_tokens * self.k_dim]
    }

    /// Values of `layer` for positions `0..n_tokens`, `[n_tokens, v_dim]`.
    pub fn values(&self, layer: usize, n_tokens: usize) -> &[f32] {
        &self.values[layer][..n_tokens * self.v_dim]
    }

    /// Commits `n_tokens` written positions.
    pub fn advance(&mut self, n_tokens: usize) {
        let new_len = self.len_tokens + n_tokens;
        for (k, v) in self.keys.iter().zip(&self.values) {
            assert!(k.len() >= new_len * self.k_dim && v.len() >= new_len * self.v_dim, "every layer written");
        }
        self.len_tokens = new_len;
    }

    /// Forgets every position from `len_tokens` on.
    pub fn truncate(&mut self, len_tokens: usize) {
        self.len_tokens = self.len_tokens.min(len_tokens);
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
            k.truncate(self.len_tokens * self.k_dim);
            v.truncate(self.len_tokens * self.v_dim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_commit_only_on_advance() {
        let mut kv = KvCache::new(2, 2, 3, 4);
        kv.reserve(2).unwrap();
        for layer in 0..2 {
            kv.write(layer, &[1.0, 2.0, 3.0, 4.0], &[0.0; 6]);
        }
        assert_eq!(kv.len(), 0);
        kv.advance(2);
        assert_eq!(kv.keys(1, 2), &[1.0, 2.0, 3.0, 4.0]);
        // An abandoned pass is overwritten by the next one.
        kv.write(0, &[9.0, 9.0], &[0.0; 3]);
        kv.write(0, &[5.0, 6.0], &[0.0; 3]);
        assert_eq!(kv.keys(0, 2), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(kv.bytes_per_token(), 2 * 5 * 4);
    }

    #[test]
    fn overflowing_the_context_is_an_error() {
        let kv = KvCache::new(1, 1, 1, 3);
        let err = kv.reserve(4).unwrap_err().to_string();
        assert!(err.contains("4 tokens needed") && err.contains("at most 3"), "{err}");
    }
}
