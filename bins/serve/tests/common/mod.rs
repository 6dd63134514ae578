//! Shared by the `serve` tests: start the binary on the demo model on a
//! free port, and a minimal HTTP/1.1 client over std's TcpStream (the tests
//! need exact control of headers and connections, e.g. to drop one
//! mid-stream, and no HTTP client crate in the build).

#![allow(dead_code)] // Each test file uses a different part.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn demo_model() -> PathBuf {
    repo_root().join("models/demo")
}

/// Where this test binary's servers convert checkpoints to.
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("serve-models-{}", env!("CARGO_CRATE_NAME")))
}

/// The demo model's container, converted by a server started before.
pub fn converted_demo() -> PathBuf {
    std::fs::read_dir(cache_dir())
        .expect("a server converted the demo model")
        .map(|entry| entry.expect("cache entry").path())
        .find(|dir| dir.join("manifest.json").is_file())
        .expect("a container in the cache")
}

/// A running `serve`, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    stderr: PathBuf,
}

/// Servers start one at a time within a test binary: the first converts the
/// demo checkpoint into the cache the others then reuse.
static STARTING: Mutex<()> = Mutex::new(());
static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Server {
    /// `serve --model models/demo` with `args` added.
    pub fn start(args: &[&str]) -> Server {
        Self::start_with_model(&demo_model(), args)
    }

    pub fn start_with_model(model: &Path, args: &[&str]) -> Server {
        Self::launch(Command::new(env!("CARGO_BIN_EXE_serve")), model, args)
    }

    /// `serve --model models/demo` with `args` added and `env` set.
    pub fn start_with_env(env: &[(&str, &str)], args: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_serve"));
        command.envs(env.iter().copied());
        Self::launch(command, &demo_model(), args)
    }

    /// `serve` with at most `files` open file descriptors (soft and hard
    /// limit, as `ulimit -n` sets them), as on a host with a low limit.
    pub fn start_with_fd_limit(files: u32, args: &[&str]) -> Server {
        let mut shell = Command::new("sh");
        shell.args(["-c", &format!("ulimit -n {files} && exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_serve")]);
        Self::launch(shell, &demo_model(), args)
    }

    /// `serve --model models/demo` with `args` added, its stderr a pipe
    /// nobody reads (closed before the server starts): every line it logs
    /// fails with EPIPE.
    pub fn start_with_stderr_closed(args: &[&str]) -> Server {
        Self::launch_logging_to(Command::new(env!("CARGO_BIN_EXE_serve")), &demo_model(), args, Log::ClosedPipe)
    }

    /// `serve --model models/demo` with `args` added, expected to refuse to
    /// start: its exit status and stderr, or `None` if it was still running
    /// after `timeout` (it is killed then).
    pub fn start_refused(args: &[&str], timeout: Duration) -> Option<(std::process::ExitStatus, String)> {
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        let (mut child, stderr) = spawn(Command::new(env!("CARGO_BIN_EXE_serve")), &demo_model(), args, Log::File);
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = std::fs::read_to_string(&stderr).unwrap_or_default();
        let _ = std::fs::remove_file(&stderr);
        status.map(|status| (status, text))
    }

    fn launch(command: Command, model: &Path, args: &[&str]) -> Server {
        Self::launch_logging_to(command, model, args, Log::File)
    }

    fn launch_logging_to(command: Command, model: &Path, args: &[&str], log: Log) -> Server {
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        let (mut child, stderr) = spawn(command, model, args, log);
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("serve: listening on http://") {
                    let addr = rest.split_whitespace().next().unwrap_or_default().to_owned();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(addr) => addr.parse().expect("address"),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve did not start:\n{}", std::fs::read_to_string(&stderr).unwrap_or_default());
            }
        };
        Server { child, addr, stderr }
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, &[], None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        request(self.addr, "POST", path, &[("Content-Type", "application/json")], Some(body.to_string().as_bytes()))
    }

    /// One sample of `/metrics` (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until `check` holds, for at most `timeout`.
    pub fn wait_for(&self, timeout: Duration, mut check: impl FnMut(&Server) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if check(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        check(self)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit for at most `timeout`: the
    /// status, or `None` if it was still running (it is killed on drop).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let sent = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The server's peak resident memory so far (VmHWM), in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).expect("kB") * 1024
    }
}

/// Where a server's stderr goes.
enum Log {
    /// A file, read by [`Server::stderr`].
    File,
    /// A pipe whose reading end is closed before the server starts.
    ClosedPipe,
}

/// Starts `command` (serve) on `model` in this test binary's cache, on a
/// free port, with `args` added; the file its stderr goes to (empty with
/// [`Log::ClosedPipe`]).
fn spawn(mut command: Command, model: &Path, args: &[&str], log: Log) -> (Child, PathBuf) {
    // One cache per test binary, so binaries run in parallel (nextest)
    // never convert into the same directory at once.
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stderr = tmp.join(format!("serve-{}-{}-{n}.stderr", env!("CARGO_CRATE_NAME"), std::process::id()));
    match log {
        Log::File => command.stderr(std::fs::File::create(&stderr).expect("stderr file")),
        Log::ClosedPipe => {
            let (reader, writer) = std::io::pipe().expect("pipe");
            drop(reader);
            command.stderr(writer)
        }
    };
    let child = command
        .arg("--model")
        .arg(model)
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["--port", "0"])
        // One kernel thread unless asked: tests run side by side on few cores.
        .args(if args.contains(&"--threads") { &[][..] } else { &["--threads", "1"][..] })
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start serve");
    (child, stderr)
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// An HTTP response, its body de-chunked.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The SSE events: (event name, data) in order.
    pub fn events(&self) -> Vec<(Option<String>, String)> {
        let text = self.text();
        text.split("\n\n")
            .filter(|block| !block.trim().is_empty())
            .filter_map(|block| {
                let mut name = None;
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                    }
                }
                // Keep-alive comments have neither.
                (name.is_some() || !data.is_empty()).then(|| (name, data.join("\n")))
            })
            .collect()
    }
}

/// Sends one request on a fresh connection and reads the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Response {
    let mut stream = send(addr, method, path, headers, body);
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

/// Sends a request and returns the open connection, to read as it comes.
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write head");
    if let Some(body) = body {
        // The server may answer (413) before reading it all.
        let _ = stream.write_all(body);
    }
    stream
}

pub fn parse_response(raw: &[u8]) -> Response {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status");
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))).collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked =
        headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Response { status, headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 || data.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[(eol + 2 + size + 2).min(data.len())..];
    }
    out
}

/// The text of an OpenAI chat stream, its finish reason and its usage.
pub fn chat_stream_text(response: &Response) -> (String, Option<String>, Option<Value>) {
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    let events = response.events();
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"), "a stream ends with [DONE]: {events:?}");
    for (_, data) in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(data).expect("chunk JSON");
        assert!(chunk.get("error").is_none(), "stream failed: {chunk}");
        if !chunk["usage"].is_null() {
            usage = Some(chunk["usage"].clone());
        }
        if let Some(choice) = chunk["choices"].get(0) {
            if let Some(piece) = choice["delta"]["content"].as_str().or_else(|| choice["text"].as_str()) {
                text.push_str(piece);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_owned());
            }
        }
    }
    (text, finish, usage)
}

/// A client that sends a request head one header at a time and never ends
/// it (slowloris).
pub struct Slow(TcpStream);

impl Slow {
    pub fn open(addr: SocketAddr) -> Option<Slow> {
        let mut stream = TcpStream::connect(addr).ok()?;
        stream.set_nonblocking(true).ok()?;
        stream.write_all(format!("POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n").as_bytes()).ok()?;
        Some(Slow(stream))
    }

    /// One more header line (a failure means the server closed it, which
    /// `closed` tells).
    pub fn dribble(&mut self) {
        let _ = self.0.write_all(b"X-Slow: 1\r\n");
    }

    /// Whether the server has closed this connection.
    pub fn closed(&self) -> bool {
        let mut byte = [0u8; 1];
        match (&self.0).read(&mut byte) {
            Ok(0) => true,
            // hyper may answer a timed-out head with a 408 before closing.
            Ok(_) => true,
            Err(e) => e.kind() != ErrorKind::WouldBlock,
        }
    }
}

/// Seconds one `GET /health` takes on a fresh connection.
pub fn health_seconds(addr: SocketAddr) -> f64 {
    let started = Instant::now();
    let response = request(addr, "GET", "/health", &[], None);
    assert_eq!(response.status, 200, "{}", response.text());
    started.elapsed().as_secs_f64()
}
