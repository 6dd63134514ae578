//! A delaying TCP relay: every chunk it forwards is held a fixed time in
//! each direction. It stands in for a LAN's wire and switch delay between
//! network namespaces, which `netem` would add but this kernel lacks; the
//! rate of the link is `tc`'s `tbf`, on the namespaces' own interfaces.
//! [`Relay::partition`] cuts the link without closing it, as a pulled cable
//! or a dead switch does: bytes are held, no connection ends
//! ([`Relay::heal`] plugs it back in).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The most one read takes; a chunk is held and written whole.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks held per direction of a connection: at 10 Gbit/s and a hold of
/// 1 ms, 1.25 MB are in flight, 20 chunks; beyond the bound the reader
/// waits, as a full switch buffer makes the sender wait.
const CHUNKS_HELD_MAX: usize = 256;
/// The timer slack of a writer thread: Linux's default of 50 µs would add
/// itself to every hold of a few tens of microseconds.
const TIMER_SLACK_NS: libc::c_ulong = 1_000;

/// A listening relay; its threads run until the process ends.
#[derive(Debug)]
pub struct Relay {
    local_addr: SocketAddr,
    link: Arc<Link>,
}

/// What every connection of a relay shares.
#[derive(Debug, Default)]
struct Link {
    /// Bytes written on, both directions together.
    bytes_forwarded: AtomicU64,
    /// While set, nothing is written on: the network is partitioned.
    partitioned: AtomicBool,
}

/// How long a writer held by a partition sleeps between looks at it.
const PARTITION_POLL: Duration = Duration::from_millis(1);

impl Relay {
    /// Listens on `listen` and forwards each connection to `target`, holding
    /// every chunk `one_way_delay` on its way in either direction.
    pub fn start(listen: SocketAddr, target: SocketAddr, one_way_delay: Duration) -> Result<Relay> {
        let io = |what: String| move |source| Error::Io { what, source };
        let listener = TcpListener::bind(listen).map_err(io(format!("relay: listen on {listen}")))?;
        let local_addr = listener.local_addr().map_err(io(format!("relay: address of {listen}")))?;
        let link = Arc::new(Link::default());
        let shared = link.clone();
        thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || {
                // A connection that fails is the client's to see (it is
                // closed); the relay keeps accepting.
                for inbound in listener.incoming().flatten() {
                    let _ = forward(inbound, target, one_way_delay, &shared);
                }
            })
            .map_err(io("relay: accept thread".into()))?;
        Ok(Relay { local_addr, link })
    }

    /// Bytes passed on so far, both directions together.
    pub fn bytes_forwarded(&self) -> u64 {
        self.link.bytes_forwarded.load(Ordering::Relaxed)
    }

    /// Holds every byte from now on, closing nothing.
    pub fn partition(&self) {
        self.link.partitioned.store(true, Ordering::Relaxed);
    }

    /// Ends a partition: the bytes held go on, in order.
    pub fn heal(&self) {
        self.link.partitioned.store(false, Ordering::Relaxed);
    }

    /// Where the relay listens (the port chosen, if `listen` asked for 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// Connects `inbound` to `target`, one delayed pump each way.
fn forward(inbound: TcpStream, target: SocketAddr, one_way_delay: Duration, link: &Arc<Link>) -> std::io::Result<()> {
    let outbound = TcpStream::connect(target)?;
    for stream in [&inbound, &outbound] {
        stream.set_nodelay(true)?;
    }
    pump(inbound.try_clone()?, outbound.try_clone()?, one_way_delay, link.clone())?;
    pump(outbound, inbound, one_way_delay, link.clone())
}

/// Reads `from` on one thread and writes `to` on another, each chunk once
/// `delay` has passed since it was read; the end of `from` ends `to`'s
/// writing side after the same delay.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration, link: Arc<Link>) -> std::io::Result<()> {
    let (held, due) = mpsc::sync_channel::<(Instant, Vec<u8>)>(CHUNKS_HELD_MAX);
    let reader_side = from.try_clone()?;
    thread::Builder::new().name("relay-read".into()).spawn(move || {
        loop {
            let mut chunk = vec![0u8; CHUNK_BYTES];
            let bytes_read = match from.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            chunk.truncate(bytes_read);
            if held.send((Instant::now() + delay, chunk)).is_err() {
                break;
            }
        }
    })?;
    thread::Builder::new().name("relay-write".into()).spawn(move || {
        // SAFETY: prctl(PR_SET_TIMERSLACK) takes a plain integer and changes
        // only this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS) };
        for (due_at, chunk) in due {
            sleep_until(due_at);
            while link.partitioned.load(Ordering::Relaxed) {
                thread::sleep(PARTITION_POLL);
            }
            link.bytes_forwarded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if to.write_all(&chunk).is_err() {
                // The far side is gone: stop reading the near one too.
                let _ = reader_side.shutdown(Shutdown::Both);
                return;
            }
        }
        // `from` ended: pass its end on, after the same hold.
        sleep_until(Instant::now() + delay);
        let _ = to.shutdown(Shutdown::Write);
    })?;
    Ok(())
}

fn sleep_until(due_at: Instant) {
    let now = Instant::now();
    if due_at > now {
        thread::sleep(due_at - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback: each connection's bytes sent back.
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                stream.set_nodelay(true).unwrap();
                thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        stream.write_all(&buf[..n]).unwrap();
                    }
                });
            }
        });
        addr
    }

    /// The median round trip of a 64-byte ping through `addr`.
    fn median_round_trip(addr: SocketAddr) -> Duration {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let mut times: Vec<Duration> = (0..21)
            .map(|_| {
                let started = Instant::now();
                stream.write_all(&[7u8; 64]).unwrap();
                stream.read_exact(&mut [0u8; 64]).unwrap();
                started.elapsed()
            })
            .collect();
        times.sort();
        times[times.len() / 2]
    }

    #[test]
    fn the_relay_adds_the_delay_it_claims_each_way() {
        let one_way_delay = Duration::from_millis(5);
        let echo = echo_server();
        let relay = Relay::start("127.0.0.1:0".parse().unwrap(), echo, one_way_delay).unwrap();
        let direct = median_round_trip(echo);
        let relayed = median_round_trip(relay.local_addr());
        let added = relayed.saturating_sub(direct);
        assert!(added >= 2 * one_way_delay, "the relay added {added:?}, not 2 x {one_way_delay:?}");
        // Two shared cores under other builds wake a sleeper late by up to a
        // few milliseconds; more than that is the relay holding too long.
        assert!(added < 2 * one_way_delay + Duration::from_millis(4), "the relay added {added:?}");
    }
}
