//! Counters shared by the engine's batcher thread (which writes them, as
//! its [`BatchObserver`]) and the HTTP side (which reads them for
//! `/metrics` and the chat page), as atomics so neither side ever waits on
//! the other.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use strata_engine::{BatchObserver, Engine, SpeculationStats};

/// The window over which the live tokens/s is measured.
const RATE_WINDOW: Duration = Duration::from_secs(5);
/// Steps remembered for the live rate: a bound, so memory stays fixed however
/// fast steps are (the rate then covers the last this-many steps).
const RATE_STEPS: usize = 4096;

/// Which endpoint a request came through, for per-endpoint counts.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint {
    Chat = 0,
    Completions = 1,
    Messages = 2,
}

const ENDPOINTS: [&str; 3] = ["chat_completions", "completions", "messages"];

#[derive(Debug, Default)]
pub struct Metrics {
    requests: [AtomicU64; 3],
    pub rejected_queue_full: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose KV was reused from a finished request's session.
    pub prompt_tokens_reused: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub steps: AtomicU64,
    /// Sum over steps of the sequences in the step (mean batch = this / steps).
    pub step_sequences: AtomicU64,
    pub step_ns: AtomicU64,
    pub active_sequences: AtomicU64,
    pub expert_hits: AtomicU64,
    pub expert_misses: AtomicU64,
    pub expert_bytes_read: AtomicU64,
    pub expert_evictions: AtomicU64,
    pub expert_stall_ns: AtomicU64,
    /// Bytes of expert records in the cache now.
    pub expert_cache_used_bytes: AtomicU64,
    /// The tier of routed experts in VRAM (`--device gpu`).
    pub vram_expert_hits: AtomicU64,
    pub vram_expert_misses: AtomicU64,
    pub vram_bytes_uploaded: AtomicU64,
    pub vram_upload_stall_ns: AtomicU64,
    /// Bytes of KV cache the active and idle sessions fill now.
    pub kv_bytes: AtomicU64,
    /// (when, tokens generated) of recent steps.
    recent: Mutex<VecDeque<(Instant, u64)>>,
    /// Speculative decoding's counts over every sequence's verify passes.
    speculation: Mutex<SpeculationStats>,
}

impl BatchObserver for Metrics {
    fn admitted(&self, prompt_tokens: usize, reused_tokens: usize) {
        self.prompt_tokens.fetch_add(prompt_tokens as u64, Relaxed);
        self.prompt_tokens_reused.fetch_add(reused_tokens as u64, Relaxed);
    }

    fn cancelled(&self, jobs: usize) {
        self.cancelled.fetch_add(jobs as u64, Relaxed);
    }

    fn stepped(&self, sequences: usize, sampled_tokens: usize, elapsed: Duration) {
        self.step(sequences, sampled_tokens as u64, elapsed);
    }

    fn speculated(&self, pass: &SpeculationStats) {
        // `stepped` counted one token for the sequence; its accepted drafts
        // are the rest.
        self.generated_tokens.fetch_add(pass.verified_tokens.saturating_sub(1) as u64, Relaxed);
        self.speculation.lock().unwrap_or_else(|p| p.into_inner()).add(pass);
    }

    fn settled(&self, engine: &Engine, active_sequences: usize, kv_bytes: u64) {
        self.active_sequences.store(active_sequences as u64, Relaxed);
        self.kv_bytes.store(kv_bytes, Relaxed);
        let store = engine.store_stats();
        self.expert_hits.store(store.hits, Relaxed);
        self.expert_misses.store(store.misses, Relaxed);
        self.expert_bytes_read.store(store.bytes_read, Relaxed);
        self.expert_evictions.store(store.evictions, Relaxed);
        self.expert_stall_ns.store(engine.pipeline_stats().stall_ns, Relaxed);
        self.expert_cache_used_bytes.store(engine.memory_use().expert_cache_used_bytes, Relaxed);
        let vram = engine.vram_stats().experts;
        self.vram_expert_hits.store(vram.hits, Relaxed);
        self.vram_expert_misses.store(vram.misses, Relaxed);
        self.vram_bytes_uploaded.store(vram.bytes_uploaded, Relaxed);
        self.vram_upload_stall_ns.store(vram.upload_stall_ns, Relaxed);
    }

    // The batcher's news goes to the log, as every other line of the server's.
    fn failed(&self, sequences: usize, message: &str) {
        tracing::error!(sequences, "generation(s) failed: {message}");
    }

    fn warning(&self, message: &str) {
        tracing::warn!("{message}");
    }
}

/// What the chat page shows, read in one go.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Live {
    pub tokens_per_second: f64,
    pub expert_hit_rate: f64,
    pub active_sequences: u64,
    pub queue_depth: u64,
    pub generated_tokens: u64,
    pub expert_bytes_read: u64,
    /// The process's resident memory (`VmRSS`), if the kernel says.
    pub resident_bytes: Option<u64>,
    pub expert_cache_used_bytes: u64,
    pub kv_bytes: u64,
}

impl Metrics {
    pub fn request(&self, endpoint: Endpoint) {
        self.requests[endpoint as usize].fetch_add(1, Relaxed);
    }

    /// Records one forward step that generated `tokens` tokens.
    pub fn step(&self, sequences: usize, tokens: u64, elapsed: Duration) {
        self.steps.fetch_add(1, Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Relaxed);
        self.step_ns.fetch_add(elapsed.as_nanos() as u64, Relaxed);
        self.generated_tokens.fetch_add(tokens, Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == RATE_STEPS {
            recent.pop_front();
        }
        recent.push_back((Instant::now(), tokens));
    }

    /// Generated tokens per second over the last few seconds (0 when idle).
    pub fn tokens_per_second(&self) -> f64 {
        let now = Instant::now();
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let in_window: Vec<&(Instant, u64)> = recent.iter().filter(|(at, _)| now - *at <= RATE_WINDOW).collect();
        let Some(first) = in_window.first() else { return 0.0 };
        // From the end of the first step in the window, so the tokens of the
        // steps after it: a burst that just started is measured over its own
        // length, one that ended decays to 0.
        let tokens: u64 = in_window.iter().skip(1).map(|(_, t)| t).sum();
        let span = now - first.0;
        tokens as f64 / span.as_secs_f64().max(1e-3)
    }

    pub fn hit_rate(&self) -> f64 {
        let hits = self.expert_hits.load(Relaxed);
        let accesses = hits + self.expert_misses.load(Relaxed);
        if accesses == 0 { 0.0 } else { hits as f64 / accesses as f64 }
    }

    pub fn live(&self, queue_depth: u64) -> Live {
        Live {
            tokens_per_second: self.tokens_per_second(),
            expert_hit_rate: self.hit_rate(),
            active_sequences: self.active_sequences.load(Relaxed),
            queue_depth,
            generated_tokens: self.generated_tokens.load(Relaxed),
            expert_bytes_read: self.expert_bytes_read.load(Relaxed),
            resident_bytes: strata_engine::resident_bytes(),
            expert_cache_used_bytes: self.expert_cache_used_bytes.load(Relaxed),
            kv_bytes: self.kv_bytes.load(Relaxed),
        }
    }

    /// The Prometheus text exposition format (version 0.0.4).
    /// `expert_cache_capacity_bytes`: the cache's fixed size, beside its use.
    pub fn render(&self, queue_depth: u64, queue_capacity: u64, expert_cache_capacity_bytes: u64) -> String {
        let mut out = String::new();
        // The standard process metric (no `strata_` prefix), as Prometheus'
        // own client libraries name it, so existing dashboards find it.
        if let Some(resident) = strata_engine::resident_bytes() {
            let _ = writeln!(
                out,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n\
                 # TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {resident}"
            );
        }
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, String)]| {
            let _ = writeln!(out, "# HELP strata_{name} {help}\n# TYPE strata_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "strata_{name}{labels} {value}");
            }
        };
        let get = |a: &AtomicU64| a.load(Relaxed).to_string();
        let secs = |a: &AtomicU64| format!("{:.6}", a.load(Relaxed) as f64 / 1e9);
        let requests: Vec<(String, String)> =
            ENDPOINTS.iter().zip(&self.requests).map(|(e, n)| (format!("{{endpoint=\"{e}\"}}"), get(n))).collect();
        let requests: Vec<(&str, String)> = requests.iter().map(|(l, v)| (l.as_str(), v.clone())).collect();
        metric("requests_total", "counter", "Generation requests accepted, by endpoint.", &requests);
        metric(
            "requests_rejected_total",
            "counter",
            "Requests answered 429 because the queue was full.",
            &[("", get(&self.rejected_queue_full))],
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Generations ended early because the client went away or a stop string matched.",
            &[("", get(&self.cancelled))],
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            &[("", get(&self.prompt_tokens))],
        );
        metric(
            "prompt_tokens_reused_total",
            "counter",
            "Prompt tokens not prefilled: their KV was kept from an earlier request with the same prefix.",
            &[("", get(&self.prompt_tokens_reused))],
        );
        metric("generated_tokens_total", "counter", "Tokens generated.", &[("", get(&self.generated_tokens))]);
        metric(
            "tokens_per_second",
            "gauge",
            "Generated tokens per second, all sequences together, over the last 5 s.",
            &[("", format!("{:.3}", self.tokens_per_second()))],
        );
        metric("queue_depth", "gauge", "Requests waiting for a place in the batch.", &[("", queue_depth.to_string())]);
        metric("queue_capacity", "gauge", "Requests that may wait before 429.", &[("", queue_capacity.to_string())]);
        metric("active_sequences", "gauge", "Sequences being decoded together.", &[("", get(&self.active_sequences))]);
        metric("steps_total", "counter", "Batched forward passes.", &[("", get(&self.steps))]);
        metric(
            "step_sequences_total",
            "counter",
            "Sequences summed over forward passes (divide by steps_total for the mean batch).",
            &[("", get(&self.step_sequences))],
        );
        metric("step_seconds_total", "counter", "Time in forward passes and sampling.", &[("", secs(&self.step_ns))]);
        let speculation = self.speculation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        metric(
            "speculation_drafted_tokens_total",
            "counter",
            "Tokens drafted by the MTP layer.",
            &[("", speculation.drafted.to_string())],
        );
        let accepted_at: Vec<(String, String)> = speculation
            .accepted_at
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("{{position=\"{i}\"}}"), n.to_string()))
            .collect();
        let accepted_at: Vec<(&str, String)> = accepted_at.iter().map(|(l, v)| (l.as_str(), v.clone())).collect();
        metric(
            "speculation_accepted_tokens_total",
            "counter",
            "Drafted tokens that stood, by their place in the draft (from 0).",
            &accepted_at,
        );
        metric(
            "speculation_verify_passes_total",
            "counter",
            "Sequences' verify passes (divide verified_tokens_total by it for tokens per pass).",
            &[("", speculation.verify_passes.to_string())],
        );
        metric(
            "speculation_verified_tokens_total",
            "counter",
            "Tokens the verify passes gave: each pass's own and its accepted drafts.",
            &[("", speculation.verified_tokens.to_string())],
        );
        metric(
            "speculation_seconds_total",
            "counter",
            "Time of the steps that verified drafts, drafting included, summed per sequence.",
            &[("", format!("{:.6}", speculation.speculative_ms / 1e3))],
        );
        metric("expert_hits_total", "counter", "Routed-expert lookups found in RAM.", &[("", get(&self.expert_hits))]);
        metric(
            "expert_misses_total",
            "counter",
            "Routed-expert lookups read from disk.",
            &[("", get(&self.expert_misses))],
        );
        metric(
            "expert_hit_rate",
            "gauge",
            "expert_hits_total / (hits + misses) since start.",
            &[("", format!("{:.6}", self.hit_rate()))],
        );
        metric(
            "expert_bytes_read_total",
            "counter",
            "Bytes of expert records read from disk.",
            &[("", get(&self.expert_bytes_read))],
        );
        metric(
            "expert_evictions_total",
            "counter",
            "Experts evicted from the cache.",
            &[("", get(&self.expert_evictions))],
        );
        metric(
            "expert_stall_seconds_total",
            "counter",
            "Time waiting for expert loads.",
            &[("", secs(&self.expert_stall_ns))],
        );
        metric(
            "expert_cache_used_bytes",
            "gauge",
            "Bytes of expert records held in the cache now.",
            &[("", get(&self.expert_cache_used_bytes))],
        );
        metric(
            "expert_cache_capacity_bytes",
            "gauge",
            "The expert cache's capacity in bytes.",
            &[("", expert_cache_capacity_bytes.to_string())],
        );
        metric(
            "vram_expert_hits_total",
            "counter",
            "Routed-expert lookups found in VRAM (--device gpu).",
            &[("", get(&self.vram_expert_hits))],
        );
        metric(
            "vram_expert_misses_total",
            "counter",
            "Routed-expert lookups not in VRAM (then looked up in RAM).",
            &[("", get(&self.vram_expert_misses))],
        );
        metric(
            "vram_bytes_uploaded_total",
            "counter",
            "Bytes of expert records copied to the GPU.",
            &[("", get(&self.vram_bytes_uploaded))],
        );
        metric(
            "vram_upload_stall_seconds_total",
            "counter",
            "Time copying experts to the GPU.",
            &[("", secs(&self.vram_upload_stall_ns))],
        );
        metric(
            "kv_bytes",
            "gauge",
            "Bytes of KV cache filled by the active and idle sessions now.",
            &[("", get(&self.kv_bytes))],
        );
        out
    }
}
