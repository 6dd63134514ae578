//! The delta-rule steps on the CPU: the causal convolution + SiLU, q and k
//! l2-normalised once per key head, then the delta rule per value head,
//! the heads shared out across the pool: Gated DeltaNet's with a decay per
//! head, Kimi Delta Attention's with one per key channel (docs/gdn.md).

use rayon::prelude::*;
use strata_format::GdnDims;
use strata_kernels::gdn::{self, DeltaTokens, LogDecays};
use strata_kernels::simd::Isa;
use strata_kernels::{Threads, ops};

use crate::backend::DeltaJob;

/// A delta-rule layer's weights, as the host holds them.
pub struct GdnWeights<'a> {
    pub conv: &'a [f32],
    /// One per value head (GDN) or per key channel (KDA).
    pub dt_bias: &'a [f32],
    pub a_log: &'a [f32],
}

/// One sequence's tokens through the layer (see [`DeltaJob`]). Each head is
/// computed by the same code on any thread, so the result does not depend
/// on the thread count.
pub fn gated_delta_net(threads: &Threads, isa: Isa, d: &GdnDims, w: &GdnWeights<'_>, job: DeltaJob<'_>) {
    let (d_k, d_v, n_v) = (d.head_k_dim, d.head_v_dim, d.num_v_heads);
    let (recurrent, conv_state) = job.state.split_at_mut(n_v * d_k * d_v);
    gdn::causal_conv1d_silu(job.qkv, d.conv_dim(), w.conv, conv_state);
    let qkv = &*job.qkv;
    let m = qkv.len() / d.conv_dim();
    let per_key_head = n_v / d.num_k_heads;
    let scale = gdn::query_scale(d_k);
    // q and k per key head, l2-normalised (q also scaled) once for the
    // value heads that share them: `[k_head][token, d_k]`.
    let normed = |offset: usize, scale: Option<f32>| -> Vec<Vec<f32>> {
        (0..d.num_k_heads)
            .map(|head| {
                let mut rows = Vec::with_capacity(m * d_k);
                for token in qkv.chunks_exact(d.conv_dim()) {
                    let start = rows.len();
                    rows.extend_from_slice(&token[offset + head * d_k..offset + (head + 1) * d_k]);
                    ops::l2norm(&mut rows[start..], gdn::L2NORM_EPS);
                    if let Some(s) = scale {
                        rows[start..].iter_mut().for_each(|x| *x *= s);
                    }
                }
                rows
            })
            .collect()
    };
    let (qs, ks) = (normed(0, Some(scale)), normed(d.key_dim(), None));
    let (b, a) = (job.b, job.a);
    let head = |head: usize, state: &mut [f32]| {
        let k_head = head / per_key_head;
        let v_offset = 2 * d.key_dim() + head * d_v;
        let v: Vec<f32> =
            qkv.chunks_exact(d.conv_dim()).flat_map(|token| &token[v_offset..v_offset + d_v]).copied().collect();
        let g: Vec<f32> = (0..m).map(|t| gdn::log_decay(a[t * n_v + head], w.dt_bias[head], w.a_log[head])).collect();
        let beta: Vec<f32> = (0..m).map(|t| gdn::write_strength(b[t * n_v + head])).collect();
        let tokens = DeltaTokens { q: &qs[k_head], k: &ks[k_head], v: &v, g: LogDecays::Head(&g), beta: &beta };
        let mut head_out = vec![0.0f32; m * d_v];
        gdn::delta_rule_recurrent(isa, state, d_v, &tokens, &mut head_out);
        head_out
    };
    let heads: Vec<Vec<f32>> = threads.pool().install(|| {
        recurrent.par_chunks_exact_mut(d_k * d_v).enumerate().map(|(index, state)| head(index, state)).collect()
    });
    for (head, head_out) in heads.iter().enumerate() {
        for (row, o) in job.out.chunks_exact_mut(d.value_dim()).zip(head_out.chunks_exact(d_v)) {
            row[head * d_v..(head + 1) * d_v].copy_from_slice(o);
        }
    }
}

/// One sequence's tokens through a Kimi Delta Attention layer (see
/// [`DeltaJob`]; `a` is the forget gate's projection `f_b(f_a(x))`), its
/// forget gate bounded below by `gate_lower_bound` if given.
pub fn kimi_delta_attention(
    threads: &Threads,
    isa: Isa,
    d: &GdnDims,
    w: &GdnWeights<'_>,
    gate_lower_bound: Option<f32>,
    job: DeltaJob<'_>,
) {
    let (d_k, d_v, heads) = (d.head_k_dim, d.head_v_dim, d.num_v_heads);
    assert_eq!(d.num_k_heads, heads, "KDA shares no key heads");
    let (recurrent, conv_state) = job.state.split_at_mut(heads * d_k * d_v);
    gdn::causal_conv1d_silu(job.qkv, d.conv_dim(), w.conv, conv_state);
    let m = job.qkv.len() / d.conv_dim();
    let g = channel_log_decays(&job.a[..m * d.key_dim()], w.dt_bias, w.a_log, d_k, gate_lower_bound);
    let beta: Vec<f32> = job.b[..m * heads].iter().map(|&b| gdn::write_strength(b)).collect();
    let tokens = KdaTokens { qkv: job.qkv, g: &g, beta: &beta };
    kda_heads(threads, isa, d, &tokens, recurrent, job.out);
}

/// `g = −exp(A_log_h) · softplus(f + dt_bias)`, or with a lower bound
/// `bound · sigmoid(exp(A_log_h) · (f + dt_bias))`, of every token and key
/// channel, `[m, key_dim]` from the forget gate's projection `f`.
fn channel_log_decays(f: &[f32], dt_bias: &[f32], a_log: &[f32], d_k: usize, lower_bound: Option<f32>) -> Vec<f32> {
    let key_dim = dt_bias.len();
    assert_eq!(key_dim, a_log.len() * d_k, "dt_bias per key channel, A_log per head");
    f.iter()
        .enumerate()
        .map(|(i, &fi)| {
            let channel = i % key_dim;
            let (dt_bias, a_log) = (dt_bias[channel], a_log[channel / d_k]);
            match lower_bound {
                None => gdn::channel_log_decay(fi, dt_bias, a_log),
                Some(bound) => gdn::bounded_channel_log_decay(fi, dt_bias, a_log, bound),
            }
        })
        .collect()
}

/// A sequence's convolved `qkv` `[m, conv_dim]`, log decays `g` `[m,
/// key_dim]` and write strengths `beta` `[m, heads]`.
struct KdaTokens<'a> {
    qkv: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

/// The delta rule of every head over `t`, from and into `recurrent` (`[heads,
/// d_k, d_v]`), writing `out` `[m, value_dim]`. q and k are l2-normalised
/// as kimi_linear's `l2norm` does (a division per element, not Qwen's
/// reciprocal), q then scaled by `1 / sqrt(d_k)`.
fn kda_heads(threads: &Threads, isa: Isa, d: &GdnDims, t: &KdaTokens<'_>, recurrent: &mut [f32], out: &mut [f32]) {
    let (d_k, d_v, heads) = (d.head_k_dim, d.head_v_dim, d.num_v_heads);
    let (key_dim, conv_dim) = (d.key_dim(), d.conv_dim());
    let scale = gdn::query_scale(d_k);
    let head = |head: usize, state: &mut [f32]| {
        let column = |offset: usize, width: usize| -> Vec<f32> {
            t.qkv.chunks_exact(conv_dim).flat_map(|token| &token[offset + head * width..][..width]).copied().collect()
        };
        let (mut q, mut k, v) = (column(0, d_k), column(key_dim, d_k), column(2 * key_dim, d_v));
        for (qt, kt) in q.chunks_exact_mut(d_k).zip(k.chunks_exact_mut(d_k)) {
            ops::l2norm_divided(qt, gdn::L2NORM_EPS);
            ops::scale(scale, qt);
            ops::l2norm_divided(kt, gdn::L2NORM_EPS);
        }
        let g: Vec<f32> =
            t.g.chunks_exact(key_dim).flat_map(|token| &token[head * d_k..(head + 1) * d_k]).copied().collect();
        let beta: Vec<f32> = t.beta.chunks_exact(heads).map(|token| token[head]).collect();
        let tokens = DeltaTokens { q: &q, k: &k, v: &v, g: LogDecays::Channel(&g), beta: &beta };
        let mut head_out = vec![0.0f32; beta.len() * d_v];
        gdn::delta_rule_recurrent(isa, state, d_v, &tokens, &mut head_out);
        head_out
    };
    let outs: Vec<Vec<f32>> = threads.pool().install(|| {
        recurrent.par_chunks_exact_mut(d_k * d_v).enumerate().map(|(index, state)| head(index, state)).collect()
    });
    for (head, head_out) in outs.iter().enumerate() {
        for (row, o) in out.chunks_exact_mut(d.value_dim()).zip(head_out.chunks_exact(d_v)) {
            row[head * d_v..(head + 1) * d_v].copy_from_slice(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use strata_format::{GdnDims, GdnProjections, npy};
    use strata_kernels::Threads;
    use strata_kernels::simd::Isa;

    use super::{KdaTokens, channel_log_decays, kda_heads};

    /// Agreement with torch, relative to the largest magnitude of each
    /// tensor (the kernels' own bar for these arrays).
    const TORCH_REL_TOL: f32 = 1e-5;

    fn load(name: &str) -> (Vec<usize>, Vec<f32>) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gdn").join(format!("{name}.npy"));
        npy::read_f32(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1.0);
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= TORCH_REL_TOL * scale, "{what}[{i}]: {g} vs torch's {w}");
        }
    }

    /// The block's layout (q | k | v per token, heads side by side, the
    /// decay per key channel from the gate's projection, beta per head)
    /// against `recurrent_kimi_delta_attention` on testdata/gdn's `kda_*`.
    #[test]
    fn kimi_delta_heads_match_transformers_recurrence() {
        kda_heads_match("kda", None);
    }

    /// The same with GLM-5.3-Flash's forget gate bounded at −5, on
    /// testdata/gdn's `glm_*` (glm5_next's recurrence).
    #[test]
    fn bounded_kimi_delta_heads_match_glm5_next_recurrence() {
        kda_heads_match("glm", Some(-5.0));
    }

    /// The heads of the GDN case's q, k, v, beta and state with the gate
    /// arrays `{prefix}_*`, against torch's `{prefix}_recurrent_*`.
    fn kda_heads_match(prefix: &str, gate_lower_bound: Option<f32>) {
        let (q_shape, q) = load("q");
        let (v_shape, v) = load("v");
        let (_, k) = load("k");
        let (_, beta) = load("beta");
        let (_, state0) = load("state0");
        let (_, f) = load(&format!("{prefix}_f"));
        let (_, dt_bias) = load(&format!("{prefix}_dt_bias"));
        let (_, a_log) = load(&format!("{prefix}_a_log"));
        let (_, want_out) = load(&format!("{prefix}_recurrent_out"));
        let (_, want_state) = load(&format!("{prefix}_recurrent_state"));
        let [tokens, heads, d_k] = q_shape[..] else { panic!("q shape {q_shape:?}") };
        let d = GdnDims {
            num_k_heads: heads,
            num_v_heads: heads,
            head_k_dim: d_k,
            head_v_dim: v_shape[2],
            conv_kernel: 4,
            projections: GdnProjections::Kimi,
        };
        let (key_dim, value_dim) = (d.key_dim(), d.value_dim());
        let qkv: Vec<f32> = (0..tokens)
            .flat_map(|t| {
                let row = |x: &[f32], width: usize| x[t * width..(t + 1) * width].to_vec();
                [row(&q, key_dim), row(&k, key_dim), row(&v, value_dim)].concat()
            })
            .collect();
        let g = channel_log_decays(&f, &dt_bias, &a_log, d_k, gate_lower_bound);
        let mut state = state0.clone();
        let mut out = vec![f32::NAN; tokens * value_dim];
        let threads = Threads::new(2).expect("a pool of two");
        kda_heads(&threads, Isa::detect(), &d, &KdaTokens { qkv: &qkv, g: &g, beta: &beta }, &mut state, &mut out);
        assert_close(&out, &want_out, &format!("{prefix} out"));
        assert_close(&state, &want_state, &format!("{prefix} state"));
    }
}
