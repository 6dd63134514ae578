//! Transformer operators against direct f64 evaluations of their
//! definitions, and the dispatching wrappers against the scalar reference.

use proptest::prelude::*;

use super::{CASES, assert_close, cols, magnitude, values};
use crate::{ops, scalar};

fn vector() -> impl Strategy<Value = Vec<f32>> {
    cols().prop_flat_map(values)
}

/// An even-length vector with matching cos/sin tables of half its length.
fn rope_case() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (0usize..=64).prop_flat_map(|half| (values(2 * half), prop::collection::vec(-10.0f32..10.0, half)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn rmsnorm_matches_definition(x in (1usize..=300).prop_flat_map(values), eps in 1e-6f32..1e-3) {
        let weight: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mean_sq = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
        let inv_rms = 1.0 / (mean_sq + f64::from(eps)).sqrt();
        let mut out = vec![0.0; x.len()];
        ops::rmsnorm(&x, &weight, eps, &mut out);
        let mut inplace = x.clone();
        ops::rmsnorm_inplace(&mut inplace, &weight, eps);
        let mut reference = vec![0.0; x.len()];
        scalar::rmsnorm(&x, &weight, eps, &mut reference);
        for i in 0..x.len() {
            let want = f64::from(weight[i]) * f64::from(x[i]) * inv_rms;
            let tol = 1e-5 * want.abs() + 1e-6;
            prop_assert!((f64::from(out[i]) - want).abs() <= tol, "{} vs {}", out[i], want);
            prop_assert!((f64::from(reference[i]) - want).abs() <= tol);
        }
        prop_assert_eq!(&inplace, &out);
    }

    /// transformers' `UnweightedRMSNorm`, `x * rsqrt(mean(x^2) + eps)`, is
    /// the weighted norm with a weight of ones, bit for bit.
    #[test]
    fn rmsnorm_unweighted_is_rmsnorm_with_unit_weight(
        x in (1usize..=300).prop_flat_map(values),
        eps in 1e-6f32..1e-3,
    ) {
        let mut want = vec![0.0; x.len()];
        ops::rmsnorm(&x, &vec![1.0; x.len()], eps, &mut want);
        let mut got = x.clone();
        ops::rmsnorm_unweighted_inplace(&mut got, eps);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&got), bits(&want));
    }

    /// transformers' `l2norm`: eps inside the square root, on the sum.
    #[test]
    fn l2norm_matches_definition(x in vector(), eps in prop_oneof![Just(1e-6f32), 1e-6f32..1e-2]) {
        let sum_sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = 1.0 / (sum_sq + f64::from(eps)).sqrt();
        let (mut got, mut reference) = (x.clone(), x.clone());
        ops::l2norm(&mut got, eps);
        scalar::l2norm(&mut reference, eps);
        for i in 0..x.len() {
            let want = f64::from(x[i]) * inv;
            prop_assert!((f64::from(got[i]) - want).abs() <= 1e-5 * want.abs() + 1e-7, "{} vs {want}", got[i]);
            prop_assert!((f64::from(reference[i]) - want).abs() <= 1e-5 * want.abs() + 1e-7);
        }
    }

    /// kimi_linear's `l2norm`: a division by the norm, eps on the sum.
    #[test]
    fn l2norm_divided_matches_definition(x in vector(), eps in prop_oneof![Just(1e-6f32), 1e-6f32..1e-2]) {
        let sum_sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let norm = (sum_sq + f64::from(eps)).sqrt();
        let (mut got, mut reference) = (x.clone(), x.clone());
        ops::l2norm_divided(&mut got, eps);
        scalar::l2norm_divided(&mut reference, eps);
        for i in 0..x.len() {
            let want = f64::from(x[i]) / norm;
            prop_assert!((f64::from(got[i]) - want).abs() <= 1e-5 * want.abs() + 1e-7, "{} vs {want}", got[i]);
            prop_assert!((f64::from(reference[i]) - want).abs() <= 1e-5 * want.abs() + 1e-7);
        }
    }

    #[test]
    fn rmsnorm_gated_matches_definition(
        x in (1usize..=300).prop_flat_map(values),
        eps in 1e-6f32..1e-3,
        sigmoid_gate in any::<bool>(),
    ) {
        let gate_act = if sigmoid_gate { ops::NormGate::Sigmoid } else { ops::NormGate::Silu };
        let gate: Vec<f32> = x.iter().map(|v| 1.0 - 2.0 * v).collect();
        let weight: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mean_sq = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
        let inv_rms = 1.0 / (mean_sq + f64::from(eps)).sqrt();
        let (mut got, mut reference) = (x.clone(), x.clone());
        ops::rmsnorm_gated(&mut got, &gate, &weight, eps, gate_act);
        scalar::rmsnorm_gated(&mut reference, &gate, &weight, eps, gate_act);
        for i in 0..x.len() {
            let g = f64::from(gate[i]);
            let sigmoid = 1.0 / (1.0 + (-g).exp());
            let act = if sigmoid_gate { sigmoid } else { g * sigmoid };
            let want = f64::from(weight[i]) * f64::from(x[i]) * inv_rms * act;
            let tol = 1e-5 * want.abs() + 1e-6;
            prop_assert!((f64::from(got[i]) - want).abs() <= tol, "{} vs {want}", got[i]);
            prop_assert!((f64::from(reference[i]) - want).abs() <= tol);
        }
    }

    #[test]
    fn softmax_matches_definition(x in (1usize..=300).prop_flat_map(|n| prop::collection::vec(-30.0f32..30.0, n))) {
        let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let exps: Vec<f64> = x.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        let mut got = x.clone();
        ops::softmax_inplace(&mut got);
        for (g, e) in got.iter().zip(&exps) {
            prop_assert!((f64::from(*g) - e / sum).abs() <= 1e-5 * (e / sum) + 1e-7);
        }
    }

    #[test]
    fn silu_mul_matches_definition(x in vector()) {
        let up: Vec<f32> = x.iter().map(|v| 1.5 - v).collect();
        let mut gate = x.clone();
        ops::silu_mul(&mut gate, &up);
        for i in 0..x.len() {
            let g = f64::from(x[i]);
            let want = g / (1.0 + (-g).exp()) * f64::from(up[i]);
            prop_assert!((f64::from(gate[i]) - want).abs() <= 1e-6 * want.abs() + 1e-7);
        }
    }

    /// Wide enough inputs that both clamps bite.
    #[test]
    fn clamped_swiglu_matches_definition(
        gate_up in (0usize..=300).prop_flat_map(|n| prop::collection::vec(-12.0f32..12.0, 2 * n))
    ) {
        let (alpha, limit) = (1.702f32, 7.0f32);
        let mut got = vec![0.0f32; gate_up.len() / 2];
        ops::clamped_swiglu_interleaved(&gate_up, alpha, limit, &mut got);
        for (o, pair) in got.iter().zip(gate_up.chunks_exact(2)) {
            let gate = f64::from(pair[0]).min(f64::from(limit));
            let up = f64::from(pair[1]).clamp(-f64::from(limit), f64::from(limit));
            let want = (up + 1.0) * gate / (1.0 + (-gate * f64::from(alpha)).exp());
            prop_assert!((f64::from(*o) - want).abs() <= 1e-6 * want.abs() + 1e-7, "{} vs {want}", o);
        }
    }

    /// GLM-5.3-Flash's and DeepSeek V4's `act_fn(gate.clamp(max=limit)) *
    /// up.clamp(-limit, limit)`, on inputs wide enough that both clamps bite.
    #[test]
    fn silu_mul_limited_matches_definition(
        (gate, up) in (0usize..=300).prop_flat_map(|n| {
            (prop::collection::vec(-12.0f32..12.0, n), prop::collection::vec(-12.0f32..12.0, n))
        })
    ) {
        let limit = 7.0f32;
        let mut got = gate.clone();
        ops::silu_mul_limited(&mut got, &up, limit);
        for ((o, g), u) in got.iter().zip(&gate).zip(&up) {
            let g = f64::from(*g).min(f64::from(limit));
            let u = f64::from(*u).clamp(-f64::from(limit), f64::from(limit));
            let want = g / (1.0 + (-g).exp()) * u;
            prop_assert!((f64::from(*o) - want).abs() <= 1e-6 * want.abs() + 1e-7, "{} vs {want}", o);
        }
    }

    /// The HF formula: `x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)`
    /// with `rotate_half(x) = cat(-x2, x1)`.
    #[test]
    fn rope_neox_is_rotate_half((x, angles) in rope_case()) {
        let half = angles.len();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let mut got = x.clone();
        ops::rope_neox(&mut got, &cos, &sin);
        for i in 0..2 * half {
            let rotated = if i < half { -x[i + half] } else { x[i - half] };
            let want = x[i] * cos[i % half] + rotated * sin[i % half];
            // Same two products and one add: bit-exact.
            prop_assert_eq!(got[i].to_bits(), want.to_bits());
        }
    }

    #[test]
    fn rope_interleaved_rotates_pairs((x, angles) in rope_case()) {
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let mut got = x.clone();
        ops::rope_interleaved(&mut got, &cos, &sin);
        for i in 0..angles.len() {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            prop_assert_eq!(got[2 * i], a * cos[i] - b * sin[i]);
            prop_assert_eq!(got[2 * i + 1], b * cos[i] + a * sin[i]);
        }
    }

    #[test]
    fn dot_axpy_scale_match_reference((a, b) in cols().prop_flat_map(|n| (values(n), values(n)))) {
        assert_close(ops::dot(&a, &b), scalar::dot_f32(&a, &b), magnitude(&a, &b), "dot");
        let mut y = b.clone();
        ops::axpy(-0.75, &a, &mut y);
        for i in 0..a.len() {
            let want = b[i] + -0.75 * a[i];
            assert_close(y[i], want, (0.75 * a[i]).abs() + b[i].abs(), "axpy");
        }
        let mut s = a.clone();
        ops::scale(3.0, &mut s);
        prop_assert_eq!(s, a.iter().map(|v| v * 3.0).collect::<Vec<_>>());
    }
}

#[test]
fn softmax_known_values() {
    let mut x = [0.0f32, (2.0f32).ln(), f32::NEG_INFINITY];
    ops::softmax_inplace(&mut x);
    assert!((x[0] - 1.0 / 3.0).abs() < 1e-7);
    assert!((x[1] - 2.0 / 3.0).abs() < 1e-7);
    assert_eq!(x[2], 0.0);
    ops::softmax_inplace(&mut []);
}

#[test]
fn log_sigmoid_weights_are_the_sigmoids_share_even_where_they_underflow() {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    let logits = [1.5f32, -0.25, 0.0, -3.0, 4.0];
    let mut got = logits;
    ops::softmax_of_log_sigmoids_inplace(&mut got);
    let total: f64 = logits.iter().map(|&x| sigmoid(f64::from(x))).sum();
    for (&g, &x) in got.iter().zip(&logits) {
        let want = sigmoid(f64::from(x)) / total;
        assert!((f64::from(g) - want).abs() < 1e-6, "{x}: {g} vs {want}");
    }
    // sigmoid(-200) is 0 in f32 (a share of 0/0); in log space the two
    // keep their ratio e : 1.
    let mut far = [-200.0f32, -201.0];
    ops::softmax_of_log_sigmoids_inplace(&mut far);
    let e = std::f32::consts::E;
    assert!((far[0] - e / (e + 1.0)).abs() < 1e-5 && (far[1] - 1.0 / (e + 1.0)).abs() < 1e-5, "{far:?}");
}

#[test]
fn a_sink_takes_its_share_of_the_softmax() {
    // exp(0) : exp(ln 2) : exp(ln 2) for x0, x1, sink: the sink's 2/5 is dropped.
    let mut x = [0.0f32, (2.0f32).ln()];
    ops::softmax_with_sink_inplace(&mut x, (2.0f32).ln());
    assert!((x[0] - 0.2).abs() < 1e-7, "{}", x[0]);
    assert!((x[1] - 0.4).abs() < 1e-7, "{}", x[1]);
    // A sink far above every key leaves the keys nearly nothing, without overflow.
    let mut x = [0.0f32, 1.0];
    ops::softmax_with_sink_inplace(&mut x, 1000.0);
    assert_eq!(x, [0.0, 0.0]);
}

/// `softmax_inplace` runs through the sink path with a sink of -inf; its
/// results must stay those of the plain definition (max, exp, left-to-right
/// sum, divide), bit for bit, down to -inf and NaN rows.
#[test]
fn softmax_without_a_sink_keeps_the_plain_bits() {
    let plain = |x: &mut [f32]| {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        x.iter_mut().for_each(|v| *v /= sum);
    };
    let varied: Vec<f32> = (0..37).map(|i| (i * 37 % 11) as f32 * 0.7 - 3.0).collect();
    let rows = [varied, vec![f32::NEG_INFINITY, 1.0], vec![f32::NEG_INFINITY; 3], vec![f32::INFINITY, 0.0], vec![]];
    for row in rows {
        let (mut got, mut want) = (row.clone(), row.clone());
        ops::softmax_inplace(&mut got);
        plain(&mut want);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{row:?}"
        );
    }
}

#[test]
fn silu_known_values() {
    let mut gate = [0.0f32, 1.0, -1.0];
    ops::silu_mul(&mut gate, &[1.0, 2.0, 1.0]);
    assert_eq!(gate[0], 0.0);
    assert!((gate[1] - 2.0 * 0.731_058_6).abs() < 1e-6);
    assert!((gate[2] + 0.268_941_43).abs() < 1e-6);
}

#[test]
fn rope_known_values() {
    // A quarter turn maps (1, 0) to (0, 1) in both conventions.
    let mut neox = [1.0f32, 5.0, 0.0, 7.0];
    ops::rope_neox(&mut neox, &[0.0, 1.0], &[1.0, 0.0]);
    assert_eq!(neox, [0.0, 5.0, 1.0, 7.0]);
    let mut interleaved = [1.0f32, 0.0, 5.0, 7.0];
    ops::rope_interleaved(&mut interleaved, &[0.0, 1.0], &[1.0, 0.0]);
    assert_eq!(interleaved, [0.0, 1.0, 5.0, 7.0]);
}

#[test]
#[should_panic(expected = "two values per angle")]
fn rope_asserts_lengths() {
    ops::rope_neox(&mut [0.0; 4], &[1.0], &[0.0]);
}

#[test]
fn clamped_swiglu_known_values() {
    let (alpha, limit) = (1.702f32, 7.0f32);
    // (gate, up) pairs: zero gate; both in range; gate and up above the
    // limit; up below -limit.
    let gate_up = [0.0f32, 3.0, 1.0, 2.0, 10.0, 100.0, 1.0, -9.0];
    let mut out = [0.0f32; 4];
    ops::clamped_swiglu_interleaved(&gate_up, alpha, limit, &mut out);
    let glu = |g: f32| g / (1.0 + (-g * alpha).exp());
    assert_eq!(out[0], 0.0);
    assert!((out[1] - 3.0 * glu(1.0)).abs() < 1e-6, "{}", out[1]);
    assert!((out[2] - 8.0 * glu(7.0)).abs() < 1e-5, "{}", out[2]);
    assert!((out[3] + 6.0 * glu(1.0)).abs() < 1e-6, "{}", out[3]);
}

#[test]
fn clamped_swiglu_on_split_operands_equals_the_interleaved_reference() {
    // Values on both sides of both clamps, zero and a NaN included.
    let gate = [0.0f32, 1.0, 10.0, 1.0, -3.0, 0.7, f32::NAN, 0.2];
    let up = [3.0f32, 2.0, 100.0, -9.0, 0.4, -0.7, 1.0, f32::NAN];
    for limit in [7.0f32, 0.5] {
        let interleaved: Vec<f32> = gate.iter().zip(&up).flat_map(|(g, u)| [*g, *u]).collect();
        let mut want = [0.0f32; 8];
        ops::clamped_swiglu_interleaved(&interleaved, 1.702, limit, &mut want);
        let mut got = gate;
        ops::clamped_swiglu(&mut got, &up, 1.702, limit);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "limit {limit}");
    }
}

#[test]
fn clamped_swiglu_keeps_a_nan_gate() {
    let mut out = [0.0f32; 2];
    ops::clamped_swiglu_interleaved(&[f32::NAN, 1.0, 1.0, f32::NAN], 1.702, 7.0, &mut out);
    assert!(out[0].is_nan(), "torch's clamp keeps NaN; f32::min would give the limit");
    assert!(out[1].is_nan());
}

#[test]
#[should_panic(expected = "two inputs (gate, up) per output")]
fn clamped_swiglu_refuses_an_odd_input() {
    ops::clamped_swiglu_interleaved(&[1.0, 2.0, 3.0], 1.702, 7.0, &mut [0.0; 2]);
}

#[test]
fn silu_mul_limited_clamps_the_gate_from_above_and_the_up_both_ways() {
    let limit = 7.0f32;
    // Both in range; gate and up above the limit; a gate far below (no
    // lower clamp) and up below -limit; a NaN gate and a NaN up.
    let mut gate = [1.0f32, 10.0, -30.0, f32::NAN, 1.0];
    let up = [2.0f32, 100.0, -9.0, 1.0, f32::NAN];
    ops::silu_mul_limited(&mut gate, &up, limit);
    let silu = |g: f32| g / (1.0 + (-g).exp());
    assert_eq!(gate[0], silu(1.0) * 2.0);
    assert_eq!(gate[1], silu(7.0) * 7.0);
    assert_eq!(gate[2], silu(-30.0) * -7.0);
    assert!(gate[3].is_nan() && gate[4].is_nan(), "torch's clamp keeps NaN: {gate:?}");
}

#[test]
#[should_panic(expected = "must be a non-negative number")]
fn silu_mul_limited_refuses_a_negative_limit() {
    ops::silu_mul_limited(&mut [1.0], &[1.0], -1.0);
}
