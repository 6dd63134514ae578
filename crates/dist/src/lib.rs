//! Expert workers on other machines (docs/DISTRIBUTED.md): `strata worker`
//! serves a shard of a model's routed experts ([`serve`]); a coordinator's
//! [`Workers`] sends each MoE layer's share of the union to the workers
//! holding it, over Eclipse Zenoh (peer to peer, user-password
//! authentication with a [`SharedKey`]), and is the engine's
//! [`strata_sched::RemoteExperts`]. [`Relay`] stands in for a LAN's delay
//! between network namespaces, in the substrate measurement
//! (`examples/substrates`, feature `bench-substrates`) and the tests.

#[cfg(feature = "clap")]
pub mod args;
mod coordinator;
mod error;
mod key;
mod relay;
mod session;
mod shard;
mod wire;
mod worker;

pub use coordinator::Workers;
pub use error::{Error, Result};
pub use key::{KEY_ENV, SharedKey};
pub use relay::Relay;
pub use shard::Shard;
pub use worker::serve;
