//! Routed experts on workers in other processes (`strata worker`,
//! `--workers`, docs/DISTRIBUTED.md), each in a network namespace of its own
//! where the test can make one (`net`), on loopback otherwise: logits
//! bit-identical to one machine with 1, 2 and 3 workers; a worker killed or
//! cut off mid-generation (its link down, or a relay, `strata_dist::Relay`,
//! holding its bytes) is served here with a warning, never a hang or another
//! token, and used again once it answers; a coordinator without the key is
//! refused.

mod net;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use net::Place;
use strata_dist::Relay;

const KEY: &str = "a-test-key-0123456789";
const KEY_ENV: &str = "STRATA_WORKER_KEY";

fn strata() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strata"));
    command.env(KEY_ENV, KEY);
    command
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `family`'s fixture converted at `quant` into `dir`.
fn convert(dir: &Path, family: &str, quant: &str) -> PathBuf {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata").join(family).join("hf");
    let model = dir.join(format!("{family}-{quant}"));
    let out = strata().args(["convert", path(&hf), path(&model), "--quant", quant]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    model
}

/// A `strata worker` process, killed when dropped (before its place goes).
struct Worker {
    child: Child,
    addr: String,
    place: Place,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts shard `shard` of `model` in a place of its own and waits until it
/// answers.
fn worker(model: &Path, shard: &str) -> Worker {
    let place = Place::new();
    let addr = place.listen_addr();
    let child = start_worker(&place, &addr, model, shard);
    Worker { child, addr, place }
}

/// A `strata worker` process in `place` at `addr`, once it answers.
fn start_worker(place: &Place, addr: &str, model: &Path, shard: &str) -> Child {
    let mut child = place
        .command(Path::new(env!("CARGO_BIN_EXE_strata")))
        .env(KEY_ENV, KEY)
        .args(["worker", path(model), "--listen", addr, "--shard", shard, "--threads", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("strata: worker:") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "worker {shard} ended before it was ready");
    }
    // Its later lines must not fill the pipe and stall it.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    child
}

fn logits(model: &Path, out: &Path, extra: &[&str]) -> Vec<u8> {
    let output = strata()
        .args(["logits", path(model), "--tokens", "1,5,9,2,7,3", "--out", path(out), "--threads", "1"])
        .args(extra)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    std::fs::read(out).unwrap()
}

#[test]
fn logits_are_bit_identical_with_one_two_and_three_workers() {
    let dir = tempfile::tempdir().unwrap();
    for (family, quant) in [("olmoe", "q4"), ("qwen3_moe", "q8"), ("deepseek_v3", "f32"), ("mixtral", "bf16")] {
        let model = convert(dir.path(), family, quant);
        let alone = logits(&model, &dir.path().join("alone.npy"), &[]);
        for count in 1..=3 {
            let workers: Vec<Worker> = (0..count).map(|index| worker(&model, &format!("{index}/{count}"))).collect();
            let addrs: Vec<&str> = workers.iter().map(|w| w.addr.as_str()).collect();
            let spread = logits(&model, &dir.path().join("spread.npy"), &["--workers", &addrs.join(",")]);
            assert!(spread == alone, "{family} {quant}: logits with {count} workers differ from one machine's");
        }
    }
}

/// Starts `generate`: `new_tokens` greedy tokens after 3, stdout and stderr
/// piped.
fn generate(model: &Path, new_tokens: usize, extra: &[&str]) -> Child {
    let new_tokens = new_tokens.to_string();
    strata()
        .args(["generate", path(model), "--tokens", "1,5,9", "--max-new-tokens", &new_tokens, "--ignore-eos"])
        .args(["--temperature", "0", "--json", "--threads", "1"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn tokens(output: &Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    json["tokens"].to_string()
}

/// Generates through `relay` to shard 1 of 2 (and directly to shard 0),
/// doing `fault` once a third of a whole run's bytes have crossed it: the
/// same tokens as one machine, a warning, and no hang.
fn survives_a_fault_mid_generation(fault: impl FnOnce(&mut Worker, &Relay)) {
    let dir = tempfile::tempdir().unwrap();
    let model = convert(dir.path(), "olmoe", "q8");
    let alone = tokens(&generate(&model, 48, &[]).wait_with_output().unwrap());
    let whole_run_bytes = {
        let shard0 = worker(&model, "0/2");
        let shard1 = worker(&model, "1/2");
        let relay = Relay::start("127.0.0.1:0".parse().unwrap(), shard1.addr.parse().unwrap(), Duration::ZERO).unwrap();
        let workers = format!("{},{}", shard0.addr, relay.local_addr());
        let output = generate(&model, 48, &["--workers", &workers]).wait_with_output().unwrap();
        assert_eq!(tokens(&output), alone, "with workers, before any fault");
        relay.bytes_forwarded()
    };
    let shard0 = worker(&model, "0/2");
    let mut shard1 = worker(&model, "1/2");
    let relay = Relay::start("127.0.0.1:0".parse().unwrap(), shard1.addr.parse().unwrap(), Duration::ZERO).unwrap();
    let workers = format!("{},{}", shard0.addr, relay.local_addr());
    let started = Instant::now();
    let run = generate(&model, 48, &["--workers", &workers, "--worker-deadline-ms", "2000"]);
    while relay.bytes_forwarded() < whole_run_bytes / 3 {
        assert!(started.elapsed() < Duration::from_secs(60), "generation never got a third of the way");
        std::thread::sleep(Duration::from_millis(1));
    }
    fault(&mut shard1, &relay);
    let output = run.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(60), "a lost worker must not hang the coordinator");
    assert_eq!(tokens(&output), alone, "a lost worker's experts are computed here, the same");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("expert worker lost"), "a warning names the loss: {stderr}");
}

#[test]
fn a_worker_killed_mid_generation_is_served_here_with_the_same_tokens() {
    survives_a_fault_mid_generation(|worker, _| worker.child.kill().unwrap());
}

#[test]
fn a_worker_cut_off_mid_generation_is_served_here_after_the_deadline() {
    survives_a_fault_mid_generation(|_, relay| relay.partition());
}

#[test]
fn a_worker_whose_link_goes_down_mid_generation_is_served_here_after_the_deadline() {
    survives_a_fault_mid_generation(|worker, relay| match &worker.place {
        Place::Namespace(namespace) => namespace.cut(),
        // Without a namespace there is no link of its own to take down.
        Place::Loopback => relay.partition(),
    });
}

/// `child`'s stderr, line by line as it comes.
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    lines
}

/// Waits for a line of `lines` that holds `needle`, at most a minute.
fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) {
    let started = Instant::now();
    loop {
        let left = Duration::from_secs(60).saturating_sub(started.elapsed());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(_) => panic!("no `{needle}` on stderr within a minute"),
        }
    }
}

/// Generates long enough through `relay` to shard 1 of 2 (and directly to
/// shard 0) for shard 1 to be lost to `fault` and answer again after
/// `repair`: the same tokens as one machine, and the worker computing again
/// once back.
fn is_used_again_after(fault: impl FnOnce(&mut Worker, &Relay), repair: impl FnOnce(&mut Worker, &Relay, &Path)) {
    // Long enough that the run outlasts the deadline and the return.
    const NEW_TOKENS: usize = 1500;
    let dir = tempfile::tempdir().unwrap();
    let model = convert(dir.path(), "olmoe", "q8");
    let alone = tokens(&generate(&model, NEW_TOKENS, &[]).wait_with_output().unwrap());
    let shard0 = worker(&model, "0/2");
    let mut shard1 = worker(&model, "1/2");
    let relay = Relay::start("127.0.0.1:0".parse().unwrap(), shard1.addr.parse().unwrap(), Duration::ZERO).unwrap();
    let workers = format!("{},{}", shard0.addr, relay.local_addr());
    let mut run = generate(&model, NEW_TOKENS, &["--workers", &workers, "--worker-deadline-ms", "1000"]);
    let lines = stderr_lines(&mut run);
    let started = Instant::now();
    while relay.bytes_forwarded() < 100_000 {
        assert!(started.elapsed() < Duration::from_secs(60), "generation never used the worker");
        std::thread::sleep(Duration::from_millis(1));
    }
    fault(&mut shard1, &relay);
    wait_for_line(&lines, "expert worker lost");
    repair(&mut shard1, &relay, &model);
    wait_for_line(&lines, "expert worker back");
    let bytes_at_return = relay.bytes_forwarded();
    let output = run.wait_with_output().unwrap();
    assert_eq!(tokens(&output), alone, "a worker lost and back changes no token");
    // Each token's queries to the shard and replies cross the relay: far
    // more than the session's keep-alives if the worker computes again.
    let bytes_since = relay.bytes_forwarded() - bytes_at_return;
    assert!(bytes_since > 10_000, "only {bytes_since} bytes crossed to the worker after its return");
}

#[test]
fn a_worker_back_after_a_partition_is_used_again() {
    is_used_again_after(|_, relay| relay.partition(), |_, relay, _| relay.heal());
}

#[test]
fn a_worker_killed_and_restarted_at_its_address_is_used_again() {
    is_used_again_after(
        |worker, _| worker.child.kill().unwrap(),
        |worker, _, model| {
            let _ = worker.child.wait();
            worker.child = start_worker(&worker.place, &worker.addr, model, "1/2");
        },
    );
}

#[test]
fn a_coordinator_without_the_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = convert(dir.path(), "olmoe", "q8");
    let shard = worker(&model, "0/1");
    let output = strata()
        .env(KEY_ENV, "another-key-0123456789")
        .args(["logits", path(&model), "--tokens", "1,2", "--out", path(&dir.path().join("x.npy"))])
        .args(["--workers", &shard.addr, "--worker-deadline-ms", "1500"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "computed without the key: {stderr}");
    assert!(stderr.contains("did not make a whole set of shards"), "{stderr}");
}
