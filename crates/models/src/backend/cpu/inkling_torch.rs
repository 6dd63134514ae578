//! Inkling's attention against transformers' `InklingAttention` on small
//! seeded cases (`testdata/inkling_blocks/attn_*.npy`, written by
//! `xtask/fixtures/inkling_ref.py`): the projections, the short
//! convolutions of k and v with their residual, per-head q/k RMSNorm, the
//! scale `1 / head_dim`, the bias by distance from `rel_logits_proj` and the
//! log scaling of q and bias, composed here from the operations the block
//! will call, around this backend's attention with a [`PositionBias`]; and
//! `InklingTopkRouter`, the shared-expert sink (`router_*`), as this
//! backend routes it.

use std::path::PathBuf;

use strata_kernels::simd::Isa;
use strata_kernels::{Threads, gdn, ops};

use super::attend::attend_all;
use super::inkling::{Sink, shared_expert_sink};
use crate::backend::{AttendJob, AttnShape, PositionBias};

/// Agreement with torch, relative to the largest magnitude of the output.
const TORCH_REL_TOL: f32 = 1e-5;

/// Epsilon of the q/k norms (the config's `rms_norm_eps`).
const NORM_EPS: f32 = 1e-6;

/// `testdata/inkling_blocks/NAME.npy`: (shape, values).
fn load(name: &str) -> (Vec<usize>, Vec<f32>) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/inkling_blocks").join(format!("{name}.npy"));
    strata_format::npy::read_f32(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `xs W^T` for `[n, cols]` rows and a `[rows, cols]` weight.
fn linear(xs: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
    xs.chunks_exact(cols).flat_map(|x| w.chunks_exact(cols).map(|row| ops::dot(x, row))).collect()
}

/// One layer's case: its shape besides what the weights give.
struct Case {
    name: &'static str,
    n_heads: usize,
    n_kv_heads: usize,
    window: Option<usize>,
    /// `(log_scaling_n_floor, log_scaling_alpha)` on a full layer that has it.
    log_scaling: Option<(f32, f32)>,
}

/// transformers' `tau` at position `pos`: `1 + alpha · ln(max((pos + 1) /
/// floor, 1))`, in f32.
fn log_scale(pos: usize, floor: f32, alpha: f32) -> f32 {
    1.0 + alpha * ((pos + 1) as f32 / floor).max(1.0).ln()
}

/// The layer's output for its whole input, its queries attended in passes
/// of `passes` tokens over the keys and values of the positions so far (on
/// a windowed layer, only those its ring would hold).
fn inkling_attention(case: &Case, passes: &[usize]) -> Vec<f32> {
    let (x_shape, x) = load(&format!("attn_{}_x", case.name));
    let w = |part: &str| load(&format!("attn_{}_{part}", case.name));
    let [tokens, hidden] = x_shape[..] else { panic!("x shape {x_shape:?}") };
    let ((q_shape, wq), (_, wk), (_, wv), (r_shape, wr), (_, wo)) = (w("wq"), w("wk"), w("wv"), w("wr"), w("wo"));
    let ((_, q_norm), (_, k_norm), (_, k_conv), (_, v_conv)) = (w("q_norm"), w("k_norm"), w("k_conv"), w("v_conv"));
    let (proj_shape, proj) = w("rel_proj");
    let [d_rel, extent] = proj_shape[..] else { panic!("rel_proj shape {proj_shape:?}") };
    let head_dim = q_shape[0] / case.n_heads;
    let kv_dim = case.n_kv_heads * head_dim;
    assert_eq!(r_shape[0], case.n_heads * d_rel);

    let mut q = linear(&x, &wq, hidden);
    let (mut k, mut v) = (linear(&x, &wk, hidden), linear(&x, &wv, hidden));
    let r = linear(&x, &wr, hidden);
    gdn::causal_conv1d_residual(&mut k, kv_dim, &k_conv, &mut vec![0.0; kv_dim * 3]);
    gdn::causal_conv1d_residual(&mut v, kv_dim, &v_conv, &mut vec![0.0; kv_dim * 3]);
    for head in q.chunks_exact_mut(head_dim) {
        ops::rmsnorm_inplace(head, &q_norm, NORM_EPS);
    }
    for head in k.chunks_exact_mut(head_dim) {
        ops::rmsnorm_inplace(head, &k_norm, NORM_EPS);
    }
    // Each query head's bias by distance: its d_rel relative state times
    // the learned [d_rel, extent] profiles.
    let mut bias: Vec<f32> = r
        .chunks_exact(d_rel)
        .flat_map(|rel| (0..extent).map(|d| rel.iter().enumerate().map(|(j, &rj)| rj * proj[j * extent + d]).sum()))
        .collect();
    if let Some((floor, alpha)) = case.log_scaling {
        let q_row = case.n_heads * head_dim;
        for (pos, (q_t, bias_t)) in
            q.chunks_exact_mut(q_row).zip(bias.chunks_exact_mut(case.n_heads * extent)).enumerate()
        {
            let tau = log_scale(pos, floor, alpha);
            q_t.iter_mut().chain(bias_t.iter_mut()).for_each(|v| *v *= tau);
        }
    }

    let shape = AttnShape {
        n_heads: case.n_heads,
        n_kv_heads: case.n_kv_heads,
        head_dim,
        window: case.window,
        sinks: None,
        scale: 1.0 / head_dim as f32,
    };
    let q_dim = case.n_heads * head_dim;
    let mut attn = vec![f32::NAN; tokens * q_dim];
    let threads = Threads::new(1).expect("pool");
    let mut start = 0;
    for &m in passes {
        let end = start + m;
        // A windowed layer's ring holds no key before the first query's
        // window.
        let first_key = case.window.map_or(0, |w| (start + 1).saturating_sub(w));
        let job = AttendJob {
            q: &q[start * q_dim..end * q_dim],
            keys: &k[first_key * kv_dim..end * kv_dim],
            values: &v[first_key * kv_dim..end * kv_dim],
            first_key,
            start,
            bias: Some(PositionBias {
                rows: &bias[start * case.n_heads * extent..end * case.n_heads * extent],
                extent,
            }),
            selected: None,
            out: &mut attn[start * q_dim..end * q_dim],
        };
        attend_all(&threads, Isa::detect(), &shape, None, vec![job]);
        start = end;
    }
    assert_eq!(start, tokens, "the passes cover every token");
    linear(&attn, &wo, q_dim)
}

fn assert_close_to_torch(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let tol = TORCH_REL_TOL * want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "{what}[{i}]: {g} vs torch {w} (tol {tol})");
    }
}

/// A `hybrid_sliding` layer (6 q / 3 kv heads × 6, window 5, so the bias
/// reaches the whole window) and a `hybrid` one (4 q / 2 kv heads × 8, the
/// bias over 7 of the 12 positions, log scaling from position 3).
const CASES: [Case; 2] = [
    Case { name: "sliding", n_heads: 6, n_kv_heads: 3, window: Some(5), log_scaling: None },
    Case { name: "full", n_heads: 4, n_kv_heads: 2, window: None, log_scaling: Some((3.0, 0.3)) },
];

#[test]
fn inkling_attention_matches_transformers_on_sliding_and_full_layers() {
    for case in &CASES {
        let want = load(&format!("attn_{}_out", case.name)).1;
        assert_close_to_torch(&inkling_attention(case, &[12]), &want, case.name);
    }
}

#[test]
fn the_bias_by_distance_counts_from_each_query_s_own_position_in_any_pass() {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    for case in &CASES {
        let whole = bits(inkling_attention(case, &[12]));
        assert_eq!(bits(inkling_attention(case, &[7, 1, 4])), whole, "{}", case.name);
    }
}

/// The fixture router's `route_scale` and learned `global_scale`.
const ROUTE_SCALE: f32 = 2.5;
const GLOBAL_SCALE: f32 = 0.75;

#[test]
fn the_shared_expert_sink_routes_and_weighs_as_transformers() {
    let (x_shape, x) = load("router_x");
    let (w_shape, weight) = load("router_weight");
    let (_, bias) = load("router_bias");
    let (chosen_shape, want_experts) = load("router_experts");
    let (_, want_weights) = load("router_weights");
    let (_, want_shared) = load("router_shared");
    let (n_routed, top_k) = (bias.len(), chosen_shape[1]);
    let n_shared = w_shape[0] - n_routed;
    assert!(n_shared > 0, "the gate has a row per shared expert after the routed ones");
    let logits = linear(&x, &weight, x_shape[1]);
    let sink = Sink { n_shared, top_k, scale: [ROUTE_SCALE, GLOBAL_SCALE], bias: &bias };
    let (routes, shares) = shared_expert_sink(&logits, w_shape[0], &sink);
    for (t, (token_routes, token_shares)) in routes.chunks_exact(top_k).zip(shares.chunks_exact(n_shared)).enumerate() {
        // transformers' top-k is unsorted: compare the choice as a set,
        // each expert with its weight.
        let mut got: Vec<(usize, f32)> = token_routes.iter().map(|r| (r.expert, r.weight)).collect();
        got.sort_unstable_by_key(|&(expert, _)| expert);
        let want_ids = &want_experts[t * top_k..(t + 1) * top_k];
        let mut want: Vec<(usize, f32)> =
            want_ids.iter().zip(&want_weights[t * top_k..(t + 1) * top_k]).map(|(&e, &w)| (e as usize, w)).collect();
        want.sort_unstable_by_key(|&(expert, _)| expert);
        let ids = |v: &[(usize, f32)]| v.iter().map(|&(e, _)| e).collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want), "token {t}'s experts");
        let weights = |v: &[(usize, f32)]| v.iter().map(|&(_, w)| w).collect::<Vec<_>>();
        let (got_all, want_all) = (
            [weights(&got), token_shares.to_vec()].concat(),
            [weights(&want), want_shared[t * n_shared..(t + 1) * n_shared].to_vec()].concat(),
        );
        assert_close_to_torch(&got_all, &want_all, &format!("token {t}'s weights"));
    }
}
