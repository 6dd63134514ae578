//! The connection loop: hyper's HTTP/1 under the router, with the bounds
//! `axum::serve` lacks.
//!
//! - A client that dribbles its request head is cut off after
//!   `--header-timeout-secs` (idle keep-alive connections too: hyper times
//!   the head from the moment it waits for one).
//! - Open connections are capped at `--max-connections`, and below the file
//!   descriptor limit, so `accept` never fails for want of descriptors. At
//!   the cap a new connection displaces one that is not yet working: one
//!   that has not sent a whole request head, or whose request's body has
//!   not all arrived (a client that sends a head, then a byte a second,
//!   would otherwise hold its slot for the whole body deadline). The victim
//!   is taken from the peer address holding the most connections, the
//!   oldest first, those still waiting for a head before those sending a
//!   body; so a crowd of slow clients from one address cannot lock out
//!   `/health`, real requests or other addresses. Only when every open
//!   connection is working on a request does the newcomer close.
//! - Shutdown waits for open requests only until `--shutdown-timeout-secs`,
//!   so a half-sent request cannot hold the process forever.
//!
//! Bodies have their own deadline (see `body`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

/// The connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// The longest a client may take to send a request head.
    pub header_read_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// How long shutdown waits for open requests before closing them.
    pub shutdown_deadline: Duration,
}

/// How long to wait after a failed accept before trying again: long enough
/// not to spin, short enough that service resumes as soon as it can.
const ACCEPT_RETRY: Duration = Duration::from_millis(20);

/// How long a newcomer waits for the connection it displaced to close.
const EVICTION_WAIT: Duration = Duration::from_millis(200);

/// How long replies cut at the shutdown deadline get to send their last
/// events.
const CUT_REPLIES_END_WAIT: Duration = Duration::from_secs(1);

/// Where a connection is in its current request: what displacing it costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
enum Phase {
    /// No request head yet (a new or idle keep-alive connection).
    AwaitingHead = 0,
    /// A head arrived; its body (if the handler reads one) has not.
    ReceivingBody = 1,
    /// The whole request arrived: real work, never displaced.
    Working = 2,
}

/// A connection's [`Phase`], shared by the accept loop and the request's
/// handler: the loop sets `ReceivingBody` when a head arrives and hands the
/// request this as an extension; the body reader (`body`) sets `Working`
/// once the body is in.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<AtomicU8>);

impl Progress {
    fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::Relaxed);
    }

    fn get(&self) -> Phase {
        match self.0.load(Ordering::Relaxed) {
            0 => Phase::AwaitingHead,
            1 => Phase::ReceivingBody,
            _ => Phase::Working,
        }
    }

    /// The request's body has arrived whole.
    pub fn body_arrived(&self) {
        self.set(Phase::Working);
    }
}

/// One open connection, as the accept loop sees it.
struct Open {
    peer: IpAddr,
    progress: Progress,
    /// Closes the connection when notified.
    close: Arc<Notify>,
}

/// The open connections, oldest first, and how many each peer holds.
#[derive(Default)]
struct Registry {
    next_id: u64,
    open: BTreeMap<u64, Open>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Registry {
    fn insert(&mut self, peer: IpAddr, progress: Progress, close: Arc<Notify>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(id, Open { peer, progress, close });
        *self.per_peer.entry(peer).or_default() += 1;
        id
    }

    fn remove(&mut self, id: u64) -> Option<Open> {
        let conn = self.open.remove(&id)?;
        if let Some(count) = self.per_peer.get_mut(&conn.peer) {
            *count -= 1;
            if *count == 0 {
                self.per_peer.remove(&conn.peer);
            }
        }
        Some(conn)
    }

    /// Closes a connection that is not working on a request: of the peer
    /// holding the most connections, the one waiting for a head before one
    /// sending a body, the oldest first. Whether there was one.
    fn evict(&mut self) -> bool {
        let victim = self
            .open
            .iter()
            .filter_map(|(&id, c)| {
                let phase = c.progress.get();
                (phase != Phase::Working).then(|| (std::cmp::Reverse(self.per_peer[&c.peer]), phase, id))
            })
            .min()
            .map(|(_, _, id)| id);
        match victim.and_then(|id| self.remove(id)) {
            Some(conn) => {
                conn.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets open
/// requests finish for at most the shutdown deadline. After it, `cut` tells
/// the replies still running to end; connections still open a moment later
/// are abandoned to the caller's runtime shutdown.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
    cut: tokio::sync::watch::Sender<bool>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let registry = Arc::new(Mutex::new(Registry::default()));
    let mut told_accept_failed = false;
    let mut told_full = false;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok((stream, peer)) => (stream, peer.ip()),
            Err(e) => {
                // Once is enough to tell (an attack repeats it thousands of
                // times); the loop keeps serving.
                if !std::mem::replace(&mut told_accept_failed, true) {
                    tracing::warn!("accepting a connection failed: {e} (retrying)");
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !std::mem::replace(&mut told_full, true) {
                    tracing::warn!(
                        "{} connections are open (--max-connections); new ones displace those \
                         that have not sent a whole request, from the address holding the most",
                        limits.max_connections
                    );
                }
                // Every connection busy with a request: the newcomer is
                // closed (the client retries).
                if !lock(&registry).evict() {
                    continue;
                }
                match tokio::time::timeout(EVICTION_WAIT, Arc::clone(&slots).acquire_owned()).await {
                    Ok(Ok(permit)) => permit,
                    _ => continue,
                }
            }
        };
        // Small SSE chunks go out as they are written.
        let _ = stream.set_nodelay(true);
        let progress = Progress::default();
        let close = Arc::new(Notify::new());
        let id = lock(&registry).insert(peer, progress.clone(), Arc::clone(&close));
        let router = TowerToHyperService::new(router.clone());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            progress.set(Phase::ReceivingBody);
            request.extensions_mut().insert(progress.clone());
            router.call(request)
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            // A failed connection (reset, timed-out head) concerns only its
            // client; a displaced one is dropped, which closes it.
            tokio::select! {
                _ = connection => {}
                () = close.notified() => {}
            }
            lock(&registry).remove(id);
            drop(permit);
        });
    }
    drop(listener);
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    if tokio::time::timeout(limits.shutdown_deadline, &mut drained).await.is_ok() {
        return;
    }
    tracing::info!(
        "requests still open {} s after shutdown began; ending their replies",
        limits.shutdown_deadline.as_secs()
    );
    // Replies end with an error event (OpenAI's followed by `[DONE]`), so
    // their clients can tell shutdown from a network fault; a client that
    // does not read them is not waited for long.
    cut.send_replace(true);
    if tokio::time::timeout(CUT_REPLIES_END_WAIT, &mut drained).await.is_err() {
        tracing::warn!("closing connections whose clients did not read the end of their replies");
    }
}

fn lock(registry: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    // Entries are plain flags and handles: a panic elsewhere cannot leave
    // them inconsistent.
    registry.lock().unwrap_or_else(|p| p.into_inner())
}
