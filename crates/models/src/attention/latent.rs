//! The Multi-head Latent Attention block (DeepSeek-V3, Kimi K2.5, GLM-5,
//! GLM-5.3-Flash): [`crate::mla`]'s attention over the cached latents,
//! optionally sparse through a DSA indexer ([`crate::dsa`]), per token or
//! pooled, whose selection a sharing layer takes from the full layer
//! before it.

use strata_format::{CoreSpec, IndexerKind, MlaAttention, RopeSpec, names};
use strata_kv::{SequenceState, StatePart};

use crate::backend::Backend;
use crate::backend::Runtime;
use crate::common::Linear;
use crate::dsa::Indexer;
use crate::error::{Error, Result};
use crate::lm::SeqBatch;
use crate::mla::Mla;
use crate::rope::Angles;

/// The cache part of the latent rows (with the rotated shared key).
const LATENT: usize = 0;
/// The cache part of the DSA indexer keys: a row per token, or, pooled, a
/// row per pool and the open pool's rows pending.
const INDEX_KEYS: usize = 1;
/// The cache part of a pooled indexer's gate logits, a ring of the open
/// pool's (pools of more than one token).
const INDEX_GATES: usize = 2;

/// One layer's MLA block.
pub struct LatentAttention {
    attn: Mla,
    rope: Option<RopeSpec>,
    hidden: usize,
    indexer: IndexerSlot,
    /// Width of the indexer keys the cache holds, with DSA.
    index_head_dim: Option<usize>,
    /// What a sequence keeps in this layer.
    parts: Vec<StatePart>,
    /// Kimi K3's full-rank output gate `g_proj`: each head's value context
    /// times `σ(g_proj x)` before `o_proj`.
    output_gate: Option<Linear>,
}

/// The DSA indexer of a layer.
// One a layer, made at load and never moved in a pass: a box would buy
// nothing (its handles grew a byte each when a second device came).
#[allow(clippy::large_enum_variant)]
enum IndexerSlot {
    /// No sparse attention: every earlier token is visible.
    Absent,
    /// The layer selects with its own indexer (boxed: the largest by far).
    Own(Box<Indexer>),
    /// The layer reuses the previous full layer's selection.
    Shared,
}

impl LatentAttention {
    /// Layer `layer`'s tensors, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, kind: &MlaAttention, layer: usize) -> Result<Self> {
        let indexer = match (kind.indexer, kind.dims.q_lora_rank) {
            (None, _) => IndexerSlot::Absent,
            (Some(ix), Some(rank)) if ix.kind == IndexerKind::Full => {
                IndexerSlot::Own(Box::new(Indexer::load(b, spec, &ix, rank, layer)?))
            }
            (Some(ix), Some(_)) if layer > 0 && ix.kind == IndexerKind::Shared => IndexerSlot::Shared,
            _ => return Err(Error::Unsupported(format!("layer {layer}: DSA indexer layout is inconsistent"))),
        };
        // A per-token indexer rotates its keys and queries with the layer's
        // RoPE; a pooled one pools unrotated keys.
        if let Some(ix) = kind.indexer
            && ix.pool.is_some() == kind.rope.is_some()
        {
            return Err(Error::Unsupported(format!(
                "layer {layer}: a DSA indexer needs RoPE exactly when it is not pooled"
            )));
        }
        let gate_rows = kind.num_heads * kind.dims.v_head_dim;
        let gate_name = names::layer_tensor(spec, layer, "self_attn.g_proj.weight");
        let output_gate =
            if kind.output_gate { Some(Linear::load(b, &gate_name, None, gate_rows, spec.hidden_size)?) } else { None };
        Ok(Self {
            output_gate,
            attn: Mla::load(b, spec, kind, layer)?,
            rope: kind.rope,
            hidden: spec.hidden_size,
            indexer,
            index_head_dim: kind.indexer.map(|ix| ix.head_dim),
            parts: cache_parts(kind),
        })
    }

    /// What a sequence keeps in this layer: the latent rows ([`LATENT`]),
    /// then with DSA the indexer keys ([`INDEX_KEYS`]) and, pooled in pools
    /// of more than one token, the open pool's gate logits
    /// ([`INDEX_GATES`]); a pooled sharing layer keeps no indexer part.
    pub fn cache_parts(&self) -> Vec<StatePart> {
        self.parts.clone()
    }

    /// RoPE rotates the `qk_rope_head_dim` part of each head (`None`: no
    /// rotation).
    pub fn rope(&self) -> Option<&RopeSpec> {
        self.rope.as_ref()
    }

    /// See [`super::Attention::forward`]. `selections[k]` carries sequence
    /// `k`'s DSA choice from layer to layer.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        l: usize,
        xs: &[f32],
        angles: Option<&Angles>,
        seqs: &mut [SeqBatch<'_>],
        selections: &mut [Option<Vec<Vec<usize>>>],
    ) -> Result<Vec<f32>> {
        let h = self.hidden;
        let queries = self.attn.queries(rt, b, xs, angles);
        let latents = self.attn.latents(rt, b, xs, angles);
        let index_keys = match &self.indexer {
            IndexerSlot::Own(indexer) => Some((indexer.keys(rt, b, xs, angles), indexer.gate_logits(rt, b, xs))),
            IndexerSlot::Absent | IndexerSlot::Shared => None,
        };
        let n = xs.len() / h;
        let (q_width, latent_width) = (queries.q.len() / n, latents.len() / n);
        let mut out = Vec::with_capacity(n * self.attn.output_width());
        let mut row = 0;
        for (seq, selection) in seqs.iter_mut().zip(selections.iter_mut()) {
            let (start, m) = (seq.cache.len(), seq.tokens.len());
            let rows = row..row + m;
            seq.cache.write(l, LATENT, &latents[rows.start * latent_width..rows.end * latent_width]);
            match (&self.indexer, &index_keys) {
                (IndexerSlot::Own(indexer), Some((keys, gate_logits))) => {
                    let width = keys.len() / n;
                    let seq_rows = rows.start * width..rows.end * width;
                    let candidates = match gate_logits {
                        None => {
                            seq.cache.write(l, INDEX_KEYS, &keys[seq_rows]);
                            seq.cache.rows(l, INDEX_KEYS, start + m)
                        }
                        Some(gates) => {
                            write_pools(indexer, b, seq.cache, l, &keys[seq_rows.clone()], &gates[seq_rows]);
                            seq.cache.groups(l, INDEX_KEYS, start + m)
                        }
                    };
                    let compressed = queries.compressed.as_deref().ok_or_else(|| {
                        Error::Unsupported(format!("layer {l}: the DSA indexer needs a compressed query"))
                    })?;
                    let cw = compressed.len() / n;
                    *selection = Some(indexer.select(
                        rt,
                        b,
                        &xs[rows.start * h..rows.end * h],
                        &compressed[rows.start * cw..rows.end * cw],
                        candidates,
                        start,
                        angles.map(|angles| angles.rows(rows.clone())).as_ref(),
                    ));
                }
                (IndexerSlot::Shared, _) if self.parts.len() > 1 => {
                    // GLM-5's stream has a row for every layer; a sharing
                    // layer has no key of its own, so its row stays zero.
                    let width = self.index_head_dim.expect("a sharing layer keeps indexer keys");
                    seq.cache.write(l, INDEX_KEYS, &vec![0.0; m * width]);
                }
                (IndexerSlot::Shared, _) => {}
                _ => *selection = None,
            }
            let q = &queries.q[rows.start * q_width..rows.end * q_width];
            let cached = seq.cache.rows(l, LATENT, start + m);
            out.extend(self.attn.attend(rt, b, q, cached, start, selection.as_deref()));
            row += m;
        }
        if let Some(gate) = &self.output_gate {
            b.sigmoid_gate(&mut out, &gate.apply(rt, b, xs));
        }
        Ok(self.attn.output(rt, b, &out))
    }
}

/// The parts of a layer of `kind` (see [`LatentAttention::cache_parts`]).
fn cache_parts(kind: &MlaAttention) -> Vec<StatePart> {
    let mut parts = vec![StatePart::Rows { dim: kind.dims.latent_dim() }];
    if let Some(ix) = kind.indexer {
        let dim = ix.head_dim;
        match (ix.pool, ix.kind) {
            (None, _) => parts.push(StatePart::Rows { dim }),
            (Some(pool), IndexerKind::Full) => {
                parts.push(StatePart::Strided { dim, every: pool });
                if pool > 1 {
                    parts.push(StatePart::Ring { dim, window: pool - 1 });
                }
            }
            (Some(_), IndexerKind::Shared) => {}
        }
    }
    parts
}

/// Writes a pooled indexer's `keys` and `gate_logits` of a sequence's new
/// tokens into its cache, and the key of every pool they close: the open
/// pool's earlier tokens come from the cache (their keys pending, their
/// gate logits in the ring), so a prompt split into passes pools as one.
fn write_pools(indexer: &Indexer, b: &Backend, cache: &mut SequenceState, l: usize, keys: &[f32], gate_logits: &[f32]) {
    let (start, pool) = (cache.len(), indexer.pool());
    let open_from = start / pool * pool;
    let mut pool_keys = cache.pending(l, INDEX_KEYS, start).to_vec();
    let mut pool_gates = match start - open_from {
        0 => Vec::new(),
        _ => cache.rows_between(l, INDEX_GATES, open_from, start).to_vec(),
    };
    pool_keys.extend_from_slice(keys);
    pool_gates.extend_from_slice(gate_logits);
    // Rows from the open pool's first token: whole pools, then the rest.
    let pool_floats = pool * indexer.head_dim();
    let whole = pool_keys.len() / pool_floats * pool_floats;
    let pooled = indexer.pool_keys(b, &pool_keys[..whole], &pool_gates[..whole]);
    cache.write(l, INDEX_KEYS, keys);
    if pool > 1 {
        cache.write(l, INDEX_GATES, gate_logits);
    }
    cache.write_groups(l, INDEX_KEYS, &pooled);
}
