//! A bounded pool of I/O worker threads that load expert records.
//!
//! Loads are submitted with a caller-chosen tag and complete in any order;
//! [`IoPool::recv`] hands back the tag with the filled buffer or the error.
//!
//! Every queue is bounded by one number, `max_in_flight`: a load counts from
//! [`IoPool::submit`] until its completion is received, whether it is waiting
//! for a worker, being read, or finished and waiting for `recv`. `submit`
//! blocks while the pool is full, so neither pending loads nor unclaimed
//! completions (each holding a record-sized buffer) can pile up. A caller
//! that submits more than `max_in_flight` loads must receive concurrently.
//!
//! A pool may *defer* to a [`Gate`] ([`IoPool::deferring`]): its workers
//! start a read only while nobody holds the gate. The store's prefetch pool
//! defers to the demand reads this way, so a guess is read only while the
//! drive would otherwise idle, and guesses not yet started can be taken
//! back ([`IoPool::cancel_pending`]) once the demand they guessed is known.
//! A deferring pool reads in short requests, so a read already started can
//! be stopped too ([`IoPool::stop_running`]): a wrong guess then holds the
//! drive for at most one request after its demand arrives.

use std::collections::{HashMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};

use super::RecordSource;
use crate::{AlignedBuf, Error, Result};

/// One load waiting for a worker.
struct Load {
    file: Arc<dyn RecordSource>,
    expert: usize,
    buf: AlignedBuf,
    tag: u64,
}

/// A finished load. A worker that panicked passes the panic on to whoever
/// receives it, so a bug surfaces in the caller instead of a hang.
enum Completion {
    Done(Result<AlignedBuf>),
    Panicked(Box<dyn std::any::Any + Send>),
}

#[derive(Default)]
struct State {
    pending: VecDeque<Load>,
    completed: VecDeque<(u64, Completion)>,
    /// Submitted and not yet received: pending + being read + completed.
    in_flight: usize,
    /// A deferring pool's loads being read, by tag: set a flag to stop one.
    running: HashMap<u64, Arc<AtomicBool>>,
    shutting_down: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a load is pending (or on shutdown): wakes a worker.
    load_ready: Condvar,
    /// Signalled when a completion is received: wakes a blocked `submit`.
    slot_free: Condvar,
    /// Signalled when a load completes: wakes `recv`.
    completion_ready: Condvar,
    max_in_flight: usize,
    /// Reads start only while this gate is open (`IoPool::deferring`).
    gate: Option<Arc<Gate>>,
    /// Set (under the gate's lock) when the pool shuts down, so a worker
    /// waiting on the gate stops waiting.
    stopping: AtomicBool,
}

/// Held while reads that must go first are in progress; a deferring pool
/// starts no read while anyone holds it. A read it started just before the
/// gate closed runs on: at most one per worker shares the drive with the
/// reads that go first.
#[derive(Debug, Default)]
pub struct Gate {
    holders: Mutex<usize>,
    opened: Condvar,
}

/// One hold on a [`Gate`]; the gate opens when the last hold drops.
#[derive(Debug)]
pub struct GateHold(Arc<Gate>);

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        // Only counts change under this lock; a poisoned one is consistent.
        self.holders.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the gate until the returned hold drops.
    pub fn hold(self: &Arc<Self>) -> GateHold {
        *self.lock() += 1;
        GateHold(Arc::clone(self))
    }

    /// Whether nobody holds the gate.
    pub fn is_open(&self) -> bool {
        *self.lock() == 0
    }

    /// Blocks until the gate is open or `stopping` is set.
    fn wait_open(&self, stopping: &AtomicBool) {
        let mut holders = self.lock();
        while *holders > 0 && !stopping.load(Ordering::Relaxed) {
            holders = self.opened.wait(holders).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

impl Drop for GateHold {
    fn drop(&mut self) {
        let mut holders = self.0.lock();
        assert!(*holders > 0, "a hold is counted until it drops");
        *holders -= 1;
        if *holders == 0 {
            self.0.opened.notify_all();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock (reads run outside it), so a
        // poisoned lock still guards consistent state.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait<'a>(&self, condvar: &Condvar, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        condvar.wait(guard).unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A bounded pool of I/O worker threads. Loads are submitted with a tag and
/// complete in any order.
pub struct IoPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl IoPool {
    /// Starts `workers` threads; at most `max_in_flight` loads are queued,
    /// being read, or completed and not yet received (`submit` blocks when
    /// full — every queue has a limit).
    pub fn new(workers: usize, max_in_flight: usize) -> Result<IoPool> {
        Self::build(workers, max_in_flight, None)
    }

    /// [`new`](Self::new), but a worker starts a read only while `gate` is
    /// open; loads wait (and may be cancelled) meanwhile.
    pub fn deferring(workers: usize, max_in_flight: usize, gate: Arc<Gate>) -> Result<IoPool> {
        Self::build(workers, max_in_flight, Some(gate))
    }

    fn build(workers: usize, max_in_flight: usize, gate: Option<Arc<Gate>>) -> Result<IoPool> {
        if workers == 0 || max_in_flight == 0 {
            return Err(Error::IoPoolSize { workers, max_in_flight });
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            load_ready: Condvar::new(),
            slot_free: Condvar::new(),
            completion_ready: Condvar::new(),
            max_in_flight,
            gate,
            stopping: AtomicBool::new(false),
        });
        let mut pool = IoPool { shared, workers: Vec::with_capacity(workers) };
        for index in 0..workers {
            let shared = Arc::clone(&pool.shared);
            let spawned = thread::Builder::new().name(format!("strata-io-{index}")).spawn(move || work(&shared));
            // On failure, dropping `pool` stops the workers already started.
            pool.workers.push(spawned.map_err(|source| Error::SpawnWorker { source })?);
        }
        Ok(pool)
    }

    /// Queues a load of record `expert` of `file` into `buf` (which must be
    /// exactly one record long), blocking while `max_in_flight` loads are in
    /// flight. Its completion comes back from [`recv`](Self::recv) with `tag`.
    pub fn submit(&self, file: Arc<dyn RecordSource>, expert: usize, buf: AlignedBuf, tag: u64) {
        let mut state = self.shared.lock();
        while state.in_flight >= self.shared.max_in_flight {
            state = self.shared.wait(&self.shared.slot_free, state);
        }
        state.in_flight += 1;
        state.pending.push_back(Load { file, expert, buf, tag });
        drop(state);
        self.shared.load_ready.notify_one();
    }

    /// Blocks for the next completion: `(tag, Ok(buf))` with the whole record,
    /// or `(tag, Err(_))`, in which case the buffer has been dropped — a
    /// partly read record is never handed back.
    ///
    /// With nothing in flight this waits for a load that another thread has
    /// yet to submit; a thread that both submits and receives should check
    /// [`in_flight`](Self::in_flight) first (or use [`try_recv`](Self::try_recv)).
    ///
    /// # Panics
    ///
    /// If a worker panicked while reading this load (the panic is passed on).
    pub fn recv(&self) -> (u64, Result<AlignedBuf>) {
        let mut state = self.shared.lock();
        loop {
            if let Some(completion) = self.take_completion(&mut state) {
                return completion;
            }
            state = self.shared.wait(&self.shared.completion_ready, state);
        }
    }

    /// The next completion if one is ready, without blocking.
    pub fn try_recv(&self) -> Option<(u64, Result<AlignedBuf>)> {
        self.take_completion(&mut self.shared.lock())
    }

    fn take_completion(&self, state: &mut State) -> Option<(u64, Result<AlignedBuf>)> {
        let (tag, completion) = state.completed.pop_front()?;
        state.in_flight -= 1;
        self.shared.slot_free.notify_one();
        match completion {
            Completion::Done(result) => Some((tag, result)),
            Completion::Panicked(payload) => panic::resume_unwind(payload),
        }
    }

    /// Takes back every load no worker has started, with its tag and
    /// buffer; they no longer count in flight and never complete.
    pub fn cancel_pending(&self) -> Vec<(u64, AlignedBuf)> {
        let mut state = self.shared.lock();
        let cancelled: Vec<(u64, AlignedBuf)> = state.pending.drain(..).map(|load| (load.tag, load.buf)).collect();
        state.in_flight -= cancelled.len();
        drop(state);
        if !cancelled.is_empty() {
            self.shared.slot_free.notify_all();
        }
        cancelled
    }

    /// Stops the reads in progress whose tag `keep` refuses (a deferring
    /// pool's only; others read whole records unstoppably). Each completes
    /// soon after with [`Error::ReadStopped`](crate::Error::ReadStopped),
    /// unless it finishes first. Returns how many were asked to stop.
    pub fn stop_running(&self, keep: impl Fn(u64) -> bool) -> usize {
        let state = self.shared.lock();
        let mut stopped = 0;
        for (&tag, stop) in &state.running {
            if !keep(tag) {
                stop.store(true, Ordering::Relaxed);
                stopped += 1;
            }
        }
        stopped
    }

    /// Loads submitted and not yet received.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight
    }

    /// The bound on [`in_flight`](Self::in_flight).
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight
    }

    /// Worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }
}

impl Drop for IoPool {
    /// Stops the workers: loads not yet started are dropped, loads being read
    /// finish first (a worker owns its buffer until its read returns).
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.shutting_down = true;
        state.pending.clear();
        drop(state);
        self.shared.load_ready.notify_all();
        if let Some(gate) = &self.shared.gate {
            // Under the gate's lock, so a worker about to wait sees it.
            let _holders = gate.lock();
            self.shared.stopping.store(true, Ordering::Relaxed);
            gate.opened.notify_all();
        }
        for worker in self.workers.drain(..) {
            // A worker never panics outside `catch_unwind`; nothing to report.
            let _ = worker.join();
        }
    }
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoPool")
            .field("workers", &self.workers.len())
            .field("max_in_flight", &self.shared.max_in_flight)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// A worker: take the oldest pending load (once the gate, if any, is open),
/// read it outside the lock, post the completion; until shutdown.
fn work(shared: &Shared) {
    loop {
        let mut state = shared.lock();
        let load = loop {
            if state.shutting_down {
                return;
            }
            if !state.pending.is_empty() {
                match &shared.gate {
                    Some(gate) if !gate.is_open() => {
                        drop(state);
                        gate.wait_open(&shared.stopping);
                        // The load may have been cancelled meanwhile.
                        state = shared.lock();
                        continue;
                    }
                    _ => break state.pending.pop_front().expect("checked non-empty"),
                }
            }
            state = shared.wait(&shared.load_ready, state);
        };
        // A deferring pool's reads can be stopped (`stop_running`).
        let stop = shared.gate.as_ref().map(|_| {
            let stop = Arc::new(AtomicBool::new(false));
            state.running.insert(load.tag, Arc::clone(&stop));
            stop
        });
        drop(state);

        let Load { file, expert, mut buf, tag } = load;
        let read = panic::catch_unwind(AssertUnwindSafe(|| match &stop {
            Some(stop) => file.read_record_until(expert, &mut buf, &|| stop.load(Ordering::Relaxed)),
            None => file.read_record(expert, &mut buf),
        }));
        let completion = match read {
            Ok(Ok(())) => Completion::Done(Ok(buf)),
            // The partly read buffer is dropped here, never handed back.
            Ok(Err(err)) => Completion::Done(Err(err)),
            Err(payload) => Completion::Panicked(payload),
        };
        let mut state = shared.lock();
        state.running.remove(&tag);
        state.completed.push_back((tag, completion));
        drop(state);
        shared.completion_ready.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoBackend;
    use crate::io::RecordFile;
    use crate::io::tests::{record_pattern, write_records};

    const RECORD_BYTES: usize = 2 * 4096;
    const NUM_EXPERTS: usize = 16;

    /// `NUM_EXPERTS` patterned records in a temporary file, read with `pread`.
    fn pread_records() -> (tempfile::TempDir, Arc<RecordFile>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        write_records(&path, NUM_EXPERTS, RECORD_BYTES);
        (dir, Arc::new(RecordFile::open(IoBackend::Pread, &path, 0, RECORD_BYTES, NUM_EXPERTS).unwrap()))
    }

    #[test]
    fn loads_complete_with_the_right_bytes_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer.bin");
        write_records(&path, NUM_EXPERTS, RECORD_BYTES);
        for backend in IoBackend::ALL {
            for workers in [2, 3, 4] {
                let file = Arc::new(RecordFile::open(backend, &path, 0, RECORD_BYTES, NUM_EXPERTS).unwrap());
                let pool = IoPool::new(workers, 3).unwrap();
                let loads = 64u64;
                let mut received = vec![false; loads as usize];
                let mut check = |(tag, result): (u64, Result<AlignedBuf>)| {
                    let buf = result.unwrap();
                    let expert = (tag as usize * 7) % NUM_EXPERTS;
                    assert!(buf.as_slice() == record_pattern(expert, RECORD_BYTES), "{backend}: load {tag}");
                    assert!(!std::mem::replace(&mut received[tag as usize], true), "load {tag} came back twice");
                };
                for tag in 0..loads {
                    // Receive whenever full, so submit never blocks this (only) thread.
                    if pool.in_flight() == pool.max_in_flight() {
                        check(pool.recv());
                    }
                    let expert = (tag as usize * 7) % NUM_EXPERTS;
                    pool.submit(file.clone(), expert, AlignedBuf::zeroed(RECORD_BYTES), tag);
                    assert!(pool.in_flight() <= 3);
                }
                while pool.in_flight() > 0 {
                    check(pool.recv());
                }
                assert!(received.iter().all(|&r| r), "{backend}: a load never came back");
            }
        }
    }

    /// A separate thread receives, so `submit` really blocks on a full pool;
    /// an observer samples `in_flight` throughout.
    #[test]
    fn submit_blocks_when_full_and_in_flight_never_exceeds_the_limit() {
        let (_dir, file) = pread_records();
        let pool = IoPool::new(4, 3).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        /// Stops the observer even when an assertion below fails, so a
        /// failure reports instead of hanging the scope.
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        thread::scope(|scope| {
            let _stop = StopOnDrop(&done);
            scope.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    assert!(pool.in_flight() <= 3);
                    thread::yield_now();
                }
            });
            let receiver = scope.spawn(|| {
                let mut tags: Vec<u64> = (0..64).map(|_| pool.recv().0).collect();
                tags.sort_unstable();
                tags
            });
            for tag in 0..64 {
                let expert = tag as usize % NUM_EXPERTS;
                pool.submit(file.clone(), expert, AlignedBuf::zeroed(RECORD_BYTES), tag);
                assert!(pool.in_flight() <= 3);
            }
            assert_eq!(receiver.join().unwrap(), (0..64).collect::<Vec<_>>());
        });
        assert_eq!(pool.in_flight(), 0);
        assert!(pool.try_recv().is_none());
    }

    #[test]
    fn errors_come_back_tagged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer_009.bin");
        write_records(&path, 4, RECORD_BYTES);
        // Expert 3 is cut short.
        std::fs::File::options().write(true).open(&path).unwrap().set_len(3 * RECORD_BYTES as u64 + 100).unwrap();
        for backend in IoBackend::ALL {
            let file = Arc::new(RecordFile::open(backend, &path, 9, RECORD_BYTES, 4).unwrap());
            let pool = IoPool::new(2, 3).unwrap();
            let mut outcomes = Vec::new();
            for (tag, expert) in [(10, 0), (13, 3), (11, 1), (14, 4), (12, 2)] {
                if pool.in_flight() == pool.max_in_flight() {
                    outcomes.push(pool.recv());
                }
                pool.submit(file.clone(), expert, AlignedBuf::zeroed(RECORD_BYTES), tag);
            }
            while pool.in_flight() > 0 {
                outcomes.push(pool.recv());
            }
            outcomes.sort_by_key(|(tag, _)| *tag);
            for (tag, result) in outcomes {
                let expert = tag as usize - 10;
                match (expert, result) {
                    (0..=2, Ok(buf)) => assert!(buf.as_slice() == record_pattern(expert, RECORD_BYTES)),
                    (3, Err(Error::ShortRead { layer: 9, expert: 3, got_bytes: 100, .. })) => {}
                    (4, Err(Error::NoSuchExpert { layer: 9, expert: 4 })) => {}
                    (_, other) => panic!("{backend}: load {tag}: unexpected {other:?}"),
                }
            }
        }
    }

    #[test]
    fn empty_pool_is_an_error() {
        assert!(matches!(IoPool::new(0, 1), Err(Error::IoPoolSize { workers: 0, .. })));
        assert!(matches!(IoPool::new(1, 0), Err(Error::IoPoolSize { max_in_flight: 0, .. })));
    }

    #[test]
    fn a_deferring_pool_reads_only_while_its_gate_is_open_and_cancels_what_waits() {
        let (_dir, file) = pread_records();
        let gate = Gate::new();
        let pool = IoPool::deferring(2, 4, Arc::clone(&gate)).unwrap();
        let hold = gate.hold();
        assert!(!gate.is_open());
        for tag in 0..3 {
            pool.submit(file.clone(), tag as usize, AlignedBuf::zeroed(RECORD_BYTES), tag);
        }
        thread::sleep(std::time::Duration::from_millis(50));
        assert!(pool.try_recv().is_none(), "no read starts while the gate is held");
        let mut cancelled: Vec<u64> = pool.cancel_pending().into_iter().map(|(tag, _)| tag).collect();
        cancelled.sort_unstable();
        assert_eq!(cancelled, [0, 1, 2]);
        assert_eq!(pool.in_flight(), 0);
        // Loads submitted while held start once the gate opens.
        for tag in 3..5 {
            pool.submit(file.clone(), tag as usize, AlignedBuf::zeroed(RECORD_BYTES), tag);
        }
        drop(hold);
        assert!(gate.is_open());
        let mut tags: Vec<u64> = (0..2)
            .map(|_| {
                let (tag, buf) = pool.recv();
                assert!(buf.unwrap().as_slice() == record_pattern(tag as usize, RECORD_BYTES));
                tag
            })
            .collect();
        tags.sort_unstable();
        assert_eq!(tags, [3, 4]);
        assert!(pool.cancel_pending().is_empty());
        // A pool dropped while its gate is held and loads wait still stops.
        let _hold = gate.hold();
        pool.submit(file.clone(), 0, AlignedBuf::zeroed(RECORD_BYTES), 9);
        drop(pool);
    }

    /// A source whose reads run until stopped (or 10 s pass), as a long
    /// read of a wrong guess would.
    struct Endless;

    impl RecordSource for Endless {
        fn read_record(&self, _: usize, _: &mut AlignedBuf) -> Result<()> {
            unreachable!("a deferring pool reads stoppably")
        }

        fn read_record_until(&self, expert: usize, _: &mut AlignedBuf, stop: &dyn Fn() -> bool) -> Result<()> {
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_secs(10) {
                if stop() {
                    return Err(Error::ReadStopped { path: "endless".into(), layer: 0, expert, done_bytes: 4096 });
                }
                thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(())
        }
    }

    #[test]
    fn a_deferring_pool_stops_the_reads_in_progress_it_is_told_to() {
        let pool = IoPool::deferring(2, 4, Gate::new()).unwrap();
        let source: Arc<dyn RecordSource> = Arc::new(Endless);
        pool.submit(Arc::clone(&source), 0, AlignedBuf::zeroed(RECORD_BYTES), 7);
        pool.submit(source, 1, AlignedBuf::zeroed(RECORD_BYTES), 8);
        while pool.shared.lock().running.len() < 2 {
            thread::yield_now();
        }
        // Kept reads run on; the others stop at their next request.
        assert_eq!(pool.stop_running(|tag| tag == 8), 1);
        let (tag, result) = pool.recv();
        assert_eq!(tag, 7);
        assert!(matches!(result, Err(Error::ReadStopped { expert: 0, .. })));
        assert!(pool.try_recv().is_none(), "the kept read still runs");
        assert_eq!(pool.stop_running(|_| false), 1);
        assert!(matches!(pool.recv(), (8, Err(Error::ReadStopped { expert: 1, .. }))));
        assert!(pool.shared.lock().running.is_empty());
    }

    #[test]
    fn dropping_a_busy_pool_stops_its_workers() {
        let (_dir, file) = pread_records();
        let pool = IoPool::new(2, 8).unwrap();
        for tag in 0..8 {
            pool.submit(file.clone(), tag as usize, AlignedBuf::zeroed(RECORD_BYTES), tag);
        }
        drop(pool);
    }
}
