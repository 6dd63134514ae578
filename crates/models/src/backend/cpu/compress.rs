//! DeepSeek V4's compressors on the CPU: the windows a pass closes, each
//! pooled into one entry per channel by a softmax over its slots' gates
//! (`crate::attention::compressed` says what the slots are).

use strata_kernels::ops;

use crate::backend::CompressJob;

/// The entries (before their norm and rotation) of `job.windows`,
/// `[windows, width]`: for each channel, `Σ_s softmax_s(gate) · kv` over
/// the window's slots, as transformers' `(kv * gate.softmax(dim=slots))
/// .sum(dim=slots)`. With overlap, slots `0..ratio` are the previous
/// window's first halves (none before window 0: no weight) and slots
/// `ratio..2 ratio` the window's own second halves.
pub fn compress_windows(job: &CompressJob<'_>) -> Vec<f32> {
    let s = &job.state;
    let (w, r, rest_w) = (s.width, s.ratio, s.rest_width());
    let current = |t: usize| &job.current[(t - job.current_from) * w..][..w];
    let rest = |t: usize| &job.rest[(t - job.rest_from) * rest_w..][..rest_w];
    let slots = s.span();
    let (mut kv, mut gate) = (vec![0.0f32; slots * w], vec![0.0f32; slots * w]);
    let mut weights = vec![0.0f32; slots];
    let mut out = Vec::with_capacity(job.windows.len() * w);
    for window in job.windows.clone() {
        let p0 = window * r;
        let own = if s.overlap { r } else { 0 };
        if s.overlap {
            for (slot, (kv, gate)) in kv.chunks_exact_mut(w).zip(gate.chunks_exact_mut(w)).take(r).enumerate() {
                match p0.checked_sub(r) {
                    Some(previous) => {
                        let rest = rest(previous + slot);
                        kv.copy_from_slice(&rest[..w]);
                        gate.copy_from_slice(&rest[w..2 * w]);
                    }
                    None => {
                        kv.fill(0.0);
                        gate.fill(f32::NEG_INFINITY);
                    }
                }
            }
        }
        for slot in 0..r {
            let at = (own + slot) * w;
            kv[at..at + w].copy_from_slice(current(p0 + slot));
            gate[at..at + w].copy_from_slice(&rest(p0 + slot)[rest_w - w..]);
        }
        for c in 0..w {
            weights.iter_mut().enumerate().for_each(|(slot, g)| *g = gate[slot * w + c]);
            ops::softmax_inplace(&mut weights);
            out.push(weights.iter().enumerate().map(|(slot, p)| kv[slot * w + c] * p).sum());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use strata_format::CompressorState;

    use super::*;
    use crate::backend::compressor_rows;
    use crate::backend::cpu::{COMPRESS_ROTARY_DIM, assert_close, compress_rope, fixture};
    use crate::rope::Angles;

    /// The entries of every window of the fixture's sequence, normalised and
    /// rotated as the block does, against those transformers' compressor
    /// `prefix` holds after the sequence's passes of 9, 1, 4 and 7 tokens.
    fn assert_entries_match(prefix: &str, state: CompressorState) {
        let load = |name: &str| fixture("deepseek_v4/blocks", &format!("{prefix}_{name}")).1;
        let (kv, mut gate, bias, norm) = (load("kv"), load("gate"), load("position_bias"), load("norm"));
        let p = state.projection_width();
        for (t, row) in gate.chunks_exact_mut(p).enumerate() {
            row.iter_mut().zip(&bias[t % state.ratio * p..][..p]).for_each(|(g, b)| *g += b);
        }
        let (current, rest) = compressor_rows(&state, &kv, &gate);
        let windows = 0..kv.len() / p / state.ratio;
        let job = CompressJob { state, current: &current, current_from: 0, rest: &rest, rest_from: 0, windows };
        let mut entries = compress_windows(&job);
        let positions: Vec<usize> = job.windows.clone().map(|w| w * state.ratio).collect();
        let angles = Angles::new(&compress_rope(), &positions);
        for (i, entry) in entries.chunks_exact_mut(state.width).enumerate() {
            ops::rmsnorm_inplace(entry, &norm, 1e-6);
            let (cos, sin) = angles.at(i);
            ops::rope_interleaved(&mut entry[state.width - COMPRESS_ROTARY_DIM..], cos, sin);
        }
        assert_close(&entries, &load("entries"), prefix);
    }

    #[test]
    fn csa_entries_pool_overlapping_windows_as_transformers_across_passes() {
        assert_entries_match("csa", CompressorState { ratio: 4, width: 32, overlap: true });
    }

    #[test]
    fn the_csa_indexers_entries_pool_as_transformers_across_passes() {
        assert_entries_match("csa_index", CompressorState { ratio: 4, width: 16, overlap: true });
    }

    #[test]
    fn hca_entries_pool_their_own_window_as_transformers_across_passes() {
        assert_entries_match("hca", CompressorState { ratio: 8, width: 32, overlap: false });
    }
}
