//! The per-layer pipeline of routed experts: **route → union → place →
//! overlap → learn**.
//!
//! The model's own router (in `strata-models`) produces, for every token, its
//! top-k experts and their weights. This crate takes those routes for a whole
//! batch of tokens, reads each distinct expert once ([`union`]), fetches its
//! record from the tiered store, applies it to every token routed to it, and
//! combines the results in a fixed order.
//!
//! **Architecture invariant:** results never depend on which experts happened
//! to be resident or in which order loads completed: each token's expert
//! outputs are summed in ascending expert order, whatever the cache did.

mod error;
mod ffn;
mod moe;
mod remote;
mod stats;
mod union;
mod vram;

pub use error::{Error, Result};
pub use ffn::gated_ffn;
pub use moe::{ExpertFfn, Guess, MoeBatch, run_expert_calls, run_moe_layer};
pub use remote::{ExpertCall, Pending, RemoteExperts};
pub use stats::LayerStats;
pub use union::{Route, union};
pub use vram::{ExpertOnDevice, VramExperts};
