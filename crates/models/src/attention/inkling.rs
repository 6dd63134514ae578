//! Inkling's attention (`InklingAttention`, docs/inkling.md): q, k, v and r
//! projections; k and v through their short convolutions; per-head RMSNorm
//! of q and k; no RoPE; scores `q · k / head_dim` plus each query head's bias
//! by backward distance (`r_proj(x)` per head times `rel_logits_proj`); on
//! full layers with log scaling, q and the bias times `tau(position)`; o_proj,
//! then the output's own short convolution. Its layer's heads, head dim and
//! window are its own ([`InklingAttention`]).

use strata_format::{CoreSpec, InklingAttention, LogScaling, NormKind, names};
use strata_kv::StatePart;

use crate::backend::Runtime;
use crate::backend::{AttendJob, AttnShape, Backend, PositionBias, VectorHandle};
use crate::common::Linear;
use crate::conv::ShortConvolution;
use crate::error::Result;
use crate::lm::SeqBatch;
use crate::norm::Norm;

/// The cache parts, in [`strata_kv::layout_of`]'s order: keys, values (rows,
/// or a window's ring), then the k, v and output convolutions' states.
const KEYS: usize = 0;
const VALUES: usize = 1;
const KEY_CONV: usize = 2;
const VALUE_CONV: usize = 3;
const OUTPUT_CONV: usize = 4;

/// One layer's Inkling attention tensors and shape.
pub struct Inkling {
    dims: InklingAttention,
    q: Linear,
    k: Linear,
    v: Linear,
    r: Linear,
    o: Linear,
    q_norm: Norm,
    k_norm: Norm,
    k_conv: ShortConvolution,
    v_conv: ShortConvolution,
    output_conv: ShortConvolution,
    /// `rel_logits_proj.proj`, `[d_rel, rel_extent]`.
    rel_proj: VectorHandle,
}

/// transformers' `tau` for the query at `position`: `1 + alpha · ln(max((p
/// + 1) / n_floor, 1))`, in f32 as its "original impl" computes it.
fn log_scale(position: usize, scaling: LogScaling) -> f32 {
    1.0 + scaling.alpha * ((position + 1) as f32 / scaling.n_floor as f32).max(1.0).ln()
}

impl Inkling {
    /// Layer `layer`'s tensors, shape-checked; its q/k norms of kind `norm`.
    pub fn load(
        b: &mut Backend,
        spec: &CoreSpec,
        dims: InklingAttention,
        norm: NormKind,
        layer: usize,
    ) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, suffix);
        let (h, q_dim, kv_dim) = (spec.hidden_size, dims.q_dim(), dims.kv_dim());
        let mut proj = |name: &str, rows: usize, cols: usize| {
            Linear::load(b, &t(&format!("self_attn.{name}.weight")), None, rows, cols)
        };
        let (q, k, v) = (proj("q_proj", q_dim, h)?, proj("k_proj", kv_dim, h)?, proj("v_proj", kv_dim, h)?);
        let (r, o) = (proj("r_proj", dims.num_heads * dims.d_rel, h)?, proj("o_proj", h, q_dim)?);
        let q_norm = Norm::load(b, &t("self_attn.q_norm.weight"), norm, dims.head_dim)?;
        let k_norm = Norm::load(b, &t("self_attn.k_norm.weight"), norm, dims.head_dim)?;
        let mut conv =
            |module: &str, conv, part| ShortConvolution::load(b, &t(&format!("{module}.conv1d.weight")), conv, part);
        let k_conv = conv("self_attn.k_sconv", dims.kv_conv(), KEY_CONV)?;
        let v_conv = conv("self_attn.v_sconv", dims.kv_conv(), VALUE_CONV)?;
        let output_conv = conv("attn_sconv", dims.output_conv(), OUTPUT_CONV)?;
        let rel_proj = b.vector(&t("self_attn.rel_logits_proj.proj"), dims.d_rel * dims.rel_extent)?;
        Ok(Self { dims, q, k, v, r, o, q_norm, k_norm, k_conv, v_conv, output_conv, rel_proj })
    }

    /// What a sequence keeps in this layer (see [`KEYS`]).
    pub fn cache_parts(&self) -> Vec<StatePart> {
        let dim = self.dims.kv_dim();
        let rows = self.dims.sliding_window.map_or(StatePart::Rows { dim }, |window| StatePart::Ring { dim, window });
        vec![rows, rows, self.k_conv.cache_part(), self.v_conv.cache_part(), self.output_conv.cache_part()]
    }

    /// See [`super::Attention::forward`]: the block's output after its
    /// output convolution. A cache's row r is position `first_position + r`
    /// (what log scaling reads; the bias and the window see distances only).
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        xs: &[f32],
        first_position: usize,
        seqs: &mut [SeqBatch<'_>],
    ) -> Vec<f32> {
        let d = &self.dims;
        let (q_dim, kv_dim, extent) = (d.q_dim(), d.kv_dim(), d.rel_extent);
        let (mut q, mut k, mut v) = (self.q.apply(rt, b, xs), self.k.apply(rt, b, xs), self.v.apply(rt, b, xs));
        self.k_conv.apply(b, layer, &mut k, seqs);
        self.v_conv.apply(b, layer, &mut v, seqs);
        self.q_norm.apply_rows(b, &mut q);
        self.k_norm.apply_rows(b, &mut k);
        let mut bias = b.relative_bias(self.rel_proj, d.d_rel, &self.r.apply(rt, b, xs));
        if let Some(scaling) = d.log_scaling {
            let positions = seqs
                .iter()
                .flat_map(|seq| first_position + seq.cache.len()..first_position + seq.cache.len() + seq.tokens.len());
            for ((q_t, bias_t), position) in
                q.chunks_exact_mut(q_dim).zip(bias.chunks_exact_mut(d.num_heads * extent)).zip(positions)
            {
                let tau = log_scale(position, scaling);
                q_t.iter_mut().chain(bias_t.iter_mut()).for_each(|x| *x *= tau);
            }
        }
        let shape = AttnShape {
            n_heads: d.num_heads,
            n_kv_heads: d.num_kv_heads,
            head_dim: d.head_dim,
            window: d.sliding_window,
            sinks: None,
            // q and k are RMS-normalised per head: 1 / d, not 1 / sqrt(d).
            scale: 1.0 / d.head_dim as f32,
        };
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let rows = row..row + seq.tokens.len();
            seq.cache.write(layer, KEYS, &k[rows.start * kv_dim..rows.end * kv_dim]);
            seq.cache.write(layer, VALUES, &v[rows.start * kv_dim..rows.end * kv_dim]);
            row = rows.end;
        }
        let mut attn = vec![0.0f32; q.len()];
        let mut jobs = Vec::with_capacity(seqs.len());
        let (mut q_rest, mut bias_rest, mut out_rest) = (&q[..], &bias[..], &mut attn[..]);
        for seq in seqs.iter() {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let (q_seq, q_tail) = q_rest.split_at(m * q_dim);
            let (bias_seq, bias_tail) = bias_rest.split_at(m * d.num_heads * extent);
            let (out_seq, out_tail) = out_rest.split_at_mut(m * q_dim);
            (q_rest, bias_rest, out_rest) = (q_tail, bias_tail, out_tail);
            // A windowed layer's ring holds no key before the first
            // query's window.
            let first_key = d.sliding_window.map_or(0, |w| (start + 1).saturating_sub(w));
            let keys = seq.cache.rows_between(layer, KEYS, first_key, start + m);
            let values = seq.cache.rows_between(layer, VALUES, first_key, start + m);
            let bias = Some(PositionBias { rows: bias_seq, extent });
            jobs.push(AttendJob { q: q_seq, keys, values, first_key, start, bias, selected: None, out: out_seq });
        }
        b.attend(rt, shape, jobs);
        let mut out = self.o.apply(rt, b, &attn);
        self.output_conv.apply(b, layer, &mut out, seqs);
        out
    }
}
