//! The engine's command-line flags, shared by every binary that runs a
//! model (`strata`, `chat`, `serve`), so each flag is defined once.

use std::path::PathBuf;

use clap::Args;
use strata_tier::{ByteSize, IoBackend, MirrorSpec, PolicyKind, RamBudget};

use crate::{EngineOptions, Prefetch};

/// Flags of every command that runs a model.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// The one memory budget for dense weights, expert cache, KV and I/O
    /// buffers: a size (e.g. 6GiB) or `auto` (75% of MemAvailable).
    #[arg(long, default_value = "auto")]
    pub ram_budget: RamBudget,
    /// A further cap on the RAM holding routed experts, e.g. 16KiB, 512MiB.
    #[arg(long)]
    pub expert_cache: Option<ByteSize>,
    /// Expert cache replacement policy: predict (learned routing
    /// transitions; measures best on real traces), lru, lfru or pinned.
    #[arg(long, default_value = "predict")]
    pub cache_policy: PolicyKind,
    /// How experts are read: pread, direct (O_DIRECT), uring (io_uring) or mmap.
    #[arg(long, default_value = "pread")]
    pub io: IoBackend,
    /// Kernel worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// The most tokens a session may hold; its KV arena comes out of the
    /// budget (default: the model's context, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    /// Record every routing decision (layer, token, experts) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Where learned expert usage is kept (default: usage.json in the model directory).
    #[arg(long)]
    pub usage_file: Option<PathBuf>,
    /// A copy of some or all expert files on another drive, staged by
    /// `strata mirror stage`; RATE (e.g. 3GB, per second) weighs its share
    /// of reads, measured at open if not given. Repeatable.
    #[arg(long = "mirror", value_name = "DIR[=RATE]")]
    pub mirrors: Vec<MirrorSpec>,
    /// Read the next layer's predicted experts while a layer computes: on,
    /// off, or auto (on when the expert cache cannot hold every expert).
    /// Off by default: it measured faster on the demo model's real routes
    /// but slower on a random-weight streaming model (docs/BENCHMARKS.md).
    #[arg(long, default_value = "off")]
    pub prefetch: Prefetch,
}

impl EngineArgs {
    /// The engine options these flags ask for.
    pub fn options(&self) -> EngineOptions {
        EngineOptions {
            threads: self.threads,
            ram_budget: self.ram_budget,
            expert_cache_bytes: self.expert_cache.map(ByteSize::bytes),
            cache_policy: self.cache_policy,
            io: self.io,
            context_tokens: self.context,
            trace_file: self.trace.clone(),
            usage_file: self.usage_file.clone(),
            mirrors: self.mirrors.clone(),
            prefetch: self.prefetch,
            ..EngineOptions::default()
        }
    }
}

/// An error and its causes as one line, each said once. The library errors
/// put their cause in their own message (so that they read whole shown
/// alone) and give it as `source()` too, which anyhow's `{:#}` would then
/// print a second time.
pub fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}
