//! The coordinator's side: `--workers HOST:PORT,...`. Each MoE layer's
//! share of the union that a worker holds goes to it as one query, all
//! workers at once; the layer combines the outputs in its fixed order
//! (`strata_sched`), so the logits are those of one machine. A worker that
//! fails, refuses or misses the deadline is lost: its experts are computed
//! here from the container, with a warning, until it answers for its shard
//! again (asked every [`REJOIN_POLL`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use strata_sched::{ExpertCall, Pending, RemoteExperts};
use zenoh::Wait;
use zenoh::handlers::FifoChannelHandler;
use zenoh::query::{ConsolidationMode, Reply};

use crate::key::SharedKey;
use crate::session::{ALL_SHARDS_KEY, experts_key, open_coordinator, shard_key, zenoh_error};
use crate::worker::shard_info;
use crate::{Error, Result, Shard, wire};

/// How often the shards of lost workers are asked whether they answer
/// again: a worker back after a partition (or restarted at its address, once
/// Zenoh has reconnected to it) computes its experts again within this.
const REJOIN_POLL: Duration = Duration::from_millis(250);
/// The longest one such question waits; a worker still away costs only the
/// watcher's thread this time.
const REJOIN_ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// Workers holding a model's experts, shard by shard.
pub struct Workers {
    session: zenoh::Session,
    shard_count: usize,
    /// The longest a layer waits for a worker's reply.
    deadline: Duration,
    /// Per shard: lost, and served here since (until it answers again).
    lost: Arc<[AtomicBool]>,
    /// Each shard's answer at start (`INDEX COUNT ACTIVATIONS HASH`).
    infos: Vec<String>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers").field("shard_count", &self.shard_count).field("deadline", &self.deadline).finish()
    }
}

impl Workers {
    /// Connects to the workers at `addrs` (`HOST:PORT`) with `key` and waits
    /// until one worker answers for every shard of the set (`0/N` to
    /// `N-1/N`), or refuses naming what is missing once `deadline` (also the
    /// longest a layer waits for a reply) has passed.
    pub fn connect(addrs: &[String], key: &SharedKey, deadline: Duration) -> Result<Workers> {
        if addrs.is_empty() {
            return Err(Error::Workers("--workers names no worker".into()));
        }
        let session = open_coordinator(addrs, key)?;
        let started = Instant::now();
        loop {
            let infos = ask_shards(&session, ALL_SHARDS_KEY, Duration::from_secs(1))?;
            let count = infos.first().map(|(shard, _)| shard.count);
            let complete = count.filter(|&count| {
                infos.iter().all(|(shard, _)| shard.count == count)
                    && (0..count).all(|index| infos.iter().filter(|(shard, _)| shard.index == index).count() == 1)
            });
            if let Some(shard_count) = complete {
                let mut infos = infos;
                infos.sort_by_key(|(shard, _)| shard.index);
                let infos: Vec<String> = infos.into_iter().map(|(_, info)| info).collect();
                let lost: Arc<[AtomicBool]> = (0..shard_count).map(|_| AtomicBool::new(false)).collect();
                watch_for_returns(session.clone(), infos.clone(), Arc::downgrade(&lost))?;
                return Ok(Workers { session, shard_count, deadline, lost, infos });
            }
            if started.elapsed() > deadline {
                let found: Vec<String> = infos.iter().map(|(shard, _)| shard.to_string()).collect();
                return Err(Error::Workers(format!(
                    "the workers at {} did not make a whole set of shards within {:.1} s (answered: {}); \
                     are they running, with the same key?",
                    addrs.join(","),
                    deadline.as_secs_f64(),
                    if found.is_empty() { "none".to_owned() } else { found.join(", ") },
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Refuses workers that serve another model, or compute with other
    /// activations, than the coordinator's: their outputs would differ.
    pub fn check(&self, activations: &str, content_hash: &str) -> Result<()> {
        for (index, info) in self.infos.iter().enumerate() {
            let expected = shard_info(Shard { index, count: self.shard_count }, activations, content_hash);
            if *info != expected {
                return Err(Error::Workers(format!(
                    "worker of shard {index}/{} serves `{info}`, not this model and --activations (`{expected}`)",
                    self.shard_count
                )));
            }
        }
        Ok(())
    }
}

/// Asks the shards of lost workers, every [`REJOIN_POLL`], whether they
/// answer again as they did at start (`infos`, by shard), and gives a shard
/// that does back to its worker. The thread ends with the last holder of
/// `lost` (the `Workers` and the layers in flight).
fn watch_for_returns(session: zenoh::Session, infos: Vec<String>, lost: Weak<[AtomicBool]>) -> Result<()> {
    let watch = move || {
        while let Some(lost) = lost.upgrade() {
            for (index, info) in infos.iter().enumerate() {
                if !lost[index].load(Ordering::Relaxed) {
                    continue;
                }
                // A question that fails is a worker still away: asked again.
                let answers = ask_shards(&session, &shard_key(index), REJOIN_ASK_TIMEOUT).unwrap_or_default();
                if answers.iter().any(|(_, answer)| answer == info) {
                    lost[index].store(false, Ordering::Relaxed);
                    tracing::warn!(shard = index, "expert worker back: its experts are computed there again");
                }
            }
            drop(lost);
            std::thread::sleep(REJOIN_POLL);
        }
    };
    std::thread::Builder::new()
        .name("workers-rejoin".into())
        .spawn(watch)
        .map(drop)
        .map_err(|source| Error::Io { what: "the lost workers' watcher thread".into(), source })
}

/// The answers to a shard question on `key` (every shard, or one) within
/// `timeout`: `(shard, info)`.
fn ask_shards(session: &zenoh::Session, key: &str, timeout: Duration) -> Result<Vec<(Shard, String)>> {
    let replies = session
        .get(key)
        .consolidation(ConsolidationMode::None)
        .timeout(timeout)
        .wait()
        .map_err(zenoh_error("asking for shards"))?;
    let mut infos = Vec::new();
    while let Ok(reply) = replies.recv() {
        let Ok(sample) = reply.result() else { continue };
        let info = String::from_utf8_lossy(&sample.payload().to_bytes()).into_owned();
        let mut words = info.split(' ');
        let shard = words.next().zip(words.next()).and_then(|(index, count)| format!("{index}/{count}").parse().ok());
        if let Some(shard) = shard {
            infos.push((shard, info));
        }
    }
    Ok(infos)
}

impl RemoteExperts for Workers {
    fn is_remote(&self, _layer: usize, expert: usize) -> bool {
        !self.lost[Shard::of(expert, self.shard_count)].load(Ordering::Relaxed)
    }

    fn start(&self, layer: usize, hidden: usize, calls: Vec<ExpertCall>) -> Box<dyn Pending> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.shard_count];
        for (index, call) in calls.iter().enumerate() {
            by_shard[Shard::of(call.expert, self.shard_count)].push(index);
        }
        let queries = by_shard
            .into_iter()
            .enumerate()
            .filter(|(_, indices)| !indices.is_empty())
            .map(|(shard, indices)| {
                let shard_calls: Vec<ExpertCall> = indices.iter().map(|&index| calls[index].clone()).collect();
                let rows: Vec<usize> = shard_calls.iter().map(|call| call.xs.len() / hidden).collect();
                let replies = self
                    .session
                    .get(experts_key(shard))
                    .payload(wire::encode_request(layer, hidden, &shard_calls))
                    .consolidation(ConsolidationMode::None)
                    .timeout(self.deadline)
                    .wait()
                    .map_err(|error| error.to_string());
                Query { shard, indices, rows, replies }
            })
            .collect();
        Box::new(InFlight { layer, hidden, calls: calls.len(), queries, lost: self.lost.clone() })
    }
}

/// One shard's query of a layer.
struct Query {
    shard: usize,
    /// The calls' places in the layer's list.
    indices: Vec<usize>,
    rows: Vec<usize>,
    replies: std::result::Result<FifoChannelHandler<Reply>, String>,
}

struct InFlight {
    layer: usize,
    hidden: usize,
    calls: usize,
    queries: Vec<Query>,
    lost: Arc<[AtomicBool]>,
}

impl Query {
    fn outputs(&self, hidden: usize) -> std::result::Result<Vec<Vec<f32>>, String> {
        let replies = self.replies.as_ref()?;
        // No reply by the deadline (a stalled or partitioned worker) or
        // none at all (a dead one: its queryable is gone) ends the channel.
        let reply = replies.recv().map_err(|_| "no reply by the deadline".to_owned())?;
        let sample =
            reply.result().map_err(|error| String::from_utf8_lossy(&error.payload().to_bytes()).into_owned())?;
        wire::decode_reply(&sample.payload().to_bytes(), hidden, &self.rows).map_err(|error| error.to_string())
    }
}

impl Pending for InFlight {
    fn wait(self: Box<Self>) -> Vec<std::result::Result<Vec<f32>, String>> {
        let mut results: Vec<std::result::Result<Vec<f32>, String>> = vec![Err(String::new()); self.calls];
        for query in &self.queries {
            match query.outputs(self.hidden) {
                Ok(outputs) => {
                    for (&index, ys) in query.indices.iter().zip(outputs) {
                        results[index] = Ok(ys);
                    }
                }
                Err(why) => {
                    if !self.lost[query.shard].swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            layer = self.layer,
                            shard = query.shard,
                            %why,
                            "expert worker lost: its experts are computed here until it answers again"
                        );
                    }
                    for &index in &query.indices {
                        results[index] = Err(format!("worker of shard {}: {why}", query.shard));
                    }
                }
            }
        }
        results
    }
}
