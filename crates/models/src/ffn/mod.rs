//! Feed-forward blocks: each layer's dense SwiGLU MLP or mixture of
//! experts, chosen by its [`FfnKind`].

mod moe;
mod router;

use strata_format::{Container, CoreSpec, FfnKind, names};
use strata_sched::Guess;

use crate::weights::swiglu_names;
use crate::{Result, Runtime};

/// One layer's feed-forward block.
pub enum Ffn {
    /// A resident SwiGLU MLP: gate, up, down.
    Dense([String; 3]),
    Moe(moe::Moe),
}

impl Ffn {
    /// Layer `layer`'s block of kind `kind`, its tensors shape-checked.
    pub fn load(c: &Container, spec: &CoreSpec, kind: &FfnKind, layer: usize) -> Result<Self> {
        Ok(match kind {
            FfnKind::Dense { intermediate_size } => {
                Ffn::Dense(swiglu_names(c, names::dense_mlp_names(spec, layer), spec.hidden_size, *intermediate_size)?)
            }
            FfnKind::Moe(block) => Ffn::Moe(moe::Moe::load(c, spec, block, layer)?),
        })
    }

    /// The distinct experts this block's router would pick for the rows of
    /// `xs`, in route order (`None` for a dense block): applied to an
    /// earlier layer's input, a guess at what this layer will read.
    pub fn predict(&self, rt: &Runtime<'_>, c: &Container, xs: &[f32]) -> Result<Option<Vec<usize>>> {
        match self {
            Ffn::Dense(_) => Ok(None),
            Ffn::Moe(moe) => moe.predict(rt, c, xs).map(Some),
        }
    }

    /// Adds the block's output for `xs` (`[n, hidden]`, row `i` at sequence
    /// position `positions[i]`) to the residual stream `out`, prefetching
    /// `guess` while it runs.
    #[allow(clippy::too_many_arguments)]
    pub fn add_to(
        &self,
        rt: &Runtime<'_>,
        c: &Container,
        layer: usize,
        positions: &[usize],
        xs: &[f32],
        out: &mut [f32],
        guess: Option<Guess<'_>>,
    ) -> Result<()> {
        match self {
            Ffn::Dense(mlp) => {
                if let Some(guess) = guess {
                    rt.store.prefetch(guess.layer, guess.experts)?;
                }
                let mut ys = vec![0.0f32; out.len()];
                dense_swiglu(rt, c, mlp, xs, &mut ys)?;
                out.iter_mut().zip(&ys).for_each(|(o, y)| *o += y);
                Ok(())
            }
            Ffn::Moe(moe) => moe.add_to(rt, c, layer, positions, xs, out, guess),
        }
    }
}

/// `ys = down(silu(gate(xs)) * up(xs))` with resident weights.
fn dense_swiglu(rt: &Runtime<'_>, c: &Container, [g, u, d]: &[String; 3], xs: &[f32], ys: &mut [f32]) -> Result<()> {
    rt.ops().swiglu(&[c.dense(g)?, c.dense(u)?, c.dense(d)?], xs, ys);
    Ok(())
}
