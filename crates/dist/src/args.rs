//! The coordinator's flags, shared by every binary that runs a model
//! (`strata generate` and `logits`, `chat`, `serve`).

use std::path::{Path, PathBuf};

use clap::Args;
use strata_engine::{Engine, EngineOptions};

use crate::Result;

/// Where a model's routed experts run, when on other machines.
#[derive(Debug, Clone, Args)]
pub struct WorkersArgs {
    /// Expert workers (`strata worker`) that compute this model's routed
    /// experts, each a shard of them: HOST:PORT,...
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT,...")]
    pub workers: Vec<String>,
    /// The file holding the key the workers require (default: the
    /// STRATA_WORKER_KEY environment variable).
    #[arg(long, value_name = "FILE")]
    pub worker_key_file: Option<PathBuf>,
    /// How long a layer waits for a worker's reply; past it the worker is
    /// lost and its experts are computed here, from the model's own files.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub worker_deadline_ms: u64,
}

impl WorkersArgs {
    /// Opens the model in `dir` with `options`, its routed experts on the
    /// workers named, if any: connected first (one per shard), then checked
    /// to serve this model with these activations.
    pub fn open(&self, dir: &Path, options: EngineOptions) -> Result<Engine> {
        if self.workers.is_empty() {
            return Ok(Engine::open(dir, &options)?);
        }
        self.open_on_workers(dir, options)
    }

    #[cfg(feature = "workers")]
    fn open_on_workers(&self, dir: &Path, mut options: EngineOptions) -> Result<Engine> {
        let key = crate::SharedKey::from_file_or_env(self.worker_key_file.as_deref())?;
        let deadline = std::time::Duration::from_millis(self.worker_deadline_ms);
        let workers = std::sync::Arc::new(crate::Workers::connect(&self.workers, &key, deadline)?);
        options.workers = Some(workers.clone());
        let engine = Engine::open(dir, &options)?;
        workers.check(engine.activations().name(), engine.container().content_hash())?;
        Ok(engine)
    }

    #[cfg(not(feature = "workers"))]
    fn open_on_workers(&self, _dir: &Path, _options: EngineOptions) -> Result<Engine> {
        Err(crate::Error::NotBuilt)
    }
}
