//! The Multi-head Latent Attention block (DeepSeek-V3, Kimi K2.5, GLM-5):
//! [`crate::mla`]'s attention over the cached latents, optionally sparse
//! through GLM-5's DSA indexer ([`crate::dsa`]), whose selection a sharing
//! layer takes from the full layer before it.

use strata_format::{CoreSpec, IndexerKind, MlaAttention, RopeSpec};
use strata_kv::StatePart;

use crate::backend::Backend;
use crate::backend::Runtime;
use crate::dsa::Indexer;
use crate::error::{Error, Result};
use crate::lm::SeqBatch;
use crate::mla::Mla;
use crate::rope::Angles;

/// The cache part of the latent rows (with the rotated shared key).
const LATENT: usize = 0;
/// The cache part of the DSA indexer keys.
const INDEX_KEYS: usize = 1;

/// One layer's MLA block.
pub struct LatentAttention {
    attn: Mla,
    rope: Option<RopeSpec>,
    hidden: usize,
    indexer: IndexerSlot,
    /// Width of the indexer keys the cache holds, with DSA.
    index_head_dim: Option<usize>,
    latent_dim: usize,
}

/// The DSA indexer of a layer.
// One a layer, made at load and never moved in a pass: a box would buy
// nothing (its handles grew a byte each when a second device came).
#[allow(clippy::large_enum_variant)]
enum IndexerSlot {
    /// No sparse attention: every earlier token is visible.
    Absent,
    /// The layer selects with its own indexer.
    Own(Indexer),
    /// The layer reuses the previous full layer's selection.
    Shared,
}

impl LatentAttention {
    /// Layer `layer`'s tensors, shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, kind: &MlaAttention, layer: usize) -> Result<Self> {
        let indexer = match (kind.indexer, kind.dims.q_lora_rank) {
            (None, _) => IndexerSlot::Absent,
            (Some(ix), Some(rank)) if ix.kind == IndexerKind::Full => {
                IndexerSlot::Own(Indexer::load(b, spec, &ix, rank, layer)?)
            }
            (Some(ix), Some(_)) if layer > 0 && ix.kind == IndexerKind::Shared => IndexerSlot::Shared,
            _ => return Err(Error::Unsupported(format!("layer {layer}: DSA indexer layout is inconsistent"))),
        };
        // The indexer rotates its keys and queries with the layer's RoPE.
        if kind.indexer.is_some() && kind.rope.is_none() {
            return Err(Error::Unsupported(format!("layer {layer}: a DSA indexer without RoPE")));
        }
        Ok(Self {
            attn: Mla::load(b, spec, kind, layer)?,
            rope: kind.rope,
            hidden: spec.hidden_size,
            indexer,
            index_head_dim: kind.indexer.map(|ix| ix.head_dim),
            latent_dim: kind.dims.latent_dim(),
        })
    }

    /// What a sequence keeps in this layer: the latent rows ([`LATENT`]),
    /// then with DSA the indexer keys ([`INDEX_KEYS`]).
    pub fn cache_parts(&self) -> Vec<StatePart> {
        std::iter::once(self.latent_dim).chain(self.index_head_dim).map(|dim| StatePart::Rows { dim }).collect()
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
            IndexerSlot::Own(indexer) => Some(indexer.keys(rt, b, xs, indexer_angles(angles))),
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
                (IndexerSlot::Own(indexer), Some(keys)) => {
                    let width = keys.len() / n;
                    seq.cache.write(l, INDEX_KEYS, &keys[rows.start * width..rows.end * width]);
                    let compressed = queries.compressed.as_deref().ok_or_else(|| {
                        Error::Unsupported(format!("layer {l}: the DSA indexer needs a compressed query"))
                    })?;
                    let cw = compressed.len() / n;
                    *selection = Some(indexer.select(
                        rt,
                        b,
                        &xs[rows.start * h..rows.end * h],
                        &compressed[rows.start * cw..rows.end * cw],
                        seq.cache.rows(l, INDEX_KEYS, start + m),
                        start,
                        &indexer_angles(angles).rows(rows.clone()),
                    ));
                }
                (IndexerSlot::Shared, _) => {
                    // The stream has a row for every layer; a sharing layer
                    // has no key of its own, so its row stays zero.
                    let width = self.index_head_dim.expect("a sharing layer keeps indexer keys");
                    seq.cache.write(l, INDEX_KEYS, &vec![0.0; m * width]);
                }
                _ => *selection = None,
            }
            let q = &queries.q[rows.start * q_width..rows.end * q_width];
            let cached = seq.cache.rows(l, LATENT, start + m);
            out.extend(self.attn.attend(rt, b, q, cached, start, selection.as_deref()));
            row += m;
        }
        Ok(self.attn.output(rt, b, &out))
    }
}

/// The angles of a layer with a DSA indexer, which [`LatentAttention::load`]
/// refuses without RoPE.
fn indexer_angles(angles: Option<&Angles>) -> &Angles {
    angles.expect("a layer with a DSA indexer has RoPE")
}
