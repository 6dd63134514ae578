//! The engine: composes the container, the expert store, the kernels' thread
//! pool and a model graph into something that turns token ids into tokens.
//!
//! ```no_run
//! use strata_engine::{Engine, EngineOptions, GenerateOptions};
//!
//! # fn main() -> Result<(), strata_engine::Error> {
//! let engine = Engine::open("path/to/container".as_ref(), &EngineOptions::default())?;
//! let mut session = engine.session();
//! let options = GenerateOptions { max_new_tokens: 16, ..GenerateOptions::default() };
//! let report = session.generate(&[1, 2, 3], &options, |token| {
//!     println!("{token}");
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! println!("{} tokens at {:.1} tok/s", report.tokens.len(), report.stats.decode_tokens_per_s());
//! # Ok(())
//! # }
//! ```
//!
//! Token ids in, token ids out: text (tokenizers, chat templates) is
//! `strata-text`'s, grammars `strata-grammar`'s, and finding a model (the
//! demo, the checkpoint cache, pulling from the hub) `strata-hub`'s; a
//! program that only runs a model links none of them.
//!
//! **Architecture invariant:** the engine holds no global state. Everything a
//! run depends on (threads, cache size, sampling) is passed in explicitly.

#[cfg(feature = "clap")]
pub mod args;
mod batch;
mod closing;
mod constraint;
mod decode;
mod device;
mod engine;
mod error;
#[cfg(feature = "clap")]
pub mod logging;
pub mod mirror;
mod persist;
mod sampler;
mod session;
mod speculate;

pub use batch::{Admission, BatchLimits, BatchObserver, Batcher, Event, EventSink, Events, Job};
pub use closing::CLOSING_TOKENS_MAX;
pub use constraint::Constraint;
pub use decode::{Finish, Generation, Step};
pub use device::{DeviceKind, VramBudget};
pub use engine::{
    CONTEXT_TOKENS_DEFAULT_MAX, DRAFT_TOKENS_DEFAULT, Engine, EngineOptions, KvFootprint, MemoryUse, Prefetch,
    USAGE_FILE_NAME, kv_footprint,
};
pub use error::{Error, Result};
pub use persist::{SESSION_FILE_EXTENSION, SESSION_NAME_MAX_BYTES, SessionReport, session_path, validate_session_name};
pub use sampler::{Sampler, SamplingDefaults, SamplingOptions, Verdict};
pub use session::{GenerateOptions, GenerateReport, RunStats, Session};
pub use speculate::{Drafted, Policy, SpeculateMode, Speculation, SpeculationStats};
pub use strata_format::{CoreSpec, ModelArch};
pub use strata_kernels::ActivationPrecision;
pub use strata_kv::CutTail;
pub use strata_models::{DeviceRequest, VramStats};
pub use strata_tier::{ByteSize, IoBackend, MirrorSpec, PolicyKind, RamBudget, StoreStats, resident_bytes};
