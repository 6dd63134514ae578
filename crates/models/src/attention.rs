//! Causal grouped-query attention over the KV cache.

use strata_kernels::ops;

/// The shape of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Keys visible to a query, itself included (`None`: all earlier keys).
    pub window: Option<usize>,
}

/// Attention of `n` queries at positions `start..start + n`.
///
/// `q` is `[n, n_heads * head_dim]`; `keys` and `values` hold positions
/// `0..start + n`, `[start + n, n_kv_heads * head_dim]`; `out` receives
/// `[n, n_heads * head_dim]`. Query head `h` reads kv head
/// `h / (n_heads / n_kv_heads)`, as transformers' `repeat_kv` arranges.
pub fn attend(shape: AttnShape, q: &[f32], keys: &[f32], values: &[f32], start: usize, out: &mut [f32]) {
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let n = q.len() / q_dim;
    assert_eq!(keys.len(), (start + n) * kv_dim, "keys cover every position");
    assert_eq!(values.len(), keys.len(), "values cover every position");
    assert_eq!(out.len(), q.len(), "output matches queries");
    assert!(shape.n_heads.is_multiple_of(shape.n_kv_heads), "query heads group evenly");
    let group = shape.n_heads / shape.n_kv_heads;
    let scale = (hd as f32).powf(-0.5);
    let mut scores = Vec::with_capacity(start + n);
    for i in 0..n {
        let pos = start + i;
        let first = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..shape.n_heads {
            let kvh = h / group;
            let qh = &q[i * q_dim + h * hd..i * q_dim + (h + 1) * hd];
            scores.clear();
            for t in first..=pos {
                let kt = &keys[t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd];
                scores.push(ops::dot(qh, kt) * scale);
            }
            ops::softmax_inplace(&mut scores);
            let oh = &mut out[i * q_dim + h * hd..i * q_dim + (h + 1) * hd];
            oh.fill(0.0);
            for (t, &p) in (first..=pos).zip(&scores) {
                let vt = &values[t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd];
                ops::axpy(p, vt, oh);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_key_returns_its_value() {
        let shape = AttnShape { n_heads: 2, n_kv_heads: 1, head_dim: 2, window: None };
        let mut out = vec![0.0; 4];
        attend(shape, &[1.0, 2.0, 3.0, 4.0], &[0.5, 0.5], &[7.0, -1.0], 0, &mut out);
        assert_eq!(out, vec![7.0, -1.0, 7.0, -1.0]);
    }

    #[test]
    fn the_window_hides_old_keys() {
        let shape = AttnShape { n_heads: 1, n_kv_heads: 1, head_dim: 1, window: Some(1) };
        let mut out = vec![0.0; 1];
        attend(shape, &[1.0], &[1.0, 1.0], &[5.0, 9.0], 1, &mut out);
        assert_eq!(out, vec![9.0]);
    }
}
