//! The KV cache: per layer, a list of typed parts ([`StatePart`]): rows per
//! token, a ring of the last rows, rows per group of tokens with a pending
//! buffer, a fixed-size state, token ids.
//!
//! The cache does not know which layer keeps what: a layer says its parts
//! and indexes them in its own order (keys and values, a latent, a
//! recurrent state). One type serves every kind, so persistence and
//! budgeting treat every family alike.
//!
//! Positions are written during a pass and become part of the sequence only
//! when [`SequenceState::advance`] commits them, all parts at once, so a failed
//! pass leaves the committed sequence untouched. A part that cannot be cut
//! back to any length (a ring past its window, a strided part inside a
//! group, a fixed state) makes the cache keep a few snapshots of it
//! ([`SequenceState::snapshot`], taken at turn boundaries), and
//! [`SequenceState::truncate`] resumes from the longest prefix it can restore,
//! saying which; the caller runs the rest again.

mod store;

use store::{Store, row_dim};

use crate::{Error, LayerLayout, Result, StatePart};

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

/// The state of every part with one ([`StatePart::state_floats`]) after the
/// first `len_tokens` tokens, concatenated layer by layer, part by part.
#[derive(Debug, Clone)]
struct Snapshot {
    len_tokens: usize,
    floats: Vec<f32>,
}

/// Every part of every layer for the tokens seen so far.
#[derive(Debug, Clone)]
pub struct SequenceState {
    layouts: Vec<LayerLayout>,
    capacity_tokens: usize,
    len_tokens: usize,
    /// `[layer][part]`.
    stores: Vec<Vec<Store>>,
    /// Bytes one token adds, all layers (see [`StatePart::bytes_per_token`]).
    bytes_per_token: usize,
    /// f32s of the state of every part with one: a snapshot's size.
    state_floats: usize,
    /// Ascending by length, all at most `len_tokens`, at most [`SNAPSHOTS_MAX`].
    snapshots: Vec<Snapshot>,
    /// The length before the last [`SequenceState::advance`] while every fixed
    /// state's `staged` still holds the state from then (and rings and
    /// strided parts their rows from then): a free way back from the last
    /// pass.
    undo_len_tokens: Option<usize>,
    /// The length the parts with state are at: `len_tokens`, except while a
    /// session file loads rows ahead of the state it restores at the end.
    state_len_tokens: usize,
}

impl SequenceState {
    /// An empty cache of `n_layers` layers that all keep `layout`, holding
    /// at most `capacity_tokens`.
    pub fn new(n_layers: usize, layout: LayerLayout, capacity_tokens: usize) -> Self {
        Self::with_layers(vec![layout; n_layers], capacity_tokens)
    }

    /// An empty cache where each layer keeps what its layout says, holding
    /// at most `capacity_tokens`. Memory grows with use, up to
    /// `capacity_tokens` × [`Self::bytes_per_token`] plus
    /// [`Self::state_bytes_max`].
    pub fn with_layers(layouts: Vec<LayerLayout>, capacity_tokens: usize) -> Self {
        let mut bytes_per_token = 0usize;
        let mut state_floats = 0usize;
        for (layer, layout) in layouts.iter().enumerate() {
            assert!(!layout.parts.is_empty(), "layer {layer} keeps something");
            for part in &layout.parts {
                // The layouts come from a model's config or a checked
                // session header: sizes past usize are a broken invariant,
                // not input.
                assert_eq!(part.invalid_reason(), None, "layer {layer}");
                bytes_per_token = bytes_per_token.checked_add(part.bytes_per_token()).expect("sizes fit usize");
                state_floats = state_floats.checked_add(part.state_floats()).expect("sizes fit usize");
            }
        }
        assert!(state_floats.checked_mul(size_of::<f32>() * STATE_COPIES_MAX).is_some(), "sizes in bytes fit usize");
        let stores = layouts.iter().map(|l| l.parts.iter().map(|&p| Store::new(p)).collect()).collect();
        Self {
            layouts,
            capacity_tokens,
            len_tokens: 0,
            stores,
            bytes_per_token,
            state_floats,
            snapshots: Vec::new(),
            undo_len_tokens: None,
            state_len_tokens: 0,
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

    /// Bytes one token adds across all layers' parts (their states aside).
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    /// Bytes of the committed state of every part with one: what a sequence
    /// holds whatever its length.
    pub fn state_bytes(&self) -> usize {
        self.state_floats * size_of::<f32>()
    }

    /// Bytes of state the cache may hold at once: [`STATE_COPIES_MAX`]
    /// copies (committed, staged, snapshots). What a memory budget reserves
    /// per sequence besides its rows. A ring or strided part holds the rows
    /// of its last pass beside its window until the next pass: a pass longer
    /// than the window is activations' share of the budget.
    pub fn state_bytes_max(&self) -> usize {
        // Checked at construction.
        self.state_bytes() * STATE_COPIES_MAX
    }

    /// Bytes of state held now: fixed states with their staged copies, the
    /// rows rings and strided parts hold beside their groups, and the
    /// snapshots.
    pub fn state_bytes_held(&self) -> usize {
        let held: usize = self.parts().map(|(_, store)| store.state_floats_held()).sum();
        let snapshots: usize = self.snapshots.iter().map(|s| s.floats.len()).sum();
        (held + snapshots) * size_of::<f32>()
    }

    fn part(&self, layer: usize, part: usize) -> StatePart {
        self.layouts[layer].parts[part]
    }

    /// Fails unless `n_tokens` more tokens fit. Starts a pass: states staged
    /// before are forgotten, and so is the way back from the last pass.
    pub fn reserve(&mut self, n_tokens: usize) -> Result<()> {
        for (layout, stores) in self.layouts.iter().zip(&mut self.stores) {
            for (&part, store) in layout.parts.iter().zip(stores) {
                store.start_pass(part, self.len_tokens);
            }
        }
        self.undo_len_tokens = None;
        let needed_tokens = self.len_tokens.saturating_add(n_tokens);
        if needed_tokens > self.capacity_tokens {
            return Err(Error::ContextFull { needed_tokens, capacity_tokens: self.capacity_tokens });
        }
        Ok(())
    }

    /// Stores per-token `rows` (`[n, dim]`) of a rows, ring or strided part
    /// for the uncommitted positions `len()..len() + n`.
    pub fn write(&mut self, layer: usize, part: usize, rows: &[f32]) {
        let kind = self.part(layer, part);
        self.assert_fits(rows.len() / row_dim(kind));
        self.stores[layer][part].write(kind, self.len_tokens, rows);
    }

    /// Stores a strided part's rows (`[g, dim]`) of the groups that the
    /// uncommitted positions complete, in order.
    pub fn write_groups(&mut self, layer: usize, part: usize, rows: &[f32]) {
        let kind = self.part(layer, part);
        self.stores[layer][part].write_groups(kind, self.len_tokens, rows);
    }

    /// Stores the ids of the uncommitted positions `len()..len() + n` in a
    /// token part.
    pub fn write_tokens(&mut self, layer: usize, part: usize, ids: &[u32]) {
        self.assert_fits(ids.len());
        let kind = self.part(layer, part);
        self.stores[layer][part].write_tokens(kind, self.len_tokens, ids);
    }

    fn assert_fits(&self, n_tokens: usize) {
        assert!(self.len_tokens + n_tokens <= self.capacity_tokens, "reserve() first");
    }

    /// Rows of a rows part for positions `0..n_tokens`.
    pub fn rows(&self, layer: usize, part: usize, n_tokens: usize) -> &[f32] {
        self.rows_between(layer, part, 0, n_tokens)
    }

    /// Rows of a rows or ring part for positions `from_tokens..to_tokens`
    /// (a ring holds its last `window` committed positions and the pass's).
    pub fn rows_between(&self, layer: usize, part: usize, from_tokens: usize, to_tokens: usize) -> &[f32] {
        self.stores[layer][part].rows_between(self.part(layer, part), from_tokens, to_tokens)
    }

    /// A strided part's group rows of the groups complete within the first
    /// `n_tokens` positions.
    pub fn groups(&self, layer: usize, part: usize, n_tokens: usize) -> &[f32] {
        self.stores[layer][part].groups(self.part(layer, part), n_tokens)
    }

    /// A strided part's per-token rows of the group not complete at
    /// `n_tokens` (fewer than `every`).
    pub fn pending(&self, layer: usize, part: usize, n_tokens: usize) -> &[f32] {
        self.stores[layer][part].pending(self.part(layer, part), n_tokens)
    }

    /// A token part's last `n` ids before position `n_tokens` (fewer near
    /// the start).
    pub fn tokens(&self, layer: usize, part: usize, n_tokens: usize) -> &[u32] {
        self.stores[layer][part].tokens(self.part(layer, part), n_tokens)
    }

    /// The committed fixed state of `layer`'s `part` (zeros while the cache
    /// is empty).
    pub fn state(&self, layer: usize, part: usize) -> &[f32] {
        assert_eq!(self.state_len_tokens, self.len_tokens, "the state is at the committed length");
        match &self.stores[layer][part] {
            Store::Fixed(fixed) => &fixed.committed,
            _ => panic!("layer {layer} part {part} is not a fixed state"),
        }
    }

    /// The fixed state of `layer`'s `part` for the current pass to update in
    /// place: a copy of the committed state the first time in a pass, the
    /// same buffer (not copied again) after. [`Self::advance`] commits it
    /// with the rows; a pass that fails before leaves the committed state as
    /// it was.
    pub fn stage_state(&mut self, layer: usize, part: usize) -> &mut [f32] {
        assert_eq!(self.state_len_tokens, self.len_tokens, "the state is at the committed length");
        let Store::Fixed(fixed) = &mut self.stores[layer][part] else {
            panic!("layer {layer} part {part} is not a fixed state");
        };
        if !fixed.staged_in_pass {
            // `staged` no longer holds the state before the last pass.
            self.undo_len_tokens = None;
            fixed.staged.clear();
            fixed.staged.extend_from_slice(&fixed.committed);
            fixed.staged_in_pass = true;
        }
        &mut fixed.staged
    }

    /// Commits `n_tokens` written positions, and with them every staged
    /// fixed state, all at once.
    pub fn advance(&mut self, n_tokens: usize) {
        let new_len = self.len_tokens + n_tokens;
        self.assert_fits(n_tokens);
        self.assert_written(new_len, true);
        let mut any_fixed = false;
        if n_tokens > 0 {
            for (layer, stores) in self.stores.iter_mut().enumerate() {
                for store in stores {
                    if let Store::Fixed(fixed) = store {
                        assert!(fixed.staged_in_pass, "layer {layer}'s state staged in this pass");
                        // A swap, not a copy: `staged` keeps the state the
                        // pass started from, which `truncate` can go back to
                        // for free.
                        std::mem::swap(&mut fixed.committed, &mut fixed.staged);
                        fixed.staged_in_pass = false;
                        any_fixed = true;
                    }
                }
            }
        }
        if any_fixed {
            self.undo_len_tokens = Some(self.len_tokens);
        }
        self.len_tokens = new_len;
        self.state_len_tokens = new_len;
    }

    /// Asserts every part written up to `new_len`; parts with state only
    /// when `with_state` (they are behind while a session file loads).
    fn assert_written(&self, new_len: usize, with_state: bool) {
        for (part, store) in self.parts() {
            let behind = !with_state && part.has_state();
            let written = behind || store.written(part, new_len);
            assert!(written && store.groups_written(part, new_len), "every {part:?} written");
        }
    }

    /// Records the state of every part with one at `len()`, so that
    /// [`Self::truncate`] can come back here. Does nothing for a cache
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
        for (part, store) in self.parts() {
            store.snapshot_into(part, self.len_tokens, &mut floats);
        }
        self.snapshots.push(Snapshot { len_tokens: self.len_tokens, floats });
    }

    /// Lengths at which snapshots are kept, ascending.
    pub fn snapshot_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.snapshots.iter().map(|s| s.len_tokens)
    }

    /// Forgets every position from `len_tokens` on, and returns the length
    /// actually kept: the longest prefix of at most `len_tokens` that every
    /// part reaches, by its own rewind rule, by the undo of the last pass,
    /// or from the latest snapshot at or below it (else the empty
    /// sequence). The caller runs the tokens from there to `len_tokens`
    /// again if it needs them.
    pub fn truncate(&mut self, len_tokens: usize) -> usize {
        if len_tokens >= self.len_tokens {
            // Positions written by an abandoned pass go; states are untouched.
            self.cut(self.len_tokens);
            return self.len_tokens;
        }
        self.resume_at_most(len_tokens)
    }

    /// Whether every part reaches `len_tokens` by its own rewind rule; a
    /// fixed state may be left to the undo (`but_fixed`).
    fn reaches(&self, len_tokens: usize, but_fixed: bool) -> bool {
        self.state_len_tokens == self.len_tokens
            && self.parts().all(|(part, store)| {
                (but_fixed && matches!(store, Store::Fixed(_))) || store.reaches(part, len_tokens, self.len_tokens)
            })
    }

    /// The longest length of at most `len_tokens` every part reaches by its
    /// own rewind rule, if any.
    fn longest_reached(&self, len_tokens: usize) -> Option<usize> {
        if self.state_len_tokens != self.len_tokens {
            return None;
        }
        let mut len = len_tokens;
        // Each round only shortens `len`, and stops once every part agrees.
        loop {
            let mut agreed = len;
            for (part, store) in self.parts() {
                agreed = agreed.min(store.longest_reached(part, len, self.len_tokens)?);
            }
            if agreed == len {
                return Some(len);
            }
            len = agreed;
        }
    }

    /// Every part of every layer with its store, layer by layer.
    fn parts(&self) -> impl Iterator<Item = (StatePart, &Store)> {
        self.layouts.iter().zip(&self.stores).flat_map(|(layout, stores)| layout.parts.iter().copied().zip(stores))
    }

    /// Cuts every part back to `len_tokens`, which each reaches.
    fn cut(&mut self, len_tokens: usize) {
        for (layout, stores) in self.layouts.iter().zip(&mut self.stores) {
            for (&part, store) in layout.parts.iter().zip(stores) {
                store.cut(part, len_tokens);
            }
        }
        self.len_tokens = len_tokens;
    }

    /// Goes back to the longest prefix of at most `len_tokens` whose state
    /// is known (see [`Self::truncate`]), returning its length.
    fn resume_at_most(&mut self, len_tokens: usize) -> usize {
        assert!(len_tokens <= self.len_tokens);
        let undo = self.undo_len_tokens.filter(|&u| u <= len_tokens && self.reaches(u, true));
        let snapshot = self.snapshots.iter().rposition(|s| s.len_tokens <= len_tokens);
        let snapshot_len = snapshot.map_or(0, |i| self.snapshots[i].len_tokens);
        let kept = match self.longest_reached(len_tokens) {
            // Cutting is cheapest: taken whenever it keeps as much.
            Some(reached) if undo.is_none_or(|u| reached >= u) && reached >= snapshot_len => {
                self.cut(reached);
                reached
            }
            _ => match undo {
                Some(undo_len) if undo_len >= snapshot_len => {
                    for store in self.stores.iter_mut().flatten() {
                        if let Store::Fixed(fixed) = store {
                            std::mem::swap(&mut fixed.committed, &mut fixed.staged);
                        }
                    }
                    self.cut(undo_len);
                    undo_len
                }
                _ => {
                    let mut floats = snapshot.map(|i| self.snapshots[i].floats.as_slice());
                    for (layout, stores) in self.layouts.iter().zip(&mut self.stores) {
                        for (&part, store) in layout.parts.iter().zip(stores) {
                            let n = part.state_floats();
                            store.restore(part, snapshot_len, floats.map(|f| &f[..n]));
                            floats = floats.map(|f| &f[n..]);
                        }
                    }
                    self.len_tokens = snapshot_len;
                    snapshot_len
                }
            },
        };
        for store in self.stores.iter_mut().flatten() {
            if let Store::Fixed(fixed) = store {
                fixed.staged_in_pass = false;
            }
        }
        self.undo_len_tokens = None;
        self.snapshots.retain(|s| s.len_tokens <= kept);
        self.state_len_tokens = kept;
        kept
    }

    /// The latest snapshot: its length and its state (see [`Snapshot`]).
    pub(crate) fn latest_snapshot(&self) -> Option<(usize, &[f32])> {
        self.snapshots.last().map(|s| (s.len_tokens, s.floats.as_slice()))
    }

    /// Commits `n_tokens` positions read from a session file, leaving the
    /// parts with state behind: [`Self::finish_load`] puts them back in step.
    pub(crate) fn advance_loaded_rows(&mut self, n_tokens: usize) {
        let new_len = self.len_tokens + n_tokens;
        self.assert_fits(n_tokens);
        self.assert_written(new_len, false);
        self.len_tokens = new_len;
    }

    /// Keeps a snapshot read from a session file (at most `len()`, after
    /// those loaded before).
    pub(crate) fn push_loaded_snapshot(&mut self, len_tokens: usize, floats: Vec<f32>) {
        assert_eq!(floats.len(), self.state_floats, "a state for every part with one");
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
    /// latest snapshot (or from empty), dropping the positions after it.
    /// Returns the length kept.
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
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{assert_at, run};
    use super::*;

    const KEYS: usize = 0;
    const VALUES: usize = 1;

    fn rows(dims: &[usize]) -> LayerLayout {
        LayerLayout::new(dims.iter().map(|&dim| StatePart::Rows { dim }).collect())
    }

    #[test]
    fn positions_commit_only_on_advance() {
        let mut kv = SequenceState::new(2, rows(&[2, 3]), 4);
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
    fn bytes_per_token_sum_every_part_of_every_layer() {
        let latent_only = SequenceState::new(3, rows(&[576]), 8);
        assert_eq!(latent_only.bytes_per_token(), 3 * 576 * 4);
        let with_index_keys = SequenceState::new(3, rows(&[576, 128]), 8);
        assert_eq!(with_index_keys.bytes_per_token(), 3 * (576 + 128) * 4);
    }

    #[test]
    fn overflowing_the_context_is_an_error() {
        let mut kv = SequenceState::new(1, rows(&[1, 1]), 3);
        let err = kv.reserve(4).unwrap_err().to_string();
        assert!(err.contains("4 tokens needed") && err.contains("at most 3"), "{err}");
    }

    /// Attention rows, a recurrent state, and a layer with both.
    fn hybrid(capacity_tokens: usize) -> SequenceState {
        SequenceState::with_layers(
            vec![
                rows(&[2, 2]),
                LayerLayout::new(vec![StatePart::Fixed { floats: 3 }]),
                LayerLayout::new(vec![StatePart::Rows { dim: 1 }, StatePart::Fixed { floats: 2 }]),
            ],
            capacity_tokens,
        )
    }

    #[test]
    fn a_state_commits_with_the_rows_and_a_failed_pass_leaves_it_untouched() {
        let mut kv = hybrid(16);
        assert_eq!(kv.state(1, 0), &[0.0; 3], "a fresh state is zero");
        run(&mut kv, 2, false);
        assert_at(&kv, 2);
        run(&mut kv, 3, true);
        assert_at(&kv, 2);
        // The next pass starts again from the committed state.
        run(&mut kv, 1, false);
        assert_at(&kv, 3);
    }

    #[test]
    fn staging_twice_in_one_pass_returns_the_same_buffer_uncopied() {
        let mut kv = hybrid(4);
        kv.reserve(1).unwrap();
        kv.stage_state(1, 0)[0] = 5.0;
        assert_eq!(kv.stage_state(1, 0)[0], 5.0, "not copied again from the committed state");
        // A new pass (reserve) stages afresh.
        kv.reserve(1).unwrap();
        assert_eq!(kv.stage_state(1, 0)[0], 0.0);
    }

    #[test]
    fn truncate_resumes_from_the_latest_snapshot_at_or_below_and_says_where() {
        let mut kv = hybrid(32);
        run(&mut kv, 4, false);
        kv.snapshot();
        run(&mut kv, 4, false);
        kv.snapshot();
        run(&mut kv, 4, false);
        assert_eq!(kv.snapshot_lens().collect::<Vec<_>>(), [4, 8]);
        assert_eq!(kv.truncate(12), 12, "nothing to cut");
        assert_eq!(kv.truncate(10), 8);
        assert_at(&kv, 8);
        // Re-running the gap gives the state one pass would have.
        run(&mut kv, 2, false);
        assert_at(&kv, 10);
        assert_eq!(kv.truncate(7), 4, "the snapshot at 8 is past the cut");
        assert_at(&kv, 4);
        assert_eq!(kv.snapshot_lens().collect::<Vec<_>>(), [4]);
        assert_eq!(kv.truncate(3), 0, "below every snapshot: the empty state");
        assert_at(&kv, 0);
        assert_eq!(kv.snapshot_lens().count(), 0);
    }

    #[test]
    fn truncate_takes_back_the_last_pass_without_a_snapshot() {
        let mut kv = hybrid(16);
        run(&mut kv, 2, false);
        run(&mut kv, 3, false);
        // The state the last pass started from is still staged: exact.
        assert_eq!(kv.truncate(2), 2);
        assert_at(&kv, 2);
        // Only once: the way back is gone after use, and after a new pass stages.
        run(&mut kv, 1, false);
        kv.reserve(1).unwrap();
        kv.stage_state(1, 0);
        assert_eq!(kv.truncate(2), 0);
        assert_at(&kv, 0);
    }

    #[test]
    fn snapshots_are_bounded_and_one_at_the_same_length_is_kept() {
        let mut kv = hybrid(16);
        kv.snapshot();
        assert_eq!(kv.snapshot_lens().count(), 0, "the empty state needs no snapshot");
        for _ in 1..=4 {
            run(&mut kv, 1, false);
            kv.snapshot();
            kv.snapshot();
        }
        assert_eq!(kv.snapshot_lens().collect::<Vec<_>>(), [3, 4], "the latest {SNAPSHOTS_MAX}");
        assert_eq!(kv.truncate(3), 3);
        assert_at(&kv, 3);
    }

    #[test]
    fn rows_only_caches_truncate_exactly_and_keep_no_snapshots() {
        let mut kv = SequenceState::new(2, rows(&[2, 2]), 8);
        run(&mut kv, 3, false);
        kv.snapshot();
        assert_eq!(kv.snapshot_lens().count(), 0);
        assert_eq!((kv.state_bytes(), kv.state_bytes_max()), (0, 0));
        assert_eq!(kv.truncate(9), 3);
        assert_eq!(kv.truncate(1), 1);
        assert_at(&kv, 1);
    }

    #[test]
    fn bytes_per_token_count_rows_and_state_bytes_every_copy_of_the_state() {
        let kv = hybrid(4);
        assert_eq!(kv.bytes_per_token(), (2 + 2 + 1) * 4);
        assert_eq!(kv.state_bytes(), (3 + 2) * 4);
        assert_eq!(kv.state_bytes_max(), (3 + 2) * 4 * (2 + SNAPSHOTS_MAX));
    }

    fn one_part(part: StatePart) -> SequenceState {
        SequenceState::with_layers(vec![LayerLayout::new(vec![StatePart::Rows { dim: 1 }, part])], 64)
    }

    #[test]
    fn a_ring_keeps_its_window_and_cuts_back_only_within_it() {
        let mut kv = one_part(StatePart::Ring { dim: 2, window: 4 });
        run(&mut kv, 3, false);
        assert_at(&kv, 3);
        run(&mut kv, 5, false);
        assert_at(&kv, 8);
        assert_eq!(kv.truncate(3), 3, "the window before the last pass is held until the next");
        assert_at(&kv, 3);
        run(&mut kv, 5, false);
        run(&mut kv, 1, false);
        assert_at(&kv, 9);
        assert_eq!(kv.truncate(7), 0, "rows 3.. went when the pass at 8 started, and no snapshot");
        assert_at(&kv, 0);
        run(&mut kv, 6, false);
        kv.snapshot();
        run(&mut kv, 1, false);
        run(&mut kv, 1, false);
        run(&mut kv, 3, false);
        assert_eq!(kv.truncate(7), 6, "past the window: the snapshot");
        assert_at(&kv, 6);
        run(&mut kv, 4, false);
        assert_at(&kv, 10);
        assert_eq!(kv.state_bytes(), 4 * 2 * 4);
        assert_eq!(kv.bytes_per_token(), 4, "the rows part alone grows");
    }

    #[test]
    fn a_strided_part_keeps_a_row_per_group_and_the_pending_rows() {
        let mut kv = one_part(StatePart::Strided { dim: 2, every: 3 });
        run(&mut kv, 2, false);
        assert_at(&kv, 2);
        run(&mut kv, 5, false);
        assert_at(&kv, 7);
        assert_eq!(kv.truncate(4), 4, "within the pending rows the last pass holds");
        assert_at(&kv, 4);
        kv.snapshot();
        run(&mut kv, 5, false);
        run(&mut kv, 1, false);
        assert_eq!(kv.truncate(8), 6, "inside a group no longer held: the multiple of every below");
        assert_at(&kv, 6);
        run(&mut kv, 1, false);
        run(&mut kv, 1, false);
        run(&mut kv, 3, false);
        run(&mut kv, 1, false);
        assert_eq!(kv.truncate(10), 10, "within the pending rows held");
        assert_at(&kv, 10);
        assert_eq!(kv.truncate(5), 4, "the snapshot inside a group beats the multiple below");
        assert_at(&kv, 4);
        run(&mut kv, 3, true);
        assert_at(&kv, 4);
        run(&mut kv, 3, false);
        assert_at(&kv, 7);
        assert_eq!((kv.bytes_per_token(), kv.state_bytes()), (4 + 3, 2 * 2 * 4));
    }

    #[test]
    fn token_ids_cut_back_to_any_length() {
        let mut kv = one_part(StatePart::Tokens { n: 3 });
        run(&mut kv, 2, false);
        assert_at(&kv, 2);
        run(&mut kv, 6, false);
        assert_at(&kv, 8);
        run(&mut kv, 2, true);
        assert_eq!(kv.truncate(5), 5);
        assert_at(&kv, 5);
        assert_eq!(kv.snapshot_lens().count(), 0);
        assert_eq!((kv.bytes_per_token(), kv.state_bytes()), (4 + 4, 0));
    }

    #[test]
    fn every_kind_of_part_together_resumes_at_the_longest_length_all_reach() {
        let layouts = vec![
            LayerLayout::new(vec![
                StatePart::Rows { dim: 2 },
                StatePart::Ring { dim: 1, window: 3 },
                StatePart::Tokens { n: 2 },
            ]),
            LayerLayout::new(vec![StatePart::Strided { dim: 2, every: 2 }, StatePart::Fixed { floats: 2 }]),
        ];
        let mut kv = SequenceState::with_layers(layouts, 64);
        run(&mut kv, 5, false);
        kv.snapshot();
        run(&mut kv, 4, false);
        // Back by the undo: the ring and the strided part still hold the
        // pass's start and the fixed state its staged copy.
        assert_eq!(kv.truncate(5), 5);
        assert_at(&kv, 5);
        run(&mut kv, 4, false);
        run(&mut kv, 1, false);
        assert_eq!(kv.truncate(7), 5, "the fixed state reaches only the snapshot");
        assert_at(&kv, 5);
        run(&mut kv, 2, false);
        assert_at(&kv, 7);
        let held_floats = 2 + 2 + 3 + 2 * 2;
        assert!(kv.state_bytes_held() >= held_floats * 4);
    }
}
