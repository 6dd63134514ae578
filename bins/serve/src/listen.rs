//! The connection loop: hyper's HTTP/1 under the router, with the bounds
//! `axum::serve` lacks.
//!
//! - A client that dribbles its request head is cut off after
//!   `--header-timeout-secs` (idle keep-alive connections too: hyper times
//!   the head from the moment it waits for one).
//! - Open connections are capped at `--max-connections`, and below the file
//!   descriptor limit, so `accept` never fails for want of descriptors. At
//!   the cap a new connection closes the oldest one that has not yet sent a
//!   whole request head (a slow client, or one that sends nothing), so a
//!   crowd of slow clients cannot lock out `/health` or real requests; only
//!   when every open connection has a request does the newcomer close.
//! - Shutdown waits for open requests only until `--shutdown-timeout-secs`,
//!   so a half-sent request cannot hold the process forever.
//!
//! Bodies have their own deadline (see `body`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// One open connection, as the accept loop sees it.
struct Open {
    /// Set once a whole request head has arrived: from then on the
    /// connection is doing real work and is never displaced.
    served: Arc<AtomicBool>,
    /// Closes the connection when notified.
    close: Arc<Notify>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Registry {
    next_id: u64,
    open: BTreeMap<u64, Open>,
}

impl Registry {
    /// Closes the oldest connection still waiting for its first request
    /// head; whether there was one.
    fn evict_oldest_unserved(&mut self) -> bool {
        let oldest = self.open.iter().find(|(_, c)| !c.served.load(Ordering::Relaxed)).map(|(&id, _)| id);
        match oldest.and_then(|id| self.open.remove(&id)) {
            Some(conn) => {
                conn.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets open
/// requests finish for at most the shutdown deadline. Connections still open
/// after it are abandoned to the caller's runtime shutdown.
pub async fn serve(listener: TcpListener, router: Router, limits: ConnLimits, shutdown: impl Future<Output = ()>) {
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
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Once is enough to tell (an attack repeats it thousands of
                // times); the loop keeps serving.
                if !std::mem::replace(&mut told_accept_failed, true) {
                    crate::log!("serve: warning: accepting a connection failed: {e} (retrying)");
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !std::mem::replace(&mut told_full, true) {
                    crate::log!(
                        "serve: warning: {} connections are open (--max-connections); new ones displace those \
                         that have not sent a request",
                        limits.max_connections
                    );
                }
                // Every connection busy with a request: the newcomer is
                // closed (the client retries).
                if !lock(&registry).evict_oldest_unserved() {
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
        let served = Arc::new(AtomicBool::new(false));
        let close = Arc::new(Notify::new());
        let id = {
            let mut registry = lock(&registry);
            let id = registry.next_id;
            registry.next_id += 1;
            registry.open.insert(id, Open { served: Arc::clone(&served), close: Arc::clone(&close) });
            id
        };
        let router = TowerToHyperService::new(router.clone());
        let service = hyper::service::service_fn(move |request| {
            served.store(true, Ordering::Relaxed);
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
            lock(&registry).open.remove(&id);
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_deadline, graceful.shutdown()).await.is_err() {
        crate::log!(
            "serve: requests still open {} s after shutdown began; closing them",
            limits.shutdown_deadline.as_secs()
        );
    }
}

fn lock(registry: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    // Entries are plain flags and handles: a panic elsewhere cannot leave
    // them inconsistent.
    registry.lock().unwrap_or_else(|p| p.into_inner())
}
