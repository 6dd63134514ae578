//! The storage of one part of one layer, and how each kind writes, commits,
//! cuts back, snapshots and restores. [`super::SequenceState`] runs the protocol
//! (passes, the undo, snapshots) over these.

use crate::StatePart;

/// The data of one [`StatePart`]. Positions past the committed length are
/// the current pass's, until it commits or the next write overwrites them.
#[derive(Debug, Clone)]
pub(super) enum Store {
    /// `[positions, dim]` from position 0.
    Rows(Vec<f32>),
    /// `[positions, dim]` from position `first`.
    Ring { rows: Vec<f32>, first: usize },
    /// `groups`: `[complete groups, dim]`; `pending`: `[positions, dim]`
    /// from position `first`, which is a multiple of `every` once a pass
    /// starts (rows of complete groups are dropped then).
    Strided { groups: Vec<f32>, pending: Vec<f32>, first: usize },
    /// The committed state and the one the current pass updates.
    Fixed(Fixed),
    /// Token ids from position 0.
    Tokens(Vec<u32>),
}

/// A fixed state and its staged copy (see [`super::SequenceState::stage_state`]).
#[derive(Debug, Clone)]
pub(super) struct Fixed {
    /// The state after the committed tokens.
    pub committed: Vec<f32>,
    /// The state the current pass updates; after a commit it holds the state
    /// the pass started from, until the next pass stages.
    pub staged: Vec<f32>,
    /// Whether `staged` was copied from `committed` in this pass.
    pub staged_in_pass: bool,
}

impl Store {
    /// An empty store of `part`; a fixed state starts at zero (its pages are
    /// not touched until a pass writes them).
    pub fn new(part: StatePart) -> Self {
        match part {
            StatePart::Rows { .. } => Self::Rows(Vec::new()),
            StatePart::Ring { .. } => Self::Ring { rows: Vec::new(), first: 0 },
            StatePart::Strided { .. } => Self::Strided { groups: Vec::new(), pending: Vec::new(), first: 0 },
            StatePart::Fixed { floats } => {
                Self::Fixed(Fixed { committed: vec![0.0; floats], staged: Vec::new(), staged_in_pass: false })
            }
            StatePart::Tokens { .. } => Self::Tokens(Vec::new()),
        }
    }

    /// Stores per-token `rows` (`[n, dim]`) for positions `len..len + n`.
    pub fn write(&mut self, part: StatePart, len: usize, rows: &[f32]) {
        let (stored, first) = match self {
            Self::Rows(stored) => (stored, 0),
            Self::Ring { rows, first } => (rows, *first),
            Self::Strided { pending, first, .. } => (pending, *first),
            _ => panic!("{part:?} keeps no per-token rows"),
        };
        let dim = row_dim(part);
        assert_eq!(rows.len() % dim, 0, "whole rows");
        assert!(first <= len, "rows up to the committed length are held");
        stored.truncate((len - first) * dim);
        assert_eq!(stored.len(), (len - first) * dim, "every committed position is held");
        stored.extend_from_slice(rows);
    }

    /// Stores a strided part's rows (`[g, dim]`) of the groups that complete
    /// after the committed `len`.
    pub fn write_groups(&mut self, part: StatePart, len: usize, rows: &[f32]) {
        let (Self::Strided { groups, .. }, StatePart::Strided { dim, every }) = (self, part) else {
            panic!("{part:?} keeps no groups");
        };
        assert_eq!(rows.len() % dim, 0, "whole rows");
        groups.truncate(len / every * dim);
        groups.extend_from_slice(rows);
    }

    /// Stores `ids` for positions `len..len + n`.
    pub fn write_tokens(&mut self, part: StatePart, len: usize, ids: &[u32]) {
        let Self::Tokens(stored) = self else { panic!("{part:?} keeps no token ids") };
        stored.truncate(len);
        stored.extend_from_slice(ids);
    }

    /// Rows of positions `from..to` (a rows or ring part).
    pub fn rows_between(&self, part: StatePart, from: usize, to: usize) -> &[f32] {
        let (stored, first) = match self {
            Self::Rows(stored) => (stored, 0),
            Self::Ring { rows, first } => (rows, *first),
            _ => panic!("{part:?} keeps no rows by position"),
        };
        let dim = row_dim(part);
        assert!(first <= from && from <= to, "positions {from}..{to} of {part:?} are held (from {first})");
        &stored[(from - first) * dim..(to - first) * dim]
    }

    /// A strided part's group rows of the groups complete within `n_tokens`.
    pub fn groups(&self, part: StatePart, n_tokens: usize) -> &[f32] {
        let (Self::Strided { groups, .. }, StatePart::Strided { dim, every }) = (self, part) else {
            panic!("{part:?} keeps no groups");
        };
        &groups[..n_tokens / every * dim]
    }

    /// A strided part's per-token rows of the group not complete at `n_tokens`.
    pub fn pending(&self, part: StatePart, n_tokens: usize) -> &[f32] {
        let (Self::Strided { pending, first, .. }, StatePart::Strided { dim, every }) = (self, part) else {
            panic!("{part:?} keeps no pending rows");
        };
        let from = n_tokens / every * every;
        assert!(*first <= from, "the pending rows at {n_tokens} are held (from {first})");
        &pending[(from - first) * dim..(n_tokens - first) * dim]
    }

    /// The last `n` ids (fewer at the start) before `n_tokens`.
    pub fn tokens(&self, part: StatePart, n_tokens: usize) -> &[u32] {
        let (Self::Tokens(ids), StatePart::Tokens { n }) = (self, part) else {
            panic!("{part:?} keeps no token ids");
        };
        &ids[n_tokens.saturating_sub(n)..n_tokens]
    }

    /// Whether positions up to `len` are written: every one of rows and ids,
    /// and every complete group's row. A fixed state is checked by the cache
    /// (it is staged, not written), and so are parts behind while loading.
    pub fn written(&self, part: StatePart, len: usize) -> bool {
        match (self, part) {
            (Self::Rows(rows), StatePart::Rows { dim }) => rows.len() >= len * dim,
            (Self::Ring { rows, first }, StatePart::Ring { dim, .. })
            | (Self::Strided { pending: rows, first, .. }, StatePart::Strided { dim, .. }) => {
                first + rows.len() / dim >= len
            }
            (Self::Tokens(ids), _) => ids.len() >= len,
            (Self::Fixed(_), _) => true,
            _ => unreachable!("a store of its own part"),
        }
    }

    /// Whether a strided part's group rows up to `len` are written.
    pub fn groups_written(&self, part: StatePart, len: usize) -> bool {
        match (self, part) {
            (Self::Strided { groups, .. }, StatePart::Strided { dim, every }) => groups.len() >= len / every * dim,
            _ => true,
        }
    }

    /// Starts a pass at the committed `len`: a ring drops rows older than
    /// its window, a strided part the per-token rows of complete groups, a
    /// fixed state its staged copy's claim to this pass.
    pub fn start_pass(&mut self, part: StatePart, len: usize) {
        match (self, part) {
            (Self::Ring { rows, first }, StatePart::Ring { dim, window }) => {
                drop_before(rows, first, dim, len.saturating_sub(window));
            }
            (Self::Strided { pending, first, .. }, StatePart::Strided { dim, every }) => {
                drop_before(pending, first, dim, len / every * every);
            }
            (Self::Fixed(fixed), _) => fixed.staged_in_pass = false,
            _ => {}
        }
    }

    /// Whether the part can be cut back to `len` from what it holds (its
    /// rewind rule), with its state at the committed length `committed`.
    pub fn reaches(&self, part: StatePart, len: usize, committed: usize) -> bool {
        assert!(len <= committed);
        match (self, part) {
            (Self::Rows(_) | Self::Tokens(_), _) => true,
            (Self::Ring { first, .. }, StatePart::Ring { window, .. }) => *first <= len.saturating_sub(window),
            (Self::Strided { first, .. }, StatePart::Strided { every, .. }) => {
                len.is_multiple_of(every) || *first <= len / every * every
            }
            (Self::Fixed(_), _) => len == committed,
            _ => unreachable!("a store of its own part"),
        }
    }

    /// The longest length of at most `len` the part [`Self::reaches`], if
    /// any: a strided part falls back to the multiple of `every` below; a
    /// ring reaches shorter lengths only if it reaches `len`.
    pub fn longest_reached(&self, part: StatePart, len: usize, committed: usize) -> Option<usize> {
        if self.reaches(part, len, committed) {
            return Some(len);
        }
        match part {
            StatePart::Strided { every, .. } => Some(len / every * every),
            _ => None,
        }
    }

    /// Cuts the part back to `len`, which it [`Self::reaches`].
    pub fn cut(&mut self, part: StatePart, len: usize) {
        match (self, part) {
            (Self::Rows(rows), StatePart::Rows { dim }) => rows.truncate(len * dim),
            (Self::Ring { rows, first }, StatePart::Ring { dim, .. }) => rows.truncate((len - *first) * dim),
            (Self::Strided { groups, pending, first }, StatePart::Strided { dim, every }) => {
                groups.truncate(len / every * dim);
                if *first <= len {
                    pending.truncate((len - *first) * dim);
                } else {
                    // A multiple of `every`: nothing pending.
                    pending.clear();
                    *first = len;
                }
            }
            (Self::Tokens(ids), _) => ids.truncate(len),
            (Self::Fixed(_), _) => {}
            _ => unreachable!("a store of its own part"),
        }
    }

    /// Appends the part's state at the committed `len` to `out`
    /// ([`StatePart::state_floats`] of them): a ring's last `window` rows,
    /// zeros before the first token; a strided part's pending rows, zeros
    /// after them; a fixed state.
    pub fn snapshot_into(&self, part: StatePart, len: usize, out: &mut Vec<f32>) {
        let start = out.len();
        match (self, part) {
            (Self::Ring { .. }, StatePart::Ring { window, .. }) => {
                let held = len.min(window);
                out.resize(start + part.state_floats() - held * row_dim(part), 0.0);
                out.extend_from_slice(self.rows_between(part, len - held, len));
            }
            (Self::Strided { .. }, _) => {
                out.extend_from_slice(self.pending(part, len));
                out.resize(start + part.state_floats(), 0.0);
            }
            (Self::Fixed(fixed), _) => out.extend_from_slice(&fixed.committed),
            _ => {}
        }
        debug_assert_eq!(out.len() - start, part.state_floats());
    }

    /// Puts the part back at `len`, with the state a snapshot there holds
    /// (`state`, [`StatePart::state_floats`] of them), or empty at 0.
    pub fn restore(&mut self, part: StatePart, len: usize, state: Option<&[f32]>) {
        assert_eq!(state.is_none(), len == 0, "a snapshot, or the empty sequence");
        let state = state.unwrap_or(&[]);
        match (self, part) {
            (Self::Ring { rows, first }, StatePart::Ring { dim, window }) => {
                let held = len.min(window);
                rows.clear();
                rows.extend_from_slice(&state[state.len() - held * dim..]);
                *first = len - held;
            }
            (Self::Strided { groups, pending, first }, StatePart::Strided { dim, every }) => {
                groups.truncate(len / every * dim);
                pending.clear();
                pending.extend_from_slice(&state[..len % every * dim]);
                *first = len / every * every;
            }
            (Self::Fixed(fixed), _) if len == 0 => fixed.committed.fill(0.0),
            (Self::Fixed(fixed), _) => fixed.committed.copy_from_slice(state),
            (store, _) => store.cut(part, len),
        }
    }

    /// f32s held beyond rows that grow with the length: a fixed state with
    /// its staged copy, a ring's rows, a strided part's pending rows.
    pub fn state_floats_held(&self) -> usize {
        match self {
            Self::Fixed(fixed) => fixed.committed.len() + fixed.staged.len(),
            Self::Ring { rows, .. } => rows.len(),
            Self::Strided { pending, .. } => pending.len(),
            Self::Rows(_) | Self::Tokens(_) => 0,
        }
    }
}

/// The width of a part's per-token rows.
pub(super) fn row_dim(part: StatePart) -> usize {
    part.row_dim().unwrap_or_else(|| panic!("{part:?} keeps no per-token rows"))
}

/// Drops the rows (`[positions, dim]` from `first`) before position `to`,
/// as far as they are held.
fn drop_before(rows: &mut Vec<f32>, first: &mut usize, dim: usize, to: usize) {
    let dropped = to.saturating_sub(*first).min(rows.len() / dim);
    if dropped > 0 {
        rows.drain(..dropped * dim);
        *first += dropped;
    }
}
