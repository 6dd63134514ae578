//! The set `torch.topk(row, k)` returns on the CPU, ties included.
//!
//! A ReLU-scored indexer (DSA) gives exactly equal scores whenever every
//! head's `relu(q·k)` is zero, which is common with few indexer heads; which
//! of the tied positions attention then sees decides the logits. torch does
//! not break ties by position: its CPU kernel (`aten/src/ATen/native/
//! TopKImpl.h`, `topk_impl_loop`) pairs each value with its index and runs
//! libstdc++'s `std::nth_element` (or `std::partial_sort` when
//! `k * 64 <= n`) with the comparator "x is NaN and y is not, or x > y".
//! Those algorithms are deterministic, so the chosen set is a function of
//! the whole row, masked entries included. This module replays them step for
//! step (introselect: median-of-three partitions, a heap select past the
//! depth limit, insertion sort for the last three or fewer), so Strata picks
//! the positions transformers picks. `docs/mla.md` §4 has the derivation and
//! how it was checked (3,000 tie-heavy rows against torch 2.15: identical).

/// One row entry: its value and its position in the row.
type Entry = (f32, u32);

/// torch's "largest first" order: NaN above everything, then by value.
/// Equal values (and ±0) compare false both ways, as in C++.
fn before(a: &Entry, b: &Entry) -> bool {
    (a.0.is_nan() && !b.0.is_nan()) || a.0 > b.0
}

/// The positions of the `k` entries `values.topk(k)` returns (in no
/// particular order). All of them when `k >= values.len()`.
pub fn torch_topk(values: &[f32], k: usize) -> Vec<usize> {
    let n = values.len();
    assert!(n <= u32::MAX as usize, "a row of at most 2^32 entries");
    if k >= n {
        return (0..n).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let mut q: Vec<Entry> = values.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
    if k * 64 <= n {
        // std::partial_sort = heap select, then sorting the heap (which
        // only orders the chosen set).
        heap_select(&mut q, k);
    } else {
        nth_element(&mut q, k - 1);
    }
    q[..k].iter().map(|&(_, i)| i as usize).collect()
}

/// `std::nth_element(first, first + nth, last)`.
fn nth_element(q: &mut [Entry], nth: usize) {
    let n = q.len();
    let depth_limit = 2 * n.ilog2() as usize;
    introselect(q, nth, depth_limit);
}

/// libstdc++'s `__introselect` over the whole slice.
fn introselect(q: &mut [Entry], nth: usize, mut depth_limit: usize) {
    let (mut first, mut last) = (0, q.len());
    while last - first > 3 {
        if depth_limit == 0 {
            heap_select(&mut q[first..last], nth + 1 - first);
            q.swap(first, nth);
            return;
        }
        depth_limit -= 1;
        let cut = unguarded_partition_pivot(q, first, last);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(&mut q[first..last]);
}

/// Median of `q[first + 1]`, `q[mid]`, `q[last - 1]` moved to `q[first]`,
/// then a partition of `first + 1..last` around it; returns the cut.
fn unguarded_partition_pivot(q: &mut [Entry], first: usize, last: usize) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(q, first, first + 1, mid, last - 1);
    unguarded_partition(q, first + 1, last, first)
}

/// `__move_median_to_first(result, a, b, c)`.
fn move_median_to_first(q: &mut [Entry], result: usize, a: usize, b: usize, c: usize) {
    let median = if before(&q[a], &q[b]) {
        if before(&q[b], &q[c]) {
            b
        } else if before(&q[a], &q[c]) {
            c
        } else {
            a
        }
    } else if before(&q[a], &q[c]) {
        a
    } else if before(&q[b], &q[c]) {
        c
    } else {
        b
    };
    q.swap(result, median);
}

/// `__unguarded_partition(first, last, pivot)`: the pivot sits before
/// `first` and stops both scans, so no bounds are checked in C++.
fn unguarded_partition(q: &mut [Entry], mut first: usize, mut last: usize, pivot: usize) -> usize {
    loop {
        while before(&q[first], &q[pivot]) {
            first += 1;
        }
        last -= 1;
        while before(&q[pivot], &q[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        q.swap(first, last);
        first += 1;
    }
}

/// `__insertion_sort`: each entry either goes to the front (when it beats
/// the first) or moves left past the entries it beats.
fn insertion_sort(q: &mut [Entry]) {
    for i in 1..q.len() {
        let v = q[i];
        if before(&v, &q[0]) {
            q.copy_within(0..i, 1);
            q[0] = v;
        } else {
            let mut hole = i;
            while before(&v, &q[hole - 1]) {
                q[hole] = q[hole - 1];
                hole -= 1;
            }
            q[hole] = v;
        }
    }
}

/// `__heap_select(first, first + middle, last)`: a heap of the first
/// `middle` entries whose top is the worst kept; every later entry that
/// beats it replaces it.
fn heap_select(q: &mut [Entry], middle: usize) {
    make_heap(&mut q[..middle]);
    for i in middle..q.len() {
        if before(&q[i], &q[0]) {
            // __pop_heap(first, middle, i): the top goes to i, q[i] sifts in.
            let v = q[i];
            q[i] = q[0];
            adjust_heap(&mut q[..middle], 0, v);
        }
    }
}

/// `__make_heap`.
fn make_heap(h: &mut [Entry]) {
    let len = h.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let v = h[parent];
        adjust_heap(h, parent, v);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// `__adjust_heap(first, hole, len, value)`: moves the hole down to a leaf
/// along the better children, then pushes `v` up from there.
fn adjust_heap(h: &mut [Entry], mut hole: usize, v: Entry) {
    let len = h.len();
    let top = hole;
    let mut second = hole;
    while second < (len - 1) / 2 {
        second = 2 * (second + 1);
        if before(&h[second], &h[second - 1]) {
            second -= 1;
        }
        h[hole] = h[second];
        hole = second;
    }
    if len.is_multiple_of(2) && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        h[hole] = h[second - 1];
        hole = second - 1;
    }
    // __push_heap(first, hole, top, value)
    while hole > top {
        let parent = (hole - 1) / 2;
        if !before(&h[parent], &v) {
            break;
        }
        h[hole] = h[parent];
        hole = parent;
    }
    h[hole] = v;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows drawn from a few values (so most boundaries are ties), with
    /// torch 2.15's `topk` indices, from `xtask/fixtures/topk_ties.py`.
    const TORCH_TIES: &str = include_str!("../../../testdata/dsa/topk_ties.json");

    #[test]
    fn dsa_selection_breaks_score_ties_as_torch_topk() {
        let cases: serde_json::Value = serde_json::from_str(TORCH_TIES).expect("fixture parses");
        let cases = cases.as_array().expect("a list of rows");
        assert!(cases.len() >= 700, "the fixture covers many rows");
        for (r, case) in cases.iter().enumerate() {
            let values: Vec<f32> =
                case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let k = case["k"].as_u64().unwrap() as usize;
            let mut want: Vec<usize> =
                case["torch"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
            let mut got = torch_topk(&values, k);
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "row {r}: n {} k {k} values {values:?}", values.len());
        }
    }

    #[test]
    fn distinct_values_give_the_k_largest() {
        let values: Vec<f32> = (0..200).map(|i| ((i * 37) % 200) as f32).collect();
        for k in [1, 2, 3, 4, 7, 50, 199, 200, 300] {
            let mut got = torch_topk(&values, k);
            got.sort_unstable_by(|&a, &b| values[b].total_cmp(&values[a]));
            let mut want: Vec<usize> = (0..200).collect();
            want.sort_unstable_by(|&a, &b| values[b].total_cmp(&values[a]));
            want.truncate(k.min(200));
            assert_eq!(got, want, "k {k}");
        }
    }
}
