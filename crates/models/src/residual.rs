//! The residual as a component: how the stack's hidden states feed each
//! block and take its output back.
//!
//! The stack carries [`Streams`], `[tokens, streams, hidden]`. Every block
//! runs wrapped the same way, whatever the layer's [`ResidualKind`]:
//!
//! 1. **mix** — the block's input, `[tokens, hidden]`, from the streams
//!    ([`Residual::mix`]);
//! 2. the layer's norm of it, then the block, which *adds* its output into
//!    the slot the residual hands it ([`Residual::slot`]);
//! 3. **combine** — the slot joins the streams ([`Residual::combine`]).
//!
//! With the plain residual there is one stream, the input is the stream
//! itself and the slot is the stream too: the block accumulates straight
//! into the hidden states, as transformers' `hidden = residual + block(...)`
//! does for one output and as the expert pipeline does for each routed
//! expert in turn — the bits of the stack before the residual was a
//! component, with no copy. Hyper-connections (mHC: GLM-5.3-Flash,
//! DeepSeek V4) carry several streams: the mix weighs them into a fresh
//! input and keeps each token's `post` and `comb` weights with the streams,
//! the slot is zeroed, and the combine takes `post ⊗ slot + combᵀ · x`.
//! Each block (attention, FFN) of a layer has its own hyper-connection;
//! after the last layer the stack's [`StreamHead`] collapses the streams.
//! Gated residual streams (Qwen3.8-Flash-Next) are wrapped the same way:
//! the mix keeps each token's injection weights, and the combine adds the
//! slot to every stream times its weight; the head is the mix itself.
//! Attention Residuals (Kimi K3) keep one stream, the running partial sum,
//! and the block snapshots beside it: the mix weighs the snapshots and the
//! partial sum into a fresh input; the slot is the partial sum, except where
//! a block starts (then a fresh slot, and the combine keeps the partial sum
//! as a snapshot and the slot as the new partial sum). The head is a mix.

use std::borrow::Cow;

use strata_format::names::{self, HyperSite};
use strata_format::{CoreSpec, HyperHead, ResidualKind};

use crate::backend::{AttnResMix, Backend, GatedResidual, HyperConnection, Runtime, StreamHead, StreamWeights};
use crate::error::Result;

/// The hidden states of a pass, `[tokens, streams, hidden]`.
pub struct Streams {
    rows: Vec<f32>,
    streams: usize,
    hidden: usize,
    /// A hyper-connection's mix waiting for its block's output.
    mixed: Option<Mixed>,
    /// Attention Residuals' finished blocks, each `[tokens, hidden]`, the
    /// embeddings first; `rows` is the running partial sum.
    snapshots: Vec<Vec<f32>>,
}

/// What a mix of several streams keeps for its combine.
struct Mixed {
    weights: MixWeights,
    /// The block's output, `[tokens, hidden]`, zeroed at the mix.
    slot: Vec<f32>,
}

/// The per-token weights of a combine.
enum MixWeights {
    Hyper(StreamWeights),
    /// Each token's injection weight per stream, `[tokens, streams]`.
    Gated(Vec<f32>),
    /// None: the partial sum becomes a snapshot and the slot replaces it.
    Snapshot,
}

impl Streams {
    /// The embeddings of a pass (`[tokens, hidden]`) as the stack's
    /// `streams` streams: each row repeated once per stream (the one
    /// stream of the plain residual is the embeddings themselves).
    pub fn expand(streams: usize, embeddings: Vec<f32>, hidden: usize) -> Self {
        assert_eq!(embeddings.len() % hidden, 0, "embeddings are whole rows");
        assert!(streams > 0, "a stack carries at least one stream");
        let rows = match streams {
            1 => embeddings,
            _ => embeddings.chunks_exact(hidden).flat_map(|row| row.repeat(streams)).collect(),
        };
        Self { rows, streams, hidden, mixed: None, snapshots: Vec::new() }
    }

    /// The final hidden states, `[tokens, hidden]`, the streams collapsed
    /// by the stack's `head`.
    pub fn collapse(self, rt: &Runtime<'_>, b: &Backend, head: &StreamHead) -> Vec<f32> {
        assert_eq!(self.streams, head.streams(), "the head collapses the stack's streams");
        assert!(self.mixed.is_none(), "every mix was combined");
        if let StreamHead::AttnRes(mix) = head {
            let mut out = vec![0.0f32; self.rows.len()];
            b.attn_res_mix(mix, &self.snapshots, &self.rows, &mut out);
            return out;
        }
        b.collapse_streams(rt, head, self.rows, self.hidden)
    }

    /// Ends an Attention Residuals block: the partial sum becomes the
    /// newest snapshot, and `partial` (`[tokens, hidden]`) the partial sum.
    fn snapshot(&mut self, partial: Vec<f32>) {
        assert_eq!(partial.len(), self.rows.len(), "the new partial sum has the old one's rows");
        let finished = std::mem::replace(&mut self.rows, partial);
        self.snapshots.push(finished);
    }

    /// Rows of the pass.
    /// Every stream of every token, `[tokens, streams · hidden]`, between
    /// blocks, for what adds to all streams at once (the PLE). A mix still
    /// pending there is a look-ahead's (`guess_first_layer` mixes for its
    /// router and combines nothing): it is dropped, as the next block's mix
    /// would replace it.
    pub fn rows_mut(&mut self) -> &mut [f32] {
        self.mixed = None;
        &mut self.rows
    }

    pub fn tokens(&self) -> usize {
        self.rows.len() / (self.streams * self.hidden)
    }
}

/// The residual around one block of a layer: built from the layer's
/// [`ResidualKind`].
#[derive(Debug, Clone, Copy)]
pub enum Residual {
    /// One stream, `x += block(norm(x))`.
    Plain,
    /// Hyper-connections: this block's weights.
    Hyper(HyperConnection),
    /// Gated residual streams: this block's weights.
    Gated(GatedResidual),
    /// Attention Residuals: this block's mix, and whether its output starts
    /// a block (the attention of a layer whose index is a multiple of the
    /// block size).
    AttnRes { mix: AttnResMix, starts_block: bool },
}

impl Residual {
    /// The residual of kind `kind` around `site` of layer `layer`, its
    /// weights registered; `norm_eps` is the layer norms' epsilon, which
    /// the hyper-connection's unweighted norm shares.
    pub fn load(
        b: &mut Backend,
        spec: &CoreSpec,
        kind: ResidualKind,
        norm_eps: f32,
        layer: usize,
        site: HyperSite,
    ) -> Result<Self> {
        let (streams, sinkhorn_iters, eps) = match kind {
            ResidualKind::Plain => return Ok(Residual::Plain),
            ResidualKind::AttentionResiduals { block_size } => {
                let mix = load_attn_res(b, spec, norm_eps, names::attn_res_names(spec, layer, site))?;
                let starts_block = site == HyperSite::Attention && layer.is_multiple_of(block_size);
                return Ok(Residual::AttnRes { mix, starts_block });
            }
            ResidualKind::GatedStreams { streams, lowrank } => {
                let [norm, down, up, inject] = names::gated_residual_names(spec, layer, site);
                let mut gated = load_gated(b, spec, streams, lowrank, norm_eps, [norm, down, up])?;
                gated.inject = Some(b.matrix(&inject, streams, streams * spec.hidden_size)?);
                return Ok(Residual::Gated(gated));
            }
            ResidualKind::HyperConnections { streams, sinkhorn_iters, eps, .. } => (streams, sinkhorn_iters, eps),
        };
        let [mixes, base, scale] = names::hyper_connection_names(spec, layer, site);
        let logits = (2 + streams) * streams;
        Ok(Residual::Hyper(HyperConnection {
            streams,
            mixes: b.matrix(&mixes, logits, streams * spec.hidden_size)?,
            base: b.vector(&base, logits)?,
            scale: b.vector(&scale, 3)?,
            sinkhorn_iters,
            eps,
            norm_eps,
        }))
    }

    /// The streams a stack of this residual carries.
    pub fn streams(self) -> usize {
        match self {
            Residual::Plain | Residual::AttnRes { .. } => 1,
            Residual::Hyper(hc) => hc.streams,
            Residual::Gated(gated) => gated.streams,
        }
    }

    /// The block's input, `[tokens, hidden]` (the stream itself, unless
    /// streams are mixed: then the weights of the combine are kept with
    /// the streams, replacing any mix not combined, the look-ahead's).
    pub fn mix<'s>(self, rt: &Runtime<'_>, b: &Backend, streams: &'s mut Streams) -> Cow<'s, [f32]> {
        assert_eq!(streams.streams, self.streams(), "the stack carries this residual's streams");
        match self {
            Residual::Plain => Cow::Borrowed(&streams.rows),
            Residual::AttnRes { mix, starts_block } => {
                let mut input = vec![0.0f32; streams.rows.len()];
                b.attn_res_mix(&mix, &streams.snapshots, &streams.rows, &mut input);
                streams.mixed = starts_block
                    .then(|| Mixed { weights: MixWeights::Snapshot, slot: vec![0.0f32; streams.rows.len()] });
                Cow::Owned(input)
            }
            Residual::Hyper(_) | Residual::Gated(_) => {
                let width = streams.tokens() * streams.hidden;
                let mut input = vec![0.0f32; width];
                let weights = match self {
                    Residual::Hyper(hc) => MixWeights::Hyper(b.hyper_mix(rt, &hc, &streams.rows, &mut input)),
                    Residual::Gated(gated) => MixWeights::Gated(b.gated_mix(rt, &gated, &streams.rows, &mut input)),
                    Residual::Plain | Residual::AttnRes { .. } => unreachable!("mixed above"),
                };
                streams.mixed = Some(Mixed { weights, slot: vec![0.0f32; width] });
                Cow::Owned(input)
            }
        }
    }

    /// Where the block adds its output, `[tokens, hidden]`.
    pub fn slot(self, streams: &mut Streams) -> &mut [f32] {
        match self {
            Residual::Plain | Residual::AttnRes { starts_block: false, .. } => &mut streams.rows,
            Residual::Hyper(_) | Residual::Gated(_) | Residual::AttnRes { starts_block: true, .. } => {
                &mut streams.mixed.as_mut().expect("a block's slot follows its mix").slot
            }
        }
    }

    /// Joins the slot's contents to the streams (nothing left to do when
    /// the slot was the stream).
    pub fn combine(self, b: &Backend, streams: &mut Streams) {
        match self {
            Residual::Plain | Residual::AttnRes { starts_block: false, .. } => {}
            Residual::Hyper(_) | Residual::Gated(_) | Residual::AttnRes { starts_block: true, .. } => {
                let Mixed { weights, slot } = streams.mixed.take().expect("a block's combine follows its mix");
                match (self, weights) {
                    (Residual::Hyper(hc), MixWeights::Hyper(weights)) => {
                        b.hyper_combine(&hc, &weights, &slot, &mut streams.rows)
                    }
                    (Residual::Gated(gated), MixWeights::Gated(injection)) => {
                        b.gated_combine(&gated, &injection, &slot, &mut streams.rows)
                    }
                    (Residual::AttnRes { .. }, MixWeights::Snapshot) => streams.snapshot(slot),
                    _ => unreachable!("a residual combines its own mix"),
                }
            }
        }
    }
}

/// The head of a stack whose layers' residual is `kind`, its weights
/// registered; `norm_eps` is the final norm's, which the σ-weighted head's
/// unweighted norm shares (transformers builds both from `rms_norm_eps`).
pub fn load_head(b: &mut Backend, spec: &CoreSpec, kind: ResidualKind, norm_eps: f32) -> Result<StreamHead> {
    let (streams, eps, head) = match kind {
        ResidualKind::Plain => return Ok(StreamHead::One),
        ResidualKind::AttentionResiduals { .. } => {
            return Ok(StreamHead::AttnRes(load_attn_res(b, spec, norm_eps, names::attn_res_head_names(spec))?));
        }
        ResidualKind::GatedStreams { streams, lowrank } => {
            let gated = load_gated(b, spec, streams, lowrank, norm_eps, names::gated_head_names(spec))?;
            return Ok(StreamHead::Gated(gated));
        }
        ResidualKind::HyperConnections { streams, eps, head, .. } => (streams, eps, head),
    };
    Ok(match head {
        HyperHead::Mean => StreamHead::Mean { streams },
        HyperHead::Sigmoid => {
            let [mixes, base, scale] = names::hyper_head_names(spec);
            StreamHead::Sigmoid {
                streams,
                mixes: b.matrix(&mixes, streams, streams * spec.hidden_size)?,
                base: b.vector(&base, streams)?,
                scale: b.vector(&scale, 1)?,
                eps,
                norm_eps,
            }
        }
    })
}

/// An Attention Residuals mix's norm and score projection, registered (the
/// projection is the hub's `[1, hidden]`, read as `[hidden]`).
fn load_attn_res(b: &mut Backend, spec: &CoreSpec, norm_eps: f32, [norm, proj]: [String; 2]) -> Result<AttnResMix> {
    let hidden = spec.hidden_size;
    Ok(AttnResMix { norm: b.vector(&norm, hidden)?, proj: b.vector(&proj, hidden)?, norm_eps })
}

/// A gated residual's norm, `down` and `up`, registered; no `inject` (the
/// final mixer's, which a block's adds to).
fn load_gated(
    b: &mut Backend,
    spec: &CoreSpec,
    streams: usize,
    lowrank: usize,
    norm_eps: f32,
    [norm, down, up]: [String; 3],
) -> Result<GatedResidual> {
    let width = streams * spec.hidden_size;
    Ok(GatedResidual {
        streams,
        norm: b.vector(&norm, width)?,
        down: b.matrix(&down, lowrank, width)?,
        up: b.matrix(&up, width, lowrank)?,
        inject: None,
        norm_eps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_residual_hands_its_one_stream_as_the_blocks_slot() {
        let residual = Residual::Plain;
        let mut streams = Streams::expand(1, vec![1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!((streams.tokens(), residual.streams()), (2, 1));
        residual.slot(&mut streams).iter_mut().for_each(|x| *x += 0.5);
        assert_eq!(streams.rows, [1.5, 2.5, 3.5, 4.5]);
    }

    #[test]
    fn an_attention_residuals_block_end_keeps_the_partial_sum_as_a_snapshot_and_restarts_it() {
        let mut streams = Streams::expand(1, vec![1.0, 2.0, 3.0, 4.0], 2);
        streams.snapshot(vec![0.5, 0.5, 0.25, 0.25]);
        streams.snapshot(vec![9.0, 8.0, 7.0, 6.0]);
        assert_eq!(streams.snapshots, [vec![1.0, 2.0, 3.0, 4.0], vec![0.5, 0.5, 0.25, 0.25]]);
        assert_eq!(streams.rows, [9.0, 8.0, 7.0, 6.0]);
    }

    #[test]
    fn expanded_streams_repeat_each_embedding_row_once_per_stream() {
        let streams = Streams::expand(3, vec![1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(streams.tokens(), 2);
        assert_eq!(streams.rows, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0, 3.0, 4.0]);
    }
}
