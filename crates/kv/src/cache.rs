//! The KV cache: per layer, zero or more *streams* of fixed-width f32 rows,
//! one row per token, and possibly a fixed-size recurrent state.
//!
//! Grouped-query attention keeps two streams (keys and values); Multi-head
//! Latent Attention keeps one (the compressed latent with its rotary part);
//! DeepSeek Sparse Attention adds a stream of indexer keys; a linear-attention
//! layer (Gated DeltaNet) keeps no rows but a state of the same size whatever
//! the length. One type serves them all, so persistence and budgeting treat
//! every family alike.
//!
//! A recurrent state cannot be cut back to an arbitrary position, so a cache
//! with state keeps a few snapshots of it ([`KvCache::snapshot`], taken at
//! turn boundaries) and [`KvCache::truncate`] resumes from the longest prefix
//! it can restore, saying which; the caller runs the rest again.

use crate::{Error, Result};

/// What one layer keeps: rows per token (possibly none) and a fixed state
/// (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerLayout {
    /// Width of each stream's row, in f32s.
    pub row_dims: Vec<usize>,
    /// f32s of the layer's recurrent state per sequence (0: none).
    pub state_floats: usize,
}

/// Snapshots of the state a cache keeps. Two, because resuming happens at a
/// turn boundary of the latest turn: the end of its answer when the next
/// prompt repeats the answer as generated, the end of its prompt when the
/// chat template renders the answer differently (reasoning stripped, say).
/// Older turns' boundaries are reached only by an edited conversation, and
/// every copy costs `state_bytes` in each session the budget holds.
pub const SNAPSHOTS_MAX: usize = 2;

/// Copies of the state a cache may hold at once: the committed one, the one
/// a pass is updating, and [`SNAPSHOTS_MAX`] snapshots.
pub const STATE_COPIES_MAX: usize = 2 + SNAPSHOTS_MAX;

/// One layer's recurrent state (empty vectors for a layer without one).
#[derive(Debug, Clone)]
struct LayerState {
    /// The state after the committed tokens.
    committed: Vec<f32>,
    /// The state the current pass updates; after [`KvCache::advance`] it
    /// holds the state the pass started from, until the next pass stages.
    staged: Vec<f32>,
    /// Whether `staged` was copied from `committed` in this pass.
    staged_in_pass: bool,
}

/// The state of every stateful layer after the first `len_tokens` tokens,
/// concatenated in layer order.
#[derive(Debug, Clone)]
struct Snapshot {
    len_tokens: usize,
    floats: Vec<f32>,
}

/// Rows and states of every layer for the tokens seen so far.
///
/// Positions are written layer by layer during a forward pass and become part
/// of the sequence only when [`KvCache::advance`] commits them, so a failed
/// pass leaves the committed state untouched.
#[derive(Debug, Clone)]
pub struct KvCache {
    layouts: Vec<LayerLayout>,
    capacity_tokens: usize,
    len_tokens: usize,
    /// `[layer][stream]` → rows, `[tokens, row_dims[stream]]`.
    rows: Vec<Vec<Vec<f32>>>,
    /// `[layer]`, every layer (stateless ones hold empty vectors).
    states: Vec<LayerState>,
    /// f32s of one token's rows, all layers.
    floats_per_token: usize,
    /// f32s of the state of every stateful layer.
    state_floats: usize,
    /// Ascending by length, all at most `len_tokens`, at most [`SNAPSHOTS_MAX`].
    snapshots: Vec<Snapshot>,
    /// The length before the last [`KvCache::advance`] while every stateful
    /// layer's `staged` still holds the state from then: a free way back
    /// from the last pass.
    undo_len_tokens: Option<usize>,
    /// The length the committed state is at: `len_tokens`, except while a
    /// session file loads rows ahead of the state it restores at the end.
    state_len_tokens: usize,
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
    /// `row_dims` and no state, holding at most `capacity_tokens`. Memory
    /// grows with use, up to `capacity_tokens * sum(row_dims) * 4` bytes per
    /// layer.
    pub fn new(n_layers: usize, row_dims: Vec<usize>, capacity_tokens: usize) -> Self {
        assert!(!row_dims.is_empty(), "every layer has a stream");
        Self::with_layers(vec![LayerLayout { row_dims, state_floats: 0 }; n_layers], capacity_tokens)
    }

    /// An empty cache where each layer keeps what its layout says, holding
    /// at most `capacity_tokens`. States start at zero (the zero pages are
    /// not touched until a pass writes them).
    pub fn with_layers(layouts: Vec<LayerLayout>, capacity_tokens: usize) -> Self {
        let mut floats_per_token = 0usize;
        let mut state_floats = 0usize;
        for (layer, layout) in layouts.iter().enumerate() {
            assert!(layout.row_dims.iter().all(|&d| d > 0), "layer {layer}: every stream has a width");
            assert!(!layout.row_dims.is_empty() || layout.state_floats > 0, "layer {layer} keeps rows or a state");
            // The layouts come from a model's config: sizes past usize are
            // a broken invariant of the format's validation, not input.
            floats_per_token =
                layout.row_dims.iter().try_fold(floats_per_token, |a, &d| a.checked_add(d)).expect("rows fit usize");
            state_floats = state_floats.checked_add(layout.state_floats).expect("states fit usize");
        }
        assert!(
            state_floats.checked_mul(size_of::<f32>() * STATE_COPIES_MAX).is_some()
                && floats_per_token.checked_mul(size_of::<f32>()).is_some(),
            "sizes in bytes fit usize"
        );
        let rows = layouts.iter().map(|l| vec![Vec::new(); l.row_dims.len()]).collect();
        let states = layouts
            .iter()
            .map(|l| LayerState { committed: vec![0.0; l.state_floats], staged: Vec::new(), staged_in_pass: false })
            .collect();
        Self {
            layouts,
            capacity_tokens,
            len_tokens: 0,
            rows,
            states,
            floats_per_token,
            state_floats,
            snapshots: Vec::new(),
            undo_len_tokens: None,
            state_len_tokens: 0,
        }
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
        self.layouts.len()
    }

    /// What `layer` keeps.
    pub fn layout(&self, layer: usize) -> &LayerLayout {
        &self.layouts[layer]
    }

    /// What every layer keeps, in order.
    pub fn layouts(&self) -> &[LayerLayout] {
        &self.layouts
    }

    /// The most tokens the cache can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_tokens
    }

    /// Bytes one token occupies across all layers' rows (states aside).
    pub fn bytes_per_token(&self) -> usize {
        self.floats_per_token * size_of::<f32>()
    }

    /// Bytes of the committed fixed state of every layer: what a sequence
    /// holds whatever its length.
    pub fn state_bytes(&self) -> usize {
        self.state_floats * size_of::<f32>()
    }

    /// Bytes of fixed state the cache may hold at once: [`STATE_COPIES_MAX`]
    /// copies (committed, staged, snapshots). What a memory budget reserves
    /// per sequence besides its rows.
    pub fn state_bytes_max(&self) -> usize {
        // Checked at construction.
        self.state_bytes() * STATE_COPIES_MAX
    }

    /// Bytes of fixed state held now: the committed state, a staged copy
    /// once a pass has made one, and the snapshots.
    pub fn state_bytes_held(&self) -> usize {
        let staged: usize = self.states.iter().map(|s| s.staged.len()).sum();
        let snapshots: usize = self.snapshots.iter().map(|s| s.floats.len()).sum();
        (self.state_floats + staged + snapshots) * size_of::<f32>()
    }

    /// Fails unless `n_tokens` more tokens fit. Starts a pass: states staged
    /// before are forgotten, and so is the way back from the last pass.
    pub fn reserve(&mut self, n_tokens: usize) -> Result<()> {
        for state in &mut self.states {
            state.staged_in_pass = false;
        }
        self.undo_len_tokens = None;
        let needed_tokens = self.len_tokens.saturating_add(n_tokens);
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

    /// The committed state of `layer` (zeros while the cache is empty).
    pub fn state(&self, layer: usize) -> &[f32] {
        assert_eq!(self.state_len_tokens, self.len_tokens, "the state is at the committed length");
        &self.states[layer].committed
    }

    /// The state of `layer` for the current pass to update in place: a copy
    /// of the committed state the first time in a pass, the same buffer
    /// (not copied again) after. [`Self::advance`] commits it with the
    /// rows; a pass that fails before leaves the committed state as it was.
    pub fn stage_state(&mut self, layer: usize) -> &mut [f32] {
        assert!(self.layouts[layer].state_floats > 0, "layer {layer} keeps no state");
        assert_eq!(self.state_len_tokens, self.len_tokens, "the state is at the committed length");
        let state = &mut self.states[layer];
        if !state.staged_in_pass {
            // `staged` no longer holds the state before the last pass.
            self.undo_len_tokens = None;
            state.staged.clear();
            state.staged.extend_from_slice(&state.committed);
            state.staged_in_pass = true;
        }
        &mut state.staged
    }

    /// Commits `n_tokens` written positions, and with them every layer's
    /// staged state, all at once.
    pub fn advance(&mut self, n_tokens: usize) {
        let new_len = self.len_tokens + n_tokens;
        assert!(new_len <= self.capacity_tokens, "reserve() first");
        self.assert_rows_written(new_len);
        if n_tokens > 0 && self.state_floats > 0 {
            for (layer, state) in self.states.iter_mut().enumerate() {
                if self.layouts[layer].state_floats == 0 {
                    continue;
                }
                assert!(state.staged_in_pass, "layer {layer}'s state staged in this pass");
                // A swap, not a copy: `staged` keeps the state the pass
                // started from, which `truncate` can go back to for free.
                std::mem::swap(&mut state.committed, &mut state.staged);
                state.staged_in_pass = false;
            }
            self.undo_len_tokens = Some(self.len_tokens);
        }
        self.len_tokens = new_len;
        self.state_len_tokens = new_len;
    }

    fn assert_rows_written(&self, new_len: usize) {
        for (layer, streams) in self.rows.iter().enumerate() {
            for (stream, dim) in streams.iter().zip(&self.layouts[layer].row_dims) {
                assert!(stream.len() >= new_len * dim, "every layer and stream written");
            }
        }
    }

    /// Records the committed state of every stateful layer at `len()`, so
    /// that [`Self::truncate`] can come back here. Does nothing for a cache
    /// without state, or at length 0 (the empty state is known). At most
    /// [`SNAPSHOTS_MAX`] are kept; the oldest goes first.
    pub fn snapshot(&mut self) {
        if self.state_floats == 0 || self.len_tokens == 0 {
            return;
        }
        assert_eq!(self.state_len_tokens, self.len_tokens, "the state is at the committed length");
        match self.snapshots.last() {
            // Snapshots past a truncation are dropped, so one at this length
            // holds this very state: nothing to copy.
            Some(last) if last.len_tokens == self.len_tokens => return,
            Some(last) => assert!(last.len_tokens < self.len_tokens, "snapshots ascend"),
            None => {}
        }
        // The evicted snapshot's buffer is reused: no allocation once full.
        let mut floats = if self.snapshots.len() == SNAPSHOTS_MAX {
            self.snapshots.remove(0).floats
        } else {
            Vec::with_capacity(self.state_floats)
        };
        floats.clear();
        for state in &self.states {
            floats.extend_from_slice(&state.committed);
        }
        self.snapshots.push(Snapshot { len_tokens: self.len_tokens, floats });
    }

    /// Lengths at which snapshots are kept, ascending.
    pub fn snapshot_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.snapshots.iter().map(|s| s.len_tokens)
    }

    /// Forgets every position from `len_tokens` on, and returns the length
    /// actually kept. Without state that is `min(len_tokens, len())`. With
    /// state, a cut below `len()` resumes from the longest prefix of at most
    /// `len_tokens` whose state is known: the start of the last pass, the
    /// latest snapshot, or the empty sequence; the caller runs the tokens
    /// from there to `len_tokens` again if it needs them.
    pub fn truncate(&mut self, len_tokens: usize) -> usize {
        if len_tokens >= self.len_tokens {
            // Rows written by an abandoned pass go; the state is untouched.
            self.cut_rows(self.len_tokens);
            return self.len_tokens;
        }
        self.resume_at_most(len_tokens)
    }

    /// Goes back to the longest prefix of at most `len_tokens` whose state
    /// is known (see [`Self::truncate`]), returning its length.
    fn resume_at_most(&mut self, len_tokens: usize) -> usize {
        assert!(len_tokens <= self.len_tokens);
        if self.state_floats == 0 {
            self.state_len_tokens = len_tokens;
            self.cut_rows(len_tokens);
            return len_tokens;
        }
        let undo = self.undo_len_tokens.filter(|&u| u <= len_tokens);
        let snapshot = self.snapshots.iter().rposition(|s| s.len_tokens <= len_tokens);
        let snapshot_len = snapshot.map_or(0, |i| self.snapshots[i].len_tokens);
        let kept = match undo {
            Some(undo_len) if undo_len >= snapshot_len => {
                for (state, layout) in self.states.iter_mut().zip(&self.layouts) {
                    if layout.state_floats > 0 {
                        std::mem::swap(&mut state.committed, &mut state.staged);
                    }
                }
                undo_len
            }
            _ => {
                let mut floats = snapshot.map(|i| self.snapshots[i].floats.as_slice());
                for state in &mut self.states {
                    let n = state.committed.len();
                    match &mut floats {
                        Some(f) => {
                            state.committed.copy_from_slice(&f[..n]);
                            *f = &f[n..];
                        }
                        None => state.committed.fill(0.0),
                    }
                }
                snapshot_len
            }
        };
        for state in &mut self.states {
            state.staged_in_pass = false;
        }
        self.undo_len_tokens = None;
        self.snapshots.retain(|s| s.len_tokens <= kept);
        self.state_len_tokens = kept;
        self.cut_rows(kept);
        kept
    }

    fn cut_rows(&mut self, len_tokens: usize) {
        self.len_tokens = len_tokens;
        for (streams, layout) in self.rows.iter_mut().zip(&self.layouts) {
            for (stream, dim) in streams.iter_mut().zip(&layout.row_dims) {
                stream.truncate(len_tokens * dim);
            }
        }
    }

    /// The latest snapshot: its length and the state of every stateful
    /// layer, concatenated in layer order.
    pub(crate) fn latest_snapshot(&self) -> Option<(usize, &[f32])> {
        self.snapshots.last().map(|s| (s.len_tokens, s.floats.as_slice()))
    }

    /// Commits `n_tokens` rows read from a session file, leaving the state
    /// behind: [`Self::finish_load`] puts it back in step.
    pub(crate) fn advance_loaded_rows(&mut self, n_tokens: usize) {
        let new_len = self.len_tokens + n_tokens;
        assert!(new_len <= self.capacity_tokens, "reserve() first");
        self.assert_rows_written(new_len);
        self.len_tokens = new_len;
    }

    /// Keeps a snapshot read from a session file (at most `len()`, after
    /// those loaded before).
    pub(crate) fn push_loaded_snapshot(&mut self, len_tokens: usize, floats: Vec<f32>) {
        assert_eq!(floats.len(), self.state_floats, "a state for every stateful layer");
        assert!(len_tokens > 0 && len_tokens <= self.len_tokens, "a snapshot of loaded rows");
        if let Some(last) = self.snapshots.last_mut() {
            assert!(last.len_tokens <= len_tokens, "snapshots ascend");
            if last.len_tokens == len_tokens {
                last.floats = floats;
                return;
            }
        }
        if self.snapshots.len() == SNAPSHOTS_MAX {
            self.snapshots.remove(0);
        }
        self.snapshots.push(Snapshot { len_tokens, floats });
    }

    /// Ends loading a session file: a cache with state resumes from its
    /// latest snapshot (or from empty), dropping the rows after it. Returns
    /// the length kept.
    pub(crate) fn finish_load(&mut self) -> usize {
        assert!(self.undo_len_tokens.is_none(), "nothing ran while loading");
        if self.state_floats == 0 {
            self.state_len_tokens = self.len_tokens;
            return self.len_tokens;
        }
        self.resume_at_most(self.len_tokens)
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
        assert_eq!(latent_only.layout(2).row_dims, &[576]);
        assert_eq!(latent_only.bytes_per_token(), 3 * 576 * 4);
        let dsa = KvCache::mla(3, 576, Some(128), 8);
        assert_eq!(dsa.layout(0).row_dims[LATENT], 576);
        assert_eq!(dsa.layout(0).row_dims[INDEX_KEYS], 128);
        assert_eq!(dsa.bytes_per_token(), 3 * (576 + 128) * 4);
    }

    #[test]
    fn overflowing_the_context_is_an_error() {
        let mut kv = KvCache::gqa(1, 1, 3);
        let err = kv.reserve(4).unwrap_err().to_string();
        assert!(err.contains("4 tokens needed") && err.contains("at most 3"), "{err}");
    }

    /// Attention rows, a recurrent state, and a layer with both.
    fn hybrid(capacity_tokens: usize) -> KvCache {
        KvCache::with_layers(
            vec![
                LayerLayout { row_dims: vec![2, 2], state_floats: 0 },
                LayerLayout { row_dims: vec![], state_floats: 3 },
                LayerLayout { row_dims: vec![1], state_floats: 2 },
            ],
            capacity_tokens,
        )
    }

    /// The recurrence of the test layers: each token folds into each float.
    fn step(state: &mut [f32], token: f32) {
        for (i, s) in state.iter_mut().enumerate() {
            *s = *s * 0.5 + token + i as f32;
        }
    }

    /// Runs `tokens` through every layer as a model pass would, committing
    /// unless `fail` (a pass that errs before `advance`).
    fn pass(kv: &mut KvCache, tokens: &[f32], fail: bool) {
        kv.reserve(tokens.len()).unwrap();
        for layer in 0..kv.n_layers() {
            for (stream, &dim) in kv.layout(layer).row_dims.clone().iter().enumerate() {
                let rows: Vec<f32> = tokens.iter().flat_map(|&t| std::iter::repeat_n(t, dim)).collect();
                kv.write(layer, stream, &rows);
            }
            if kv.layout(layer).state_floats > 0 {
                for &t in tokens {
                    step(kv.stage_state(layer), t);
                }
            }
        }
        if !fail {
            kv.advance(tokens.len());
        }
    }

    /// What every stateful layer's state is after `tokens`.
    fn expected_state(kv: &KvCache, tokens: &[f32]) -> Vec<Vec<f32>> {
        (0..kv.n_layers())
            .map(|layer| {
                let mut state = vec![0.0; kv.layout(layer).state_floats];
                tokens.iter().for_each(|&t| step(&mut state, t));
                state
            })
            .collect()
    }

    fn assert_at(kv: &KvCache, tokens: &[f32]) {
        assert_eq!(kv.len(), tokens.len());
        for (layer, want) in expected_state(kv, tokens).iter().enumerate() {
            assert_eq!(kv.state(layer), want.as_slice(), "layer {layer} after {tokens:?}");
        }
        assert_eq!(kv.rows(2, 0, tokens.len()), tokens);
    }

    #[test]
    fn a_state_commits_with_the_rows_and_a_failed_pass_leaves_it_untouched() {
        let mut kv = hybrid(16);
        assert_eq!(kv.state(1), &[0.0; 3], "a fresh state is zero");
        pass(&mut kv, &[1.0, 2.0], false);
        assert_at(&kv, &[1.0, 2.0]);
        pass(&mut kv, &[7.0, 7.0, 7.0], true);
        assert_at(&kv, &[1.0, 2.0]);
        // The next pass starts again from the committed state.
        pass(&mut kv, &[3.0], false);
        assert_at(&kv, &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn staging_twice_in_one_pass_returns_the_same_buffer_uncopied() {
        let mut kv = hybrid(4);
        kv.reserve(1).unwrap();
        kv.stage_state(1)[0] = 5.0;
        assert_eq!(kv.stage_state(1)[0], 5.0, "not copied again from the committed state");
        // A new pass (reserve) stages afresh.
        kv.reserve(1).unwrap();
        assert_eq!(kv.stage_state(1)[0], 0.0);
    }

    #[test]
    fn truncate_resumes_from_the_latest_snapshot_at_or_below_and_says_where() {
        let mut kv = hybrid(32);
        let tokens: Vec<f32> = (1..=12).map(|t| t as f32).collect();
        pass(&mut kv, &tokens[..4], false);
        kv.snapshot();
        pass(&mut kv, &tokens[4..8], false);
        kv.snapshot();
        pass(&mut kv, &tokens[8..], false);
        assert_eq!(kv.snapshot_lens().collect::<Vec<_>>(), [4, 8]);
        assert_eq!(kv.truncate(12), 12, "nothing to cut");
        assert_eq!(kv.truncate(10), 8);
        assert_at(&kv, &tokens[..8]);
        // Re-running the gap gives the state one pass would have.
        pass(&mut kv, &tokens[8..10], false);
        assert_at(&kv, &tokens[..10]);
        assert_eq!(kv.truncate(7), 4, "the snapshot at 8 is past the cut");
        assert_at(&kv, &tokens[..4]);
        assert_eq!(kv.snapshot_lens().collect::<Vec<_>>(), [4]);
        assert_eq!(kv.truncate(3), 0, "below every snapshot: the empty state");
        assert_at(&kv, &[]);
        assert_eq!(kv.snapshot_lens().count(), 0);
    }

    #[test]
    fn truncate_takes_back_the_last_pass_without_a_snapshot() {
        let mut kv = hybrid(16);
        pass(&mut kv, &[1.0, 2.0], false);
        pass(&mut kv, &[3.0, 4.0, 5.0], false);
        // The state the last pass started from is still staged: exact.
        assert_eq!(kv.truncate(2), 2);
        assert_at(&kv, &[1.0, 2.0]);
        // Only once: the way back is gone after use, and after a new pass stages.
        pass(&mut kv, &[3.0], false);
        kv.reserve(1).unwrap();
        kv.stage_state(1);
        assert_eq!(kv.truncate(2), 0);
        assert_at(&kv, &[]);
    }

    #[test]
    fn snapshots_are_bounded_and_one_at_the_same_length_is_kept() {
        let mut kv = hybrid(16);
        kv.snapshot();
        assert_eq!(kv.snapshot_lens().count(), 0, "the empty state needs no snapshot");
        for t in 1..=4 {
            pass(&mut kv, &[t as f32], false);
            kv.snapshot();
            kv.snapshot();
        }
        assert_eq!(kv.snapshot_lens().collect::<Vec<_>>(), [3, 4], "the latest {SNAPSHOTS_MAX}");
        assert_eq!(kv.truncate(3), 3);
        assert_at(&kv, &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn rows_only_caches_truncate_exactly_and_keep_no_snapshots() {
        let mut kv = KvCache::gqa(2, 2, 8);
        pass(&mut kv, &[1.0, 2.0, 3.0], false);
        kv.snapshot();
        assert_eq!(kv.snapshot_lens().count(), 0);
        assert_eq!((kv.state_bytes(), kv.state_bytes_max()), (0, 0));
        assert_eq!(kv.truncate(9), 3);
        assert_eq!(kv.truncate(1), 1);
        assert_eq!(kv.rows(1, VALUES, 1), &[1.0, 1.0]);
    }

    #[test]
    fn bytes_per_token_count_rows_and_state_bytes_every_copy_of_the_state() {
        let kv = hybrid(4);
        assert_eq!(kv.bytes_per_token(), (2 + 2 + 1) * 4);
        assert_eq!(kv.state_bytes(), (3 + 2) * 4);
        assert_eq!(kv.state_bytes_max(), (3 + 2) * 4 * (2 + SNAPSHOTS_MAX));
    }
}
