//! Attention blocks: each layer's token mixer, chosen by its
//! [`AttentionKind`], reading and extending the sequences' KV caches.

mod gqa;
pub mod grouped;
mod latent;

use strata_format::{AttentionKind, Container, ModelSpec};

use crate::rope::Angles;
use crate::{Result, Runtime, SeqBatch};

/// One layer's attention block.
pub enum Attention {
    Gqa(gqa::Gqa),
    Mla(latent::LatentAttention),
}

/// What a forward pass carries from layer to layer besides the hidden
/// states: the rope angles of its rows, and each sequence's DSA selection,
/// which a sharing layer takes from the full layer before it.
pub struct Pass {
    /// cos/sin of every row, per rotary width.
    angles: Vec<(usize, Angles)>,
    /// `selections[k]`: sequence `k`'s positions per query, if chosen.
    selections: Vec<Option<Vec<Vec<usize>>>>,
}

impl Pass {
    pub fn new(angles: Vec<(usize, Angles)>, n_seqs: usize) -> Self {
        Self { angles, selections: vec![None; n_seqs] }
    }

    /// The angles for `rotary_dim`-wide rotations (built for every width a
    /// layer uses), and the sequences' selections.
    fn parts(&mut self, rotary_dim: usize) -> (&Angles, &mut [Option<Vec<Vec<usize>>>]) {
        let (_, angles) =
            self.angles.iter().find(|(dim, _)| *dim == rotary_dim).expect("angles for every rotary width");
        (angles, &mut self.selections)
    }
}

impl Attention {
    /// Layer `layer`'s block of kind `kind`, its tensors shape-checked.
    pub fn load(c: &Container, spec: &ModelSpec, kind: &AttentionKind, layer: usize) -> Result<Self> {
        Ok(match kind {
            AttentionKind::Gqa(gqa) => Attention::Gqa(gqa::Gqa::load(c, spec, *gqa, layer)?),
            AttentionKind::Mla(mla) => Attention::Mla(latent::LatentAttention::load(c, spec, mla, layer)?),
        })
    }

    /// Widths of the KV-cache rows one token adds to this layer.
    pub fn cache_row_dims(&self) -> Vec<usize> {
        match self {
            Attention::Gqa(gqa) => gqa.cache_row_dims(),
            Attention::Mla(mla) => mla.cache_row_dims(),
        }
    }

    /// The attention output of every row of `xs` (the normalised hidden
    /// states of a batch), where `seqs` says which rows belong to which
    /// sequence, writing each sequence's cache rows for `layer`. Projections
    /// run once over all rows; attention itself per sequence, over its own
    /// cache.
    pub fn forward(
        &self,
        rt: &Runtime<'_>,
        c: &Container,
        layer: usize,
        xs: &[f32],
        pass: &mut Pass,
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<Vec<f32>> {
        let (angles, selections) = pass.parts(self.rotary_dim());
        match self {
            Attention::Gqa(gqa) => gqa.forward(rt, c, layer, xs, angles, seqs),
            Attention::Mla(mla) => mla.forward(rt, c, layer, xs, angles, seqs, selections),
        }
    }

    /// Width of each head's rotated part.
    pub fn rotary_dim(&self) -> usize {
        match self {
            Attention::Gqa(gqa) => gqa.rotary_dim(),
            Attention::Mla(mla) => mla.rotary_dim(),
        }
    }
}
