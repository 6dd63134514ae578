//! Continuous batching. One thread owns the engine and every session (a
//! session borrows its engine, so they live and die together here); HTTP
//! handlers hand it jobs over a bounded queue and receive tokens over a
//! channel per job.
//!
//! Each step is one forward pass over every active sequence
//! ([`Session::feed_batch`]): new sequences bring their prompt (at most
//! `--prefill-chunk` prompt tokens a step in all, so a long prompt does not
//! stall the others), the others the token sampled last step. So each
//! dense weight is read once per step for all of them, and each MoE layer's
//! expert union once. Sequences
//! join between steps as soon as there is room and leave as soon as they
//! end, are cancelled, or their client goes away.
//!
//! A finished request's session stays in an idle pool (within `max_batch`
//! sessions in all, the KV the budget reserves), so a prompt extending it
//! is fed only from where they differ.
//!
//! A sequence's tokens do not depend on what it is batched with, or on
//! whether its prefix's KV was reused:
//! `feed_batch` gives each session the logits it would get alone, and the
//! sampler draws from (seed, position) only.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use strata_engine::{Engine, Sampler, SamplingOptions, Session};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// One generation request, tokenized and checked.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingOptions,
    pub ignore_eos: bool,
    /// Where tokens go. Its capacity holds every event the job can produce,
    /// so the scheduler never waits on a slow client; when the receiver is
    /// dropped (client gone, stop string), the job is cancelled.
    pub events: mpsc::Sender<Event>,
}

impl Job {
    /// The events channel for a job of at most `max_tokens` tokens: one slot
    /// per token, and one for the end.
    pub fn channel(max_tokens: usize) -> (mpsc::Sender<Event>, mpsc::Receiver<Event>) {
        mpsc::channel(max_tokens + 1)
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model produced an end-of-sequence token.
    Eos,
    /// `max_tokens` were generated.
    Length,
}

/// What the scheduler tells a job.
#[derive(Debug)]
pub enum Event {
    /// The next generated token (end-of-sequence tokens are not sent).
    Token(u32),
    /// The end; `completion_tokens` counts every token generated, an
    /// end-of-sequence token included.
    Done { finish: Finish, completion_tokens: usize },
    /// The engine failed on this job's batch.
    Failed(String),
}

/// How the scheduler batches.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Sequences decoded together.
    pub max_batch: usize,
    /// Prompt tokens fed in one step, over all sequences (at least 1): a
    /// long prompt is prefilled over several steps, so the sequences
    /// already decoding keep producing tokens meanwhile.
    pub prefill_chunk: usize,
}

/// The HTTP side's end of the scheduler.
#[derive(Debug, Clone)]
pub struct Handle {
    jobs: mpsc::Sender<Job>,
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    QueueFull,
    ShutDown,
}

/// A place held in the queue for one job (see [`Handle::reserve`]);
/// dropping it gives the place back.
pub type Admission = mpsc::OwnedPermit<Job>;

impl Handle {
    /// Takes a place in the queue without waiting, for a job to be sent
    /// once its request is prepared: a full queue is the caller's 429, found
    /// before any work is spent on the request.
    pub fn reserve(&self) -> Result<Admission, Rejected> {
        self.jobs.clone().try_reserve_owned().map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Rejected::QueueFull,
            mpsc::error::TrySendError::Closed(_) => Rejected::ShutDown,
        })
    }

    /// Jobs waiting for a place in the batch.
    pub fn queue_depth(&self) -> u64 {
        (self.jobs.max_capacity() - self.jobs.capacity()) as u64
    }

    pub fn queue_capacity(&self) -> u64 {
        self.jobs.max_capacity() as u64
    }

    /// Whether the scheduler thread is still taking jobs.
    pub fn is_running(&self) -> bool {
        !self.jobs.is_closed()
    }
}

/// A bounded queue of `capacity` jobs.
pub fn queue(capacity: usize) -> (Handle, mpsc::Receiver<Job>) {
    let (jobs, rx) = mpsc::channel(capacity);
    (Handle { jobs }, rx)
}

/// One sequence in the batch.
struct Seq<'e> {
    session: Session<'e>,
    sampler: Sampler,
    /// Tokens to feed at the next step: the prompt at first, then nothing
    /// (the session holds the sampled token, unfed, itself).
    to_feed: Vec<u32>,
    generated: usize,
    max_tokens: usize,
    ignore_eos: bool,
    events: mpsc::Sender<Event>,
    /// Ended (end of sequence or length): its session goes to the idle pool.
    finished: bool,
}

/// Sessions of finished requests, kept so that a later prompt sharing a
/// prefix with one (the next turn of a chat resends the whole conversation)
/// is prefilled only from where they differ. Together with the active
/// sequences they never exceed `max_batch`, the sessions the memory budget
/// holds KV for; the least recently finished goes first.
struct IdlePool<'e> {
    sessions: Vec<Session<'e>>,
}

impl<'e> IdlePool<'e> {
    /// The session for `prompt`: the idle one sharing the longest prefix with
    /// it (cut back to that prefix, at least one prompt token left to feed,
    /// or with a recurrent state to its latest snapshot there), or a fresh
    /// one; and how many prompt tokens it already holds.
    fn take(&mut self, engine: &'e Engine, prompt: &[u32], room: usize) -> (Session<'e>, usize) {
        let usable = |s: &Session<'_>| s.common_prefix_len(prompt).min(prompt.len().saturating_sub(1));
        let best = (0..self.sessions.len()).max_by_key(|&i| (usable(&self.sessions[i]), i));
        if let Some(i) = best.filter(|&i| usable(&self.sessions[i]) > 0) {
            let mut session = self.sessions.remove(i);
            let usable = usable(&session);
            let reused = session.rewind(usable);
            return (session, reused);
        }
        // A fresh session's KV must fit beside the active ones.
        while !self.sessions.is_empty() && self.sessions.len() >= room {
            self.sessions.remove(0);
        }
        (engine.session(), 0)
    }

    /// Keeps `session`, within `room` sessions.
    fn put(&mut self, session: Session<'e>, room: usize) {
        self.sessions.push(session);
        while self.sessions.len() > room {
            self.sessions.remove(0);
        }
    }
}

/// Runs until every [`Handle`] is dropped and the last job has ended.
pub fn run(engine: &Engine, eos: &[u32], limits: Limits, mut jobs: mpsc::Receiver<Job>, metrics: &Metrics) {
    let mut active: Vec<Seq<'_>> = Vec::with_capacity(limits.max_batch);
    let mut idle = IdlePool { sessions: Vec::with_capacity(limits.max_batch) };
    let mut open = true;
    loop {
        if active.is_empty() {
            // Idle: a good moment to save what the expert store learned.
            // (The engine tells once, e.g., of a read-only model directory.)
            if let Some(warning) = engine.persist_learning_or_warn() {
                eprintln!("serve: warning: {warning}");
            }
            if !open {
                return;
            }
            match jobs.blocking_recv() {
                Some(job) => admit(engine, job, &mut active, &mut idle, limits, metrics),
                None => return,
            }
        }
        while open && active.len() < limits.max_batch {
            match jobs.try_recv() {
                Ok(job) => admit(engine, job, &mut active, &mut idle, limits, metrics),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        // Clients that went away since the last step: free their KV now
        // rather than compute a token nobody reads.
        let before = active.len();
        active.retain(|s| !s.events.is_closed());
        metrics.cancelled.fetch_add((before - active.len()) as u64, Relaxed);
        metrics.active_sequences.store(active.len() as u64, Relaxed);
        if active.is_empty() {
            continue;
        }
        step(engine, eos, limits.prefill_chunk, &mut active, metrics);
        let (finished, running): (Vec<Seq<'_>>, Vec<Seq<'_>>) = active.drain(..).partition(|s| s.finished);
        active = running;
        for seq in finished {
            idle.put(seq.session, limits.max_batch - active.len());
        }
        metrics.active_sequences.store(active.len() as u64, Relaxed);
        let kv_bytes = active.iter().map(|s| &s.session).chain(&idle.sessions).map(Session::kv_bytes).sum();
        metrics.kv_bytes.store(kv_bytes, Relaxed);
    }
}

fn admit<'e>(
    engine: &'e Engine,
    job: Job,
    active: &mut Vec<Seq<'e>>,
    idle: &mut IdlePool<'e>,
    limits: Limits,
    metrics: &Metrics,
) {
    if job.events.is_closed() {
        // Gave up while queued.
        metrics.cancelled.fetch_add(1, Relaxed);
        return;
    }
    metrics.prompt_tokens.fetch_add(job.prompt.len() as u64, Relaxed);
    let (session, reused) = idle.take(engine, &job.prompt, limits.max_batch - active.len());
    metrics.prompt_tokens_reused.fetch_add(reused as u64, Relaxed);
    active.push(Seq {
        session,
        sampler: Sampler::new(job.sampling),
        to_feed: job.prompt[reused..].to_vec(),
        generated: 0,
        max_tokens: job.max_tokens,
        ignore_eos: job.ignore_eos,
        events: job.events,
        finished: false,
    });
}

/// One forward pass over every active sequence that has something to feed:
/// the token sampled last step, or the next piece of its prompt (at most
/// `prefill_chunk` prompt tokens in all). Then one token for each sequence
/// whose prompt is all in.
fn step(engine: &Engine, eos: &[u32], prefill_chunk: usize, active: &mut Vec<Seq<'_>>, metrics: &Metrics) {
    let started = Instant::now();
    let mut prompt_budget = prefill_chunk.max(1);
    // (index in `active`, tokens to feed); a sequence still waiting for its
    // turn to prefill sits this step out.
    let mut inputs: Vec<(usize, Vec<u32>)> = Vec::with_capacity(active.len());
    for (i, seq) in active.iter_mut().enumerate() {
        if seq.to_feed.is_empty() {
            inputs.push((i, Vec::new()));
        } else if prompt_budget > 0 {
            let n = seq.to_feed.len().min(prompt_budget);
            prompt_budget -= n;
            inputs.push((i, seq.to_feed.drain(..n).collect()));
        }
    }
    let fed = {
        let fed_here: Vec<bool> = (0..active.len()).map(|i| inputs.iter().any(|&(j, _)| j == i)).collect();
        let mut sessions: Vec<&mut Session<'_>> =
            active.iter_mut().zip(&fed_here).filter(|(_, fed)| **fed).map(|(seq, _)| &mut seq.session).collect();
        let tokens: Vec<&[u32]> = inputs.iter().map(|(_, t)| t.as_slice()).collect();
        // A panic in the engine fails this batch, not the server.
        std::panic::catch_unwind(AssertUnwindSafe(|| Session::feed_batch(&mut sessions, &tokens)))
    };
    let logits = match fed {
        Ok(Ok(logits)) => logits,
        Ok(Err(e)) => return fail_all(active, &e.to_string()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("panic");
            return fail_all(active, &format!("internal error in the engine: {what}"));
        }
    };
    let sequences = inputs.len();
    let mut next_logits: Vec<Option<Vec<f32>>> = vec![None; active.len()];
    for ((i, fed), logits) in inputs.into_iter().zip(logits) {
        // Mid-prompt logits are not sampled from.
        if active[i].to_feed.is_empty() {
            if !fed.is_empty() {
                // The end of a prompt: a later one sharing it (the next turn
                // of a chat, the same system prompt) resumes here even when
                // the sequence holds a recurrent state.
                active[i].session.snapshot();
            }
            next_logits[i] = Some(logits);
        }
    }
    // Counted before any token goes out, so a client that has its last
    // token also sees its steps in the metrics.
    let sampled = next_logits.iter().filter(|l| l.is_some()).count() as u64;
    metrics.step(sequences, sampled, started.elapsed());
    let mut index = 0;
    active.retain_mut(|seq| {
        let logits = next_logits[index].take();
        index += 1;
        let Some(logits) = logits else { return true };
        let token = seq.session.push_sampled(&mut seq.sampler, &logits);
        seq.generated += 1;
        let event = if !seq.ignore_eos && eos.contains(&token) {
            Some(Finish::Eos)
        } else if seq.events.try_send(Event::Token(token)).is_err() {
            // Receiver gone (the channel holds every event a job can send,
            // so it is never full).
            metrics.cancelled.fetch_add(1, Relaxed);
            return false;
        } else if seq.generated >= seq.max_tokens {
            Some(Finish::Length)
        } else {
            None
        };
        match event {
            Some(finish) => {
                let _ = seq.events.try_send(Event::Done { finish, completion_tokens: seq.generated });
                seq.finished = true;
                // The end of an answer, where the next turn of a chat that
                // repeats it resumes.
                seq.session.snapshot();
                true
            }
            None => true,
        }
    });
    let store = engine.store_stats();
    metrics.expert_hits.store(store.hits, Relaxed);
    metrics.expert_misses.store(store.misses, Relaxed);
    metrics.expert_bytes_read.store(store.bytes_read, Relaxed);
    metrics.expert_evictions.store(store.evictions, Relaxed);
    metrics.expert_stall_ns.store(engine.pipeline_stats().stall_ns, Relaxed);
    metrics.expert_cache_used_bytes.store(engine.memory_use().expert_cache_used_bytes, Relaxed);
}

fn fail_all(active: &mut Vec<Seq<'_>>, message: &str) {
    eprintln!("serve: error: a batch of {} failed: {message}", active.len());
    for seq in active.drain(..) {
        let _ = seq.events.try_send(Event::Failed(message.to_owned()));
    }
}

/// Starts the scheduler thread on an engine opened there.
pub fn spawn(
    open: impl FnOnce() -> anyhow::Result<(Engine, Vec<u32>)> + Send + 'static,
    limits: Limits,
    jobs: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
    opened: impl FnOnce(anyhow::Result<&Engine>) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("scheduler".into()).spawn(move || match open() {
        Ok((engine, eos)) => {
            opened(Ok(&engine));
            run(&engine, &eos, limits, jobs, &metrics);
        }
        Err(e) => opened(Err(e)),
    })
}
