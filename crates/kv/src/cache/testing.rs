//! A stand-in model for tests: it writes every kind of part with values
//! that depend only on (layer, part, position, column), so any state can be
//! checked against the one a single uninterrupted run gives.

use crate::{SequenceState, StatePart};

/// A distinct value for every (layer, part, position, column).
pub(crate) fn value(layer: usize, part: usize, position: usize, column: usize) -> f32 {
    (layer * 1000 + part * 100 + column) as f32 + position as f32 * 0.25 - 7.5
}

/// The row a strided part keeps for group `group`.
fn group_value(layer: usize, part: usize, group: usize, column: usize) -> f32 {
    -value(layer, part, group, column)
}

/// The token id at `position`.
pub(crate) fn token(position: usize) -> u32 {
    100 + position as u32
}

/// The test recurrence: position `p` folds into every float of the state.
pub(crate) fn step(state: &mut [f32], position: usize) {
    for (i, s) in state.iter_mut().enumerate() {
        *s = *s * 0.5 + position as f32 + i as f32 * 0.125;
    }
}

fn rows(layer: usize, part: usize, positions: std::ops::Range<usize>, dim: usize) -> Vec<f32> {
    positions.flat_map(|p| (0..dim).map(move |c| value(layer, part, p, c))).collect()
}

/// Writes `n` more positions into every part of every layer, as a model
/// pass would, and commits them unless `fail` (a pass that errs before
/// `advance`).
pub(crate) fn run(kv: &mut SequenceState, n: usize, fail: bool) {
    let start = kv.len();
    kv.reserve(n).unwrap();
    for layer in 0..kv.n_layers() {
        for (i, &part) in kv.layout(layer).parts.clone().iter().enumerate() {
            match part {
                StatePart::Rows { dim } | StatePart::Ring { dim, .. } => {
                    kv.write(layer, i, &rows(layer, i, start..start + n, dim))
                }
                StatePart::Strided { dim, every } => {
                    kv.write(layer, i, &rows(layer, i, start..start + n, dim));
                    let groups: Vec<f32> = (start / every..(start + n) / every)
                        .flat_map(|g| (0..dim).map(move |c| group_value(layer, i, g, c)))
                        .collect();
                    kv.write_groups(layer, i, &groups);
                }
                StatePart::Fixed { .. } => (start..start + n).for_each(|p| step(kv.stage_state(layer, i), p)),
                StatePart::Tokens { .. } => {
                    kv.write_tokens(layer, i, &(start..start + n).map(token).collect::<Vec<_>>())
                }
            }
        }
    }
    if !fail {
        kv.advance(n);
    }
}

/// Asserts that every part holds what one run of `n_tokens` gives.
pub(crate) fn assert_at(kv: &SequenceState, n_tokens: usize) {
    assert_eq!(kv.len(), n_tokens);
    for layer in 0..kv.n_layers() {
        for (i, &part) in kv.layout(layer).parts.iter().enumerate() {
            let at = format!("layer {layer} {part:?} at {n_tokens}");
            match part {
                StatePart::Rows { dim } => {
                    assert_eq!(kv.rows(layer, i, n_tokens), rows(layer, i, 0..n_tokens, dim), "{at}")
                }
                StatePart::Ring { dim, window } => {
                    let from = n_tokens.saturating_sub(window);
                    assert_eq!(kv.rows_between(layer, i, from, n_tokens), rows(layer, i, from..n_tokens, dim), "{at}");
                }
                StatePart::Strided { dim, every } => {
                    let groups: Vec<f32> = (0..n_tokens / every)
                        .flat_map(|g| (0..dim).map(move |c| group_value(layer, i, g, c)))
                        .collect();
                    assert_eq!(kv.groups(layer, i, n_tokens), groups, "{at}");
                    let pending = rows(layer, i, n_tokens / every * every..n_tokens, dim);
                    assert_eq!(kv.pending(layer, i, n_tokens), pending, "{at}");
                }
                StatePart::Fixed { floats } => {
                    let mut state = vec![0.0; floats];
                    (0..n_tokens).for_each(|p| step(&mut state, p));
                    assert_eq!(kv.state(layer, i), state, "{at}");
                }
                StatePart::Tokens { n } => {
                    let ids: Vec<u32> = (n_tokens.saturating_sub(n)..n_tokens).map(token).collect();
                    assert_eq!(kv.tokens(layer, i, n_tokens), ids, "{at}");
                }
            }
        }
    }
}
