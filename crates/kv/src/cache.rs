//! The KV cache: per layer, one or more *streams* of fixed-width f32 rows,
//! one row per token.
//!
//! Grouped-query attention keeps two streams (keys and values); Multi-head
//! Latent Attention keeps one (the compressed latent with its rotary part);
//! DeepSeek Sparse Attention adds a stream of indexer keys. One type serves
//! them all, so persistence and budgeting treat every family alike.

use crate::{Error, Result};

/// Rows of every layer for the tokens seen so far.
///
/// Positions are written layer by layer during a forward pass and become part
/// of the sequence only when [`KvCache::advance`] commits them, so a failed
/// pass leaves the committed state untouched.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Width of each stream's row, in f32s (layer 0's).
    row_dims: Vec<usize>,
    layouts: Vec<LayerLayout>,
    capacity_tokens: usize,
    len_tokens: usize,
    /// `[layer][stream]` → rows, `[tokens, row_dims[stream]]`.
    rows: Vec<Vec<Vec<f32>>>,
    /// `[layer]` → committed fixed state, and the copy a pass updates.
    states: Vec<(Vec<f32>, Vec<f32>)>,
}

/// What one layer keeps: rows per token (possibly none) and a fixed state
/// (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerLayout {
    pub row_dims: Vec<usize>,
    pub state_floats: usize,
}

/// Stream index of keys in a grouped-query attention cache.
pub const KEYS: usize = 0;
/// Stream index of values in a grouped-query attention cache.
pub const VALUES: usize = 1;
/// Stream index of the latent rows in a Multi-head Latent Attention cache.
pub const LATENT: usize = 0;
/// Stream index of the DSA indexer keys in a Multi-head Latent Attention cache.
pub const INDEX_KEYS: usize = 1;

impl KvCache {
    /// An empty cache for `n_layers` layers with one stream per entry of
    /// `row_dims`, holding at most `capacity_tokens`. Memory grows with use,
    /// up to `capacity_tokens * sum(row_dims) * 4` bytes per layer.
    pub fn new(n_layers: usize, row_dims: Vec<usize>, capacity_tokens: usize) -> Self {
        assert!(!row_dims.is_empty() && row_dims.iter().all(|&d| d > 0), "every stream has a width");
        Self::with_layers(vec![LayerLayout { row_dims, state_floats: 0 }; n_layers], capacity_tokens)
    }

    /// A cache whose layers each keep what `layouts` says.
    pub fn with_layers(layouts: Vec<LayerLayout>, capacity_tokens: usize) -> Self {
        let rows = layouts.iter().map(|l| vec![Vec::new(); l.row_dims.len()]).collect();
        let states = layouts.iter().map(|l| (vec![0.0; l.state_floats], Vec::new())).collect();
        let row_dims = layouts.first().map(|l| l.row_dims.clone()).unwrap_or_default();
        Self { row_dims, layouts, capacity_tokens, len_tokens: 0, rows, states }
    }

    /// What layer `layer` keeps.
    pub fn layout(&self, layer: usize) -> &LayerLayout {
        &self.layouts[layer]
    }

    /// Layer `layer`'s committed state.
    pub fn state(&self, layer: usize) -> &[f32] {
        &self.states[layer].0
    }

    /// A copy of layer `layer`'s committed state for a pass to update.
    pub fn stage_state(&mut self, layer: usize) -> &mut [f32] {
        let (committed, staged) = &mut self.states[layer];
        staged.clone_from(committed);
        staged
    }

    /// Bytes of fixed state per sequence.
    pub fn state_bytes(&self) -> usize {
        self.layouts.iter().map(|l| l.state_floats).sum::<usize>() * size_of::<f32>()
    }

    /// A grouped-query attention cache: keys and values of `kv_dim` each.
    pub fn gqa(n_layers: usize, kv_dim: usize, capacity_tokens: usize) -> Self {
        Self::new(n_layers, vec![kv_dim, kv_dim], capacity_tokens)
    }

    /// A Multi-head Latent Attention cache: per token and layer one latent
    /// row of `latent_dim` (the compressed key/value and the rotated shared
    /// key), plus an indexer key of `index_dim` with DeepSeek Sparse
    /// Attention.
    pub fn mla(n_layers: usize, latent_dim: usize, index_dim: Option<usize>, capacity_tokens: usize) -> Self {
        Self::new(n_layers, std::iter::once(latent_dim).chain(index_dim).collect(), capacity_tokens)
    }

    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len_tokens
    }

    /// Whether no token is committed.
    pub fn is_empty(&self) -> bool {
        self.len_tokens == 0
    }

    /// Layers.
    pub fn n_layers(&self) -> usize {
        self.rows.len()
    }

    /// Width of each stream's row.
    pub fn row_dims(&self) -> &[usize] {
        &self.row_dims
    }

    /// The most tokens the cache can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_tokens
    }

    /// Bytes one token occupies across all layers and streams.
    pub fn bytes_per_token(&self) -> usize {
        self.layouts.iter().map(|l| l.row_dims.iter().sum::<usize>()).sum::<usize>() * size_of::<f32>()
    }

    /// Fails unless `n_tokens` more tokens fit.
    pub fn reserve(&self, n_tokens: usize) -> Result<()> {
        let needed_tokens = self.len_tokens + n_tokens;
        if needed_tokens > self.capacity_tokens {
            return Err(Error::ContextFull { needed_tokens, capacity_tokens: self.capacity_tokens });
        }
        Ok(())
    }

    /// Stores `rows` (`[n, row_dims[stream]]`) of `layer` for the uncommitted
    /// positions `len()..len() + n`.
    pub fn write(&mut self, layer: usize, stream: usize, rows: &[f32]) {
        let dim = self.layouts[layer].row_dims[stream];
        let n_tokens = rows.len() / dim;
        assert_eq!(rows.len(), n_tokens * dim, "whole rows");
        assert!(self.len_tokens + n_tokens <= self.capacity_tokens, "reserve() first");
        let stored = &mut self.rows[layer][stream];
        stored.truncate(self.len_tokens * dim);
        stored.extend_from_slice(rows);
    }

    /// Rows of `layer`'s `stream` for positions `0..n_tokens`.
    pub fn rows(&self, layer: usize, stream: usize, n_tokens: usize) -> &[f32] {
        &self.rows[layer][stream][..n_tokens * self.layouts[layer].row_dims[stream]]
    }

    /// Commits `n_tokens` written positions.
    pub fn advance(&mut self, n_tokens: usize) {
        let new_len = self.len_tokens + n_tokens;
        for (layer, layout) in self.rows.iter().zip(&self.layouts) {
            for (stream, dim) in layer.iter().zip(&layout.row_dims) {
                assert!(stream.len() >= new_len * dim, "every layer and stream written");
            }
        }
        if n_tokens > 0 {
            for (committed, staged) in &mut self.states {
                if !committed.is_empty() {
                    std::mem::swap(committed, staged);
                }
            }
        }
        self.len_tokens = new_len;
    }

    /// Forgets every position from `len_tokens` on.
    pub fn truncate(&mut self, len_tokens: usize) {
        self.len_tokens = self.len_tokens.min(len_tokens);
        for (layer, layout) in self.rows.iter_mut().zip(&self.layouts) {
            for (stream, dim) in layer.iter_mut().zip(&layout.row_dims) {
                stream.truncate(self.len_tokens * dim);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_commit_only_on_advance() {
        let mut kv = KvCache::new(2, vec![2, 3], 4);
        kv.reserve(2).unwrap();
        for layer in 0..2 {
            kv.write(layer, KEYS, &[1.0, 2.0, 3.0, 4.0]);
            kv.write(layer, VALUES, &[0.0; 6]);
        }
        assert_eq!(kv.len(), 0);
        kv.advance(2);
        assert_eq!(kv.rows(1, KEYS, 2), &[1.0, 2.0, 3.0, 4.0]);
        // An abandoned pass is overwritten by the next one.
        kv.write(0, KEYS, &[9.0, 9.0]);
        kv.write(0, KEYS, &[5.0, 6.0]);
        assert_eq!(kv.rows(0, KEYS, 2), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(kv.bytes_per_token(), 2 * 5 * 4);
    }

    #[test]
    fn mla_caches_hold_the_latent_and_optional_index_keys() {
        let latent_only = KvCache::mla(3, 576, None, 8);
        assert_eq!(latent_only.row_dims(), &[576]);
        assert_eq!(latent_only.bytes_per_token(), 3 * 576 * 4);
        let dsa = KvCache::mla(3, 576, Some(128), 8);
        assert_eq!(dsa.row_dims()[LATENT], 576);
        assert_eq!(dsa.row_dims()[INDEX_KEYS], 128);
        assert_eq!(dsa.bytes_per_token(), 3 * (576 + 128) * 4);
    }

    #[test]
    fn overflowing_the_context_is_an_error() {
        let kv = KvCache::gqa(1, 1, 3);
        let err = kv.reserve(4).unwrap_err().to_string();
        assert!(err.contains("4 tokens needed") && err.contains("at most 3"), "{err}");
    }
}
