//! Whether a bench figure means anything: how much CPU the rest of the
//! machine took while it was measured.
//!
//! A peer whose threads spin (llama.cpp) collapses when another process
//! takes a core, so a ratio measured beside a build or a test run compares
//! the peer's worst case with Strata's (2026-12-02: 3.52× loaded, 0.78–0.93×
//! quiet). Every benchmarked run is therefore timed between two samples of
//! the machine's busy CPU time (`/proc/stat`) and of the CPU time of this
//! process and its finished children (`getrusage`); what is neither, less
//! any process the bench starts on purpose as a known load and less the
//! kernel's own threads and interrupts, is the others' share. The kernel's
//! work is not another program's: most of it here is for the bench itself
//! (reclaim for the cgroup row's memory limit, the block layer's workers and
//! completions for its reads, the VM's DAMON monitor), and counting it marked
//! runs loaded with nothing else running (0.11–0.57 of a core, 2026-12-03). Before each run the bench waits, at most [`QUIET_WAIT_MAX_S`], for a
//! window in which the others stay under [`OTHERS_CORES_MAX`]; a row any of
//! whose runs saw more is marked loaded and compared with no goal
//! (`bench_report::Row::verdict`).
//!
//! The loads of runs are recorded as they happen ([`record`]) and a row
//! takes those recorded since the previous row ([`take_recorded`]), so a
//! suite's code only says where its runs start and its rows end.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The others' CPU, in cores, above which a run counts as loaded: a tenth
/// of a core is what a shell, a terminal and the system's daemons take on a
/// machine nobody else uses (measured 0.00–0.04 here).
pub(crate) const OTHERS_CORES_MAX: f64 = 0.1;

/// How long a run waits for a quiet machine before it runs anyway, loaded
/// (`--quiet-wait`, 120 s unless told; 0 on a machine shared with builds
/// that will not stop, where every row is a loaded lower bound anyway).
static QUIET_WAIT_MAX_S: AtomicU64 = AtomicU64::new(120);

/// Sets how long each run waits for a quiet machine.
pub(crate) fn set_quiet_wait(wait_max: Duration) {
    QUIET_WAIT_MAX_S.store(wait_max.as_secs(), Ordering::Relaxed);
}

/// The window a quiet probe measures.
const QUIET_PROBE: Duration = Duration::from_millis(500);

/// What the rest of the machine did while something ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Load {
    /// CPU the other processes used, in cores (CPU seconds per second).
    pub(crate) others_cores: f64,
    /// The one-minute load average when the run ended.
    pub(crate) loadavg_1m: f64,
}

impl Load {
    pub(crate) fn is_quiet(&self) -> bool {
        self.others_cores <= OTHERS_CORES_MAX
    }

    /// The worst of several runs' loads (`None` for no runs).
    pub(crate) fn worst(loads: &[Load]) -> Option<Load> {
        loads.iter().copied().reduce(|a, b| Load {
            others_cores: a.others_cores.max(b.others_cores),
            loadavg_1m: a.loadavg_1m.max(b.loadavg_1m),
        })
    }
}

/// CPU time counters at one instant, in seconds.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    /// Every CPU's non-idle time since boot.
    machine_busy_s: f64,
    /// This process's and its waited-for children's.
    ours_s: f64,
    /// The processes started on purpose as a known load.
    excluded_s: f64,
    /// The kernel's threads.
    kernel_threads_s: f64,
}

impl Sample {
    fn now(excluded: &[u32]) -> Result<Self> {
        Ok(Sample {
            at: Instant::now(),
            machine_busy_s: machine_busy_seconds()?,
            ours_s: own_seconds(),
            excluded_s: excluded.iter().map(|&pid| process_seconds(pid).unwrap_or(0.0)).sum(),
            kernel_threads_s: kernel_threads_seconds(),
        })
    }
}

/// Measures the others' CPU from its start until [`Meter::stop`].
pub(crate) struct Meter {
    before: Sample,
    excluded: Vec<u32>,
}

impl Meter {
    /// `excluded`: pids whose CPU is a known load (not the others').
    pub(crate) fn start(excluded: &[u32]) -> Result<Self> {
        Ok(Meter { before: Sample::now(excluded)?, excluded: excluded.to_vec() })
    }

    pub(crate) fn stop(self) -> Result<Load> {
        let after = Sample::now(&self.excluded)?;
        let wall_s = (after.at - self.before.at).as_secs_f64().max(1e-3);
        let others_s = (after.machine_busy_s - self.before.machine_busy_s)
            - (after.ours_s - self.before.ours_s)
            - (after.excluded_s - self.before.excluded_s)
            - (after.kernel_threads_s - self.before.kernel_threads_s);
        Ok(Load { others_cores: (others_s / wall_s).max(0.0), loadavg_1m: loadavg_1m() })
    }
}

/// Waits until a [`QUIET_PROBE`] window shows the others under
/// [`OTHERS_CORES_MAX`], for at most `wait_max`; says so while it waits and
/// when it gives up.
fn wait_for_quiet(excluded: &[u32], wait_max: Duration) -> Result<()> {
    let started = Instant::now();
    let mut said = false;
    loop {
        let meter = Meter::start(excluded)?;
        std::thread::sleep(QUIET_PROBE);
        let load = meter.stop()?;
        if load.is_quiet() {
            return Ok(());
        }
        if started.elapsed() >= wait_max {
            eprintln!(
                "bench: the machine is still busy ({:.2} cores used by other processes) after {} s; \
                 measuring anyway, and the row will be marked loaded",
                load.others_cores,
                wait_max.as_secs()
            );
            return Ok(());
        }
        if !said {
            eprintln!(
                "bench: waiting for a quiet machine ({:.2} cores used by other processes, load average {:.2})",
                load.others_cores, load.loadavg_1m
            );
            said = true;
        }
    }
}

/// The loads of the runs since the last [`take_recorded`].
static RECORDED: Mutex<Vec<Load>> = Mutex::new(Vec::new());

/// The pids of the [`BusyCore`]s running now: a known load, not the others'.
static KNOWN_LOAD: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn known_load() -> Vec<u32> {
    KNOWN_LOAD.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Runs `run` on a quiet machine if one comes within the wait (a
/// [`BusyCore`] the bench started does not count), measures what the
/// others did meanwhile and records it for the next row.
pub(crate) fn measured<T>(run: impl FnOnce() -> Result<T>) -> Result<T> {
    measured_within(Duration::from_secs(QUIET_WAIT_MAX_S.load(Ordering::Relaxed)), run)
}

/// [`measured`], waiting at most `wait_max` for a quiet machine.
pub(crate) fn measured_within<T>(wait_max: Duration, run: impl FnOnce() -> Result<T>) -> Result<T> {
    let excluded = known_load();
    wait_for_quiet(&excluded, wait_max)?;
    let meter = Meter::start(&excluded)?;
    let value = run()?;
    let load = meter.stop()?;
    RECORDED.lock().unwrap_or_else(|e| e.into_inner()).push(load);
    Ok(value)
}

pub(crate) fn take_recorded() -> Vec<Load> {
    std::mem::take(&mut *RECORDED.lock().unwrap_or_else(|e| e.into_inner()))
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Time every CPU spent running processes, from the `cpu` line of
/// `/proc/stat`: user, nice and system (guest time is inside user). Not
/// interrupts (irq, softirq: the completions of the bench's own reads), not
/// steal (the hypervisor's other guests, no process here), not idle or
/// iowait.
fn machine_busy_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat.lines().find(|l| l.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
    let fields: Vec<f64> = line.split_whitespace().skip(1).map(|f| f.parse().unwrap_or(0.0)).collect();
    let field = |i: usize| fields.get(i).copied().unwrap_or(0.0);
    let busy_ticks = field(0) + field(1) + field(2);
    Ok(busy_ticks / clock_ticks_per_s())
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// The fields of a `/proc/PID/stat` line after the parenthesised command
/// name, which may hold spaces: index 0 is the state (field 3).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// Whether a `/proc/PID/stat` line is a kernel thread's (flags, field 9).
fn is_kernel_thread(stat: &str) -> bool {
    stat_fields(stat).and_then(|f| f.get(6)?.parse::<u64>().ok()).is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// User and system time of a `/proc/PID/stat` line (fields 14 and 15).
fn stat_seconds(stat: &str) -> Option<f64> {
    let fields = stat_fields(stat)?;
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks_per_s())
}

/// CPU time of every kernel thread alive now. Kernel threads live as long
/// as the system, so the difference of two samples is their work between.
fn kernel_threads_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0.0 };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter(|stat| is_kernel_thread(stat))
        .filter_map(|stat| stat_seconds(&stat))
        .sum()
}

/// User and system time of this process and of its children that have
/// been waited for.
fn own_seconds() -> f64 {
    let seconds = |who| {
        // SAFETY: getrusage fills the zeroed struct we pass; no other effect.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(who, &mut usage);
            usage
        };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(usage.ru_utime) + tv(usage.ru_stime)
    };
    seconds(libc::RUSAGE_SELF) + seconds(libc::RUSAGE_CHILDREN)
}

/// User and system time of a running process.
fn process_seconds(pid: u32) -> Option<f64> {
    stat_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn loadavg_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A process that keeps one core busy until dropped: the known competing
/// load of the rows that measure both engines beside another program.
pub(crate) struct BusyCore {
    child: std::process::Child,
}

impl BusyCore {
    /// A shell loop pinned to `core` (with `taskset`; unpinned where it is
    /// missing, which the caller's note should say).
    pub(crate) fn start(core: usize) -> Result<Self> {
        let script = "while :; do :; done";
        let pinned = std::process::Command::new("taskset")
            .args(["-c", &core.to_string(), "sh", "-c", script])
            .stdin(std::process::Stdio::null())
            .spawn();
        let child = match pinned {
            Ok(child) => child,
            Err(_) => std::process::Command::new("sh")
                .args(["-c", script])
                .stdin(std::process::Stdio::null())
                .spawn()
                .context("starting a busy loop")?,
        };
        KNOWN_LOAD.lock().unwrap_or_else(|e| e.into_inner()).push(child.id());
        Ok(BusyCore { child })
    }
}

impl Drop for BusyCore {
    fn drop(&mut self) {
        KNOWN_LOAD.lock().unwrap_or_else(|e| e.into_inner()).retain(|&pid| pid != self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that start a busy loop: one test's loop reaped
    /// (its time joining this process's children's) between the samples of
    /// another's two meters would move one meter and not the other.
    static BUSY_LOOPS: Mutex<()> = Mutex::new(());

    fn measure_for(duration: Duration, excluded: &[u32]) -> Load {
        let meter = Meter::start(excluded).unwrap();
        std::thread::sleep(duration);
        meter.stop().unwrap()
    }

    #[test]
    fn a_run_beside_a_busy_process_is_measured_as_loaded() {
        let _serial = BUSY_LOOPS.lock().unwrap_or_else(|e| e.into_inner());
        let busy = BusyCore::start(0).unwrap();
        // Let the loop get going before the window opens.
        std::thread::sleep(Duration::from_millis(100));
        let load = measure_for(Duration::from_millis(1500), &[]);
        drop(busy);
        // One spinning loop is a whole core on an idle machine; on a busy CI
        // runner (a third of a core here beside six builds) it still gets
        // more than the threshold.
        assert!(!load.is_quiet(), "{load:?}");
    }

    #[test]
    fn a_known_competing_load_is_not_counted_as_the_others() {
        let _serial = BUSY_LOOPS.lock().unwrap_or_else(|e| e.into_inner());
        let busy = BusyCore::start(0).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Two meters over the same window: one told the loop is known.
        let counted = Meter::start(&[]).unwrap();
        let known = Meter::start(&[busy.child.id()]).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let known = known.stop().unwrap();
        let counted = counted.stop().unwrap();
        let loop_cores = process_seconds(busy.child.id()).is_some();
        drop(busy);
        assert!(loop_cores, "the loop's /proc entry is readable while it runs");
        assert!(counted.others_cores - known.others_cores > OTHERS_CORES_MAX, "counted {counted:?}, known {known:?}");
    }

    #[test]
    fn kernel_threads_are_told_from_programs_by_their_flags() {
        // kthreadd is pid 2 on Linux, the parent of every kernel thread.
        let kthreadd = std::fs::read_to_string("/proc/2/stat").unwrap();
        let ours = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(is_kernel_thread(&kthreadd), "{kthreadd}");
        assert!(!is_kernel_thread(&ours), "{ours}");
        // A command name with spaces and parentheses does not shift the fields.
        let named = "7 (a (b) c) S 2 0 0 0 -1 2129984 0 0 0 0 300 200 0 0 20 0 1 0 5 0 0";
        assert!(is_kernel_thread(named));
        assert_eq!(stat_seconds(named), Some(500.0 / clock_ticks_per_s()));
    }

    #[test]
    fn the_worst_load_of_a_rows_runs_decides() {
        let quiet = Load { others_cores: 0.02, loadavg_1m: 0.1 };
        let loaded = Load { others_cores: 0.9, loadavg_1m: 2.0 };
        assert_eq!(Load::worst(&[quiet, loaded, quiet]), Some(loaded));
        assert_eq!(Load::worst(&[]), None);
        assert!(quiet.is_quiet());
    }
}
