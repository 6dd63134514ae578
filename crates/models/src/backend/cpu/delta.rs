//! The Gated DeltaNet step on the CPU: the causal convolution + SiLU, q
//! and k l2-normalised once per key head, then the delta rule per value
//! head, the heads shared out across the pool (docs/gdn.md).

use rayon::prelude::*;
use strata_format::GdnDims;
use strata_kernels::gdn::{self, DeltaTokens, LogDecays};
use strata_kernels::simd::Isa;
use strata_kernels::{Threads, ops};

use crate::backend::DeltaJob;

/// A Gated DeltaNet layer's weights, as the host holds them.
pub struct GdnWeights<'a> {
    pub conv: &'a [f32],
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
