//! Pieces every graph shares: token embedding, RMSNorm over rows, the final
//! norm and lm_head, and running a layer's routed experts through the one
//! expert pipeline (with routing trace and time accounting).

use strata_format::{Container, ExpertLayout, ModelSpec};
use strata_kernels::{Matrix, ops};
use strata_sched::{LayerStats, MoeBatch, Route, run_moe_layer};
use strata_tier::TraceWriter;

use crate::{Error, Logits, Result, Runtime, SeqBatch};

/// Rows of the embedding `table` for `tokens`, `[n, hidden]`.
pub fn embed(container: &Container, spec: &ModelSpec, table: &str, tokens: &[u32]) -> Result<Vec<f32>> {
    let h = spec.hidden_size;
    let table: Matrix<'_> = container.dense(table)?;
    let mut x = vec![0.0f32; tokens.len() * h];
    for (row, &token) in x.chunks_exact_mut(h).zip(tokens) {
        if token as usize >= spec.vocab_size {
            return Err(Error::TokenOutOfRange { token, vocab_size: spec.vocab_size });
        }
        table.row_to_f32(token as usize, row);
    }
    Ok(x)
}

/// RMS-normalises each `weight.len()`-wide row of `xs` into `out`.
pub fn rmsnorm_into(xs: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    for (x, o) in xs.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
        ops::rmsnorm(x, weight, eps, o);
    }
}

/// RMS-normalises every `width`-wide chunk of `rows` in place.
pub fn rmsnorm_rows(rows: &mut [f32], weight: &[f32], eps: f32, width: usize) {
    assert_eq!(weight.len(), width, "norm weight matches its span");
    for chunk in rows.chunks_exact_mut(width) {
        ops::rmsnorm_inplace(chunk, weight, eps);
    }
}

/// A batch's new tokens, concatenated, and each one's position in its own
/// sequence; reserves every sequence's cache room for them first.
pub fn batch_rows(seqs: &mut [SeqBatch<'_>]) -> Result<(Vec<u32>, Vec<usize>)> {
    for seq in seqs.iter_mut() {
        seq.cache.reserve(seq.tokens.len())?;
    }
    let tokens = seqs.iter().flat_map(|seq| seq.tokens.iter().copied()).collect();
    let positions = seqs.iter().flat_map(|seq| seq.cache.len()..seq.cache.len() + seq.tokens.len()).collect();
    Ok((tokens, positions))
}

/// Each sequence's logits after its last new token, from a batch's final
/// hidden states `x` (`[rows, hidden]`): the lm head runs once over all.
pub fn batch_logits(
    rt: &Runtime<'_>,
    c: &Container,
    spec: &ModelSpec,
    x: &[f32],
    seqs: &[SeqBatch<'_>],
    final_norm: &str,
    lm_head: &str,
) -> Result<Vec<Vec<f32>>> {
    let h = spec.hidden_size;
    let mut last_rows = Vec::with_capacity(seqs.len() * h);
    let mut end = 0;
    for seq in seqs {
        end += seq.tokens.len();
        last_rows.extend_from_slice(&x[(end - 1) * h..end * h]);
    }
    let logits = output_logits(rt, c, spec, &last_rows, Logits::All, final_norm, lm_head)?;
    Ok(logits.chunks_exact(spec.vocab_size).map(<[f32]>::to_vec).collect())
}

/// The pre-norm residual stack both graphs share, over a batch's hidden
/// states `x` (`[rows, hidden]`): for each layer `l`,
/// `x += attention(l, norm_in(x))`, then `ffn(l, norm_post(x), x)` adds the
/// feed-forward output; `norms(l)` names the layer's two norm weights.
/// Afterwards every sequence's cache counts its new tokens.
pub fn decoder_stack<'n>(
    c: &Container,
    spec: &ModelSpec,
    seqs: &mut [SeqBatch<'_>],
    mut x: Vec<f32>,
    norms: impl Fn(usize) -> (&'n str, &'n str),
    mut attention: impl FnMut(usize, &[f32], &mut [SeqBatch<'_>]) -> Result<Vec<f32>>,
    mut ffn: impl FnMut(usize, &[f32], &mut [f32]) -> Result<()>,
) -> Result<Vec<f32>> {
    let mut normed = vec![0.0f32; x.len()];
    for l in 0..spec.num_layers {
        let (input_norm, post_attn_norm) = norms(l);
        rmsnorm_into(&x, c.dense_vec(input_norm)?, spec.rms_norm_eps, &mut normed);
        let attn = attention(l, &normed, seqs)?;
        x.iter_mut().zip(&attn).for_each(|(a, b)| *a += b);
        rmsnorm_into(&x, c.dense_vec(post_attn_norm)?, spec.rms_norm_eps, &mut normed);
        ffn(l, &normed, &mut x)?;
    }
    for seq in seqs.iter_mut() {
        seq.cache.advance(seq.tokens.len());
    }
    Ok(x)
}

/// Adds `bias` to every row of `rows`.
pub fn add_bias(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
    }
}

/// `y = W x` for every row of `xs` (`[n, cols]`), plus an optional bias.
pub fn project(rt: &Runtime<'_>, c: &Container, weight: &str, bias: Option<&str>, xs: &[f32]) -> Result<Vec<f32>> {
    let m = c.dense(weight)?;
    let n = xs.len() / m.cols;
    let mut out = vec![0.0f32; n * m.rows];
    rt.threads.matmul(&m, xs, n, &mut out);
    if let Some(bias) = bias {
        add_bias(&mut out, c.dense_vec(bias)?);
    }
    Ok(out)
}

/// The final RMSNorm and lm_head over the positions `which` asks for.
pub fn output_logits(
    rt: &Runtime<'_>,
    c: &Container,
    spec: &ModelSpec,
    x: &[f32],
    which: Logits,
    final_norm: &str,
    lm_head: &str,
) -> Result<Vec<f32>> {
    let h = spec.hidden_size;
    let n = x.len() / h;
    let rows = match which {
        Logits::All => x,
        Logits::Last => &x[(n - 1) * h..],
    };
    let m = rows.len() / h;
    let mut normed = vec![0.0f32; m * h];
    rmsnorm_into(rows, c.dense_vec(final_norm)?, spec.rms_norm_eps, &mut normed);
    let mut out = vec![0.0f32; m * spec.vocab_size];
    rt.threads.matmul(&c.dense(lm_head)?, &normed, m, &mut out);
    Ok(out)
}

/// Adds the routed experts' weighted outputs for `xs` (`[n, hidden]`, row
/// `i` at sequence position `positions[i]`) to `out`, recording the routes
/// in the trace and the time in the run statistics.
pub fn run_routed_experts(
    rt: &Runtime<'_>,
    layout: &ExpertLayout,
    layer: usize,
    positions: &[usize],
    xs: &[f32],
    hidden: usize,
    routes: &[Route],
    top_k: usize,
    out: &mut [f32],
) -> Result<()> {
    if let Some(trace) = rt.trace {
        record_routes(&mut trace.lock().unwrap_or_else(|p| p.into_inner()), layer, positions, routes, top_k)?;
    }
    let batch = MoeBatch { layer, layout, xs, hidden, routes, top_k };
    let mut layer_stats = LayerStats::default();
    let result = run_moe_layer(rt.store, rt.threads, &batch, out, &mut layer_stats);
    rt.stats.lock().unwrap_or_else(|p| p.into_inner()).add(layer_stats);
    Ok(result?)
}

fn record_routes(
    trace: &mut TraceWriter,
    layer: usize,
    positions: &[usize],
    routes: &[Route],
    top_k: usize,
) -> Result<()> {
    for (&position, token_routes) in positions.iter().zip(routes.chunks_exact(top_k)) {
        let experts: Vec<usize> = token_routes.iter().map(|r| r.expert).collect();
        trace.write(layer, position as u64, &experts)?;
    }
    Ok(())
}
