//! `strata pull`, `models` and `rm` against a hub in this process: a small
//! HTTP server on 127.0.0.1 answering as huggingface.co does (the repository
//! description under `/api/models/…/revision/…`, files under
//! `/…/resolve/…` with the commit, etag and linked-etag headers and Range
//! requests), serving a fixture checkpoint. Hand-written on std's
//! TcpListener rather than a server crate: the tests need to cut a response
//! after a given byte, which a server library hides.

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

/// What the hub does besides answering.
#[derive(Default)]
struct Faults {
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
}

struct Hub {
    repo: String,
    files: Vec<HubFile>,
    faults: Mutex<Faults>,
    log: Mutex<Log>,
}

impl Hub {
    /// Serves `files` as `repo` at [`COMMIT`] (also its `main`); returns the
    /// hub and its endpoint.
    fn start(repo: &str, files: Vec<HubFile>) -> (Arc<Hub>, String) {
        let hub = Arc::new(Hub { repo: repo.to_owned(), files, faults: Mutex::default(), log: Mutex::default() });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
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
        self.log.lock().unwrap().authorizations.push(header("authorization"));
        let path = target.split('?').next().unwrap_or_default();
        let revision_ok = |rev: &str| rev == "main" || rev == COMMIT;
        if let Some(rev) = path.strip_prefix(&format!("/api/models/{}/revision/", self.repo)) {
            if !revision_ok(rev) {
                return reply(&mut stream, "404 Not Found", &[], b"{\"error\":\"Revision Not Found\"}");
            }
            return reply(&mut stream, "200 OK", &[("content-type", "application/json".to_owned())], &self.info());
        }
        let file = path.strip_prefix(&format!("/{}/resolve/", self.repo)).and_then(|rest| rest.split_once('/'));
        let Some((_, name)) = file.filter(|(rev, _)| revision_ok(rev)) else {
            return reply(&mut stream, "404 Not Found", &[], b"not found");
        };
        let Some(file) = self.files.iter().find(|f| f.name == name) else {
            return reply(&mut stream, "404 Not Found", &[], b"entry not found");
        };
        self.log.lock().unwrap().requests.push((name.to_owned(), range.clone()));
        self.serve_file(&mut stream, file, range.as_deref())
    }

    fn serve_file(&self, stream: &mut TcpStream, file: &HubFile, range: Option<&str>) -> std::io::Result<()> {
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
        let mut headers = vec![
            ("x-repo-commit", COMMIT.to_owned()),
            ("etag", format!("\"{}\"", file.git_blob_id())),
            ("accept-ranges", "bytes".to_owned()),
        ];
        if file.lfs {
            headers.push(("x-linked-etag", format!("\"{}\"", file.sha256())));
            headers.push(("x-linked-size", total.to_string()));
        }
        let status = if range.is_some() {
            headers.push(("content-range", format!("bytes {start}-{}/{total}", end - 1)));
            "206 Partial Content"
        } else {
            "200 OK"
        };
        let body = &bytes[start..end];
        if let Some((name, cut)) = faults.cut.take_if(|(name, _)| whole_rest && *name == file.name) {
            // Promise the whole rest, send `cut` bytes, drop the connection;
            // the hub then stays down for this file until the test says.
            faults.down = Some(name);
            drop(faults);
            write_head(stream, status, &headers, body.len())?;
            stream.write_all(&body[..cut])?;
            *self.log.lock().unwrap().sent_bytes.entry(file.name.clone()).or_default() += cut;
            return stream.shutdown(std::net::Shutdown::Both);
        }
        drop(faults);
        *self.log.lock().unwrap().sent_bytes.entry(file.name.clone()).or_default() += body.len();
        reply(stream, status, &headers, body)
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

fn write_head(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], length: usize) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {length}\r\nconnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())
}

fn reply(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) -> std::io::Result<()> {
    write_head(stream, status, headers, body.len())?;
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

/// `strata` with the cache in `cache` and the hub at `endpoint`.
fn strata(cache: &Path, endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_TOKEN")
        .output()
        .expect("strata runs")
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
    let probes = hub.ranges("model.safetensors").iter().filter(|r| *r == "bytes=0-0").count();
    assert_eq!(hub.sent_bytes("model.safetensors"), hub.files[2].bytes.len() + probes);

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
    // Every byte once, plus one per `bytes=0-0` probe of the file's headers.
    let probes = hub.ranges("model.safetensors").iter().filter(|r| *r == "bytes=0-0").count();
    assert_eq!(hub.sent_bytes("model.safetensors"), total + probes);
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
    assert!(missing.contains("no repository tiny-org/tiny-sharded@v2 on http://127.0.0.1:"), "{missing}");
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
