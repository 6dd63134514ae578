//! Expert workers on other machines (docs/DISTRIBUTED.md): `strata worker`
//! serves a shard of a model's routed experts ([`serve`]); a coordinator's
//! [`Workers`] sends each MoE layer's share of the union to the workers
//! holding it, over Eclipse Zenoh (peer to peer, user-password
//! authentication with a [`SharedKey`]), and is the engine's
//! [`strata_sched::RemoteExperts`]. [`Relay`] stands in for a LAN's delay
//! between network namespaces, in the substrate measurement
//! (`examples/substrates`, feature `bench-substrates`) and the tests.

//!
//! Zenoh is in the build only with feature `workers` (docs/DISTRIBUTED.md,
//! its cost); without it the flags still parse, and [`serve`] and
//! `args::WorkersArgs::open` with workers named refuse, naming the feature.

#[cfg(feature = "clap")]
pub mod args;
#[cfg(feature = "workers")]
mod coordinator;
mod error;
mod key;
mod relay;
#[cfg(feature = "workers")]
mod session;
mod shard;
#[cfg(feature = "workers")]
mod wire;
#[cfg(feature = "workers")]
mod worker;

#[cfg(feature = "workers")]
pub use coordinator::Workers;
pub use error::{Error, Result};
pub use key::{KEY_ENV, SharedKey};
pub use relay::Relay;
pub use shard::Shard;
#[cfg(feature = "workers")]
pub use worker::serve;

/// `strata worker` in a build without feature `workers`: refuses.
#[cfg(not(feature = "workers"))]
pub fn serve(
    _engine: &strata_engine::Engine,
    _listen: &str,
    _shard: Shard,
    _key: &SharedKey,
    _ready: impl FnOnce(),
) -> Result<()> {
    Err(Error::NotBuilt)
}
