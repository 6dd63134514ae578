//! The delta rule kernels against transformers' own torch functions on a
//! small seeded case (`testdata/gdn/*.npy`, written by
//! `xtask/fixtures/gdn_ref.py`): both forms of the gated delta rule from a
//! non-zero state over 70 tokens (one full chunk and a partial one), l2norm,
//! the gated RMSNorm and both conv1d paths; and Kimi Delta Attention's
//! forget gate, its recurrence against both of kimi_linear's forms, its
//! l2norm and its sigmoid-gated RMSNorm (`kda_*`); GLM-5.3-Flash's bounded
//! forget gate and the recurrence with it (`glm_*`).

use super::gdn::assert_all_close;
use crate::gdn::{self, DeltaTokens, LogDecays};
use crate::simd::Isa;
use crate::{ops, scalar};

/// Agreement with torch, relative to the largest magnitude of each tensor.
const TORCH_REL_TOL: f32 = 1e-5;

/// `testdata/gdn/NAME.npy`: (shape, values).
fn load(name: &str) -> (Vec<usize>, Vec<f32>) {
    super::load_npy("gdn", name)
}

/// `[a, b, c]` -> the `[a, c]` slab of index `j` on the middle axis.
fn middle(values: &[f32], shape: &[usize], j: usize) -> Vec<f32> {
    let (b, c) = (shape[1], shape[2]);
    values.chunks_exact(b * c).flat_map(|row| &row[j * c..(j + 1) * c]).copied().collect()
}

/// `[a, b]` -> column `j`.
fn column(values: &[f32], shape: &[usize], j: usize) -> Vec<f32> {
    values.chunks_exact(shape[1]).map(|row| row[j]).collect()
}

#[test]
fn delta_rule_matches_transformers() {
    let (q_shape, q) = load("q");
    let (_, k) = load("k");
    let (v_shape, v) = load("v");
    let (g_shape, g) = load("g");
    let (_, beta) = load("beta");
    let (state_shape, state0) = load("state0");
    let [tokens, heads, d_k] = q_shape[..] else { panic!("q shape {q_shape:?}") };
    let d_v = v_shape[2];
    assert_eq!(state_shape, [heads, d_k, d_v]);
    for (form, (out_name, state_name)) in
        [("recurrent", ("recurrent_out", "recurrent_state")), ("chunk", ("chunk_out", "chunk_state"))]
    {
        let (_, want_out) = load(out_name);
        let (_, want_state) = load(state_name);
        for isa in Isa::all_supported() {
            for h in 0..heads {
                // transformers normalises and scales inside its kernels; ours
                // take q and k prepared.
                let mut q_h = middle(&q, &q_shape, h);
                let mut k_h = middle(&k, &q_shape, h);
                for (qt, kt) in q_h.chunks_exact_mut(d_k).zip(k_h.chunks_exact_mut(d_k)) {
                    ops::l2norm(qt, gdn::L2NORM_EPS);
                    ops::scale(gdn::query_scale(d_k), qt);
                    ops::l2norm(kt, gdn::L2NORM_EPS);
                }
                let (v_h, g_h, beta_h) = (middle(&v, &v_shape, h), column(&g, &g_shape, h), column(&beta, &g_shape, h));
                let run = DeltaTokens { q: &q_h, k: &k_h, v: &v_h, g: LogDecays::Head(&g_h), beta: &beta_h };
                let mut state = state0[h * d_k * d_v..(h + 1) * d_k * d_v].to_vec();
                let mut out = vec![f32::NAN; tokens * d_v];
                // Each Strata form against the torch form of the same name,
                // and against the other torch form.
                match form {
                    "recurrent" => gdn::delta_rule_recurrent(isa, &mut state, d_v, &run, &mut out),
                    _ => gdn::delta_rule_chunked(isa, &mut state, d_v, &run, &mut out),
                }
                let what = format!("{isa:?} {form} head {h}");
                assert_all_close(&out, &middle(&want_out, &v_shape, h), TORCH_REL_TOL, &format!("{what} out"));
                let want_state_h = &want_state[h * d_k * d_v..(h + 1) * d_k * d_v];
                assert_all_close(&state, want_state_h, TORCH_REL_TOL, &format!("{what} state"));
            }
        }
    }
}

/// Kimi Delta Attention: the forget gate's per-channel g, then the
/// recurrence (the one form Strata runs) against kimi_linear's recurrent and
/// chunked forms, on the GDN case's q, k, v, beta and state.
#[test]
fn kimi_delta_attention_matches_transformers() {
    let g = channel_decays("kda", gdn::channel_log_decay);
    for form in ["recurrent", "chunk"] {
        kda_matches(&g, &format!("kda_{form}"), &format!("torch's {form} form"));
    }
}

/// GLM-5.3-Flash's bounded forget gate (`Glm5NextTextForgetGate`, bound
/// −5: decays down to `exp(−5)` a token), then the recurrence with its g
/// against glm5_next's `recurrent_kimi_delta_attention`.
#[test]
fn bounded_kimi_delta_attention_matches_glm5_next() {
    const LOWER_BOUND: f32 = -5.0;
    let g = channel_decays("glm", |f, dt_bias, a_log| gdn::bounded_channel_log_decay(f, dt_bias, a_log, LOWER_BOUND));
    // Within [bound, 0]: the sigmoid rounds to 0 or 1 far enough out.
    assert!(g.iter().all(|&gi| (LOWER_BOUND..=0.0).contains(&gi)), "a bounded gate stays within [bound, 0]");
    kda_matches(&g, "glm_recurrent", "glm5_next's recurrence");
}

/// The per-channel log decays `[tokens, heads * d_k]` that `decay` gives
/// from the `{prefix}_f`, `_dt_bias` and `_a_log` arrays, checked against
/// torch's `{prefix}_g`.
fn channel_decays(prefix: &str, decay: impl Fn(f32, f32, f32) -> f32) -> Vec<f32> {
    let (q_shape, _) = load("q");
    let d_k = q_shape[2];
    let (g_shape, want_g) = load(&format!("{prefix}_g"));
    assert_eq!(g_shape, q_shape);
    let (_, f) = load(&format!("{prefix}_f"));
    let (_, dt_bias) = load(&format!("{prefix}_dt_bias"));
    let (_, a_log) = load(&format!("{prefix}_a_log"));
    let g: Vec<f32> = f
        .iter()
        .enumerate()
        .map(|(i, &fi)| {
            let channel = i % dt_bias.len();
            decay(fi, dt_bias[channel], a_log[channel / d_k])
        })
        .collect();
    assert_all_close(&g, &want_g, TORCH_REL_TOL, &format!("{prefix} forget gate g"));
    g
}

/// The KDA recurrence with log decays `g` (`[tokens, heads, d_k]`) on the
/// GDN case's q, k, v, beta and state, on every ISA, against torch's
/// `{want}_out` and `{want}_state`.
fn kda_matches(g: &[f32], want: &str, what: &str) {
    let (q_shape, q) = load("q");
    let (_, k) = load("k");
    let (v_shape, v) = load("v");
    let (beta_shape, beta) = load("beta");
    let (_, state0) = load("state0");
    let (_, want_out) = load(&format!("{want}_out"));
    let (_, want_state) = load(&format!("{want}_state"));
    let [tokens, heads, d_k] = q_shape[..] else { panic!("q shape {q_shape:?}") };
    let d_v = v_shape[2];
    for isa in Isa::all_supported() {
        for h in 0..heads {
            let mut q_h = middle(&q, &q_shape, h);
            let mut k_h = middle(&k, &q_shape, h);
            for (qt, kt) in q_h.chunks_exact_mut(d_k).zip(k_h.chunks_exact_mut(d_k)) {
                ops::l2norm_divided(qt, gdn::L2NORM_EPS);
                ops::scale(gdn::query_scale(d_k), qt);
                ops::l2norm_divided(kt, gdn::L2NORM_EPS);
            }
            let (v_h, g_h) = (middle(&v, &v_shape, h), middle(g, &q_shape, h));
            let beta_h = column(&beta, &beta_shape, h);
            let run = DeltaTokens { q: &q_h, k: &k_h, v: &v_h, g: LogDecays::Channel(&g_h), beta: &beta_h };
            let mut state = state0[h * d_k * d_v..(h + 1) * d_k * d_v].to_vec();
            let mut out = vec![f32::NAN; tokens * d_v];
            gdn::delta_rule_recurrent(isa, &mut state, d_v, &run, &mut out);
            let what = format!("{isa:?} KDA against {what}, head {h}");
            assert_all_close(&out, &middle(&want_out, &v_shape, h), TORCH_REL_TOL, &format!("{what} out"));
            let want_state_h = &want_state[h * d_k * d_v..(h + 1) * d_k * d_v];
            assert_all_close(&state, want_state_h, TORCH_REL_TOL, &format!("{what} state"));
        }
    }
}

#[test]
fn norms_match_transformers() {
    let (shape, x) = load("l2norm_x");
    let (_, want) = load("l2norm_out");
    let n = shape[1];
    for (row, want_row) in x.chunks_exact(n).zip(want.chunks_exact(n)) {
        let (mut got, mut reference) = (row.to_vec(), row.to_vec());
        ops::l2norm(&mut got, gdn::L2NORM_EPS);
        scalar::l2norm(&mut reference, gdn::L2NORM_EPS);
        assert_all_close(&got, want_row, TORCH_REL_TOL, "l2norm");
        assert_all_close(&reference, want_row, TORCH_REL_TOL, "scalar l2norm");
    }
    let (_, want) = load("kda_l2norm_out");
    for (row, want_row) in x.chunks_exact(n).zip(want.chunks_exact(n)) {
        let (mut got, mut reference) = (row.to_vec(), row.to_vec());
        ops::l2norm_divided(&mut got, gdn::L2NORM_EPS);
        scalar::l2norm_divided(&mut reference, gdn::L2NORM_EPS);
        assert_all_close(&got, want_row, TORCH_REL_TOL, "kimi l2norm");
        assert_all_close(&reference, want_row, TORCH_REL_TOL, "scalar kimi l2norm");
    }

    let (shape, x) = load("norm_x");
    let (_, z) = load("norm_z");
    let (_, weight) = load("norm_weight");
    let n = shape[1];
    for (gate_act, want_name) in [(ops::NormGate::Silu, "norm_out"), (ops::NormGate::Sigmoid, "kda_norm_out")] {
        let (_, want) = load(want_name);
        for ((row, gate), want_row) in x.chunks_exact(n).zip(z.chunks_exact(n)).zip(want.chunks_exact(n)) {
            let (mut got, mut reference) = (row.to_vec(), row.to_vec());
            ops::rmsnorm_gated(&mut got, gate, &weight, 1e-6, gate_act);
            scalar::rmsnorm_gated(&mut reference, gate, &weight, 1e-6, gate_act);
            assert_all_close(&got, want_row, TORCH_REL_TOL, &format!("rmsnorm_gated {gate_act:?}"));
            assert_all_close(&reference, want_row, TORCH_REL_TOL, &format!("scalar rmsnorm_gated {gate_act:?}"));
        }
    }
}

#[test]
fn conv1d_matches_transformers() {
    let (x_shape, x) = load("conv_x");
    let (w_shape, weight) = load("conv_weight");
    let (_, torch_state0) = load("conv_state0");
    let [channels, tokens] = x_shape[..] else { panic!("conv_x shape {x_shape:?}") };
    let kernel = w_shape[1];
    // Ours: [tokens, channels] inputs and a [channels, K - 1] state;
    // transformers: [channels, tokens] and [channels, K] (oldest unused).
    let token_major = |cm: &[f32]| -> Vec<f32> {
        (0..tokens * channels).map(|i| cm[(i % channels) * tokens + i / channels]).collect()
    };
    let last_inputs =
        |state: &[f32]| -> Vec<f32> { state.chunks_exact(kernel).flat_map(|s| &s[1..]).copied().collect() };

    // Decode path from a non-zero state, token by token.
    let mut got = token_major(&x);
    let mut state = last_inputs(&torch_state0);
    for token in got.chunks_exact_mut(channels) {
        gdn::causal_conv1d_silu_step(token, &weight, &mut state);
    }
    assert_all_close(&got, &token_major(&load("conv_update_out").1), TORCH_REL_TOL, "conv update out");
    assert_eq!(state, last_inputs(&load("conv_update_state").1), "conv update state");

    // Prefill from a zero history, many tokens at once.
    let mut got = token_major(&x);
    let mut state = vec![0.0; channels * (kernel - 1)];
    gdn::causal_conv1d_silu(&mut got, channels, &weight, &mut state);
    assert_all_close(&got, &token_major(&load("conv_prefill_out").1), TORCH_REL_TOL, "conv prefill out");
}
