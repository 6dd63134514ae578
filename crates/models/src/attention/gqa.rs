//! The grouped-query attention block (OLMoE, Qwen3-MoE, Mixtral, the full
//! layers of Qwen3-Next and Qwen3.5): q/k/v projections with optional
//! biases, q/k norms over the whole projection or per head, `clip_qkv`,
//! RoPE over the leading `rotary_dim` of each head, causal (optionally
//! sliding-window) attention over the cached keys and values, optionally
//! only over the keys QSA selects, an optional sigmoid output gate, and
//! o_proj. Every refinement is data in the layer's [`GqaSpec`], none a
//! family branch.

use strata_format::{CoreSpec, GqaSpec, NormKind, QkNorm, QsaSpec, RopeSpec, names};
use strata_kv::StatePart;

use crate::backend::Runtime;
use crate::backend::{AttendJob, AttnShape, Backend, QsaJob, QsaShape, Rotary, VectorHandle};
use crate::common::Linear;
use crate::error::Result;
use crate::lm::SeqBatch;
use crate::norm::Norm;
use crate::rope::{Angles, Rope};

/// The cache part of the keys.
const KEYS: usize = 0;
/// The cache part of the values.
const VALUES: usize = 1;
/// The cache part of QSA's raw indexer keys.
const RAW_KEYS: usize = 2;

/// A layer's QSA indexer (Qwen3.8-Flash-Next: transformers'
/// `Qwen4ExpTextQSAIndexer`).
struct Qsa {
    spec: QsaSpec,
    /// `index_qk_proj`: the query heads, then the raw key.
    qk: Linear,
    /// `q_layernorm`, per query head.
    q_norm: Norm,
    shape: QsaShape,
    /// The attention's rotation, whose angles at every key position rotate
    /// the blocks' keys.
    rope: Rope,
}

/// One layer's GQA tensors and shape.
pub struct Gqa {
    dims: GqaSpec,
    hidden: usize,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// q and k norms, when the layer normalises them.
    qk_norm: Option<(Norm, Norm)>,
    /// Each head's sink logit, `[num_heads]`, when the layer has them.
    sinks: Option<VectorHandle>,
    qsa: Option<Qsa>,
}

impl Gqa {
    /// Layer `layer`'s tensors, shape-checked.
    /// Its q/k norms are of kind `norm`, the layer's.
    pub fn load(b: &mut Backend, spec: &CoreSpec, dims: GqaSpec, norm: NormKind, layer: usize) -> Result<Self> {
        let t = |suffix: &str| names::layer_tensor(spec, layer, &format!("self_attn.{suffix}"));
        let (h, q_dim, kv_dim) = (spec.hidden_size, dims.q_dim(), dims.kv_dim());
        let q_rows = if dims.output_gate { 2 * q_dim } else { q_dim };
        let mut proj = |name: &str, rows: usize, cols: usize| {
            let bias = dims.bias.then(|| t(&format!("{name}.bias")));
            Linear::load(b, &t(&format!("{name}.weight")), bias.as_deref(), rows, cols)
        };
        let (q, k, v, o) = (
            proj("q_proj", q_rows, h)?,
            proj("k_proj", kv_dim, h)?,
            proj("v_proj", kv_dim, h)?,
            proj("o_proj", h, q_dim)?,
        );
        let qk_norm = match dims.qk_norm {
            QkNorm::None => None,
            QkNorm::Full => Some((q_dim, kv_dim)),
            QkNorm::PerHead => Some((dims.head_dim, dims.head_dim)),
        };
        let qk_norm = match qk_norm {
            None => None,
            Some((q_len, k_len)) => Some((
                Norm::load(b, &t("q_norm.weight"), norm, q_len)?,
                Norm::load(b, &t("k_norm.weight"), norm, k_len)?,
            )),
        };
        let sinks = match dims.sinks {
            true => Some(b.vector(&names::sinks_name(spec, layer), dims.num_heads)?),
            false => None,
        };
        let qsa = match dims.qsa {
            None => None,
            Some(spec) => Some(Qsa::load(b, spec, &dims, norm.eps(), t, h)?),
        };
        Ok(Self { dims, hidden: h, q, k, v, o, qk_norm, sinks, qsa })
    }

    /// What a sequence keeps in this layer: keys ([`KEYS`]) and values
    /// ([`VALUES`]), rows `kv_dim` wide, every position's or, in a sliding
    /// window, a ring of the window's; with QSA, every position's raw
    /// indexer key ([`RAW_KEYS`]).
    pub fn cache_parts(&self) -> Vec<StatePart> {
        let dim = self.dims.kv_dim();
        let part = match self.dims.sliding_window {
            None => StatePart::Rows { dim },
            Some(window) => StatePart::Ring { dim, window },
        };
        let raw_keys = self.qsa.as_ref().map(|qsa| StatePart::Rows { dim: qsa.spec.head_dim });
        [part, part].into_iter().chain(raw_keys).collect()
    }

    /// The rotary embedding of queries and keys (`None`: no positions).
    pub fn rope(&self) -> Option<&RopeSpec> {
        self.dims.rope.as_ref()
    }

    /// See [`super::Attention::forward`]; `angles` are the rows' rope
    /// angles, on a layer with RoPE.
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        xs: &[f32],
        angles: Option<&Angles>,
        seqs: &mut [SeqBatch<'_>],
    ) -> Vec<f32> {
        let d = &self.dims;
        let n = xs.len() / self.hidden;
        let (q_dim, kv_dim) = (d.q_dim(), d.kv_dim());
        let (mut q, mut k, mut v) = (self.q.apply(rt, b, xs), self.k.apply(rt, b, xs), self.v.apply(rt, b, xs));
        let gate = d.output_gate.then(|| split_gate(&mut q, d.num_heads, d.head_dim));
        if let Some((qn, kn)) = &self.qk_norm {
            qn.apply_rows(b, &mut q);
            kn.apply_rows(b, &mut k);
        }
        if let Some(clip) = d.clip_qkv {
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *x = x.clamp(-clip, clip);
            }
        }
        if let Some(angles) = angles {
            let rotary = Rotary { head_width: d.head_dim, offset: 0, interleaved: false };
            b.rotate(&mut q, angles, rotary);
            b.rotate(&mut k, angles, rotary);
        }
        let shape = AttnShape {
            n_heads: d.num_heads,
            n_kv_heads: d.num_kv_heads,
            head_dim: d.head_dim,
            window: d.sliding_window,
            sinks: self.sinks,
            scale: (d.head_dim as f32).powf(-0.5),
        };
        // The cache first (cheap, and each sequence's own), then every
        // sequence's attention at once across the pool.
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let rows = row..row + seq.tokens.len();
            seq.cache.write(layer, KEYS, &k[rows.start * kv_dim..rows.end * kv_dim]);
            seq.cache.write(layer, VALUES, &v[rows.start * kv_dim..rows.end * kv_dim]);
            row = rows.end;
        }
        let selections = match &self.qsa {
            Some(qsa) => qsa.select(rt, b, layer, xs, angles.expect("QSA rotates with the layer's RoPE"), seqs),
            None => vec![None; seqs.len()],
        };
        let mut attn = vec![0.0f32; n * q_dim];
        let mut jobs = Vec::with_capacity(seqs.len());
        let (mut q_rest, mut out_rest) = (&q[..], &mut attn[..]);
        for (seq, selected) in seqs.iter().zip(&selections) {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let (q_seq, q_tail) = q_rest.split_at(m * q_dim);
            let (out_seq, out_tail) = out_rest.split_at_mut(m * q_dim);
            (q_rest, out_rest) = (q_tail, out_tail);
            // The first position the pass's first query sees: the ring of a
            // windowed layer holds no earlier one.
            let first_key = d.sliding_window.map_or(0, |w| (start + 1).saturating_sub(w));
            let keys = seq.cache.rows_between(layer, KEYS, first_key, start + m);
            let values = seq.cache.rows_between(layer, VALUES, first_key, start + m);
            let selected = selected.as_deref();
            jobs.push(AttendJob { q: q_seq, keys, values, first_key, start, bias: None, selected, out: out_seq });
        }
        b.attend(rt, shape, jobs);
        if let Some(gate) = gate {
            b.sigmoid_gate(&mut attn, &gate);
        }
        self.o.apply(rt, b, &attn)
    }
}

impl Qsa {
    /// The indexer of a layer whose tensors `t` names, over `hidden`-wide
    /// rows; its norms are `1 + w` with the layer norms' `eps`.
    fn load(
        b: &mut Backend,
        spec: QsaSpec,
        dims: &GqaSpec,
        eps: f32,
        t: impl Fn(&str) -> String,
        hidden: usize,
    ) -> Result<Self> {
        let rope_spec = dims.rope.expect("QSA layers rotate (spec validation)");
        let [qk, q_norm, k_norm] =
            ["index_qk_proj", "q_layernorm", "k_layernorm"].map(|part| t(&format!("indexer.{part}.weight")));
        let d = spec.head_dim;
        let shape = QsaShape {
            heads: spec.n_heads,
            head_dim: d,
            budget_tokens: spec.budget_tokens,
            block_tokens: spec.block_tokens,
            k_norm: b.vector(&k_norm, d)?,
            norm_eps: eps,
        };
        Ok(Self {
            spec,
            qk: Linear::load(b, &qk, None, (spec.n_heads + 1) * d, hidden)?,
            q_norm: Norm::load(b, &q_norm, NormKind::OnePlusWeight { eps }, d)?,
            shape,
            rope: Rope::new(&rope_spec, rope_spec.rotary_dim)?,
        })
    }

    /// Writes every row's raw indexer key to its sequence's cache, then
    /// returns each sequence's choice of keys per query (`[m, start + m]`,
    /// as [`AttendJob::selected`]). `angles` are the rows' own.
    fn select(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        xs: &[f32],
        angles: &Angles,
        seqs: &mut [SeqBatch<'_>],
    ) -> Vec<Option<Vec<bool>>> {
        let (heads, d) = (self.spec.n_heads, self.spec.head_dim);
        let qk = self.qk.apply(rt, b, xs);
        let n = qk.len() / ((heads + 1) * d);
        let (mut q, mut raw) = (Vec::with_capacity(n * heads * d), Vec::with_capacity(n * d));
        for row in qk.chunks_exact((heads + 1) * d) {
            q.extend_from_slice(&row[..heads * d]);
            raw.extend_from_slice(&row[heads * d..]);
        }
        self.q_norm.apply_rows(b, &mut q);
        b.rotate(&mut q, angles, Rotary { head_width: d, offset: 0, interleaved: false });
        let mut row = 0;
        let mut selections = Vec::with_capacity(seqs.len());
        for seq in seqs.iter_mut() {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            seq.cache.write(layer, RAW_KEYS, &raw[row * d..(row + m) * d]);
            let positions: Vec<usize> = (0..start + m).collect();
            let key_angles = Angles::new(&self.rope, &positions);
            let job = QsaJob {
                q: &q[row * heads * d..(row + m) * heads * d],
                raw_keys: seq.cache.rows_between(layer, RAW_KEYS, 0, start + m),
                angles: &key_angles,
                start,
            };
            selections.push(Some(b.qsa_select(rt, self.shape, job)));
            row += m;
        }
        selections
    }
}

/// Splits a gated `q_proj`'s rows (`[q head_dim | gate head_dim]` per head)
/// into the queries, left in `q` (`[n, heads·head_dim]`), and the gates,
/// returned in the same layout.
fn split_gate(q: &mut Vec<f32>, heads: usize, head_dim: usize) -> Vec<f32> {
    let n = q.len() / (2 * heads * head_dim);
    let (mut queries, mut gates) = (Vec::with_capacity(n * heads * head_dim), Vec::with_capacity(n * heads * head_dim));
    for head in q.chunks_exact(2 * head_dim) {
        queries.extend_from_slice(&head[..head_dim]);
        gates.extend_from_slice(&head[head_dim..]);
    }
    *q = queries;
    gates
}
