//! Wall-clock timings of the delta rule kernels on every instruction-set
//! tier of this CPU: `cargo run -p strata-kernels --example gdn_timing`
//! (the dev profile is optimised). One thread; Qwen3-Next / Qwen3.6 and
//! Kimi-Linear head sizes (`d_k = d_v = 128`).
//!
//! * decode, hot: one head's 64 KiB state stepped over and over (it stays in
//!   L2), the kernel's own speed;
//! * decode, cold: one step on each of 960 heads in turn (30 layers x 32
//!   value heads, 60 MiB of state, Qwen3.6-35B-A3B), so every step reads and
//!   writes its state from and to DRAM, as in a real decode; reported with
//!   the bandwidth of [`gdn::state_bytes`] read + written;
//! * prefill of 512 tokens for one head: token-by-token recurrence against
//!   the chunked form;
//! * Kimi Delta Attention (a decay per key channel): decode, hot, and the
//!   512-token recurrent prefill.

use std::hint::black_box;
use std::time::Instant;

use strata_kernels::gdn::{self, DeltaToken, DeltaTokens, LogDecay, LogDecays};
use strata_kernels::simd::Isa;

const D: usize = 128;

/// Deterministic values in `[-1, 1)`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// l2-normalised rows of `D`, optionally scaled as queries.
fn unit_rows(n: usize, seed: u64, query: bool) -> Vec<f32> {
    let mut x = values(n * D, seed);
    for row in x.chunks_exact_mut(D) {
        strata_kernels::ops::l2norm(row, gdn::L2NORM_EPS);
        if query {
            strata_kernels::ops::scale(gdn::query_scale(D), row);
        }
    }
    x
}

/// Best of `reps` timings of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let tokens = 512;
    let q = unit_rows(tokens, 1, true);
    let k = unit_rows(tokens, 2, false);
    let v = values(tokens * D, 3);
    let g: Vec<f32> = values(tokens, 4).iter().map(|x| -0.5 * (1.0 + x)).collect();
    let g_channel: Vec<f32> = values(tokens * D, 7).iter().map(|x| -0.5 * (1.0 + x)).collect();
    let beta: Vec<f32> = values(tokens, 5).iter().map(|x| 0.5 + 0.4 * x).collect();
    let state0 = values(D * D, 6);
    let bytes = 2 * gdn::state_bytes(D, D);
    let heads = 30 * 32;
    let mut cold_states = vec![0.0f32; heads * D * D];
    for state in cold_states.chunks_exact_mut(D * D) {
        state.copy_from_slice(&state0);
    }
    println!("d_k = d_v = {D}; decode step state traffic {bytes} bytes (read + write)");
    for isa in Isa::all_supported() {
        let token = DeltaToken { q: &q[..D], k: &k[..D], v: &v[..D], g: LogDecay::Head(g[0]), beta: beta[0] };
        let (mut state, mut out) = (state0.clone(), vec![0.0f32; D]);
        let steps = 2000;
        let hot = best(20, || {
            for _ in 0..steps {
                gdn::delta_rule_step(isa, black_box(&mut state), &token, &mut out);
            }
        }) / steps as f64;
        let cold = best(3, || {
            for state in cold_states.chunks_exact_mut(D * D) {
                gdn::delta_rule_step(isa, black_box(state), &token, &mut out);
            }
        }) / heads as f64;
        let run = DeltaTokens { q: &q, k: &k, v: &v, g: LogDecays::Head(&g), beta: &beta };
        let mut prefill_out = vec![0.0f32; tokens * D];
        let recurrent = best(5, || {
            state.copy_from_slice(&state0);
            gdn::delta_rule_recurrent(isa, &mut state, D, &run, &mut prefill_out);
        });
        let chunked = best(5, || {
            state.copy_from_slice(&state0);
            gdn::delta_rule_chunked(isa, &mut state, D, &run, &mut prefill_out);
        });
        println!(
            "{:>10}: decode hot {:6.0} ns/step ({:5.1} GB/s), cold {:6.0} ns/step ({:5.1} GB/s); \
             prefill {tokens} tokens: recurrent {:6.0} us, chunked {:6.0} us ({:.2}x)",
            format!("{:?}", isa.level()),
            hot * 1e9,
            bytes as f64 / hot / 1e9,
            cold * 1e9,
            bytes as f64 / cold / 1e9,
            recurrent * 1e6,
            chunked * 1e6,
            recurrent / chunked,
        );
        let kda_token = DeltaToken { g: LogDecay::Channel(&g_channel[..D]), ..token };
        let kda_hot = best(20, || {
            for _ in 0..steps {
                gdn::delta_rule_step(isa, black_box(&mut state), &kda_token, &mut out);
            }
        }) / steps as f64;
        let kda_run = DeltaTokens { g: LogDecays::Channel(&g_channel), ..run };
        let kda_recurrent = best(5, || {
            state.copy_from_slice(&state0);
            gdn::delta_rule_recurrent(isa, &mut state, D, &kda_run, &mut prefill_out);
        });
        println!(
            "{:>10}  KDA: decode hot {:6.0} ns/step ({:5.1} GB/s); prefill {tokens} tokens: recurrent {:6.0} us",
            "",
            kda_hot * 1e9,
            bytes as f64 / kda_hot / 1e9,
            kda_recurrent * 1e6,
        );
    }
}
