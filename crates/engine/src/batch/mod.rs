//! Continuous batching, for `serve` and library users alike. One thread
//! owns the engine's sessions (a session borrows its engine, so they live
//! and die together there); callers hand it jobs over a bounded queue and
//! receive each job's events through its own [`EventSink`] (a std channel:
//! [`Batcher::submit`]). No async runtime: std threads and channels only.
//!
//! Each step is one forward pass over every active sequence
//! ([`Session::feed_batch`]): new sequences bring their prompt (at most
//! `prefill_chunk_tokens` prompt tokens a step in all, so a long prompt
//! does not stall the others), the others the token sampled last step. So
//! each dense weight is read once per step for all of them, and each MoE
//! layer's expert union once. Sequences join between steps as soon as there
//! is room and leave as soon as they end, fail, or nobody listens any more
//! (checked before each step, so a gone listener's KV is freed rather than
//! a token computed for nobody). Each sampled token goes through the one
//! decode step ([`crate::Generation::step`]).
//!
//! A finished job's session stays in an idle pool (within `max_batch`
//! sessions in all, the KV the budget reserves), so a prompt extending it
//! is fed only from where they differ.
//!
//! A sequence's tokens do not depend on what it is batched with, or on
//! whether its prefix's KV was reused: `feed_batch` gives each session the
//! logits it would get alone, and the sampler draws from (seed, position)
//! only. A panic in the engine or a constraint fails the jobs it touched,
//! never the thread.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use strata_engine::{BatchLimits, Batcher, Engine, EngineOptions, Event, GenerateOptions, Job};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The budget reserves KV for every session the batch holds.
//! let options = EngineOptions { sessions: 4, ..EngineOptions::default() };
//! let engine = Arc::new(Engine::open("path/to/container".as_ref(), &options)?);
//! let limits = BatchLimits { max_batch: 4, prefill_chunk_tokens: 512, queue_jobs_max: 16 };
//! let (batcher, thread) = Batcher::spawn(engine, limits, Arc::new(()))?;
//! let job = |prompt: Vec<u32>| Job { prompt, options: GenerateOptions::default(), constraint: None, request_id: None };
//! // Decoded together; each gets the tokens it would get alone.
//! let (a, b) = (batcher.submit(job(vec![1, 2, 3]))?, batcher.submit(job(vec![4, 5]))?);
//! while let Some(Event::Token(token)) = a.recv() {
//!     println!("a: {token}");
//! }
//! while let Some(Event::Token(token)) = b.recv() {
//!     println!("b: {token}");
//! }
//! drop(batcher);
//! thread.join().expect("the batcher thread ends once its handles are gone");
//! # Ok(())
//! # }
//! ```

mod idle;
mod run;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Constraint, Engine, Error, Finish, GenerateOptions, Result};

/// How a [`Batcher`] batches and queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Sequences decoded together, and sessions held at once (active and
    /// idle): at most the `EngineOptions::sessions` the budget holds KV for.
    pub max_batch: usize,
    /// Prompt tokens fed in one step, over all sequences (at least 1): a
    /// long prompt is prefilled over several steps, so the sequences
    /// already decoding keep producing tokens meanwhile.
    pub prefill_chunk_tokens: usize,
    /// Jobs waiting for a place in the batch (places reserved included);
    /// beyond it [`Batcher::reserve`] refuses ([`Error::QueueFull`]).
    pub queue_jobs_max: usize,
}

/// One generation: a prompt, how to generate after it, and optionally which
/// tokens may come next.
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub constraint: Option<Box<dyn Constraint>>,
    /// Names the job on the batch's debug log lines (each step's span lists
    /// the ids of the jobs it carries), so a tool can join them with the
    /// submitter's own lines: `serve` gives its request's `X-Request-Id`.
    pub request_id: Option<String>,
}

/// What the batcher tells a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The next generated token (end-of-sequence tokens that end generation
    /// are not sent).
    Token(u32),
    /// The end; `completion_tokens` counts every token generated, an
    /// end-of-sequence token included. Never [`Finish::Cancelled`]: a
    /// cancelled job has nobody to tell.
    Done { finish: Finish, completion_tokens: usize },
    /// The engine (or the job's constraint) failed on this job.
    Failed(String),
}

/// Where a job's events go. Called on the batcher's thread, so it must
/// never wait: a job sends at most `max_new_tokens + 1` events, and a sink
/// holds that many.
pub trait EventSink: Send {
    /// Hands `event` over; `false` when nobody listens any more (the job is
    /// then cancelled).
    fn send(&mut self, event: Event) -> bool;

    /// Whether nobody listens any more; checked between steps.
    fn is_closed(&self) -> bool;
}

/// What a batcher tells whoever watches it (serve's metrics). Called on the
/// batcher's thread, so an implementation must not block.
pub trait BatchObserver: Send + Sync {
    /// A job took its place in the batch, `reused_tokens` of its prompt's
    /// KV kept from a finished job's session.
    fn admitted(&self, _prompt_tokens: usize, _reused_tokens: usize) {}

    /// Jobs ended because nobody listened any more.
    fn cancelled(&self, _jobs: usize) {}

    /// A forward step over `sequences` sequences ran and sampled
    /// `sampled_tokens` tokens in `elapsed`; told before any of those
    /// tokens is sent, so whoever has a job's last token also sees its
    /// steps counted.
    fn stepped(&self, _sequences: usize, _sampled_tokens: usize, _elapsed: Duration) {}

    /// Where the batch stands after a change: `active_sequences` decoding,
    /// `kv_bytes` filled by the active and idle sessions; `engine` for its
    /// counters.
    fn settled(&self, _engine: &Engine, _active_sequences: usize, _kv_bytes: u64) {}

    /// A sequence's verify pass ran (`pass`: its counts alone); told
    /// after [`Self::stepped`], for speculative decoding's totals.
    fn speculated(&self, _pass: &crate::SpeculationStats) {}

    /// `sequences` jobs failed with `message`.
    fn failed(&self, _sequences: usize, _message: &str) {}

    /// Something that changed no answer, e.g. learned usage not saved.
    fn warning(&self, _message: &str) {}
}

/// Watches nothing.
impl BatchObserver for () {}

/// What the batcher's handles and its thread share.
#[derive(Debug)]
struct Queue {
    /// Places taken: reserved, or held by a job not yet taken into the
    /// batch. At most `capacity`.
    taken: AtomicUsize,
    capacity: usize,
    /// Cleared when the thread ends, however it ends.
    running: AtomicBool,
}

/// A job on its way to the batcher's thread.
struct Queued {
    job: Job,
    sink: Box<dyn EventSink>,
}

/// The handle of a batching thread: jobs in, events out. The thread ends
/// once every handle and [`Admission`] is gone and its last job has ended.
#[derive(Clone)]
pub struct Batcher {
    jobs: SyncSender<Queued>,
    queue: Arc<Queue>,
    vocab_size: usize,
    context_tokens: usize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("queue", &self.queue).finish_non_exhaustive()
    }
}

impl Batcher {
    /// Starts the batching thread on `engine`; join the handle returned to
    /// wait for it to end (after every [`Batcher`] is dropped).
    pub fn spawn(
        engine: Arc<Engine>,
        limits: BatchLimits,
        observer: Arc<dyn BatchObserver>,
    ) -> std::io::Result<(Batcher, JoinHandle<()>)> {
        assert!(limits.max_batch >= 1, "a batch holds at least one sequence");
        assert!(limits.prefill_chunk_tokens >= 1, "a step feeds at least one prompt token");
        assert!(limits.queue_jobs_max >= 1, "a queue holds at least one job");
        // Every queued job holds a place, so the channel is never full.
        let (jobs, rx) = std::sync::mpsc::sync_channel(limits.queue_jobs_max);
        let queue = Arc::new(Queue {
            taken: AtomicUsize::new(0),
            capacity: limits.queue_jobs_max,
            running: AtomicBool::new(true),
        });
        let batcher = Batcher {
            jobs,
            queue: Arc::clone(&queue),
            vocab_size: engine.core().vocab_size,
            context_tokens: engine.context_tokens(),
        };
        let thread = std::thread::Builder::new().name("batcher".into()).spawn(move || {
            let _stopped = Stopped(&queue);
            run::run(&engine, limits, &rx, &queue, &*observer);
        })?;
        Ok((batcher, thread))
    }

    /// Takes a place in the queue without waiting, for a job to be sent
    /// once it is prepared: a full queue is found before any work is spent
    /// on the job ([`Error::QueueFull`]; [`Error::BatcherStopped`] once the
    /// thread has ended).
    pub fn reserve(&self) -> Result<Admission> {
        if !self.is_running() {
            return Err(Error::BatcherStopped);
        }
        let taken = self.queue.taken.fetch_add(1, Relaxed);
        if taken >= self.queue.capacity {
            self.queue.taken.fetch_sub(1, Relaxed);
            return Err(Error::QueueFull { jobs: self.queue.capacity });
        }
        Ok(Admission { batcher: self.clone(), sent: false })
    }

    /// Queues `job` and returns its events: [`Self::reserve`], then
    /// [`Admission::send`] to a channel. Dropping the [`Events`] cancels it.
    pub fn submit(&self, job: Job) -> Result<Events> {
        let slots = job.options.max_new_tokens.saturating_add(1);
        let admission = self.reserve()?;
        // One slot per token, and one for the end.
        let (tx, rx) = std::sync::mpsc::sync_channel(slots);
        let listening = Arc::new(());
        admission.send(job, Box::new(ChannelSink { tx, listening: Arc::downgrade(&listening) }))?;
        Ok(Events { rx, _listening: listening })
    }

    /// Jobs waiting for a place in the batch, places reserved included.
    pub fn queue_depth(&self) -> usize {
        self.queue.taken.load(Relaxed)
    }

    /// The most jobs that may wait ([`BatchLimits::queue_jobs_max`]).
    pub fn queue_capacity(&self) -> usize {
        self.queue.capacity
    }

    /// Whether the thread is still taking jobs.
    pub fn is_running(&self) -> bool {
        self.queue.running.load(Relaxed)
    }

    /// Refuses a job the batch could not run: one failing a step would fail
    /// every job in it.
    fn check(&self, job: &Job) -> Result<()> {
        job.options.sampling.check()?;
        let invalid = |reason: String| Err(Error::InvalidRequest(reason));
        let prompt_tokens = job.prompt.len();
        if prompt_tokens == 0 {
            return invalid("the prompt is empty".into());
        }
        if let Some(&bad) = job.prompt.iter().find(|&&id| id as usize >= self.vocab_size) {
            return invalid(format!("token id {bad} is outside the vocabulary (0..{})", self.vocab_size));
        }
        if job.options.max_new_tokens == 0 {
            return invalid("max_new_tokens must be at least 1".into());
        }
        // The last token is never fed, but the sequence holds it.
        if prompt_tokens.saturating_add(job.options.max_new_tokens) > self.context_tokens {
            return invalid(format!(
                "{prompt_tokens} prompt tokens and {} to generate exceed the context of {} tokens",
                job.options.max_new_tokens, self.context_tokens
            ));
        }
        Ok(())
    }
}

/// Clears [`Queue::running`] when the thread ends, a panic included.
struct Stopped<'q>(&'q Queue);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, Relaxed);
    }
}

/// A place held in the queue for one job ([`Batcher::reserve`]); dropping
/// it unsent gives the place back.
#[derive(Debug)]
pub struct Admission {
    batcher: Batcher,
    sent: bool,
}

impl Admission {
    /// Queues `job` in this place; its events go to `sink`. Refuses a job
    /// the batch could not run (an empty prompt, an id outside the
    /// vocabulary, more tokens than the context holds, bad sampling).
    pub fn send(mut self, job: Job, sink: Box<dyn EventSink>) -> Result<()> {
        self.batcher.check(&job)?;
        self.sent = true;
        match self.batcher.jobs.try_send(Queued { job, sink }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => unreachable!("every queued job holds a place, and places fit the channel"),
            Err(TrySendError::Disconnected(_)) => {
                self.batcher.queue.taken.fetch_sub(1, Relaxed);
                Err(Error::BatcherStopped)
            }
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.sent {
            self.batcher.queue.taken.fetch_sub(1, Relaxed);
        }
    }
}

/// The events of a job queued by [`Batcher::submit`]; dropping them
/// cancels the job.
#[derive(Debug)]
pub struct Events {
    rx: Receiver<Event>,
    /// The sink sees the job cancelled once this is gone.
    _listening: Arc<()>,
}

impl Events {
    /// The next event, waiting for it; `None` once the batcher has sent the
    /// last one (or ended without one: a bug, or a panic in it).
    pub fn recv(&self) -> Option<Event> {
        self.rx.recv().ok()
    }

    /// The next event, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> std::result::Result<Event, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }
}

/// The sink of [`Batcher::submit`]: a std channel of `max_new_tokens + 1`
/// slots, so sending never waits.
struct ChannelSink {
    tx: SyncSender<Event>,
    listening: Weak<()>,
}

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(TrySendError::Disconnected(_)) => false,
            Err(TrySendError::Full(_)) => unreachable!("a job's channel holds every event it sends"),
        }
    }

    fn is_closed(&self) -> bool {
        self.listening.strong_count() == 0
    }
}
