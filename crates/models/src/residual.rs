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

use std::borrow::Cow;

use strata_format::names::{self, HyperSite};
use strata_format::{CoreSpec, HyperHead, ResidualKind};

use crate::backend::{Backend, GatedResidual, HyperConnection, Runtime, StreamHead, StreamWeights};
use crate::error::Result;

/// The hidden states of a pass, `[tokens, streams, hidden]`.
pub struct Streams {
    rows: Vec<f32>,
    streams: usize,
    hidden: usize,
    /// A hyper-connection's mix waiting for its block's output.
    mixed: Option<Mixed>,
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
        Self { rows, streams, hidden, mixed: None }
    }

    /// The final hidden states, `[tokens, hidden]`, the streams collapsed
    /// by the stack's `head`.
    pub fn collapse(self, rt: &Runtime<'_>, b: &Backend, head: &StreamHead) -> Vec<f32> {
        assert_eq!(self.streams, head.streams(), "the head collapses the stack's streams");
        assert!(self.mixed.is_none(), "every mix was combined");
        b.collapse_streams(rt, head, self.rows, self.hidden)
    }

    /// Rows of the pass.
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
            Residual::Plain => 1,
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
            Residual::Hyper(_) | Residual::Gated(_) => {
                let width = streams.tokens() * streams.hidden;
                let mut input = vec![0.0f32; width];
                let weights = match self {
                    Residual::Hyper(hc) => MixWeights::Hyper(b.hyper_mix(rt, &hc, &streams.rows, &mut input)),
                    Residual::Gated(gated) => MixWeights::Gated(b.gated_mix(rt, &gated, &streams.rows, &mut input)),
                    Residual::Plain => unreachable!("the plain residual mixes nothing"),
                };
                streams.mixed = Some(Mixed { weights, slot: vec![0.0f32; width] });
                Cow::Owned(input)
            }
        }
    }

    /// Where the block adds its output, `[tokens, hidden]`.
    pub fn slot(self, streams: &mut Streams) -> &mut [f32] {
        match self {
            Residual::Plain => &mut streams.rows,
            Residual::Hyper(_) | Residual::Gated(_) => {
                &mut streams.mixed.as_mut().expect("a block's slot follows its mix").slot
            }
        }
    }

    /// Joins the slot's contents to the streams (nothing left to do when
    /// the slot was the stream).
    pub fn combine(self, b: &Backend, streams: &mut Streams) {
        match self {
            Residual::Plain => {}
            Residual::Hyper(_) | Residual::Gated(_) => {
                let Mixed { weights, slot } = streams.mixed.take().expect("a block's combine follows its mix");
                match (self, weights) {
                    (Residual::Hyper(hc), MixWeights::Hyper(weights)) => {
                        b.hyper_combine(&hc, &weights, &slot, &mut streams.rows)
                    }
                    (Residual::Gated(gated), MixWeights::Gated(injection)) => {
                        b.gated_combine(&gated, &injection, &slot, &mut streams.rows)
                    }
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
    fn expanded_streams_repeat_each_embedding_row_once_per_stream() {
        let streams = Streams::expand(3, vec![1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(streams.tokens(), 2);
        assert_eq!(streams.rows, [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0, 3.0, 4.0]);
    }
}
