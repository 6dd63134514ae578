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
//! component, with no copy. A residual of several streams (hyper-connections)
//! mixes a fresh input, hands a zeroed slot and combines it with learned
//! weights; its kinds arrive with the families that use them.

use std::borrow::Cow;

use strata_format::ResidualKind;

use crate::error::{Error, Result};

/// The hidden states of a pass, `[tokens, streams, hidden]`.
pub struct Streams {
    rows: Vec<f32>,
    streams: usize,
    hidden: usize,
}

impl Streams {
    /// The embeddings of a pass (`[tokens, hidden]`) as the stack's streams.
    pub fn expand(residual: &Residual, embeddings: Vec<f32>, hidden: usize) -> Self {
        assert_eq!(embeddings.len() % hidden, 0, "embeddings are whole rows");
        match residual {
            Residual::Plain => Self { rows: embeddings, streams: 1, hidden },
        }
    }

    /// The final hidden states, `[tokens, hidden]`, the streams collapsed.
    pub fn collapse(self, residual: &Residual) -> Vec<f32> {
        match residual {
            Residual::Plain => {
                assert_eq!(self.streams, 1, "the plain residual keeps one stream");
                self.rows
            }
        }
    }

    /// Rows of the pass.
    pub fn tokens(&self) -> usize {
        self.rows.len() / (self.streams * self.hidden)
    }
}

/// A layer's residual: built from its [`ResidualKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    /// One stream, `x += block(norm(x))`.
    Plain,
}

impl Residual {
    pub fn new(kind: ResidualKind) -> Result<Self> {
        match kind {
            ResidualKind::Plain => Ok(Residual::Plain),
            ResidualKind::HyperConnections { .. } => {
                Err(Error::Unsupported("hyper-connections are not built yet".into()))
            }
        }
    }

    /// The streams a stack of this residual carries.
    pub fn streams(self) -> usize {
        match self {
            Residual::Plain => 1,
        }
    }

    /// The block's input, `[tokens, hidden]` (the stream itself, unless
    /// streams are mixed).
    pub fn mix(self, streams: &Streams) -> Cow<'_, [f32]> {
        assert_eq!(streams.streams, self.streams(), "the stack carries this residual's streams");
        match self {
            Residual::Plain => Cow::Borrowed(&streams.rows),
        }
    }

    /// Where the block adds its output, `[tokens, hidden]`.
    pub fn slot(self, streams: &mut Streams) -> &mut [f32] {
        match self {
            Residual::Plain => &mut streams.rows,
        }
    }

    /// Joins the slot's contents to the streams (nothing left to do when
    /// the slot was the stream).
    pub fn combine(self, _streams: &mut Streams) {
        match self {
            Residual::Plain => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_residual_adds_a_blocks_output_into_its_one_stream() {
        let residual = Residual::new(ResidualKind::Plain).unwrap();
        let mut streams = Streams::expand(&residual, vec![1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(streams.tokens(), 2);
        assert_eq!(&*residual.mix(&streams), &[1.0, 2.0, 3.0, 4.0]);
        residual.slot(&mut streams).iter_mut().for_each(|x| *x += 0.5);
        residual.combine(&mut streams);
        assert_eq!(streams.collapse(&residual), vec![1.5, 2.5, 3.5, 4.5]);
    }
}
