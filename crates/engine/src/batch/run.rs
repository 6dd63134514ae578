//! The batching thread: admit jobs, step the batch, retire what ended.

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use super::idle::IdlePool;
use super::{BatchLimits, BatchObserver, Event, EventSink, Queue, Queued};
use strata_models::Logits;

use crate::speculate::Drafted;
use crate::{Constraint, Engine, Finish, Generation, Session, SpeculationStats};

/// One sequence in the batch.
struct Seq<'e> {
    session: Session<'e>,
    generation: Generation,
    constraint: Option<Box<dyn Constraint>>,
    /// Tokens to feed at the next step: the prompt at first, then nothing
    /// (the session holds the sampled token, unfed, itself).
    to_feed: Vec<u32>,
    sink: Box<dyn EventSink>,
    /// Ended (stop or length): its session goes to the idle pool.
    finished: bool,
    /// [`crate::Job::request_id`].
    request_id: Option<String>,
}

/// The request ids of a step's sequences, `-` for a job without one:
/// `a1,-,c3`. Formatted only when a log line is written.
struct RequestIds<'a, 'e>(&'a [Seq<'e>]);

impl std::fmt::Display for RequestIds<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, seq) in self.0.iter().enumerate() {
            let separator = if i == 0 { "" } else { "," };
            write!(f, "{separator}{}", seq.request_id.as_deref().unwrap_or("-"))?;
        }
        Ok(())
    }
}

/// Runs until every sender of `jobs` is dropped and the last job has ended.
pub(super) fn run(
    engine: &Engine,
    limits: BatchLimits,
    jobs: &Receiver<Queued>,
    queue: &Queue,
    observer: &dyn BatchObserver,
) {
    let mut active: Vec<Seq<'_>> = Vec::with_capacity(limits.max_batch);
    let mut idle = IdlePool::with_capacity(limits.max_batch);
    let mut open = true;
    // A job leaving the channel gives its queue place back.
    let received = |queued: Queued| {
        queue.taken.fetch_sub(1, Relaxed);
        queued
    };
    loop {
        if active.is_empty() {
            // Idle: a good moment to save what the expert store learned.
            // (The engine tells once, e.g., of a read-only model directory.)
            if let Some(warning) = engine.persist_learning_or_warn() {
                observer.warning(&warning);
            }
            if !open {
                return;
            }
            match jobs.recv() {
                Ok(queued) => admit(engine, received(queued), &mut active, &mut idle, limits, observer),
                Err(_) => return,
            }
        }
        while open && active.len() < limits.max_batch {
            match jobs.try_recv() {
                Ok(queued) => admit(engine, received(queued), &mut active, &mut idle, limits, observer),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        // Listeners gone since the last step: free their KV now rather
        // than compute a token nobody reads.
        let before = active.len();
        active.retain(|s| !s.sink.is_closed());
        if active.len() < before {
            observer.cancelled(before - active.len());
        }
        settle(engine, &active, &idle, observer);
        if active.is_empty() {
            continue;
        }
        step(limits.prefill_chunk_tokens, &mut active, observer);
        let (finished, running): (Vec<Seq<'_>>, Vec<Seq<'_>>) = active.drain(..).partition(|s| s.finished);
        active = running;
        for seq in finished {
            idle.put(seq.session, limits.max_batch - active.len());
        }
        settle(engine, &active, &idle, observer);
    }
}

/// Tells the observer where the batch stands.
fn settle(engine: &Engine, active: &[Seq<'_>], idle: &IdlePool<'_>, observer: &dyn BatchObserver) {
    let kv_bytes = active.iter().map(|s| &s.session).chain(idle.sessions()).map(Session::kv_bytes).sum();
    observer.settled(engine, active.len(), kv_bytes);
}

fn admit<'e>(
    engine: &'e Engine,
    queued: Queued,
    active: &mut Vec<Seq<'e>>,
    idle: &mut IdlePool<'e>,
    limits: BatchLimits,
    observer: &dyn BatchObserver,
) {
    let Queued { job, sink } = queued;
    if sink.is_closed() {
        // Gave up while queued.
        observer.cancelled(1);
        return;
    }
    assert!(active.len() < limits.max_batch, "a job is admitted only where there is room");
    let (mut session, reused) = idle.take(engine, &job.prompt, limits.max_batch - active.len());
    session.prepare_drafter(&job.options.sampling);
    observer.admitted(job.prompt.len(), reused);
    active.push(Seq {
        session,
        generation: Generation::new(&job.options, &engine.core().eos_token_ids),
        constraint: job.constraint,
        to_feed: job.prompt[reused..].to_vec(),
        sink,
        finished: false,
        request_id: job.request_id,
    });
}

/// One forward pass over every active sequence that has something to feed:
/// the token sampled last step, or the next piece of its prompt (at most
/// `prefill_chunk_tokens` prompt tokens in all). Then one decode step for
/// each sequence whose prompt is all in.
fn step(prefill_chunk_tokens: usize, active: &mut Vec<Seq<'_>>, observer: &dyn BatchObserver) {
    // A disabled span evaluates no field: nothing is formatted per step
    // unless debug lines are on.
    let _span = tracing::debug_span!("step", requests = %RequestIds(active)).entered();
    let started = Instant::now();
    let mut prompt_budget = prefill_chunk_tokens;
    // (index in `active`, tokens to feed, drafts among them); a sequence
    // still waiting for its turn to prefill sits this step out, and one
    // whose drafting failed leaves.
    let mut inputs: Vec<(usize, Vec<u32>, Vec<Drafted>)> = Vec::with_capacity(active.len());
    let mut failed_drafts: Vec<(usize, String)> = Vec::new();
    for (i, seq) in active.iter_mut().enumerate() {
        if seq.to_feed.is_empty() {
            let drafts = match seq.session.drafts_next(seq.constraint.is_some()) {
                true => std::panic::catch_unwind(AssertUnwindSafe(|| seq.generation.draft(&mut seq.session))),
                false => Ok(Ok(Vec::new())),
            };
            match drafts {
                Ok(Ok(drafts)) => inputs.push((i, drafts.iter().map(|d| d.token).collect(), drafts)),
                Ok(Err(e)) => failed_drafts.push((i, e.to_string())),
                Err(panic) => failed_drafts.push((i, panic_message(&*panic))),
            }
        } else if prompt_budget > 0 {
            let n = seq.to_feed.len().min(prompt_budget);
            prompt_budget -= n;
            inputs.push((i, seq.to_feed.drain(..n).collect(), Vec::new()));
        }
    }
    if !failed_drafts.is_empty() {
        // Leaves from the back, so the indices before stay right.
        for (i, message) in failed_drafts.iter().rev() {
            let mut seq = active.remove(*i);
            observer.failed(1, message);
            seq.sink.send(Event::Failed(message.clone()));
            for input in &mut inputs {
                if input.0 > *i {
                    input.0 -= 1;
                }
            }
        }
    }
    let fed = {
        let fed_here: Vec<bool> = (0..active.len()).map(|i| inputs.iter().any(|&(j, ..)| j == i)).collect();
        let mut sessions: Vec<&mut Session<'_>> =
            active.iter_mut().zip(&fed_here).filter(|(_, fed)| **fed).map(|(seq, _)| &mut seq.session).collect();
        let tokens: Vec<&[u32]> = inputs.iter().map(|(_, t, _)| t.as_slice()).collect();
        let which: Vec<Logits> =
            inputs.iter().map(|(_, _, d)| if d.is_empty() { Logits::Last } else { Logits::All }).collect();
        // A panic in the engine fails this batch, not the thread.
        std::panic::catch_unwind(AssertUnwindSafe(|| Session::feed_batch_rows(&mut sessions, &tokens, &which)))
    };
    let logits = match fed {
        Ok(Ok(logits)) => logits,
        Ok(Err(e)) => return fail_all(active, &e.to_string(), observer),
        Err(panic) => return fail_all(active, &panic_message(&*panic), observer),
    };
    let sequences = inputs.len();
    let prompt_tokens: usize =
        inputs.iter().filter(|(_, _, drafts)| drafts.is_empty()).map(|(_, tokens, _)| tokens.len()).sum();
    let mut next_logits: Vec<Option<(Vec<f32>, Vec<Drafted>)>> = vec![None; active.len()];
    for ((i, fed, drafts), logits) in inputs.into_iter().zip(logits) {
        // Mid-prompt logits are not sampled from.
        if active[i].to_feed.is_empty() {
            if !fed.is_empty() && drafts.is_empty() {
                // The end of a prompt: a later one sharing it (the next turn
                // of a chat, the same system prompt) resumes here even when
                // the sequence holds a recurrent state.
                active[i].session.snapshot();
            }
            next_logits[i] = Some((logits, drafts));
        }
    }
    // Counted before any token goes out, so a listener that has its last
    // token also sees its steps counted.
    let sampled = next_logits.iter().filter(|l| l.is_some()).count();
    let elapsed = started.elapsed();
    observer.stepped(sequences, sampled, elapsed);
    tracing::debug!(sequences, prompt_tokens, sampled, elapsed_ms = elapsed.as_secs_f64() * 1e3, "stepped");
    let mut index = 0;
    active.retain_mut(|seq| {
        let logits = next_logits[index].take();
        index += 1;
        let Some((mut logits, drafts)) = logits else { return true };
        let Seq { session, generation, constraint, sink, finished, .. } = seq;
        // Nobody listening cancels (the sink holds every event a job sends,
        // so it is never full).
        let mut emit = |token: u32, is_eos: bool| {
            if is_eos || sink.send(Event::Token(token)) { ControlFlow::Continue(()) } else { ControlFlow::Break(()) }
        };
        // A panic in a constraint fails its own job only.
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if drafts.is_empty() {
                let step = generation.step(session, &mut logits, constraint.as_deref_mut(), &mut emit)?;
                session.policy_mut().plain_step(elapsed);
                return Ok(step.finish);
            }
            let step = generation.step_drafted(session, &logits, &drafts, &mut emit)?;
            session.policy_mut().verify_pass(step.tokens.len(), step.accepted, elapsed);
            let mut pass = SpeculationStats::default();
            pass.add_verify_pass(drafts.len(), step.accepted, step.tokens.len(), elapsed);
            observer.speculated(&pass);
            Ok(step.finish)
        }));
        let message = match stepped {
            Ok(Ok(None)) => return true,
            Ok(Ok(Some(Finish::Cancelled))) => {
                observer.cancelled(1);
                return false;
            }
            Ok(Ok(Some(finish))) => {
                sink.send(Event::Done { finish, completion_tokens: generation.generated_tokens() });
                *finished = true;
                return true;
            }
            Ok(Err(e)) => crate::Error::to_string(&e),
            Err(panic) => panic_message(&*panic),
        };
        observer.failed(1, &message);
        sink.send(Event::Failed(message));
        false
    });
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("panic");
    format!("internal error in the engine: {what}")
}

fn fail_all(active: &mut Vec<Seq<'_>>, message: &str, observer: &dyn BatchObserver) {
    observer.failed(active.len(), message);
    for mut seq in active.drain(..) {
        seq.sink.send(Event::Failed(message.to_owned()));
    }
}
