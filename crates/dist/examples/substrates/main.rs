//! The measurement behind docs/DISTRIBUTED.md's choice of substrate: the
//! round trip of one layer's union (hidden states out, expert outputs back)
//! between a coordinator and a worker in separate network namespaces, over
//! a link of 1 or 10 Gbit/s (`tbf`) with a LAN's delay (the crate's relay),
//! through Zenoh (peer mode, a queryable), NATS (`async-nats` and a
//! `nats-server`) and plain TCP (the floor a home-made protocol would
//! reach). As root:
//!
//! ```sh
//! apt-get install nats-server ethtool
//! cargo run -p strata-dist --features bench-substrates --example substrates -- run
//! ```

mod netns;
mod wire;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use strata_dist::Relay;

use netns::{
    COORDINATOR_IP, COORDINATOR_NS, RELAY_COORDINATOR_SIDE_IP, RELAY_WORKER_SIDE_IP, Topology, WORKER_IP, WORKER_NS,
    in_ns,
};
use wire::Client;

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// (request, reply) bytes of one layer's union to one worker, f32 rows:
/// Qwen3-30B-A3B-shaped decode (hidden 2048, 4 of its 8 experts on the
/// worker), GLM-5-shaped decode (hidden 6144, 4 experts) and the same with
/// all 8 experts on one worker.
const SIZES: [(usize, usize); 3] = [(8 << 10, 32 << 10), (24 << 10, 96 << 10), (24 << 10, 192 << 10)];
/// (tc rate, tbf bucket bytes): a bucket of a few packets, so a message is
/// paced at the rate rather than sent in one burst.
const LINKS: [(&str, usize); 2] = [("1gbit", 4_500), ("10gbit", 15_000)];
/// The LAN's one-way delay the relay adds: a switch and two NICs' worth.
const ONE_WAY_DELAY: Duration = Duration::from_micros(50);
const REQUESTS: usize = 1000;
const WARM_UP_REQUESTS: usize = 50;

const TCP_PORT: u16 = 7100;
const TCP_NO_HOLD_PORT: u16 = 7101;
const ZENOH_PORT: u16 = 7447;
const NATS_PORT: u16 = 4222;

fn main() -> BoxResult<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["run"] => run(),
        ["serve", "tcp", listen] => wire::serve_tcp(listen),
        ["serve", "zenoh", listen] => wire::serve_zenoh(listen),
        ["serve", "nats", server] => wire::serve_nats(server),
        ["client", kind, target, request_bytes, reply_bytes] => {
            let mut client: Box<dyn Client> = match *kind {
                "tcp" => Box::new(wire::TcpClient::connect(target)?),
                "zenoh" => Box::new(wire::ZenohClient::connect(target)?),
                "nats" => Box::new(wire::NatsClient::connect(target)?),
                other => return Err(format!("no substrate {other}").into()),
            };
            measure(client.as_mut(), request_bytes.parse()?, reply_bytes.parse()?)
        }
        _ => {
            Err("usage: substrates run | serve tcp|zenoh|nats ADDR | client KIND ADDR REQUEST_BYTES REPLY_BYTES".into())
        }
    }
}

/// This process's CPU time (all threads), user and system.
fn own_cpu() -> Duration {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Another process's CPU time, from /proc (clock ticks).
fn process_cpu(pid: u32) -> BoxResult<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may hold spaces, in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').ok_or("no ) in /proc stat")?.1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf reads a constant.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / ticks_per_second))
}

/// The client's side: warm up, then time `REQUESTS` round trips and print
/// `median_us p99_us cpu_us_per_request`.
fn measure(client: &mut dyn Client, request_bytes: usize, reply_bytes: usize) -> BoxResult<()> {
    let request = wire::request(request_bytes, reply_bytes);
    // A substrate may need a moment after connecting before the worker is
    // known (Zenoh's declarations, NATS's subscription): retry until then.
    let started = Instant::now();
    while let Err(error) = client.call(&request) {
        if started.elapsed() > Duration::from_secs(20) {
            return Err(format!("no reply within 20 s: {error}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..WARM_UP_REQUESTS {
        client.call(&request)?;
    }
    let cpu_before = own_cpu();
    let mut round_trips: Vec<Duration> = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let started = Instant::now();
        let bytes = client.call(&request)?;
        round_trips.push(started.elapsed());
        assert_eq!(bytes, reply_bytes, "the reply has the size asked for");
    }
    let cpu = own_cpu() - cpu_before;
    round_trips.sort();
    let at = |q: f64| round_trips[((round_trips.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    println!("{:.0} {:.0} {:.1}", at(0.5), at(0.99), cpu.as_secs_f64() * 1e6 / REQUESTS as f64);
    Ok(())
}

/// A worker or server process, killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(mut command: std::process::Command) -> BoxResult<Process> {
    Ok(Process(command.stdout(Stdio::null()).spawn()?))
}

struct Substrate {
    label: &'static str,
    kind: &'static str,
    /// Where the coordinator's client connects.
    target: String,
    /// Processes whose CPU a request costs besides the client's: the worker,
    /// and NATS's server.
    workers: Vec<u32>,
}

fn run() -> BoxResult<()> {
    let exe = std::env::current_exe()?;
    let topology = Topology::create()?;
    let addr = |ip: &str, port: u16| format!("{ip}:{port}");
    let relay = |listen: String, target: String, delay| -> BoxResult<Relay> {
        Ok(Relay::start(listen.parse()?, target.parse()?, delay)?)
    };
    let _relays = [
        relay(addr(RELAY_COORDINATOR_SIDE_IP, TCP_PORT), addr(WORKER_IP, TCP_PORT), ONE_WAY_DELAY)?,
        relay(addr(RELAY_COORDINATOR_SIDE_IP, TCP_NO_HOLD_PORT), addr(WORKER_IP, TCP_PORT), Duration::ZERO)?,
        relay(addr(RELAY_COORDINATOR_SIDE_IP, ZENOH_PORT), addr(WORKER_IP, ZENOH_PORT), ONE_WAY_DELAY)?,
        // NATS's worker connects out, to the server beside the coordinator.
        relay(addr(RELAY_WORKER_SIDE_IP, NATS_PORT), addr(COORDINATOR_IP, NATS_PORT), ONE_WAY_DELAY)?,
    ];
    let serve = |kind: &str, at: String| -> BoxResult<Process> {
        let mut command = in_ns(WORKER_NS, &exe);
        command.args(["serve", kind, &at]);
        spawn(command)
    };
    let tcp_worker = serve("tcp", addr(WORKER_IP, TCP_PORT))?;
    let zenoh_worker = serve("zenoh", addr(WORKER_IP, ZENOH_PORT))?;
    let mut nats_server_command = in_ns(COORDINATOR_NS, Path::new("nats-server"));
    nats_server_command.args(["-a", COORDINATOR_IP, "-p", &NATS_PORT.to_string()]);
    let nats_server = spawn(nats_server_command)?;
    std::thread::sleep(Duration::from_secs(1));
    let nats_worker = serve("nats", format!("nats://{}", addr(RELAY_WORKER_SIDE_IP, NATS_PORT)))?;
    std::thread::sleep(Duration::from_secs(2));

    let substrates = [
        Substrate {
            label: "TCP, relay without hold",
            kind: "tcp",
            target: addr(RELAY_COORDINATOR_SIDE_IP, TCP_NO_HOLD_PORT),
            workers: vec![tcp_worker.0.id()],
        },
        Substrate {
            label: "TCP (home-made floor)",
            kind: "tcp",
            target: addr(RELAY_COORDINATOR_SIDE_IP, TCP_PORT),
            workers: vec![tcp_worker.0.id()],
        },
        Substrate {
            label: "Zenoh peer, queryable",
            kind: "zenoh",
            target: addr(RELAY_COORDINATOR_SIDE_IP, ZENOH_PORT),
            workers: vec![zenoh_worker.0.id()],
        },
        Substrate {
            label: "NATS request/reply",
            kind: "nats",
            target: format!("nats://{}", addr(COORDINATOR_IP, NATS_PORT)),
            workers: vec![nats_worker.0.id(), nats_server.0.id()],
        },
    ];
    println!("load average at start: {}", std::fs::read_to_string("/proc/loadavg")?.trim());
    println!("one-way delay held by the relay: {} µs; {REQUESTS} round trips a row", ONE_WAY_DELAY.as_micros());
    println!();
    println!(
        "| link | substrate | request / reply KiB | median µs | p99 µs | client CPU µs/req | worker (+server) CPU µs/req |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (rate, burst_bytes) in LINKS {
        topology.shape(rate, burst_bytes)?;
        for substrate in &substrates {
            for (request_bytes, reply_bytes) in SIZES {
                let cpu_before: Vec<Duration> =
                    substrate.workers.iter().map(|&pid| process_cpu(pid)).collect::<BoxResult<_>>()?;
                let mut client = in_ns(COORDINATOR_NS, &exe);
                client.args(["client", substrate.kind, &substrate.target]);
                client.args([request_bytes.to_string(), reply_bytes.to_string()]);
                let output = client.stderr(Stdio::inherit()).output()?;
                if !output.status.success() {
                    return Err(format!("{} client failed: {}", substrate.label, output.status).into());
                }
                let worker_cpu: Duration = substrate
                    .workers
                    .iter()
                    .zip(&cpu_before)
                    .map(|(&pid, before)| Ok(process_cpu(pid)? - *before))
                    .sum::<BoxResult<Duration>>()?;
                let line = String::from_utf8(output.stdout)?;
                let fields: Vec<&str> = line.split_whitespace().collect();
                let [median_us, p99_us, client_cpu_us] = fields.as_slice() else {
                    return Err(format!("client printed {line:?}").into());
                };
                // The worker's count includes the client's warm-up; /proc's
                // ticks are 10 ms, so this is a coarse figure.
                let worker_cpu_us = worker_cpu.as_secs_f64() * 1e6 / (REQUESTS + WARM_UP_REQUESTS) as f64;
                println!(
                    "| {rate} | {} | {} / {} | {median_us} | {p99_us} | {client_cpu_us} | {worker_cpu_us:.1} |",
                    substrate.label,
                    request_bytes >> 10,
                    reply_bytes >> 10
                );
            }
        }
    }
    println!();
    println!("load average at end: {}", std::fs::read_to_string("/proc/loadavg")?.trim());
    drop((tcp_worker, zenoh_worker, nats_worker, nats_server, topology));
    Ok(())
}
