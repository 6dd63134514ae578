//! `strata pull`, `models` and `rm` against a hub in this process: a small
//! HTTP server on 127.0.0.1 answering as huggingface.co does (the repository
//! description under `/api/models/…/revision/…`; files under `/…/resolve/…`
//! with the commit, ETag and linked-ETag headers, LFS files through a 302 to
//! a CDN path, Range requests; the hub's 401/403/404 with its `X-Error-Code`
//! values, as huggingface_hub reads them), serving a fixture checkpoint, and
//! hostile when a test says so (names with `../` in its headers, bodies
//! longer than declared). Hand-written on std's TcpListener rather than a
//! server crate: the tests need to cut a response after a given byte, which
//! a server library hides.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use sha1::Sha1;
use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/mixtral/hf")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A file of the repository: LFS (named by SHA-256, as the hub keeps
/// weights) or kept in git (named by its blob id).
struct HubFile {
    name: String,
    bytes: Vec<u8>,
    lfs: bool,
}

impl HubFile {
    fn new(name: &str, bytes: Vec<u8>) -> Self {
        HubFile { lfs: name.ends_with(".safetensors"), name: name.to_owned(), bytes }
    }

    fn sha256(&self) -> String {
        hex(&Sha256::digest(&self.bytes))
    }

    fn git_blob_id(&self) -> String {
        let mut hasher = Sha1::new();
        hasher.update(format!("blob {}\0", self.bytes.len()));
        hasher.update(&self.bytes);
        hex(&hasher.finalize())
    }
}

/// The token the stand-in grants a gated repository to.
const GRANTED_TOKEN: &str = "hf_granted";

/// What the hub does besides answering.
#[derive(Default)]
struct Faults {
    /// Files are refused without [`GRANTED_TOKEN`] (401 `GatedRepo` with no
    /// token, 403 with another); the listing stays public, as on the hub.
    gated: bool,
    /// A file answered with this ETag (its `X-Linked-Etag` for an LFS file).
    etag: Option<(String, String)>,
    /// Every file answered with this `X-Repo-Commit`.
    commit: Option<String>,
    /// A file whose body runs on for this many bytes past its size, with no
    /// Content-Length (the connection's end delimits it).
    overlong: Option<(String, usize)>,
    /// Cut the first full download of this file after this many bytes, and
    /// answer 500 to its downloads after that until `down` is cleared.
    cut: Option<(String, usize)>,
    /// A file whose downloads get 500.
    down: Option<String>,
    /// A file served with one byte changed (the metadata keeps its digest).
    corrupt: Option<String>,
}

#[derive(Default)]
struct Log {
    /// Each file request: file name and its Range header.
    requests: Vec<(String, Option<String>)>,
    /// Body bytes sent per file.
    sent_bytes: HashMap<String, usize>,
    /// The Authorization header of every request (`None`: none sent).
    authorizations: Vec<Option<String>>,
    /// Requests that reached the CDN path through a redirect.
    cdn_requests: usize,
}

struct Hub {
    repo: String,
    files: Vec<HubFile>,
    /// Its own address, for the redirects' absolute URLs.
    endpoint: String,
    faults: Mutex<Faults>,
    log: Mutex<Log>,
}

impl Hub {
    /// Serves `files` as `repo` at [`COMMIT`] (also its `main`); returns the
    /// hub and its endpoint.
    fn start(repo: &str, files: Vec<HubFile>) -> (Arc<Hub>, String) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let hub = Arc::new(Hub {
            repo: repo.to_owned(),
            files,
            endpoint: endpoint.clone(),
            faults: Mutex::default(),
            log: Mutex::default(),
        });
        let server = Arc::clone(&hub);
        // Ends with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let hub = Arc::clone(&server);
                std::thread::spawn(move || {
                    let _ = hub.answer(stream);
                });
            }
        });
        (hub, endpoint)
    }

    /// One request per connection (`Connection: close`), as a client must
    /// then expect.
    fn answer(&self, mut stream: TcpStream) -> std::io::Result<()> {
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte)? == 0 || head.len() > 65536 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut lines = head.lines();
        let target = lines.next().and_then(|l| l.split(' ').nth(1)).unwrap_or("/").to_owned();
        let headers: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(':')).collect();
        let header =
            |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_owned());
        let range = header("range");
        let authorization = header("authorization");
        self.log.lock().unwrap().authorizations.push(authorization.clone());
        let path = target.split('?').next().unwrap_or_default();
        if let Some(sha256) = path.strip_prefix("/cdn-lfs/") {
            // The CDN: bytes by digest, its own ETag, none of the hub's headers.
            let Some(file) = self.files.iter().find(|f| f.lfs && f.sha256() == sha256) else {
                return reply(&mut stream, "404 Not Found", &[], b"no such object");
            };
            self.log.lock().unwrap().cdn_requests += 1;
            return self.serve_file(&mut stream, file, range.as_deref(), vec![("etag", "\"cdn-1\"".to_owned())]);
        }
        // The hub's own routes, and its errors as huggingface_hub reads them.
        let error = |code: &str, message: &str| {
            vec![("x-error-code", code.to_owned()), ("x-error-message", message.to_owned())]
        };
        let Some((repo, route)) = path
            .strip_prefix("/api/models/")
            .and_then(|rest| rest.split_once("/revision/").map(|(repo, rev)| (repo, Route::Info(rev))))
            .or_else(|| {
                let (repo, rest) = path.trim_start_matches('/').split_once("/resolve/")?;
                Some((repo, Route::File(rest.split_once('/')?)))
            })
        else {
            return reply(&mut stream, "404 Not Found", &[], b"not found");
        };
        if repo != self.repo {
            // Anonymous: 401, so a private repository is not revealed.
            let status = if authorization.is_some() { "404 Not Found" } else { "401 Unauthorized" };
            return reply(&mut stream, status, &error("RepoNotFound", "Repository Not Found"), b"");
        }
        let revision_ok = |rev: &str| rev == "main" || rev == COMMIT;
        let name = match route {
            Route::Info(rev) | Route::File((rev, _)) if !revision_ok(rev) => {
                return reply(&mut stream, "404 Not Found", &error("RevisionNotFound", "Invalid rev id"), b"");
            }
            Route::Info(_) => {
                return reply(&mut stream, "200 OK", &[("content-type", "application/json".to_owned())], &self.info());
            }
            Route::File((_, name)) => name,
        };
        let Some(file) = self.files.iter().find(|f| f.name == name) else {
            return reply(&mut stream, "404 Not Found", &error("EntryNotFound", "Entry not found"), b"");
        };
        let mut faults = self.faults.lock().unwrap();
        if faults.gated && authorization.as_deref() != Some(&format!("Bearer {GRANTED_TOKEN}")) {
            let status = if authorization.is_some() { "403 Forbidden" } else { "401 Unauthorized" };
            let message =
                format!("Access to model {} is restricted and you are not in the authorized list.", self.repo);
            return reply(&mut stream, status, &error("GatedRepo", &message), b"");
        }
        let etag = match faults.etag.take_if(|(f, _)| *f == file.name) {
            Some((_, etag)) => etag,
            None if file.lfs => format!("\"{}\"", file.sha256()),
            None => format!("\"{}\"", file.git_blob_id()),
        };
        let commit = faults.commit.clone().unwrap_or_else(|| COMMIT.to_owned());
        drop(faults);
        let mut headers = vec![("x-repo-commit", commit)];
        if file.lfs {
            // As the hub does: the pointer's ETag, the object's digest and
            // size in X-Linked-*, and the bytes behind a redirect.
            headers.push(("etag", format!("\"{}\"", file.git_blob_id())));
            headers.push(("x-linked-etag", etag));
            headers.push(("x-linked-size", file.bytes.len().to_string()));
            headers.push(("location", format!("{}/cdn-lfs/{}", self.endpoint, file.sha256())));
            return reply(&mut stream, "302 Found", &headers, b"");
        }
        headers.push(("etag", etag));
        self.serve_file(&mut stream, file, range.as_deref(), headers)
    }

    /// The bytes of `file` (or the Range asked for) with `headers`, and the
    /// faults the test set.
    fn serve_file(
        &self,
        stream: &mut TcpStream,
        file: &HubFile,
        range: Option<&str>,
        mut headers: Vec<(&str, String)>,
    ) -> std::io::Result<()> {
        self.log.lock().unwrap().requests.push((file.name.clone(), range.map(str::to_owned)));
        let mut bytes = file.bytes.clone();
        let mut faults = self.faults.lock().unwrap();
        if faults.corrupt.as_deref() == Some(&file.name) {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
        }
        let total = bytes.len();
        let (start, end) = match range.and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-')) {
            Some((a, b)) => (a.parse::<usize>().unwrap(), b.parse::<usize>().map_or(total, |b| (b + 1).min(total))),
            None => (0, total),
        };
        let whole_rest = end == total;
        if whole_rest && faults.down.as_deref() == Some(&file.name) {
            return reply(stream, "500 Internal Server Error", &[], b"down");
        }
        headers.push(("accept-ranges", "bytes".to_owned()));
        let status = if range.is_some() {
            headers.push(("content-range", format!("bytes {start}-{}/{total}", end - 1)));
            "206 Partial Content"
        } else {
            "200 OK"
        };
        let body = &bytes[start..end];
        if let Some((_, extra)) = faults.overlong.take_if(|(name, _)| *name == file.name) {
            drop(faults);
            return self.send_overlong(stream, status, &headers, file, body, extra);
        }
        if let Some((name, cut)) = faults.cut.take_if(|(name, _)| whole_rest && *name == file.name) {
            // Promise the whole rest, send `cut` bytes, drop the connection;
            // the hub then stays down for this file until the test says.
            faults.down = Some(name);
            drop(faults);
            write_head(stream, status, &headers, Some(body.len()))?;
            stream.write_all(&body[..cut])?;
            *self.log.lock().unwrap().sent_bytes.entry(file.name.clone()).or_default() += cut;
            return stream.shutdown(std::net::Shutdown::Both);
        }
        drop(faults);
        *self.log.lock().unwrap().sent_bytes.entry(file.name.clone()).or_default() += body.len();
        reply(stream, status, &headers, body)
    }

    /// `body`, then `extra` more bytes, with no Content-Length: as much as
    /// the client accepts is counted in `sent_bytes`.
    fn send_overlong(
        &self,
        stream: &mut TcpStream,
        status: &str,
        headers: &[(&str, String)],
        file: &HubFile,
        body: &[u8],
        extra: usize,
    ) -> std::io::Result<()> {
        write_head(stream, status, headers, None)?;
        let junk = vec![0u8; 1 << 16];
        let chunks = std::iter::once(body).chain(std::iter::repeat_n(&junk[..], extra / junk.len()));
        for chunk in chunks {
            stream.write_all(chunk)?;
            *self.log.lock().unwrap().sent_bytes.entry(file.name.clone()).or_default() += chunk.len();
        }
        stream.shutdown(std::net::Shutdown::Both)
    }

    /// `/api/models/ORG/NAME/revision/REV?blobs=true`, as the hub answers it.
    fn info(&self) -> Vec<u8> {
        let siblings: Vec<serde_json::Value> = self
            .files
            .iter()
            .map(|f| {
                let mut sibling =
                    serde_json::json!({ "rfilename": f.name, "blobId": f.git_blob_id(), "size": f.bytes.len() });
                if f.lfs {
                    sibling["lfs"] =
                        serde_json::json!({ "sha256": f.sha256(), "size": f.bytes.len(), "pointerSize": 134 });
                }
                sibling
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({ "id": self.repo, "sha": COMMIT, "siblings": siblings })).unwrap()
    }

    fn sent_bytes(&self, name: &str) -> usize {
        self.log.lock().unwrap().sent_bytes.get(name).copied().unwrap_or(0)
    }

    fn ranges(&self, name: &str) -> Vec<String> {
        self.log.lock().unwrap().requests.iter().filter(|(f, _)| f == name).filter_map(|(_, r)| r.clone()).collect()
    }
}

/// Which of the hub's routes a request is for.
enum Route<'a> {
    /// The listing at a revision.
    Info(&'a str),
    /// A file: revision and name.
    File((&'a str, &'a str)),
}

/// The status line and headers; `length: None` leaves the body to run
/// until the connection closes.
fn write_head(
    stream: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    length: Option<usize>,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    if let Some(length) = length {
        head.push_str(&format!("content-length: {length}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())
}

fn reply(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    write_head(stream, status, headers, Some(body.len()))?;
    stream.write_all(body)?;
    stream.flush()
}

/// The fixture as the hub would hold it: config, generation config and one
/// safetensors file.
fn single_file_repo() -> Vec<HubFile> {
    ["config.json", "generation_config.json", "model.safetensors"]
        .iter()
        .map(|name| HubFile::new(name, std::fs::read(fixture().join(name)).unwrap()))
        .collect()
}

/// The same weights split into two shards and their index, as the hub holds
/// large checkpoints.
fn sharded_repo() -> Vec<HubFile> {
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = tensors.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let half = names.len() / 2;
    let shard_names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
    let mut weight_map = serde_json::Map::new();
    let mut files = vec![];
    for (shard, part) in shard_names.iter().zip([&names[..half], &names[half..]]) {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
            part.iter().map(|n| (n.clone(), tensors.tensor(n).unwrap())).collect();
        for name in part {
            weight_map.insert(name.clone(), (*shard).into());
        }
        files.push(HubFile::new(shard, safetensors::serialize(views, None).unwrap()));
    }
    let index = serde_json::json!({ "metadata": { "total_size": bytes.len() }, "weight_map": weight_map });
    files.push(HubFile::new("model.safetensors.index.json", serde_json::to_vec_pretty(&index).unwrap()));
    for name in ["config.json", "generation_config.json"] {
        files.push(HubFile::new(name, std::fs::read(fixture().join(name)).unwrap()));
    }
    files
}

/// `strata` with the cache in `cache` and the hub at `endpoint`, no token.
fn strata(cache: &Path, endpoint: &str, args: &[&str]) -> Output {
    strata_with_token(cache, endpoint, None, args)
}

/// `strata` with the cache in `cache`, the hub at `endpoint` and `token` in
/// HF_TOKEN.
fn strata_with_token(cache: &Path, endpoint: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strata"));
    command.args(args).arg("--cache-dir").arg(cache).env("HF_ENDPOINT", endpoint).env_remove("HF_TOKEN");
    if let Some(token) = token {
        command.env("HF_TOKEN", token);
    }
    command.output().expect("strata runs")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one line of a failed command.
fn failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected failure, stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

fn generated_tokens(cache: &Path, endpoint: &str, model: &str) -> serde_json::Value {
    let out = strata(
        cache,
        endpoint,
        &["generate", "--model", model, "--tokens", "1,2,3", "--max-new-tokens", "6", "--json", "--temperature", "0"],
    );
    let stdout = ok(&out);
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    last["tokens"].clone()
}

#[test]
fn a_pulled_model_runs_by_name_is_listed_and_removed() {
    let cache = tempfile::tempdir().unwrap();
    let (hub, endpoint) = Hub::start("tiny-org/tiny-mixtral", single_file_repo());
    let not_yet = strata(cache.path(), &endpoint, &["info", "--model", "tiny-org/tiny-mixtral"]);
    assert!(failure(&not_yet).contains("not pulled; run `strata pull tiny-org/tiny-mixtral`"));

    let pulled = ok(&strata(cache.path(), &endpoint, &["pull", "tiny-org/tiny-mixtral"]));
    assert!(pulled.contains("pulled tiny-org/tiny-mixtral@main (commit 0123456789ab): 3 files"), "{pulled}");
    // The closing note's figure: a pull from a hub on this machine.
    eprintln!("{}", pulled.lines().next().unwrap());
    // Every byte once, through the hub's redirect to its CDN.
    assert_eq!(hub.sent_bytes("model.safetensors"), hub.files[2].bytes.len());
    assert_eq!(hub.log.lock().unwrap().cdn_requests, 1);

    let listed = ok(&strata(cache.path(), &endpoint, &["models"]));
    let row = listed.lines().find(|l| l.starts_with("tiny-org/tiny-mixtral")).unwrap_or_else(|| panic!("{listed}"));
    assert!(
        row.contains("main (01234567)") && row.contains("mixtral") && row.contains("q8") && row.ends_with("never"),
        "{row}"
    );

    let info = ok(&strata(cache.path(), &endpoint, &["info", "--model", "tiny-org/tiny-mixtral"]));
    assert!(info.contains("family        mixtral"), "{info}");
    let tokens = generated_tokens(cache.path(), &endpoint, "tiny-org/tiny-mixtral");
    assert!(!tokens.as_array().unwrap().is_empty());
    // The same weights converted from the folder give the same tokens.
    let direct = generated_tokens(cache.path(), &endpoint, fixture().to_str().unwrap());
    assert_eq!(tokens, direct);
    let listed = ok(&strata(cache.path(), &endpoint, &["models"]));
    assert!(listed.lines().any(|l| l.starts_with("tiny-org/tiny-mixtral") && l.ends_with("just now")), "{listed}");

    let removed = ok(&strata(cache.path(), &endpoint, &["rm", "tiny-org/tiny-mixtral"]));
    assert!(removed.starts_with("removed tiny-org/tiny-mixtral (mixtral, "), "{removed}");
    assert!(ok(&strata(cache.path(), &endpoint, &["models"])).starts_with("no models pulled"));
    let gone = strata(cache.path(), &endpoint, &["generate", "--model", "tiny-org/tiny-mixtral", "--tokens", "1"]);
    assert!(failure(&gone).contains("not pulled"));
    assert!(failure(&strata(cache.path(), &endpoint, &["rm", "tiny-org/tiny-mixtral"])).contains("not pulled"));
}

#[test]
fn an_interrupted_download_resumes_with_a_range_request_on_the_next_pull() {
    let cache = tempfile::tempdir().unwrap();
    let (hub, endpoint) = Hub::start("tiny-org/tiny-mixtral", single_file_repo());
    let total = hub.files[2].bytes.len();
    let cut = total / 3;
    hub.faults.lock().unwrap().cut = Some(("model.safetensors".to_owned(), cut));
    let first = failure(&strata(cache.path(), &endpoint, &["pull", "tiny-org/tiny-mixtral"]));
    assert!(first.contains("model.safetensors") && first.contains("500"), "{first}");
    assert!(ok(&strata(cache.path(), &endpoint, &["models"])).starts_with("no models pulled"));

    hub.faults.lock().unwrap().down = None;
    ok(&strata(cache.path(), &endpoint, &["pull", "tiny-org/tiny-mixtral"]));
    assert!(
        hub.ranges("model.safetensors").contains(&format!("bytes={cut}-")),
        "{:?}",
        hub.ranges("model.safetensors")
    );
    // Every byte once.
    assert_eq!(hub.sent_bytes("model.safetensors"), total);
    assert_eq!(generated_tokens(cache.path(), &endpoint, "tiny-org/tiny-mixtral").as_array().unwrap().len(), 6);
}

#[test]
fn a_file_that_does_not_match_the_hubs_sha256_is_refused_and_nothing_is_published() {
    let cache = tempfile::tempdir().unwrap();
    let (hub, endpoint) = Hub::start("tiny-org/tiny-mixtral", single_file_repo());
    hub.faults.lock().unwrap().corrupt = Some("model.safetensors".to_owned());
    let refused = failure(&strata(cache.path(), &endpoint, &["pull", "tiny-org/tiny-mixtral"]));
    let expected = hub.files[2].sha256();
    assert!(
        refused.contains("model.safetensors: SHA-256 is ") && refused.contains(&format!("the hub says {expected}")),
        "{refused}"
    );
    assert!(ok(&strata(cache.path(), &endpoint, &["models"])).starts_with("no models pulled"));
    assert!(!cache.path().join("pulled/tiny-org/tiny-mixtral").exists());
    let not_run = strata(cache.path(), &endpoint, &["generate", "--model", "tiny-org/tiny-mixtral", "--tokens", "1"]);
    assert!(failure(&not_run).contains("not pulled"));

    // The refused file is not kept: once the hub serves it right, a pull
    // fetches it afresh and succeeds.
    hub.faults.lock().unwrap().corrupt = None;
    ok(&strata(cache.path(), &endpoint, &["pull", "tiny-org/tiny-mixtral"]));
}

#[test]
fn a_sharded_checkpoint_is_pulled_and_gives_the_tokens_of_the_single_file_one() {
    let cache = tempfile::tempdir().unwrap();
    let (_sharded_hub, sharded) = Hub::start("tiny-org/tiny-sharded", sharded_repo());
    let pulled = ok(&strata(cache.path(), &sharded, &["pull", "tiny-org/tiny-sharded@main", "--quant", "q8"]));
    assert!(pulled.contains("5 files"), "{pulled}");
    let (_hub, single) = Hub::start("tiny-org/tiny-mixtral", single_file_repo());
    ok(&strata(cache.path(), &single, &["pull", "tiny-org/tiny-mixtral"]));
    assert_eq!(
        generated_tokens(cache.path(), &sharded, "tiny-org/tiny-sharded"),
        generated_tokens(cache.path(), &single, "tiny-org/tiny-mixtral")
    );
    // By commit as well as by branch; another revision is not pulled.
    ok(&strata(cache.path(), &sharded, &["info", "--model", &format!("tiny-org/tiny-sharded@{COMMIT}")]));
    let other = strata(cache.path(), &sharded, &["info", "--model", "tiny-org/tiny-sharded@v2"]);
    assert!(failure(&other).contains("tiny-org/tiny-sharded@v2 is not pulled"));
    let missing = failure(&strata(cache.path(), &sharded, &["pull", "tiny-org/tiny-sharded@v2"]));
    assert!(missing.contains("tiny-org/tiny-sharded has no revision v2 on http://127.0.0.1:"), "{missing}");
    let listed = ok(&strata(cache.path(), &sharded, &["models"]));
    assert_eq!(listed.lines().count(), 3, "{listed}");
}

#[test]
fn the_endpoint_flag_wins_over_hf_endpoint_and_hf_token_is_sent() {
    let cache = tempfile::tempdir().unwrap();
    let (hub, endpoint) = Hub::start("tiny-org/tiny-mixtral", single_file_repo());
    // HF_ENDPOINT names a port nothing listens on: only --endpoint can work.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["pull", "tiny-org/tiny-mixtral", "--endpoint", &endpoint, "--cache-dir"])
        .arg(cache.path())
        .env("HF_ENDPOINT", "http://127.0.0.1:1")
        .env("HF_TOKEN", "hf_test_token")
        .output()
        .unwrap();
    ok(&out);
    let authorizations = hub.log.lock().unwrap().authorizations.clone();
    assert!(!authorizations.is_empty());
    assert!(authorizations.iter().all(|a| a.as_deref() == Some("Bearer hf_test_token")), "{authorizations:?}");
}

const REPO: &str = "tiny-org/tiny-mixtral";

/// Every path under `dir` (files, directories, links; none followed) that
/// is not `inside` or under it.
fn paths_outside(dir: &Path, inside: &Path) -> Vec<PathBuf> {
    let mut outside = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.starts_with(inside) {
            continue;
        }
        if !inside.starts_with(&path) {
            outside.push(path.clone());
        }
        if entry.file_type().unwrap().is_dir() {
            outside.extend(paths_outside(&path, inside));
        }
    }
    outside
}

/// Pulls [`REPO`] from a hub that `hostile` sets up (given the scratch
/// directory, it returns the value the error must name) into a cache five
/// levels down a scratch directory, so that where a `../` of the hub's
/// would lead is still in sight. The pull must fail naming the value, leave
/// nothing outside the cache and keep nothing of the download.
fn refused_inside_the_cache(hostile: impl FnOnce(&mut Faults, &Path) -> String) -> (Arc<Hub>, String) {
    let scratch = tempfile::tempdir().unwrap();
    let cache = scratch.path().join("a/b/c/d/cache");
    std::fs::create_dir_all(&cache).unwrap();
    let (hub, endpoint) = Hub::start(REPO, single_file_repo());
    let bad = hostile(&mut hub.faults.lock().unwrap(), scratch.path());
    let refused = failure(&strata(&cache, &endpoint, &["pull", REPO]));
    assert!(refused.contains(&bad), "{refused}");
    assert_eq!(paths_outside(scratch.path(), &cache), Vec::<PathBuf>::new());
    assert!(!cache.join(".downloads/tiny-org").exists());
    assert!(ok(&strata(&cache, &endpoint, &["models"])).starts_with("no models pulled"));
    (hub, refused)
}

#[test]
fn a_hub_etag_with_dotdot_is_refused_and_nothing_is_written_outside_the_cache() {
    refused_inside_the_cache(|faults, _| {
        faults.etag = Some(("config.json".to_owned(), "\"../../../../../pwned_rel\"".to_owned()));
        "../../../../../pwned_rel".to_owned()
    });
}

#[test]
fn an_absolute_hub_etag_is_refused_and_nothing_is_written_outside_the_cache() {
    refused_inside_the_cache(|faults, scratch| {
        let target = scratch.join("pwned_abs").display().to_string();
        faults.etag = Some(("model.safetensors".to_owned(), format!("\"{target}\"")));
        target
    });
}

#[test]
fn an_x_repo_commit_with_dotdot_is_refused_and_nothing_is_written_outside_the_cache() {
    refused_inside_the_cache(|faults, _| {
        faults.commit = Some("../../../../../pwned_commit".to_owned());
        "../../../../../pwned_commit".to_owned()
    });
}

#[test]
fn a_body_longer_than_the_listed_size_is_stopped_at_that_size() {
    let extra = 64 << 20;
    let (hub, refused) = refused_inside_the_cache(|faults, _| {
        faults.overlong = Some(("model.safetensors".to_owned(), extra));
        "model.safetensors".to_owned()
    });
    let size = hub.files[2].bytes.len();
    assert!(refused.contains(&format!("than the {size} bytes its listing declares")), "{refused}");
    // The client stopped reading there: the socket's buffers hold the rest
    // of what the hub managed to write, far from all of it.
    assert!(hub.sent_bytes("model.safetensors") < size + extra / 2, "{}", hub.sent_bytes("model.safetensors"));
}

#[test]
fn a_missing_repository_is_not_found_or_private_not_a_token_problem() {
    let cache = tempfile::tempdir().unwrap();
    let (_hub, endpoint) = Hub::start(REPO, single_file_repo());
    // Anonymous: the hub answers 401 RepoNotFound, as for a private one.
    let anonymous = failure(&strata(cache.path(), &endpoint, &["pull", "tiny-org/no-such-model"]));
    assert!(
        anonymous.contains(&format!(
            "no repository tiny-org/no-such-model on {endpoint} (HTTP 401): not found (or private: set HF_TOKEN"
        )),
        "{anonymous}"
    );
    let with_token =
        failure(&strata_with_token(cache.path(), &endpoint, Some("hf_other"), &["pull", "tiny-org/no-such-model"]));
    assert!(with_token.contains("that HF_TOKEN can read (HTTP 404)"), "{with_token}");
    assert!(!cache.path().join(".downloads/tiny-org").exists());
}

#[test]
fn a_gated_repository_says_to_accept_its_terms_and_set_hf_token() {
    let cache = tempfile::tempdir().unwrap();
    let (hub, endpoint) = Hub::start(REPO, single_file_repo());
    hub.faults.lock().unwrap().gated = true;
    let anonymous = failure(&strata(cache.path(), &endpoint, &["pull", REPO]));
    assert!(
        anonymous
            .contains(&format!("{REPO} is gated (HTTP 401): accept its terms at {endpoint}/{REPO}, then set HF_TOKEN")),
        "{anonymous}"
    );
    assert!(!anonymous.contains("resume"), "{anonymous}");
    assert!(!cache.path().join(".downloads/tiny-org").exists());

    let not_granted = failure(&strata_with_token(cache.path(), &endpoint, Some("hf_other"), &["pull", REPO]));
    assert!(not_granted.contains("is gated and HF_TOKEN's account has no access to it (HTTP 403)"), "{not_granted}");
    ok(&strata_with_token(cache.path(), &endpoint, Some(GRANTED_TOKEN), &["pull", REPO]));
}

#[test]
fn an_unsupported_architecture_is_refused_after_config_json_and_nothing_is_kept() {
    let cache = tempfile::tempdir().unwrap();
    let mut files = single_file_repo();
    let mut config: serde_json::Value = serde_json::from_slice(&files[0].bytes).unwrap();
    config["model_type"] = "llama".into();
    config["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    files[0] = HubFile::new("config.json", serde_json::to_vec(&config).unwrap());
    let (hub, endpoint) = Hub::start(REPO, files);
    let refused = failure(&strata(cache.path(), &endpoint, &["pull", REPO]));
    assert!(refused.contains("\"llama\"") && refused.contains("nothing beyond config.json"), "{refused}");
    let requested: Vec<String> = hub.log.lock().unwrap().requests.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(requested, ["config.json"]);
    assert!(!cache.path().join(".downloads/tiny-org").exists());
}

#[test]
fn a_config_key_the_family_does_not_know_is_refused_after_config_json_unless_allowed() {
    let cache = tempfile::tempdir().unwrap();
    let mut files = single_file_repo();
    let mut config: serde_json::Value = serde_json::from_slice(&files[0].bytes).unwrap();
    config["attn_logit_softcapping"] = 30.into();
    files[0] = HubFile::new("config.json", serde_json::to_vec(&config).unwrap());
    let (hub, endpoint) = Hub::start(REPO, files);
    let refused = failure(&strata(cache.path(), &endpoint, &["pull", REPO]));
    assert!(
        refused.contains("does not know attn_logit_softcapping") && refused.contains("nothing beyond config.json"),
        "{refused}"
    );
    assert!(!refused.contains("config.json: config.json"), "the file is named once: {refused}");
    let requested: Vec<String> = hub.log.lock().unwrap().requests.iter().map(|(f, _)| f.clone()).collect();
    assert_eq!(requested, ["config.json"]);
    ok(&strata(cache.path(), &endpoint, &["pull", REPO, "--allow-unknown-config", "attn_logit_softcapping"]));
}

#[test]
fn a_partial_download_is_shown_by_models_and_removed_by_rm() {
    let cache = tempfile::tempdir().unwrap();
    let (hub, endpoint) = Hub::start(REPO, single_file_repo());
    hub.faults.lock().unwrap().cut = Some(("model.safetensors".to_owned(), hub.files[2].bytes.len() / 3));
    failure(&strata(cache.path(), &endpoint, &["pull", REPO]));
    let listed = strata(cache.path(), &endpoint, &["models"]);
    assert!(ok(&listed).starts_with("no models pulled"));
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(stderr.contains(&format!("{REPO}: a partial download of ")), "{stderr}");
    let removed = ok(&strata(cache.path(), &endpoint, &["rm", REPO]));
    assert!(removed.starts_with(&format!("removed a partial download of {REPO} (")), "{removed}");
    assert!(!cache.path().join(".downloads/tiny-org").exists());
    assert!(failure(&strata(cache.path(), &endpoint, &["rm", REPO])).contains("not pulled"));
}
