//! One decoder stack ([`Decoder`]) runs every family: each layer is the
//! attention block and feed-forward block its
//! [`strata_format::LayerSpec`] names, so a family is data, not a graph.
//!
//! A family adds blocks, never a cache: routed experts always come from the
//! one generic [`strata_tier::ExpertStore`] through [`strata_sched`], and KV
//! state from [`strata_kv`].
//!
//! **Architecture invariant:** a block registers its weights with the
//! `backend` at load and runs only its operations on them (the routed
//! experts too, through the expert store); it never opens files, never
//! calls a kernel itself, and never branches on the model family.

mod attention;
mod backend;
mod common;
mod conv;
mod decoder;
mod dsa;
mod error;
mod ffn;
mod lm;
mod mla;
mod ngram;
mod norm;
mod ple;
mod residual;
mod rope;
mod torch_topk;

pub use backend::{DeviceRequest, Runtime, VramStats};
pub use decoder::Decoder;
pub use error::{Error, Result};
pub use lm::{CausalLm, Draft, Logits, Rows, SeqBatch};

use strata_format::Container;

/// Builds the container's model on the CPU: its layers' blocks, every
/// tensor checked.
pub fn load(container: std::sync::Arc<Container>) -> Result<Box<dyn CausalLm>> {
    load_on(container, DeviceRequest::Cpu)
}

/// Builds the container's model on the device `request` names.
pub fn load_on(container: std::sync::Arc<Container>, request: DeviceRequest) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(Decoder::load_on(container, request)?))
}
