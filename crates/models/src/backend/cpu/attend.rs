//! Causal grouped-query attention over the KV cache.

use rayon::prelude::*;
use strata_kernels::simd::Isa;
use strata_kernels::{Threads, ops};

use crate::backend::{AttendJob, AttnShape};

/// Smallest share of attention work worth a parallel task, in
/// multiply-adds: below it the fork costs more than it saves.
const MIN_TASK_MACS: usize = 32 * 1024;

/// Several sequences' attention at once, shared out across the pool.
pub fn attend_all(threads: &Threads, isa: Isa, shape: &AttnShape, sinks: Option<&[f32]>, jobs: Vec<AttendJob<'_>>) {
    threads.pool().install(|| {
        jobs.into_par_iter().for_each(|job| attend(threads, isa, shape, sinks, job));
    });
}

/// Attention of `n` queries at positions `start..start + n`.
///
/// `q` is `[n, n_heads * head_dim]`; `keys` and `values` hold positions
/// `first_key..start + n`, `[start + n - first_key, n_kv_heads * head_dim]`;
/// `out` receives `[n, n_heads * head_dim]`. Query head `h` reads kv head
/// `h / (n_heads / n_kv_heads)`, as transformers' `repeat_kv` arranges.
/// `sinks` are the values of `shape.sinks`. Scores are `q · k` times
/// `shape.scale`, plus the job's bias by distance if it has one (as
/// transformers' eager attention adds `position_bias`), then softmaxed.
///
/// The (query, head) pairs are independent, so they are shared out across
/// `threads`; each pair is computed the same way on any thread, so the
/// result does not depend on the thread count.
///
/// `first_key` is 0 but for a sliding-window layer's ring, which holds
/// fewer: every key a query's window sees must be there, which
/// `first_key <= start + 1 - window` ensures. The result does not depend on
/// `first_key`, bit for bit.
fn attend(threads: &Threads, isa: Isa, shape: &AttnShape, sinks: Option<&[f32]>, job: AttendJob<'_>) {
    let AttendJob { q, keys, values, first_key, start, bias, selected, out } = job;
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let n = q.len() / q_dim;
    let window_start = shape.window.map_or(0, |w| (start + 1).saturating_sub(w));
    assert!(first_key <= window_start, "keys from {first_key} miss the window of position {start}");
    assert_eq!(keys.len(), (start + n - first_key) * kv_dim, "keys cover every position from the first");
    assert_eq!(values.len(), keys.len(), "values cover every position");
    assert_eq!(out.len(), q.len(), "output matches queries");
    assert!(shape.n_heads.is_multiple_of(shape.n_kv_heads), "query heads group evenly");
    if let Some(sinks) = sinks {
        assert_eq!(sinks.len(), shape.n_heads, "one sink logit per query head");
    }
    let pairs = n * shape.n_heads;
    if let Some(bias) = bias {
        assert!(bias.extent > 0 && bias.rows.len() == pairs * bias.extent, "a bias row per query head");
    }
    if let Some(selected) = selected {
        assert_eq!(selected.len(), n * (start + n), "a choice of keys per query");
    }
    // Keys per query on average (causal: about half the new ones).
    let macs_per_pair = 2 * hd * (start + n.div_ceil(2)).max(1);
    let pairs_per_task = MIN_TASK_MACS.div_ceil(macs_per_pair).clamp(1, pairs.max(1));
    let task = |first_pair: usize, chunk: &mut [f32], scores: &mut Vec<f32>| {
        for (j, oh) in chunk.chunks_exact_mut(hd).enumerate() {
            let pair = first_pair + j;
            let bias = bias.map(|b| &b.rows[pair * b.extent..(pair + 1) * b.extent]);
            let query = pair / shape.n_heads;
            let pos = start + query;
            let selected = selected.map(|s| &s[query * (start + n)..][..=pos]);
            let masks = Masks { bias, selected };
            attend_pair(isa, shape, sinks, masks, q, keys, values, first_key, pos, pair, oh, scores);
        }
    };
    if threads.n_threads() == 1 || pairs_per_task >= pairs {
        task(0, out, &mut Vec::with_capacity(start + n));
        return;
    }
    threads.pool().install(|| {
        out.par_chunks_mut(pairs_per_task * hd).enumerate().for_each_init(
            || Vec::with_capacity(start + n),
            |scores, (t, chunk)| task(t * pairs_per_task, chunk, scores),
        );
    });
}

/// What a query's scores are adjusted by: `bias` its row of the bias by
/// distance, `selected` whether it attends to the key at each position
/// `0..=pos` (unselected keys take no weight, as transformers' mask of
/// `finfo.min` gives them).
#[derive(Clone, Copy)]
struct Masks<'a> {
    bias: Option<&'a [f32]>,
    selected: Option<&'a [bool]>,
}

/// One query head's attention: `pair` is `query * n_heads + head`, the
/// query sits at position `pos`, `masks` adjust its scores, and row 0 of
/// `keys` and `values` is position `first_key`.
#[allow(clippy::too_many_arguments)]
fn attend_pair(
    isa: Isa,
    shape: &AttnShape,
    sinks: Option<&[f32]>,
    Masks { bias, selected }: Masks<'_>,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    first_key: usize,
    pos: usize,
    pair: usize,
    oh: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    let kv_dim = shape.n_kv_heads * hd;
    let kvh = (pair % shape.n_heads) / (shape.n_heads / shape.n_kv_heads);
    let qh = &q[pair * hd..(pair + 1) * hd];
    let first = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    // Rows `first..=pos` of this kv head: `kv_dim` apart in the cache.
    let span = (first - first_key) * kv_dim + kvh * hd..(pos - first_key) * kv_dim + (kvh + 1) * hd;
    scores.clear();
    scores.resize(pos + 1 - first, 0.0);
    isa.dot_rows_f32(qh, &keys[span.clone()], kv_dim, scores);
    for s in scores.iter_mut() {
        *s *= shape.scale;
    }
    if let Some(bias) = bias {
        // `scores` runs from position `first` to `pos`: backwards from the
        // end, entry `d` is `d` positions before the query.
        for (s, b) in scores.iter_mut().rev().zip(bias) {
            *s += b;
        }
    }
    if let Some(selected) = selected {
        for (s, _) in scores.iter_mut().zip(&selected[first..]).filter(|(_, keep)| !**keep) {
            *s = f32::NEG_INFINITY;
        }
    }
    match sinks {
        Some(sinks) => ops::softmax_with_sink_inplace(scores, sinks[pair % shape.n_heads]),
        None => ops::softmax_inplace(scores),
    }
    oh.fill(0.0);
    isa.axpy_rows(scores, &values[span], kv_dim, oh);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape without sinks, scores scaled by `1 / sqrt(head_dim)`.
    fn plain_shape(n_heads: usize, n_kv_heads: usize, head_dim: usize, window: Option<usize>) -> AttnShape {
        AttnShape { n_heads, n_kv_heads, head_dim, window, sinks: None, scale: (head_dim as f32).powf(-0.5) }
    }

    fn one_thread() -> Threads {
        Threads::new(1).expect("pool")
    }

    /// `attend` on one thread; `sinks` stand for `shape.sinks`.
    fn attend_one(
        shape: AttnShape,
        sinks: Option<&[f32]>,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        start: usize,
        out: &mut [f32],
    ) {
        attend(
            &one_thread(),
            Isa::detect(),
            &shape,
            sinks,
            AttendJob { q, keys, values, first_key: 0, start, bias: None, selected: None, out },
        );
    }

    #[test]
    fn a_window_over_only_its_keys_equals_the_window_over_every_key() {
        let (n_heads, n_kv_heads, head_dim, start, n, window) = (4, 2, 8, 9, 3, 4);
        let kv_dim = n_kv_heads * head_dim;
        let value = |i: usize| ((i * 7919) % 1000) as f32 / 250.0 - 2.0;
        let q: Vec<f32> = (0..n * n_heads * head_dim).map(value).collect();
        let keys: Vec<f32> = (0..(start + n) * kv_dim).map(|i| value(i + 13)).collect();
        let values: Vec<f32> = (0..(start + n) * kv_dim).map(|i| value(i + 29)).collect();
        let shape = plain_shape(n_heads, n_kv_heads, head_dim, Some(window));
        let sinks = [0.5, -1.0, 3.0, 0.0];
        let mut all = vec![0.0; q.len()];
        attend_one(shape, Some(&sinks), &q, &keys, &values, start, &mut all);
        // The ring's rows: the window of the first query and the pass's own.
        let first_key = start + 1 - window;
        let mut ring = vec![0.0; q.len()];
        let (keys, values) = (&keys[first_key * kv_dim..], &values[first_key * kv_dim..]);
        let job = AttendJob { q: &q, keys, values, first_key, start, bias: None, selected: None, out: &mut ring };
        attend(&one_thread(), Isa::detect(), &shape, Some(&sinks), job);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&all), bits(&ring));
    }

    #[test]
    #[should_panic(expected = "miss the window")]
    fn keys_that_start_inside_the_window_are_refused() {
        let shape = plain_shape(1, 1, 1, Some(2));
        let job = AttendJob {
            q: &[1.0],
            keys: &[1.0],
            values: &[1.0],
            first_key: 3,
            start: 3,
            bias: None,
            selected: None,
            out: &mut [0.0],
        };
        attend(&one_thread(), Isa::detect(), &shape, None, job);
    }

    #[test]
    fn a_single_key_returns_its_value() {
        let shape = plain_shape(2, 1, 2, None);
        let mut out = vec![0.0; 4];
        attend_one(shape, None, &[1.0, 2.0, 3.0, 4.0], &[0.5, 0.5], &[7.0, -1.0], 0, &mut out);
        assert_eq!(out, vec![7.0, -1.0, 7.0, -1.0]);
    }

    #[test]
    fn the_window_hides_old_keys() {
        let shape = plain_shape(1, 1, 1, Some(1));
        let mut out = vec![0.0; 1];
        attend_one(shape, None, &[1.0], &[1.0, 1.0], &[5.0, 9.0], 1, &mut out);
        assert_eq!(out, vec![9.0]);
    }

    /// transformers' eager attention with sinks, in f64: scores over the
    /// window, the sink column appended, softmax, the sink column dropped.
    fn reference(
        shape: AttnShape,
        sinks: Option<&[f32]>,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        start: usize,
    ) -> Vec<f64> {
        let hd = shape.head_dim;
        let kv_dim = shape.n_kv_heads * hd;
        let group = shape.n_heads / shape.n_kv_heads;
        let mut out = Vec::with_capacity(q.len());
        for (i, q_row) in q.chunks_exact(shape.n_heads * hd).enumerate() {
            let pos = start + i;
            let visible: Vec<usize> = (0..=pos).filter(|&k| shape.window.is_none_or(|w| pos - k < w)).collect();
            for h in 0..shape.n_heads {
                let at = (h / group) * hd;
                let qh = &q_row[h * hd..(h + 1) * hd];
                let mut logits: Vec<f64> = visible
                    .iter()
                    .map(|&k| {
                        let kh = &keys[k * kv_dim + at..][..hd];
                        qh.iter().zip(kh).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                logits.push(sinks.map_or(f64::NEG_INFINITY, |s| f64::from(s[h])));
                let max = logits.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                let exps: Vec<f64> = logits.iter().map(|&v| (v - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for d in 0..hd {
                    out.push(
                        visible
                            .iter()
                            .zip(&exps)
                            .map(|(&k, &e)| e / sum * f64::from(values[k * kv_dim + at + d]))
                            .sum(),
                    );
                }
            }
        }
        out
    }

    #[test]
    fn sinks_join_the_softmax_as_transformers_does_inside_and_beyond_the_window() {
        let (n_heads, n_kv_heads, head_dim, start, n) = (4, 2, 8, 3, 4);
        let value = |i: usize| ((i * 7919) % 1000) as f32 / 250.0 - 2.0;
        let q: Vec<f32> = (0..n * n_heads * head_dim).map(value).collect();
        let kv_len = (start + n) * n_kv_heads * head_dim;
        let keys: Vec<f32> = (0..kv_len).map(|i| value(i + 13)).collect();
        let values: Vec<f32> = (0..kv_len).map(|i| value(i + 29)).collect();
        let sinks = [0.5f32, -1.0, 3.0, -20.0];
        // Windows of 1 and 3 keys (fewer than the 7 positions), 100 (more)
        // and none; with and without sinks.
        for window in [Some(1), Some(3), Some(100), None] {
            for sinks in [Some(&sinks[..]), None] {
                let shape = plain_shape(n_heads, n_kv_heads, head_dim, window);
                let mut out = vec![0.0; q.len()];
                attend_one(shape, sinks, &q, &keys, &values, start, &mut out);
                let want = reference(shape, sinks, &q, &keys, &values, start);
                for (j, (&got, &want)) in out.iter().zip(&want).enumerate() {
                    let tol = 1e-5 * want.abs() + 1e-6;
                    assert!((f64::from(got) - want).abs() <= tol, "{window:?} {sinks:?} [{j}]: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn a_sink_as_likely_as_the_only_key_takes_half_the_weight() {
        // q . k = 0, so the key's logit equals the sink's (0): weights 1/2, 1/2.
        let shape = plain_shape(1, 1, 2, None);
        let mut out = vec![0.0; 2];
        attend_one(shape, Some(&[0.0]), &[1.0, -1.0], &[2.0, 2.0], &[8.0, -4.0], 0, &mut out);
        assert_eq!(out, vec![4.0, -2.0]);
    }

    #[test]
    #[should_panic(expected = "one sink logit per query head")]
    fn a_sink_per_kv_head_is_refused() {
        let shape = plain_shape(2, 1, 1, None);
        attend_one(shape, Some(&[0.0]), &[1.0, 1.0], &[1.0], &[1.0], 0, &mut [0.0; 2]);
    }

    #[test]
    fn the_thread_count_does_not_change_a_bit() {
        // Enough keys that the (query, head) pairs are shared across tasks.
        let shape = plain_shape(8, 2, 64, None);
        let (start, n) = (100, 3);
        let value = |i: usize| ((i * 7919) % 1000) as f32 / 500.0 - 1.0;
        let q: Vec<f32> = (0..n * 8 * 64).map(value).collect();
        let keys: Vec<f32> = (0..(start + n) * 2 * 64).map(|i| value(i + 13)).collect();
        let values: Vec<f32> = (0..(start + n) * 2 * 64).map(|i| value(i + 29)).collect();
        let run = |threads: usize| {
            let mut out = vec![0.0f32; q.len()];
            let job = AttendJob {
                q: &q,
                keys: &keys,
                values: &values,
                first_key: 0,
                start,
                bias: None,
                selected: None,
                out: &mut out,
            };
            attend(&Threads::new(threads).expect("pool"), Isa::detect(), &shape, None, job);
            out
        };
        let one = run(1);
        assert!(one.iter().all(|v| v.is_finite()));
        assert_eq!(
            one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            run(3).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
