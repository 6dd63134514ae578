//! Opening a model: container, memory budget, expert store, threads and graph.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use strata_format::{
    Container, CoreSpec, Embedding, ExpertKind, FfnKind, FfnSpec, LayerSpec, ModelArch, RowReads, SwiGlu,
};
use strata_kernels::{ActivationPrecision, Threads};
use strata_kv::SequenceState;
use strata_models::{CausalLm, DeviceRequest, Logits, Runtime, SeqBatch, VramStats};
use strata_sched::{ExpertCall, ExpertFfn, LayerStats, RemoteExperts};
use strata_tier::{
    BudgetNeeds, BudgetPlan, ExpertSource, ExpertStore, IoBackend, MirrorSpec, PREFETCH_IN_FLIGHT, PolicyKind,
    RamBudget, RecordCheck, StoreOptions, StoreStats, TraceHeader, TraceWriter, Usage,
};

use crate::speculate::{SpeculateMode, Speculation};
use crate::{Error, Result, Session};

/// How to open a model.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Worker threads for the kernels (0: one per available core).
    pub threads: usize,
    /// The one memory budget for dense weights, expert cache, KV and I/O buffers.
    pub ram_budget: RamBudget,
    /// A further cap on the expert cache (`None`: whatever the budget leaves).
    pub expert_cache_bytes: Option<u64>,
    pub cache_policy: PolicyKind,
    pub io: IoBackend,
    /// I/O worker threads per drive (the container's and each mirror's).
    pub io_workers: usize,
    /// Expert loads in flight at once, per drive.
    pub max_in_flight: usize,
    /// The most tokens a session may hold (`None`: the model's
    /// `max_position_embeddings`, capped at [`CONTEXT_TOKENS_DEFAULT_MAX`]).
    pub context_tokens: Option<usize>,
    /// Sessions held at once (`serve`: its `--max-batch`). Each may grow to
    /// `context_tokens`, so the budget reserves that much KV for every one;
    /// holding more at once than this is the caller's error.
    pub sessions: usize,
    /// The most tokens one forward pass takes; longer inputs run in pieces
    /// (bit-identical), which bounds the activations of a long prompt.
    /// `None`: as many as fit in [`ACTIVATION_BYTES_MAX`] by the model's
    /// shapes.
    pub prefill_chunk_tokens: Option<usize>,
    /// Where learned expert usage is kept (`None`: `usage.json` in the model directory).
    pub usage_file: Option<PathBuf>,
    /// Record every routing decision to this file.
    pub trace_file: Option<PathBuf>,
    /// Directories holding copies of expert files on other drives
    /// (`--mirror`), read beside the container.
    pub mirrors: Vec<MirrorSpec>,
    /// Whether to read the next layer's predicted experts ahead of demand.
    pub prefetch: Prefetch,
    /// Read every expert at open when the expert cache can hold them all
    /// (`ExpertStore::load_all`), so the first tokens do not wait for
    /// their first use of each one. Off only where a test or bench counts
    /// the first uses.
    pub preload_experts: bool,
    /// How finely q8/q4 products quantize their inputs (`--activations`):
    /// int16 by default; int8 is faster and lossy, so only ever asked for.
    pub activations: ActivationPrecision,
    /// Where the model runs (`--device`, `--vram-budget`).
    pub device: DeviceRequest,
    /// Workers computing routed experts on other machines (`--workers`,
    /// crates/dist); `None`: every expert runs here.
    pub workers: Option<Arc<dyn RemoteExperts>>,
    /// Whether decoding drafts with the model's MTP layer (`--speculate`;
    /// nothing where it has none), and how many tokens ahead
    /// (`--draft-tokens`).
    pub speculate: SpeculateMode,
    pub draft_tokens: usize,
}

/// How `model`'s sessions draft (`--speculate`, `--draft-tokens`):
/// nothing where the mode is off or the model has no MTP layer. MTP layers
/// the model keeps but cannot run ([`CausalLm::mtp_refused`]) never draft:
/// `auto` says so once, at open, and runs without; `on` is refused, since
/// it asked for what cannot be given.
fn resolve_speculation(options: &EngineOptions, model: &dyn CausalLm) -> Result<Option<Speculation>> {
    if options.draft_tokens == 0 {
        return Err(Error::InvalidOption { option: "draft-tokens", reason: "must be at least 1 token".into() });
    }
    match (options.speculate, model.mtp_refused()) {
        (SpeculateMode::Off, _) => Ok(None),
        (SpeculateMode::On, Some(why)) => Err(Error::InvalidOption {
            option: "speculate",
            reason: format!("on needs MTP layers that draft, and this model's cannot: {why}"),
        }),
        (SpeculateMode::Auto, Some(why)) => {
            tracing::warn!("speculation off: the model's MTP layers cannot draft: {why}");
            Ok(None)
        }
        (mode, None) => {
            Ok((model.mtp_layers() > 0).then_some(Speculation { mode, draft_tokens: options.draft_tokens }))
        }
    }
}

/// Look-ahead prefetch (`--prefetch`): while a layer computes, the next
/// layer's router applied to this layer's input guesses its experts, and
/// their reads start. A guess costs bytes and I/O buffers, never results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    On,
    Off,
    /// On when the expert cache cannot hold every expert (streaming): with
    /// everything resident there is nothing to read ahead.
    Auto,
}

impl Prefetch {
    pub const ALL: [Prefetch; 3] = [Prefetch::On, Prefetch::Off, Prefetch::Auto];

    pub fn name(self) -> &'static str {
        match self {
            Prefetch::On => "on",
            Prefetch::Off => "off",
            Prefetch::Auto => "auto",
        }
    }
}

impl std::fmt::Display for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Prefetch {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let wanted = text.trim().to_ascii_lowercase();
        Prefetch::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| format!("unknown prefetch mode {text:?} (expected on, off or auto)"))
    }
}

/// The default context is the model's, but no more than this, so that a
/// model advertising a million positions does not reserve a KV arena that
/// cannot exist.
pub const CONTEXT_TOKENS_DEFAULT_MAX: usize = 4096;

/// What one forward pass's activations may hold, so that a long prompt
/// stays inside the budget's slack (`strata_tier::SLACK_BYTES`, which
/// covers activations beside the binary and the stacks).
pub const ACTIVATION_BYTES_MAX: u64 = 48 << 20;

/// Tokens per forward pass when the shapes would allow more: beyond it a
/// bigger pass gains little.
const PREFILL_CHUNK_TOKENS_MAX: usize = 2048;

/// What one session's KV cache costs for a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvFootprint {
    /// Bytes of rows one token adds, all layers.
    pub bytes_per_token: u64,
    /// Bytes of the recurrent state of every layer that has one (0: none).
    pub state_bytes: u64,
    /// Bytes of fixed state one session may hold at once (the committed
    /// state, the copy a pass updates, the snapshots): what the budget
    /// reserves per session besides the rows.
    pub state_bytes_max: u64,
}

/// The KV footprint of a model with these `layers`, from what they keep
/// ([`strata_kv::layouts_of`], which the model's blocks are checked
/// against when they load): nothing is loaded.
pub fn kv_footprint(layers: &[LayerSpec]) -> KvFootprint {
    // One token of capacity: rows grow with use and a fresh state is zero
    // pages not yet touched, so the probe costs next to nothing.
    let probe = SequenceState::with_layers(strata_kv::layouts_of(layers), 1);
    KvFootprint {
        bytes_per_token: probe.bytes_per_token() as u64,
        state_bytes: probe.state_bytes() as u64,
        state_bytes_max: probe.state_bytes_max() as u64,
    }
}

/// Tokens drafted ahead per verify pass by default: DeepSeek-V3's report
/// accepts its one MTP layer's draft 85-90% of the time, so a second draft
/// from its own output still stands often.
pub const DRAFT_TOKENS_DEFAULT: usize = 2;

/// The usage file's name inside a model directory.
pub const USAGE_FILE_NAME: &str = "usage.json";

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            ram_budget: RamBudget::Auto,
            expert_cache_bytes: None,
            cache_policy: PolicyKind::Lru,
            io: IoBackend::Auto,
            io_workers: 2,
            max_in_flight: 4,
            context_tokens: None,
            sessions: 1,
            prefill_chunk_tokens: None,
            usage_file: None,
            trace_file: None,
            mirrors: Vec::new(),
            // As `--prefetch`'s default: not yet measured faster everywhere
            // it would turn on (docs/BENCHMARKS.md, "Prefetch").
            prefetch: Prefetch::Off,
            preload_experts: true,
            activations: ActivationPrecision::Int16,
            device: DeviceRequest::Cpu,
            workers: None,
            speculate: SpeculateMode::Auto,
            draft_tokens: DRAFT_TOKENS_DEFAULT,
        }
    }
}

/// Memory in use, as opposed to the budget's capacities (see
/// [`Engine::memory_use`]; a session's KV is [`Session::kv_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryUse {
    /// The process's resident memory (`VmRSS`); `None` without `/proc`.
    pub resident_bytes: Option<u64>,
    /// Bytes of expert records held in the cache now.
    pub expert_cache_used_bytes: u64,
    pub expert_cache_capacity_bytes: u64,
}

/// A model ready to run.
pub struct Engine {
    container: Arc<Container>,
    model: Box<dyn CausalLm>,
    threads: Threads,
    store: ExpertStore,
    plan: BudgetPlan,
    /// The expert bytes one token routes to over every MoE layer.
    stream_working_set_bytes: u64,
    context_tokens: usize,
    prefill_chunk_tokens: usize,
    content_hash: String,
    usage_file: PathBuf,
    pipeline: Mutex<LayerStats>,
    trace: Option<Mutex<TraceWriter>>,
    workers: Option<Arc<dyn RemoteExperts>>,
    /// Whether saving learned usage has failed once already (see
    /// [`Engine::persist_learning_or_warn`]).
    learning_save_failed: AtomicBool,
    /// How sessions draft (`None`: they do not).
    speculation: Option<Speculation>,
}

impl Engine {
    /// Opens the container in `dir`, refusing if the budget cannot hold it.
    pub fn open(dir: &Path, options: &EngineOptions) -> Result<Self> {
        let container = Arc::new(Container::open_with(dir, Embedding::ReadByRow)?);
        let core = &container.arch().core;
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let context_tokens = match options.context_tokens {
            Some(0) => {
                return Err(Error::InvalidOption { option: "context", reason: "must be at least 1 token".into() });
            }
            // Positions past the trained range give text that degrades
            // without any error; llama.cpp warns, and a library cannot be
            // sure its caller shows a warning, so it refuses.
            Some(n) if n > core.max_position_embeddings => {
                return Err(Error::InvalidOption {
                    option: "context",
                    reason: format!(
                        "{n} tokens is beyond the {} positions this model was trained for (max_position_embeddings \
                         in its config.json)",
                        core.max_position_embeddings
                    ),
                });
            }
            Some(n) => n,
            None => core.max_position_embeddings.clamp(1, CONTEXT_TOKENS_DEFAULT_MAX),
        };
        // MTP layers' experts are read through the same store and budget.
        let arch = container.arch();
        let sources =
            (0..arch.stored_layers()).map(|layer| expert_source(&container, layer)).collect::<Result<Vec<_>>>()?;
        let model = strata_models::load_on(Arc::clone(&container), options.device)?;
        if let Some(summary) = model.device_summary() {
            // Said at start: what the device does not run stays on the CPU.
            tracing::warn!("{summary}");
        }
        let speculation = resolve_speculation(options, model.as_ref())?;
        let prefill_chunk_tokens = match options.prefill_chunk_tokens {
            Some(0) => {
                return Err(Error::InvalidOption {
                    option: "prefill-chunk",
                    reason: "must be at least 1 token".into(),
                });
            }
            Some(n) => n,
            // The estimate (`ModelArch::activation_bytes_per_token`) gives
            // 197 KiB per token on a Qwen3-30B-A3B-shaped model, where 133
            // KiB were measured; it is > 0 for any model with a layer.
            None => usize::try_from(ACTIVATION_BYTES_MAX / container.arch().activation_bytes_per_token() as u64)
                .unwrap_or(usize::MAX)
                .clamp(1, PREFILL_CHUNK_TOKENS_MAX),
        };
        let footprint = kv_footprint(&container.arch().layers);
        let kv_bytes_per_token = footprint.bytes_per_token;
        let kv_state_bytes_per_session = footprint.state_bytes_max;
        let sessions = options.sessions.max(1) as u64;
        // Checked: a wrapped product would let an absurd --context pass the
        // budget with a tiny KV reservation.
        let kv_bytes = kv_bytes_per_token
            .checked_mul(context_tokens as u64)
            .and_then(|bytes| bytes.checked_mul(sessions))
            .ok_or_else(|| Error::InvalidOption {
                option: "context",
                reason: format!(
                    "{context_tokens} tokens of KV ({kv_bytes_per_token} bytes each) for {sessions} session(s) is more memory than 64 bits can count"
                ),
            })?;
        let kv_state_bytes = kv_state_bytes_per_session.checked_mul(sessions).ok_or_else(|| Error::InvalidOption {
            option: "sessions",
            reason: format!(
                "{sessions} sessions of {kv_state_bytes_per_session} bytes of fixed KV state is more memory than 64 bits can count"
            ),
        })?;
        let capacity = |plan: &BudgetPlan| {
            options.expert_cache_bytes.map_or(plan.expert_cache_bytes, |cap| cap.min(plan.expert_cache_bytes))
        };
        let prefetch = match options.prefetch {
            Prefetch::On => true,
            Prefetch::Off => false,
            Prefetch::Auto => {
                let all_experts_bytes: u64 =
                    sources.iter().flatten().map(|s| s.record_bytes as u64 * s.num_experts as u64).sum();
                capacity(&plan_budget(&container, &sources, options, kv_bytes, kv_state_bytes, false)?)
                    < all_experts_bytes
            }
        };
        let plan = plan_budget(&container, &sources, options, kv_bytes, kv_state_bytes, prefetch)?;
        let stream_working_set_bytes = sources.iter().flatten().map(|s| s.record_bytes as u64).sum::<u64>()
            * container.arch().experts_per_token() as u64;
        let capacity_bytes = capacity(&plan);
        let content_hash = container.content_hash().to_owned();
        let usage_file = options.usage_file.clone().unwrap_or_else(|| dir.join(USAGE_FILE_NAME));
        let experts_per_layer: Vec<usize> = sources.iter().map(|s| s.as_ref().map_or(0, |s| s.num_experts)).collect();
        // Said on the first run only (no usage learned yet), not every run.
        if let Some(notice) = container.missing_checksums_notice().filter(|_| !usage_file.exists()) {
            tracing::warn!("{notice}");
        }
        if options.activations.is_lossy() {
            // Said on every run: the tokens differ from the exact path's.
            tracing::warn!(
                activations = options.activations.name(),
                "int8 activations: faster q8/q4 products, but lossy (the logits and so the tokens differ from \
                 the default's); --activations exact restores the default"
            );
        }
        let (usage, ignored) = Usage::load(&usage_file, &content_hash, &experts_per_layer)?;
        if let Some(why) = ignored {
            tracing::warn!(path = %usage_file.display(), "{why}");
        }
        let store_options = StoreOptions {
            capacity_bytes: usize::try_from(capacity_bytes).unwrap_or(usize::MAX),
            policy: options.cache_policy,
            io: options.io,
            io_workers: options.io_workers.max(1).saturating_mul(drives(options)),
            max_in_flight: max_in_flight(options),
            prefetch_in_flight: if prefetch { PREFETCH_IN_FLIGHT } else { 0 },
            ..StoreOptions::default()
        };
        let mirrors = crate::mirror::mirror_options(&container, &options.mirrors)?;
        let store = ExpertStore::open_mirrored(sources, store_options, usage, &mirrors)?;
        if options.preload_experts {
            let bytes_read = store.load_all()?;
            if bytes_read > 0 {
                tracing::info!(bytes_read, "every expert read at open: the model fits its budget");
            }
        }
        let trace = options
            .trace_file
            .as_deref()
            .map(|path| trace_writer(path, &container, &content_hash).map(Mutex::new))
            .transpose()?;
        Ok(Self {
            container,
            model,
            threads: Threads::new(threads)?.with_activations(options.activations),
            store,
            plan,
            stream_working_set_bytes,
            context_tokens,
            prefill_chunk_tokens,
            content_hash,
            usage_file,
            pipeline: Mutex::new(LayerStats::default()),
            trace,
            workers: options.workers.clone(),
            learning_save_failed: AtomicBool::new(false),
            speculation,
        })
    }

    /// How sessions draft with the MTP layer (`None`: `--speculate off`, or
    /// the model has none).
    pub fn speculation(&self) -> Option<Speculation> {
        self.speculation
    }

    /// What runs on which device with `--device gpu`, as said at start
    /// (`None`: all on the CPU).
    pub fn device_summary(&self) -> Option<String> {
        self.model.device_summary()
    }

    /// The model's common part (vocabulary, widths, special tokens).
    pub fn core(&self) -> &CoreSpec {
        self.model.core()
    }

    /// The model's architecture: the common part and every layer's spec.
    pub fn arch(&self) -> &ModelArch {
        self.container.arch()
    }

    /// The opened container.
    pub fn container(&self) -> &Container {
        &self.container
    }

    /// How the memory budget was shared out.
    pub fn budget(&self) -> BudgetPlan {
        self.plan
    }

    /// Whether experts are prefetched (`Prefetch::Auto` resolved).
    pub fn prefetching(&self) -> bool {
        self.store.prefetching()
    }

    /// How experts are read (`--io auto` resolved at open).
    pub fn io(&self) -> IoBackend {
        self.store.io()
    }

    /// The expert cache's capacity in bytes.
    pub fn expert_cache_bytes(&self) -> usize {
        self.store.capacity_bytes()
    }

    /// How many streams' per-token working sets the expert cache holds at
    /// once ([`strata_tier::batch_capacity`]). Streams that share no experts
    /// read more per token when more than this decode together; a trained
    /// router's streams share many, and on the demo model 4 streams past it
    /// still read less per token than 1 (docs/BENCHMARKS.md, "A cache sized
    /// for the batch"), so callers warn rather than refuse.
    pub fn batch_capacity(&self) -> usize {
        strata_tier::batch_capacity(self.store.capacity_bytes() as u64, self.stream_working_set_bytes)
    }

    /// Memory in use now, beside the capacities the budget planned.
    pub fn memory_use(&self) -> MemoryUse {
        MemoryUse {
            resident_bytes: strata_tier::resident_bytes(),
            expert_cache_used_bytes: self.store.held_bytes() as u64,
            expert_cache_capacity_bytes: self.store.capacity_bytes() as u64,
        }
    }

    /// The most tokens a session may hold.
    pub fn context_tokens(&self) -> usize {
        self.context_tokens
    }

    /// The precision q8/q4 products quantize their inputs to.
    pub fn activations(&self) -> ActivationPrecision {
        self.threads.activations()
    }

    /// Mirror copies that failed a read and are no longer used; each was
    /// logged as a warning when it failed.
    pub fn failed_mirror_copies(&self) -> u64 {
        self.store.mirrors().failed_copies()
    }

    /// Expert-store counters since the engine opened.
    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Rows and bytes read so far from the PLE tables on disk.
    pub fn ple_row_reads(&self) -> RowReads {
        self.container.ple_row_reads()
    }

    /// What VRAM holds, and what its tier of routed experts did since the
    /// engine opened (zeros without `--device gpu`).
    pub fn vram_stats(&self) -> VramStats {
        self.model.vram_stats().unwrap_or_default()
    }

    /// Stall and compute time of the MoE pipeline since the engine opened.
    pub fn pipeline_stats(&self) -> LayerStats {
        *self.pipeline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the expert files from the page cache, so the next reads are cold.
    pub fn evict_page_cache(&self) -> Result<()> {
        Ok(self.store.evict_page_cache()?)
    }

    /// Turns the check of each expert record read from disk (CRC32C, finite
    /// floats) off or back on. It is on from open in every program; off
    /// exists only so that `cargo xtask bench` can measure what the check
    /// costs a decode step, step by step in one run.
    pub fn set_record_check(&self, on: bool) {
        self.store.set_checking(on);
    }

    /// Writes what the store has learned to the usage file (atomically) and
    /// flushes the routing trace.
    pub fn persist_learning(&self) -> Result<()> {
        self.store.usage().save(&self.usage_file, &self.content_hash)?;
        if let Some(trace) = &self.trace {
            trace.lock().unwrap_or_else(|p| p.into_inner()).flush()?;
        }
        Ok(())
    }

    /// [`Engine::persist_learning`] for callers that already hold a result:
    /// learning only makes later runs faster, so failing to save it (a
    /// read-only or full volume, a deleted model directory, no file
    /// descriptors left) must never cost an answer. The first failure comes
    /// back as a warning to show; later ones are silent, because the cause
    /// rarely goes away between two answers.
    pub fn persist_learning_or_warn(&self) -> Option<String> {
        let error = self.persist_learning().err()?;
        let first = !self.learning_save_failed.swap(true, Ordering::Relaxed);
        first.then(|| format!("expert usage not saved (answers are unaffected): {error}"))
    }

    /// A fresh conversation.
    pub fn session(&self) -> Session<'_> {
        Session::new(self, self.model.new_cache(self.context_tokens))
    }

    /// Teacher-forced logits at every position of `tokens`, `[n, vocab]`.
    pub fn logits(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::InvalidRequest("no tokens given".into()));
        }
        let mut cache = self.model.new_cache(tokens.len());
        self.forward(tokens, &mut cache, Logits::All)
    }

    /// The MTP layer's logits teacher-forced on `tokens`, `[n - 1, vocab]`:
    /// row i drafts token i + 2 from the stack's hidden state at i and
    /// token i + 1 (what transformers' `MtpModel` gives over the same).
    pub fn draft_logits(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.len() < 2 {
            return Err(Error::InvalidRequest("a draft needs at least 2 tokens".into()));
        }
        let (n, h) = (tokens.len(), self.arch().core.hidden_size);
        self.run(|model, rt| {
            let mut cache = model.new_cache(n);
            let (_, hidden) = model.forward_hidden(rt, tokens, &mut cache)?;
            let mut draft_cache = model.new_draft_cache(n);
            Ok(model.draft(rt, &hidden[..(n - 1) * h], &tokens[1..], &mut draft_cache, 0, Logits::All)?.logits)
        })
    }

    /// The most tokens one forward pass takes (see
    /// [`EngineOptions::prefill_chunk_tokens`]).
    pub fn prefill_chunk_tokens(&self) -> usize {
        self.prefill_chunk_tokens
    }

    /// Runs `tokens` after `cache`'s, in passes of at most
    /// `prefill_chunk_tokens`: the same logits as one pass (every row is
    /// computed by the same code whatever the pass), with the activations
    /// of one piece at a time. All or nothing: on error the cache is as it
    /// was.
    pub(crate) fn forward(&self, tokens: &[u32], cache: &mut SequenceState, which: Logits) -> Result<Vec<f32>> {
        self.forward_rows(tokens, cache, which, None)
    }

    /// [`Engine::forward`], appending each row's hidden state after the
    /// final norm to `hidden` where it is given (what the MTP layer drafts
    /// from); on error `hidden` is as it was too.
    pub(crate) fn forward_rows(
        &self,
        tokens: &[u32],
        cache: &mut SequenceState,
        which: Logits,
        mut hidden: Option<&mut Vec<f32>>,
    ) -> Result<Vec<f32>> {
        let pieces = tokens.len().div_ceil(self.prefill_chunk_tokens).max(1);
        let start = cache.len();
        let hidden_start = hidden.as_ref().map_or(0, |h| h.len());
        if pieces > 1 {
            // A recurrent state cannot be cut back to `start` after later
            // pieces commit, so it is snapshotted there. That is free where
            // inputs start, at 0 or at a turn boundary's snapshot; a copy of
            // the states kept aside instead would cost one every time. (One
            // piece needs nothing: the cache takes its last pass back.)
            cache.snapshot();
        }
        let mut out = Vec::new();
        let vocab = self.core().logits_width();
        for (i, piece) in tokens.chunks(self.prefill_chunk_tokens).enumerate() {
            // Only the last piece's last logits matter for `Last`; the
            // others' one lm-head row is the price of reusing `forward`.
            let piece_hidden = hidden.as_deref_mut();
            let logits = self
                .run(|model, rt| match piece_hidden {
                    None => model.forward(rt, piece, cache, which),
                    Some(hidden) => {
                        let mut rows =
                            model.forward_batch_rows(rt, &mut [SeqBatch { tokens: piece, cache }], &[which])?;
                        let rows = rows.pop().expect("one sequence's rows");
                        hidden.extend(rows.hidden);
                        Ok(rows.logits)
                    }
                })
                .map_err(Error::from)
                .and_then(|logits| {
                    // The rows are those of the piece's last positions.
                    let first_position = cache.len() - logits.len() / vocab.max(1);
                    check_logits(&logits, vocab, first_position).map(|()| logits)
                });
            match logits {
                Ok(logits) if which == Logits::All => out.extend(logits),
                Ok(logits) if i + 1 == pieces => out = logits,
                Ok(_) => {}
                Err(e) => {
                    // All or nothing: the pieces already run are taken back.
                    let kept = cache.truncate(start);
                    assert_eq!(kept, start, "a pass is taken back to where it started");
                    if let Some(hidden) = hidden.as_deref_mut() {
                        hidden.truncate(hidden_start);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Runs `f` (a forward pass) on the kernel pool's own threads. Every
    /// parallel product inside it then forks from a pool thread, which
    /// costs a work-stealing push instead of the cross-thread wake-up of
    /// entering the pool from outside (measured on the demo model: a
    /// 2-thread decode step went from 0.59 ms to 0.33 ms). The caller's
    /// span goes along, so a layer's log lines name the batch step (and
    /// its requests) they ran for.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce(&dyn CausalLm, &Runtime<'_>) -> R + Send) -> R {
        let span = tracing::Span::current();
        self.threads.pool().install(|| span.in_scope(|| f(&*self.model, &self.runtime())))
    }

    /// Computes a coordinator's share of MoE layer `layer`'s union here,
    /// through this engine's expert store and kernels: what `strata worker`
    /// does with each request. Each call's output, in the calls' order.
    pub fn run_expert_calls(&self, layer: usize, calls: &[ExpertCall]) -> Result<Vec<Vec<f32>>> {
        let moe = match self.arch().layers.get(layer).map(|spec| spec.ffn) {
            Some(FfnSpec::Moe(moe)) => moe,
            _ => return Err(strata_format::Error::NotMoeLayer { layer }.into()),
        };
        // The same feed-forward the layer runs at home (strata_models' Moe),
        // or the limit would be lost on the way and the logits differ.
        let experts = match (moe.experts, moe.swiglu) {
            (ExpertKind::SwiGlu, SwiGlu::Plain) => ExpertFfn::SwiGlu,
            (ExpertKind::SwiGlu, SwiGlu::Limited { limit }) => ExpertFfn::LimitedSwiGlu { limit },
            (ExpertKind::SwiGlu, SwiGlu::Situ { beta, linear_beta }) => ExpertFfn::SituGlu { beta, linear_beta },
            (ExpertKind::ClampedSwiGlu { .. }, _) => {
                return Err(Error::InvalidOption {
                    option: "--workers",
                    reason: format!("layer {layer}'s experts carry biases (gpt-oss), which workers do not serve yet"),
                });
            }
        };
        let layout = self.container.expert_layout(layer)?;
        let outputs = self
            .threads
            .pool()
            .install(|| strata_sched::run_expert_calls(&self.store, &self.threads, layer, layout, experts, calls));
        Ok(outputs.map_err(strata_models::Error::from)?)
    }

    pub(crate) fn model(&self) -> &dyn CausalLm {
        &*self.model
    }

    pub(crate) fn runtime(&self) -> Runtime<'_> {
        Runtime {
            threads: &self.threads,
            store: &self.store,
            stats: &self.pipeline,
            trace: self.trace.as_ref(),
            remote: self.workers.as_deref(),
        }
    }
}

/// Refuses logits (`[rows, vocab]`, row `r` at position `first_position +
/// r`) holding a NaN or an infinity: no model here masks tokens with -inf,
/// so a non-finite logit is always damage, never a meaning.
pub(crate) fn check_logits(logits: &[f32], vocab: usize, first_position: usize) -> Result<()> {
    // `all` over plain floats vectorises; the place is looked up only once
    // something is wrong.
    if logits.iter().all(|l| l.is_finite()) {
        return Ok(());
    }
    let index = logits.iter().position(|l| !l.is_finite()).expect("a non-finite logit exists");
    Err(Error::NonFiniteLogits {
        position: first_position + index / vocab.max(1),
        token: index % vocab.max(1),
        value: logits[index],
    })
}

fn expert_source(container: &Container, layer: usize) -> Result<Option<ExpertSource>> {
    if container.arch().layer(layer).is_none_or(|spec| spec.ffn.kind() != FfnKind::Moe) {
        return Ok(None);
    }
    let layout = container.expert_layout(layer)?;
    let record_bytes = usize::try_from(layout.record_bytes)
        .map_err(|_| Error::InvalidRequest(format!("layer {layer}: expert records too large for this machine")))?;
    // Each record read from disk is checked before the store hands it out,
    // so damage on disk is an error naming the expert, never a wrong token.
    let checked = layout.clone();
    let check: RecordCheck =
        Arc::new(move |expert, record| checked.check_record(expert, record).map_err(|e| e.to_string()));
    Ok(Some(ExpertSource {
        path: layout.path.clone(),
        record_bytes,
        num_experts: layout.num_experts,
        check: Some(check),
    }))
}

/// Drives the experts are read from: the container's and each mirror's.
fn drives(options: &EngineOptions) -> usize {
    1 + options.mirrors.len()
}

/// Expert loads in flight at once: `max_in_flight` for each drive, so that
/// a fast drive never idles while the loads in flight all wait on a slow
/// one (measured: two throttled drives, docs/BENCHMARKS.md).
fn max_in_flight(options: &EngineOptions) -> usize {
    options.max_in_flight.max(1).saturating_mul(drives(options))
}

fn plan_budget(
    container: &Container,
    sources: &[Option<ExpertSource>],
    options: &EngineOptions,
    kv_bytes: u64,
    kv_state_bytes: u64,
    prefetch: bool,
) -> Result<BudgetPlan> {
    let record_bytes = sources.iter().flatten().map(|s| s.record_bytes as u64).max().unwrap_or(0);
    // The least cache that runs: the experts one token routes to in one
    // layer. A batch's larger union streams through the I/O buffers one
    // expert at a time, so it never needs a whole layer resident.
    let routed_experts_bytes = record_bytes * container.arch().experts_per_token() as u64;
    // Loads in flight, as many reusable spare buffers, and the one record
    // being computed uncached. Saturating: a product past u64 is more than
    // any budget, which then refuses it naming the I/O buffers.
    // With prefetch, its reads in flight too.
    let prefetch_buffers = if prefetch { PREFETCH_IN_FLIGHT as u64 } else { 0 };
    let io_buffers =
        (max_in_flight(options) as u64).saturating_mul(2).saturating_add(1).saturating_add(prefetch_buffers);
    let io_buffer_bytes = io_buffers.saturating_mul(record_bytes);
    let needs = BudgetNeeds {
        dense_bytes: container.dense_resident_bytes(),
        kv_bytes,
        kv_state_bytes,
        io_buffer_bytes,
        min_expert_bytes: routed_experts_bytes,
    };
    Ok(BudgetPlan::new(options.ram_budget.resolve()?, needs)?)
}

fn trace_writer(path: &Path, container: &Container, content_hash: &str) -> Result<TraceWriter> {
    let arch = container.arch();
    let record_bytes = container.manifest().expert_layers.first().map_or(0, |l| l.record_bytes);
    let header = TraceHeader::new(content_hash, arch.stored_layers(), arch.num_experts(), record_bytes);
    Ok(TraceWriter::create(path, header)?)
}

#[cfg(test)]
#[path = "stateful_tests.rs"]
mod stateful_tests;

#[cfg(test)]
#[path = "rollback_tests.rs"]
mod rollback_tests;
