//! Feed-forward blocks: each layer's dense SwiGLU MLP or mixture of
//! experts, chosen by its [`FfnSpec`].

mod moe;
mod router;

use strata_format::{CoreSpec, FfnSpec, SwiGlu, names};
use strata_sched::Guess;

use crate::backend::Runtime;
use crate::backend::{Backend, MatrixHandle};
use crate::error::Result;

/// One layer's feed-forward block.
pub enum Ffn {
    /// A resident SwiGLU MLP: gate, up, down, what its SwiGLU clamps, and
    /// the learned scalar its output is multiplied by, if any (Inkling's
    /// `global_scale`).
    Dense([MatrixHandle; 3], SwiGlu, Option<f32>),
    Moe(moe::Moe),
}

impl Ffn {
    /// Layer `layer`'s block of kind `kind`, its tensors shape-checked.
    pub fn load(b: &mut Backend, spec: &CoreSpec, kind: &FfnSpec, layer: usize) -> Result<Self> {
        Ok(match kind {
            FfnSpec::Dense { intermediate_size, swiglu, global_scale } => {
                let mlp = load_swiglu(b, names::dense_mlp_names(spec, layer), spec.hidden_size, *intermediate_size)?;
                let scale = match global_scale {
                    true => Some(load_scalar(b, &names::global_scale_name(spec, layer, "mlp"))?),
                    false => None,
                };
                Ffn::Dense(mlp, *swiglu, scale)
            }
            FfnSpec::Moe(block) => Ffn::Moe(moe::Moe::load(b, spec, block, layer)?),
        })
    }

    /// The distinct experts this block's router would pick for the rows of
    /// `xs`, in route order (`None` for a dense block): applied to an
    /// earlier layer's input, a guess at what this layer will read. Row `i`
    /// is token `tokens[i]`'s.
    pub fn predict(&self, rt: &Runtime<'_>, b: &Backend, xs: &[f32], tokens: &[u32]) -> Option<Vec<usize>> {
        match self {
            Ffn::Dense(..) => None,
            Ffn::Moe(moe) => Some(moe.predict(rt, b, xs, tokens)),
        }
    }

    /// Adds the block's output for `xs` (`[n, hidden]`, row `i` token
    /// `tokens[i]` at sequence position `positions[i]`) into `out`, the slot the layer's residual
    /// hands it (the stream itself for the plain residual: the routed
    /// experts' outputs then join it one by one, as the expert pipeline sums
    /// them), prefetching `guess` while it runs.
    #[allow(clippy::too_many_arguments)]
    pub fn add_to(
        &self,
        rt: &Runtime<'_>,
        b: &Backend,
        layer: usize,
        positions: &[usize],
        tokens: &[u32],
        xs: &[f32],
        out: &mut [f32],
        guess: Option<Guess<'_>>,
    ) -> Result<()> {
        match self {
            Ffn::Dense(mlp, swiglu, scale) => {
                if let Some(guess) = guess {
                    rt.store.prefetch(guess.layer, guess.experts)?;
                }
                let mut ys = vec![0.0f32; out.len()];
                b.swiglu(rt, mlp, *swiglu, xs, &mut ys);
                if let Some(scale) = scale {
                    ys.iter_mut().for_each(|y| *y *= scale);
                }
                out.iter_mut().zip(&ys).for_each(|(o, y)| *o += y);
                Ok(())
            }
            Ffn::Moe(moe) => moe.add_to(rt, b, layer, positions, tokens, xs, out, guess),
        }
    }
}

/// The learned scalar `name` (`[1]`), read once at load.
fn load_scalar(b: &mut Backend, name: &str) -> Result<f32> {
    let handle = b.vector(name, 1)?;
    Ok(b.vector_values(handle)[0])
}

/// The gate, up and down matrices `names` of a SwiGLU MLP of width
/// `intermediate_size`, registered.
fn load_swiglu(
    b: &mut Backend,
    [gate, up, down]: [String; 3],
    hidden: usize,
    intermediate_size: usize,
) -> Result<[MatrixHandle; 3]> {
    Ok([
        b.matrix(&gate, intermediate_size, hidden)?,
        b.matrix(&up, intermediate_size, hidden)?,
        b.matrix(&down, hidden, intermediate_size)?,
    ])
}
