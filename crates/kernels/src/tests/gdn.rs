//! Delta rule kernels (Gated DeltaNet's per-head decay and Kimi Delta
//! Attention's per-channel one): every tier's decode step against the
//! scalar reference, the chunked form against the recurrence, and the
//! conv1d's decode form against its many-token form.

use proptest::prelude::*;

use super::CASES;
use crate::gdn::{self, DeltaToken, DeltaTokens, LogDecay, LogDecays};
use crate::scalar;
use crate::simd::Isa;

/// Head sizes: the odd ones of the brief, the models' 128, and any other.
fn head_dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(7), Just(33), Just(128), 1usize..=80]
}

/// Asserts `|got - want| <= rel * |want|_inf` element-wise: the rounding of
/// these kernels is relative to the largest state or output value, not to
/// each (possibly cancelled) element.
pub(crate) fn assert_all_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_within(got, want, rel * inf_norm(want), what);
}

fn inf_norm(x: &[f32]) -> f32 {
    x.iter().fold(f32::MIN_POSITIVE, |m, v| m.max(v.abs()))
}

/// Asserts `|got - want| <= tol` element-wise.
fn assert_within(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let (worst, at) = got.iter().zip(want).enumerate().fold((0.0f32, 0), |(w, at), (i, (g, v))| {
        let d = (g - v).abs();
        if d > w || d.is_nan() { (d, i) } else { (w, at) }
    });
    assert!(worst <= tol, "{what}: element {at}: got {}, want {} (diff {worst}, tol {tol})", got[at], want[at]);
}

/// A deterministic pseudo-random stream in `[-1, 1)` (xorshift), for the
/// fixed-size cases that proptest would make slow to shrink.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// Owned inputs of a run of tokens for one head, as the models produce
/// them: l2-normalised (and scaled) q, l2-normalised k, `g <= 0`,
/// `beta` in `(0, 1)`.
pub(crate) struct Run {
    pub d_k: usize,
    pub d_v: usize,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// `[tokens]`, or `[tokens, d_k]` with `per_channel`.
    pub g: Vec<f32>,
    /// Kimi Delta Attention's decay, one per key channel.
    pub per_channel: bool,
    pub beta: Vec<f32>,
    pub state: Vec<f32>,
}

impl Run {
    fn random(seed: u64, tokens: usize, d_k: usize, d_v: usize) -> Self {
        let mut rng = Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut q = rng.vec(tokens * d_k);
        let mut k = rng.vec(tokens * d_k);
        for (qt, kt) in q.chunks_exact_mut(d_k).zip(k.chunks_exact_mut(d_k)) {
            scalar::l2norm(qt, gdn::L2NORM_EPS);
            scalar::scale(gdn::query_scale(d_k), qt);
            scalar::l2norm(kt, gdn::L2NORM_EPS);
        }
        let v = rng.vec(tokens * d_v).iter().map(|x| 2.0 * x).collect();
        // softplus-like decays in (-2, 0] and sigmoid-like betas.
        let g = rng.vec(tokens).iter().map(|x| -(1.0 + x)).collect();
        let beta = rng.vec(tokens).iter().map(|x| 0.5 + 0.49 * x).collect();
        let state = rng.vec(d_k * d_v);
        Run { d_k, d_v, q, k, v, g, per_channel: false, beta, state }
    }

    /// [`Run::random`] with a decay per key channel (Kimi Delta
    /// Attention), or per head when `per_channel` is false.
    fn random_decay(seed: u64, tokens: usize, d_k: usize, d_v: usize, per_channel: bool) -> Self {
        let mut run = Run::random(seed, tokens, d_k, d_v);
        if per_channel {
            let mut rng = Lcg(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
            run.g = rng.vec(tokens * d_k).iter().map(|x| -(1.0 + x)).collect();
            run.per_channel = true;
        }
        run
    }

    pub(crate) fn tokens(&self) -> DeltaTokens<'_> {
        let g = if self.per_channel { LogDecays::Channel(&self.g) } else { LogDecays::Head(&self.g) };
        DeltaTokens { q: &self.q, k: &self.k, v: &self.v, g, beta: &self.beta }
    }

    fn token(&self, t: usize) -> DeltaToken<'_> {
        self.tokens().token(t, self.d_k, self.d_v)
    }

    /// The largest value a run passes through. The kernels round relative
    /// to it, not to the final state, which a few tokens can cancel to far
    /// below it (d_k = d_v = 1, 3 tokens: a final state of 0.0102 from values
    /// near 1, the chunked form 2.4e-7 = 1.5e-8 of the values away; the test
    /// `chunked_tolerance_is_relative_to_the_values_not_a_cancelled_state`).
    fn value_scale(&self, want_out: &[f32], want_state: &[f32]) -> f32 {
        [want_out, want_state, &self.state, &self.v].into_iter().map(inf_norm).fold(0.0, f32::max)
    }

    /// Outputs `[tokens, d_v]` and final state of the scalar reference.
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        let mut state = self.state.clone();
        let mut out = vec![f32::NAN; self.beta.len() * self.d_v];
        for (t, out_t) in out.chunks_exact_mut(self.d_v).enumerate() {
            scalar::gdn::delta_rule_step(&mut state, &self.token(t), out_t);
        }
        (out, state)
    }
}

/// Chunked and recurrent prefill agree to this, relative to the largest
/// value they pass through (worst seen over 300 000 random short runs:
/// 1.5e-8; over 3000 of the proptest's cases: 5e-6).
const CHUNK_REL_TOL: f32 = 1e-5;

/// The vector tiers agree with the scalar reference step to this.
const STEP_REL_TOL: f32 = 1e-5;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Three decode steps on every tier (the scalar one included, through
    /// the dispatching code) against the scalar reference.
    #[test]
    fn decode_step_matches_scalar(
        d_k in head_dim(),
        d_v in head_dim(),
        per_channel in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let run = Run::random_decay(seed, 3, d_k, d_v, per_channel);
        let (want_out, want_state) = run.reference();
        for isa in Isa::all_supported() {
            let mut state = run.state.clone();
            let mut out = vec![f32::NAN; 3 * d_v];
            for (t, out_t) in out.chunks_exact_mut(d_v).enumerate() {
                gdn::delta_rule_step(isa, &mut state, &run.token(t), out_t);
            }
            let tol = STEP_REL_TOL * run.value_scale(&want_out, &want_state);
            assert_within(&out, &want_out, tol, &format!("{isa:?} out"));
            assert_within(&state, &want_state, tol, &format!("{isa:?} state"));
        }
    }

    /// The dispatched step on the scalar tier is the reference, bit for bit.
    #[test]
    fn scalar_tier_step_is_the_reference(
        d_k in head_dim(),
        d_v in head_dim(),
        per_channel in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let run = Run::random_decay(seed, 2, d_k, d_v, per_channel);
        let (want_out, want_state) = run.reference();
        let mut state = run.state.clone();
        let mut out = vec![f32::NAN; 2 * d_v];
        for (t, out_t) in out.chunks_exact_mut(d_v).enumerate() {
            gdn::delta_rule_step(Isa::scalar(), &mut state, &run.token(t), out_t);
        }
        prop_assert_eq!(bits(&out), bits(&want_out));
        prop_assert_eq!(bits(&state), bits(&want_state));
    }

    #[test]
    fn chunked_matches_recurrence(
        tokens in prop_oneof![1usize..=3, 60usize..=70, 126usize..=131],
        d_k in 1usize..=24,
        d_v in 1usize..=24,
        seed in any::<u64>(),
    ) {
        check_chunked(&Run::random(seed, tokens, d_k, d_v));
    }

    /// A per-channel decay whose channels all hold the head's `g` is the
    /// per-head decay, bit for bit, on every tier.
    #[test]
    fn per_channel_decay_of_equal_channels_is_the_head_decay(
        d_k in head_dim(),
        d_v in head_dim(),
        seed in any::<u64>(),
    ) {
        let head = Run::random(seed, 3, d_k, d_v);
        let mut channel = Run::random(seed, 3, d_k, d_v);
        channel.g = head.g.iter().flat_map(|&g| std::iter::repeat_n(g, d_k)).collect();
        channel.per_channel = true;
        for isa in Isa::all_supported() {
            let mut outs = Vec::new();
            for run in [&head, &channel] {
                let mut state = run.state.clone();
                let mut out = vec![f32::NAN; 3 * d_v];
                gdn::delta_rule_recurrent(isa, &mut state, d_v, &run.tokens(), &mut out);
                outs.push((bits(&out), bits(&state)));
            }
            prop_assert_eq!(&outs[0], &outs[1], "{:?}", isa);
        }
    }

    /// The recurrent prefill with a per-channel decay is its decode steps,
    /// bit for bit, on every tier.
    #[test]
    fn per_channel_recurrent_is_its_steps(d_k in head_dim(), d_v in head_dim(), seed in any::<u64>()) {
        let run = Run::random_decay(seed, 5, d_k, d_v, true);
        for isa in Isa::all_supported() {
            let (mut state, mut out) = (run.state.clone(), vec![f32::NAN; 5 * d_v]);
            gdn::delta_rule_recurrent(isa, &mut state, d_v, &run.tokens(), &mut out);
            let (mut step_state, mut step_out) = (run.state.clone(), vec![f32::NAN; 5 * d_v]);
            for (t, out_t) in step_out.chunks_exact_mut(d_v).enumerate() {
                gdn::delta_rule_step(isa, &mut step_state, &run.token(t), out_t);
            }
            prop_assert_eq!(bits(&out), bits(&step_out));
            prop_assert_eq!(bits(&state), bits(&step_state));
        }
    }

    /// Kimi's forget gate against its definition evaluated in f64.
    #[test]
    fn channel_log_decay_matches_definition(f in -30.0f32..30.0, dt_bias in -2.0f32..2.0, a_log in -3.0f32..3.0) {
        let x = f64::from(f + dt_bias);
        let softplus = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
        let want = -f64::from(a_log).exp() * softplus;
        let got = f64::from(gdn::channel_log_decay(f, dt_bias, a_log));
        prop_assert!(got <= 0.0);
        // The kernel forms `1 + e^x` in f32, as the definition reads: for a very
        // negative `x` that sum is rounded to f32's epsilon, which the factor
        // `e^a_log` (up to e^3) carries into the result (CI: x = -12.4,
        // a_log = 2.89 gave 1.0e-6 of 7.3e-5).
        let rounding = f64::from(f32::EPSILON) * f64::from(a_log).exp();
        prop_assert!((got - want).abs() <= 1e-5 * want.abs() + 1e-6 + rounding, "{got} vs {want}");
    }

    /// The conv's many-token form equals its decode form bit for bit,
    /// whatever the split of the tokens into calls.
    #[test]
    fn conv1d_many_tokens_equals_steps(
        channels in 1usize..=40,
        kernel in 1usize..=5,
        tokens in 0usize..=12,
        split in 0usize..=12,
        seed in any::<u64>(),
    ) {
        let mut rng = Lcg(seed | 1);
        let x = rng.vec(tokens * channels);
        let weight = rng.vec(channels * kernel);
        let state0 = rng.vec(channels * (kernel - 1));
        let (mut many, mut many_state) = (x.clone(), state0.clone());
        let split = split.min(tokens) * channels;
        gdn::causal_conv1d_silu(&mut many[..split], channels, &weight, &mut many_state);
        gdn::causal_conv1d_silu(&mut many[split..], channels, &weight, &mut many_state);
        let (mut steps, mut step_state) = (x.clone(), state0.clone());
        for token in steps.chunks_exact_mut(channels) {
            gdn::causal_conv1d_silu_step(token, &weight, &mut step_state);
        }
        prop_assert_eq!(bits(&many), bits(&steps));
        prop_assert_eq!(bits(&many_state), bits(&step_state));
        // And both against an f64 evaluation of the definition.
        let hist = kernel - 1;
        for c in 0..channels {
            let mut window: Vec<f64> = state0[c * hist..(c + 1) * hist].iter().map(|&v| f64::from(v)).collect();
            for t in 0..tokens {
                window.push(f64::from(x[t * channels + c]));
                let pre: f64 = (0..kernel).map(|j| f64::from(weight[c * kernel + j]) * window[window.len() - kernel + j]).sum();
                let want = pre / (1.0 + (-pre).exp());
                let got = f64::from(many[t * channels + c]);
                prop_assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "c {c} t {t}: {got} vs {want}");
            }
            let last: Vec<f32> = window[window.len() - hist..].iter().map(|&v| v as f32).collect();
            prop_assert_eq!(&many_state[c * hist..(c + 1) * hist], last.as_slice());
        }
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Chunked prefill on every tier against the scalar recurrence.
fn check_chunked(run: &Run) {
    let (want_out, want_state) = run.reference();
    let scale = run.value_scale(&want_out, &want_state);
    for isa in Isa::all_supported() {
        let mut state = run.state.clone();
        let mut out = vec![f32::NAN; want_out.len()];
        gdn::delta_rule_chunked(isa, &mut state, run.d_v, &run.tokens(), &mut out);
        let tol = CHUNK_REL_TOL * scale;
        assert_within(&out, &want_out, tol, &format!("{isa:?} chunked out, {} tokens", run.beta.len()));
        assert_within(&state, &want_state, tol, &format!("{isa:?} chunked state"));
        let mut state = run.state.clone();
        gdn::delta_rule_recurrent(isa, &mut state, run.d_v, &run.tokens(), &mut out);
        let tol = STEP_REL_TOL * scale;
        assert_within(&out, &want_out, tol, &format!("{isa:?} recurrent out"));
        assert_within(&state, &want_state, tol, &format!("{isa:?} recurrent state"));
    }
}

/// A final state cancelled far below the values that made it is judged
/// against those values (this case failed CI when judged against itself).
#[test]
fn chunked_tolerance_is_relative_to_the_values_not_a_cancelled_state() {
    check_chunked(&Run::random(55298, 3, 1, 1));
}

/// The lengths of the brief around the chunk size, at the models' head size.
#[test]
fn chunked_matches_recurrence_at_model_sizes() {
    for (seed, tokens) in [1usize, 63, 64, 65, 130].into_iter().enumerate() {
        check_chunked(&Run::random(seed as u64, tokens, 128, 128));
    }
}

#[test]
fn empty_runs_leave_the_state() {
    let run = Run::random(7, 0, 4, 3);
    let mut state = run.state.clone();
    gdn::delta_rule_chunked(Isa::detect(), &mut state, 3, &run.tokens(), &mut []);
    gdn::delta_rule_recurrent(Isa::detect(), &mut state, 3, &run.tokens(), &mut []);
    assert_eq!(state, run.state);
}

/// A hand-computed step: d_k = 2, d_v = 1.
#[test]
fn decode_step_known_values() {
    // S = [1, 2]^T, g = ln 0.5 -> S = [0.5, 1]; kv_mem = k.S = 0.5;
    // delta = (3 - 0.5) * 0.4 = 1; S = [1.5, 1]; out = q.S = 1.5 * 2 = 3.
    let token = DeltaToken { q: &[2.0, 0.0], k: &[1.0, 0.0], v: &[3.0], g: LogDecay::Head(0.5f32.ln()), beta: 0.4 };
    for isa in Isa::all_supported() {
        let (mut state, mut out) = ([1.0f32, 2.0], [0.0f32]);
        gdn::delta_rule_step(isa, &mut state, &token, &mut out);
        assert!((state[0] - 1.5).abs() < 1e-6 && (state[1] - 1.0).abs() < 1e-6, "{isa:?}: {state:?}");
        assert!((out[0] - 3.0).abs() < 1e-6, "{isa:?}: {out:?}");
    }
}

/// A hand-computed step with a decay per key channel: d_k = 2, d_v = 1.
#[test]
fn per_channel_decode_step_known_values() {
    // S = [1, 2]^T, g = [ln 0.5, ln 0.25] -> S = [0.5, 0.5]; kv_mem = k.S =
    // 0.5; delta = (3 - 0.5) * 0.4 = 1; S = [1.5, 0.5]; out = q.S = 3 + 1.
    let g = [0.5f32.ln(), 0.25f32.ln()];
    let token = DeltaToken { q: &[2.0, 2.0], k: &[1.0, 0.0], v: &[3.0], g: LogDecay::Channel(&g), beta: 0.4 };
    for isa in Isa::all_supported() {
        let (mut state, mut out) = ([1.0f32, 2.0], [0.0f32]);
        gdn::delta_rule_step(isa, &mut state, &token, &mut out);
        assert!((state[0] - 1.5).abs() < 1e-6 && (state[1] - 0.5).abs() < 1e-6, "{isa:?}: {state:?}");
        assert!((out[0] - 4.0).abs() < 1e-6, "{isa:?}: {out:?}");
    }
}

/// Key heads wider than one block of per-channel decay factors: the
/// blocks sum `k^T S` in row order, as the reference does.
#[test]
fn per_channel_decay_over_several_row_blocks_matches_scalar() {
    let run = Run::random_decay(11, 3, 300, 17, true);
    let (want_out, want_state) = run.reference();
    let tol = STEP_REL_TOL * run.value_scale(&want_out, &want_state);
    for isa in Isa::all_supported() {
        let (mut state, mut out) = (run.state.clone(), vec![f32::NAN; 3 * 17]);
        gdn::delta_rule_recurrent(isa, &mut state, 17, &run.tokens(), &mut out);
        assert_within(&out, &want_out, tol, &format!("{isa:?} out"));
        assert_within(&state, &want_state, tol, &format!("{isa:?} state"));
    }
}

#[test]
#[should_panic(expected = "one decay per head")]
fn chunked_form_refuses_a_per_channel_decay() {
    let run = Run::random_decay(3, 2, 4, 3, true);
    gdn::delta_rule_chunked(Isa::scalar(), &mut run.state.clone(), 3, &run.tokens(), &mut [0.0; 6]);
}

#[test]
#[should_panic(expected = "one log decay per key channel")]
fn step_asserts_one_decay_per_key_channel() {
    let token = DeltaToken { q: &[0.0; 2], k: &[0.0; 2], v: &[0.0; 3], g: LogDecay::Channel(&[0.0; 3]), beta: 0.0 };
    gdn::delta_rule_step(Isa::scalar(), &mut [0.0; 6], &token, &mut [0.0; 3]);
}

#[test]
fn state_bytes_and_scale() {
    // Qwen3-Next / Qwen3.6 heads: 64 KiB read and written per decode step.
    assert_eq!(gdn::state_bytes(128, 128), 65_536);
    // Rounded to f32, `d ** -0.5` and `1 / sqrt(d)` agree for every d <= 4096.
    assert_eq!(gdn::query_scale(128), (1.0f64 / 128f64.sqrt()) as f32);
    assert_eq!(gdn::query_scale(4), 0.5);
}

#[test]
#[should_panic(expected = "state must be [d_k, d_v]")]
fn step_asserts_state_shape() {
    let token = DeltaToken { q: &[0.0; 2], k: &[0.0; 2], v: &[0.0; 3], g: LogDecay::Head(0.0), beta: 0.0 };
    gdn::delta_rule_step(Isa::scalar(), &mut [0.0; 5], &token, &mut [0.0; 3]);
}

#[test]
#[should_panic(expected = "kernel - 1")]
fn conv_asserts_state_shape() {
    gdn::causal_conv1d_silu_step(&mut [0.0; 2], &[0.0; 8], &mut [0.0; 4]);
}
