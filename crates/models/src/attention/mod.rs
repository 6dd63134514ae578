//! Attention blocks: each layer's token mixer, chosen by its
//! [`MixerSpec`], reading and extending the sequences' KV caches.

mod compressed;
mod delta;
mod gqa;
mod inkling;
mod latent;
mod shared_kv;

use strata_format::{CoreSpec, MixerSpec, NormKind, RopeSpec};
use strata_kv::StatePart;

use crate::backend::Backend;
use crate::backend::Runtime;
use crate::error::Result;
use crate::lm::SeqBatch;
use crate::rope::Angles;

/// One layer's attention block, each boxed: their sizes differ by
/// hundreds of bytes (an indexer, QSA, compressors), and a layer holds one.
pub enum Attention {
    Gqa(Box<gqa::Gqa>),
    Mla(Box<latent::LatentAttention>),
    DeltaNet(Box<delta::DeltaNet>),
    SharedKv(Box<shared_kv::SharedKv>),
    /// Boxed: its three convolutions and five projections make it large.
    Inkling(Box<inkling::Inkling>),
}

/// A sequence's DSA choice: its positions per query, if chosen.
type Selection = Option<Vec<Vec<usize>>>;

/// What a forward pass carries from layer to layer besides the hidden
/// states: the rope angles of its rows, and each sequence's DSA selection,
/// which a sharing layer takes from the full layer before it.
pub struct Pass {
    /// cos/sin of every row, per rotary embedding.
    angles: Vec<(RopeSpec, Angles)>,
    /// `selections[k]`: sequence `k`'s positions per query, if chosen.
    selections: Vec<Selection>,
    /// The position of a cache's row 0: 0 in the stack's caches, 1 in an
    /// MTP layer's draft cache, whose first row is the second token's.
    first_position: usize,
}

impl Pass {
    pub fn new(angles: Vec<(RopeSpec, Angles)>, n_seqs: usize) -> Self {
        Self { angles, selections: vec![None; n_seqs], first_position: 0 }
    }

    /// This pass over caches whose row 0 is position `first_position`
    /// (what a block without rotary angles, Inkling's log scaling, reads).
    pub fn with_first_position(self, first_position: usize) -> Self {
        Self { first_position, ..self }
    }

    /// The angles of `rope` (built for every rotary embedding a layer
    /// uses; none without one), and the sequences' selections.
    fn parts(&mut self, rope: Option<&RopeSpec>) -> (Option<&Angles>, &mut [Selection]) {
        let angles = rope.map(|rope| {
            let (_, angles) =
                self.angles.iter().find(|(known, _)| known == rope).expect("angles for every rotary embedding");
            angles
        });
        (angles, &mut self.selections)
    }
}

impl Attention {
    /// Layer `layer`'s block of kind `kind`, its tensors shape-checked.
    /// `norm` is the layer's norm kind, which q/k norms follow.
    pub fn load(b: &mut Backend, spec: &CoreSpec, kind: &MixerSpec, norm: NormKind, layer: usize) -> Result<Self> {
        Ok(match kind {
            MixerSpec::Gqa(gqa) => Attention::Gqa(Box::new(gqa::Gqa::load(b, spec, *gqa, norm, layer)?)),
            MixerSpec::Mla(mla) => Attention::Mla(Box::new(latent::LatentAttention::load(b, spec, mla, layer)?)),
            MixerSpec::GatedDeltaNet(gdn) => Attention::DeltaNet(Box::new(delta::DeltaNet::load(b, spec, gdn, layer)?)),
            MixerSpec::Inkling(ink) => {
                Attention::Inkling(Box::new(inkling::Inkling::load(b, spec, *ink, norm, layer)?))
            }
            MixerSpec::SharedKv(sk) => Attention::SharedKv(Box::new(shared_kv::SharedKv::load(b, spec, sk, layer)?)),
        })
    }

    /// What this block keeps per sequence, in the order it indexes its
    /// parts (the layer's first; its FFN's, if any, follow).
    pub fn cache_parts(&self) -> Vec<StatePart> {
        match self {
            Attention::Gqa(gqa) => gqa.cache_parts(),
            Attention::Mla(mla) => mla.cache_parts(),
            Attention::DeltaNet(delta) => delta.cache_parts(),
            Attention::SharedKv(sk) => sk.cache_parts(),
            Attention::Inkling(ink) => ink.cache_parts(),
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
        b: &Backend,
        layer: usize,
        xs: &[f32],
        pass: &mut Pass,
        seqs: &mut [SeqBatch<'_>],
    ) -> Result<Vec<f32>> {
        match self {
            Attention::Gqa(gqa) => {
                let angles = pass.parts(gqa.rope()).0;
                Ok(gqa.forward(rt, b, layer, xs, angles, seqs))
            }
            Attention::Mla(mla) => {
                let (angles, selections) = pass.parts(mla.rope());
                mla.forward(rt, b, layer, xs, angles, seqs, selections)
            }
            Attention::DeltaNet(delta) => Ok(delta.forward(rt, b, layer, xs, seqs)),
            Attention::SharedKv(sk) => {
                let angles = pass.parts(Some(sk.rope())).0.expect("angles for every rotary embedding");
                Ok(sk.forward(rt, b, layer, xs, angles, seqs))
            }
            Attention::Inkling(ink) => Ok(ink.forward(rt, b, layer, xs, pass.first_position, seqs)),
        }
    }
}
