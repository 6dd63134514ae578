//! What a layer keeps per sequence, as a list of typed parts. Each part has
//! its own rewind rule, its own cost in bytes per token and per sequence,
//! and its own share of a snapshot; the cache, its persistence and the
//! budget read them from here, so a new kind of state touches this crate
//! alone.

/// One kind of per-sequence state a layer keeps. Rows are f32s; positions
/// are token positions in the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatePart {
    /// One row of `dim` per token, every token kept: cut back to any length.
    Rows { dim: usize },
    /// One row of `dim` per token, only the last `window` kept: cut back to
    /// a length whose last `window` rows are still held, else only to a
    /// snapshot.
    Ring { dim: usize, window: usize },
    /// One row of `dim` per complete group of `every` tokens (a compressed
    /// group, written by the layer) and, until a group completes, the
    /// per-token rows of its tokens (the pending buffer): cut back to a
    /// multiple of `every`, or within the pending rows still held, else only
    /// to a snapshot.
    Strided { dim: usize, every: usize },
    /// A state of `floats` that every token updates in place: back only by
    /// the undo of the last pass or to a snapshot.
    Fixed { floats: usize },
    /// The ids of the last `n` tokens. Every committed id is kept (4 bytes a
    /// token), so it cuts back to any length.
    Tokens { n: usize },
}

impl StatePart {
    /// The width of the part's per-token rows (rows, ring, strided).
    pub fn row_dim(&self) -> Option<usize> {
        match *self {
            Self::Rows { dim } | Self::Ring { dim, .. } | Self::Strided { dim, .. } => Some(dim),
            Self::Fixed { .. } | Self::Tokens { .. } => None,
        }
    }

    /// Bytes the part grows by per token, amortized (a strided part's group
    /// row, rounded up per token).
    pub fn bytes_per_token(&self) -> usize {
        match *self {
            Self::Rows { dim } => dim * size_of::<f32>(),
            Self::Strided { dim, every } => (dim * size_of::<f32>()).div_ceil(every),
            Self::Tokens { .. } => size_of::<u32>(),
            Self::Ring { .. } | Self::Fixed { .. } => 0,
        }
    }

    /// Bytes of the part's per-sequence state, whatever the length: what a
    /// snapshot of it holds.
    pub fn bytes_per_sequence(&self) -> usize {
        self.state_floats() * size_of::<f32>()
    }

    /// f32s of the part's per-sequence state: the last `window` rows of a
    /// ring, the pending rows of a strided part (at most `every - 1`), a
    /// fixed state. Rows and token ids are cut back, never snapshot.
    pub fn state_floats(&self) -> usize {
        match *self {
            Self::Ring { dim, window } => window * dim,
            Self::Strided { dim, every } => (every - 1) * dim,
            Self::Fixed { floats } => floats,
            Self::Rows { .. } | Self::Tokens { .. } => 0,
        }
    }

    /// Whether the part has per-sequence state, so that a cache holding it
    /// keeps snapshots.
    pub fn has_state(&self) -> bool {
        self.state_floats() > 0
    }

    /// f32s the part adds to the record of the token at `position` in a
    /// session file: a row per token, or a strided part's group row on the
    /// last token of each group. Rings, states and token ids are not in
    /// token records (the state records and the records' token ids hold
    /// them).
    pub fn record_floats(&self, position: usize) -> usize {
        match *self {
            Self::Rows { dim } => dim,
            Self::Strided { dim, every } if (position + 1).is_multiple_of(every) => dim,
            _ => 0,
        }
    }

    /// The most f32s the part adds to one token record.
    pub fn record_floats_max(&self) -> usize {
        match *self {
            Self::Rows { dim } | Self::Strided { dim, .. } => dim,
            _ => 0,
        }
    }

    /// Why the part cannot be kept (a zero size, or sizes whose products
    /// overflow), if it cannot. The sizes come from a model's config or a
    /// session file.
    pub fn invalid_reason(&self) -> Option<String> {
        let (sizes, product) = match *self {
            Self::Rows { dim } => ([dim, 1], Some(dim)),
            Self::Ring { dim, window } => ([dim, window], dim.checked_mul(window)),
            Self::Strided { dim, every } => ([dim, every], dim.checked_mul(every)),
            Self::Fixed { floats } => ([floats, 1], Some(floats)),
            Self::Tokens { n } => ([n, 1], Some(n)),
        };
        let bytes = product.and_then(|floats| floats.checked_mul(size_of::<f32>()));
        if sizes.contains(&0) || bytes.is_none() {
            return Some(format!("{self:?} has a zero size or more bytes than a usize counts"));
        }
        None
    }
}

/// What one layer keeps: its parts, in an order the layer indexes them by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerLayout {
    pub parts: Vec<StatePart>,
}

impl LayerLayout {
    /// A layout of the given parts.
    pub fn new(parts: Vec<StatePart>) -> Self {
        Self { parts }
    }

    /// Bytes per token of every part.
    pub fn bytes_per_token(&self) -> usize {
        self.parts.iter().map(StatePart::bytes_per_token).sum()
    }

    /// Bytes per sequence of every part.
    pub fn bytes_per_sequence(&self) -> usize {
        self.parts.iter().map(StatePart::bytes_per_sequence).sum()
    }

    /// f32s of the state of every part: the layer's share of a snapshot.
    pub fn state_floats(&self) -> usize {
        self.parts.iter().map(StatePart::state_floats).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_counts_its_bytes_per_token_and_per_sequence() {
        let f = size_of::<f32>();
        let cases = [
            (StatePart::Rows { dim: 8 }, 8 * f, 0),
            (StatePart::Ring { dim: 8, window: 128 }, 0, 128 * 8 * f),
            (StatePart::Strided { dim: 8, every: 4 }, 8 * f / 4, 3 * 8 * f),
            (StatePart::Strided { dim: 3, every: 128 }, 1, 127 * 3 * f),
            (StatePart::Fixed { floats: 10 }, 0, 10 * f),
            (StatePart::Tokens { n: 3 }, 4, 0),
        ];
        for (part, per_token, per_sequence) in cases {
            assert_eq!((part.bytes_per_token(), part.bytes_per_sequence()), (per_token, per_sequence), "{part:?}");
        }
        let layout = LayerLayout::new(cases.iter().map(|c| c.0).collect());
        assert_eq!(layout.bytes_per_token(), cases.iter().map(|c| c.1).sum::<usize>());
        assert_eq!(layout.bytes_per_sequence(), cases.iter().map(|c| c.2).sum::<usize>());
    }

    #[test]
    fn a_strided_part_records_its_group_row_on_the_last_token_of_each_group() {
        let part = StatePart::Strided { dim: 5, every: 3 };
        let floats: Vec<usize> = (0..7).map(|p| part.record_floats(p)).collect();
        assert_eq!(floats, [0, 0, 5, 0, 0, 5, 0]);
        assert_eq!(part.record_floats_max(), 5);
    }

    #[test]
    fn zero_or_overflowing_sizes_are_invalid() {
        for part in [
            StatePart::Rows { dim: 0 },
            StatePart::Ring { dim: 4, window: 0 },
            StatePart::Strided { dim: 4, every: 0 },
            StatePart::Fixed { floats: 0 },
            StatePart::Tokens { n: 0 },
            StatePart::Ring { dim: usize::MAX / 2, window: 4 },
        ] {
            assert!(part.invalid_reason().is_some(), "{part:?}");
        }
        assert_eq!(StatePart::Strided { dim: 4, every: 1 }.invalid_reason(), None);
    }
}
