//! The hub's HTTP protocol, spoken with ureq (blocking: no async runtime):
//! the repository listing, and files fetched by commit with a Range request
//! that resumes a `.part` file. Redirects are followed here rather than by
//! ureq, because the hub's own headers (commit, ETag) are on its first
//! answer while the bytes of a weight file sit behind a 302 to a CDN, and
//! the token goes only to the hub itself. The hub's error codes are told
//! apart, its headers are checked before a byte is written, and no download
//! goes past the size the listing declares.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::ModelName;
use super::names::{self, quoted_for_error};
use crate::{Error, Result};

/// Redirects followed per request (the hub uses one: to its CDN).
const REDIRECTS_MAX: usize = 5;
/// Tries per file after a dropped connection or a 5xx, each resuming where
/// the last stopped, after a wait that doubles from [`RETRY_WAIT_FIRST`].
const DOWNLOAD_RETRIES: u32 = 3;
const RETRY_WAIT_FIRST: Duration = Duration::from_millis(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection that sends nothing for this long is dropped (and resumed).
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// What is shown of the hub's `X-Error-Message`.
const HUB_MESSAGE_CHARS_MAX: usize = 200;
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// One hub: its address, and the token sent to it.
pub(super) struct HubClient {
    agent: ureq::Agent,
    /// Without a trailing slash.
    endpoint: String,
    token: Option<String>,
    progress: bool,
}

/// What a request is for, to say so when it fails.
pub(super) struct Target<'a> {
    pub name: &'a ModelName,
    /// The revision or commit asked for.
    pub revision: &'a str,
    /// `None`: the repository's listing.
    pub file: Option<&'a str>,
}

/// A file to fetch, and what its listing says of it.
pub(super) struct FileRequest<'a> {
    pub name: &'a ModelName,
    /// The commit every file is fetched at (40 hex digits).
    pub commit: &'a str,
    /// Its name in the repository (checked by [`names::is_repo_file_name`]).
    pub file: &'a str,
    pub size_bytes: u64,
    /// The digest the listing gives (lower-case hex: SHA-256 for an LFS
    /// file, the git blob id otherwise), which the hub's ETag must name.
    pub digest_hex: &'a str,
}

/// The headers the hub itself sets on a file (on its first answer, before
/// any redirect to a CDN).
#[derive(Debug, Default, Clone)]
pub struct HubHeaders {
    /// `X-Repo-Commit`.
    pub commit: Option<String>,
    /// `X-Linked-Etag` of an LFS file, else `ETag`.
    pub etag: Option<String>,
    /// `X-Linked-Size`.
    pub linked_size: Option<String>,
}

impl HubHeaders {
    fn of(response: &ureq::Response) -> Self {
        let header = |name: &str| response.header(name).map(str::to_owned);
        HubHeaders {
            commit: header("x-repo-commit"),
            etag: header("x-linked-etag").or_else(|| header("etag")),
            linked_size: header("x-linked-size"),
        }
    }
}

/// How a request failed.
enum Failure {
    /// Worth another try that resumes: a dropped connection, a 5xx, a 429.
    Transient(String),
    /// Final: the hub refused, or answered what a pull must not use.
    Final(Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Final(error)
    }
}

impl HubClient {
    pub(super) fn new(endpoint: &str, token: Option<String>, progress: bool) -> Self {
        let agent = ureq::AgentBuilder::new()
            .try_proxy_from_env(true)
            .redirects(0)
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout_read(READ_TIMEOUT)
            .user_agent(concat!("strata/", env!("CARGO_PKG_VERSION")))
            .build();
        HubClient { agent, endpoint: endpoint.trim_end_matches('/').to_owned(), token, progress }
    }

    pub(super) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The listing of `name` at `revision` (`/api/models/ORG/NAME/revision/REV?blobs=true`),
    /// its body read up to `bytes_max` (`None`: longer).
    pub(super) fn repo_info(&self, name: &ModelName, revision: &str, bytes_max: u64) -> Result<Option<Vec<u8>>> {
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.endpoint,
            percent_encode(&name.repo, true),
            percent_encode(revision, false)
        );
        let target = Target { name, revision, file: None };
        let what = || format!("reading its file list from {}", self.endpoint);
        let transfer = |reason: String| Error::HubTransfer { name: name.to_string(), what: what(), reason };
        let (_, response) = self.get(&url, None, &target).map_err(|failure| match failure {
            Failure::Transient(reason) => transfer(reason),
            Failure::Final(error) => error,
        })?;
        let mut body = Vec::new();
        response
            .into_reader()
            .take(bytes_max.saturating_add(1))
            .read_to_end(&mut body)
            .map_err(|e| transfer(e.to_string()))?;
        Ok((body.len() as u64 <= bytes_max).then_some(body))
    }

    /// Fetches `request`'s file into `part`, resuming from what `part`
    /// holds; retries a dropped connection. On success `part` holds exactly
    /// the listing's size in bytes (whose digest the caller checks).
    pub(super) fn download(&self, request: &FileRequest<'_>, part: &Path) -> Result<()> {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint,
            percent_encode(&request.name.repo, true),
            request.commit,
            percent_encode(request.file, true)
        );
        let bar = self.progress_bar(request);
        let mut reason = String::new();
        for attempt in 0..=DOWNLOAD_RETRIES {
            if attempt > 0 {
                std::thread::sleep(RETRY_WAIT_FIRST * 2u32.pow(attempt - 1));
            }
            match self.download_once(request, &url, part, &bar) {
                Ok(()) => {
                    bar.finish_and_clear();
                    return Ok(());
                }
                Err(Failure::Transient(why)) => reason = why,
                Err(Failure::Final(error)) => {
                    bar.abandon();
                    return Err(error);
                }
            }
        }
        bar.abandon();
        Err(Error::HubTransfer {
            name: request.name.to_string(),
            what: format!("fetching {} (what arrived is kept: pull again to resume)", request.file),
            reason,
        })
    }

    fn download_once(
        &self,
        request: &FileRequest<'_>,
        url: &str,
        part: &Path,
        bar: &ProgressBar,
    ) -> std::result::Result<(), Failure> {
        let io = |e| Error::Io { path: part.to_path_buf(), source: e };
        let mut file = fs::OpenOptions::new().create(true).truncate(false).write(true).open(part).map_err(io)?;
        let mut start = file.metadata().map_err(io)?.len();
        if start > request.size_bytes {
            // Longer than the file: not a prefix of it.
            file.set_len(0).map_err(io)?;
            start = 0;
        }
        if start == request.size_bytes {
            return Ok(());
        }
        let target = Target { name: request.name, revision: request.commit, file: Some(request.file) };
        let (hub_headers, response) = self.get(url, Some(&format!("bytes={start}-")), &target)?;
        check_hub_headers(&hub_headers, request)?;
        let metadata = |reason: String| Error::HubMetadata { name: request.name.to_string(), reason };
        let offset = match response.status() {
            206 => {
                let content_range = response.header("content-range").unwrap_or_default();
                let expected = format!("bytes {start}-");
                let total = content_range.rsplit('/').next().unwrap_or_default();
                if !content_range.starts_with(&expected) || (total != "*" && total != request.size_bytes.to_string()) {
                    return Err(metadata(format!(
                        "the hub answered a request for {} from byte {start} with Content-Range {}, not that part of its {} bytes",
                        request.file,
                        quoted_for_error(content_range, HUB_MESSAGE_CHARS_MAX),
                        request.size_bytes
                    ))
                    .into());
                }
                start
            }
            // The whole file despite the Range: it replaces what was kept.
            200 => 0,
            status => return Err(metadata(format!("the hub answered {} with HTTP {status}", request.file)).into()),
        };
        let remaining_bytes = request.size_bytes - offset;
        let too_long = || {
            let _ = fs::remove_file(part);
            metadata(format!(
                "the hub sent more of {} than the {} bytes its listing declares: stopped there, and removed what arrived",
                request.file, request.size_bytes
            ))
        };
        if response
            .header("content-length")
            .and_then(|l| l.trim().parse::<u64>().ok())
            .is_some_and(|l| l > remaining_bytes)
        {
            return Err(too_long().into());
        }
        file.set_len(offset).map_err(io)?;
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        bar.set_position(offset);
        // One byte past the declared size is enough to know the hub sends
        // too much; nothing past it is read or written.
        let mut body = response.into_reader().take(remaining_bytes.saturating_add(1));
        let mut buf = vec![0u8; COPY_BUFFER_BYTES];
        let mut written_bytes = 0u64;
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Failure::Transient(format!(
                        "the connection broke after {} of {} bytes: {e}",
                        offset + written_bytes,
                        request.size_bytes
                    )));
                }
            };
            if written_bytes + n as u64 > remaining_bytes {
                return Err(too_long().into());
            }
            file.write_all(&buf[..n]).map_err(io)?;
            written_bytes += n as u64;
            bar.inc(n as u64);
        }
        if written_bytes < remaining_bytes {
            return Err(Failure::Transient(format!(
                "the transfer ended after {} of {} bytes",
                offset + written_bytes,
                request.size_bytes
            )));
        }
        Ok(())
    }

    /// GET `url`, following redirects; the hub's headers come from its
    /// first answer. The token goes only to the endpoint's own origin, as
    /// Hugging Face's clients do (a CDN is another party).
    fn get(
        &self,
        url: &str,
        range: Option<&str>,
        target: &Target<'_>,
    ) -> std::result::Result<(HubHeaders, ureq::Response), Failure> {
        let mut url = url.to_owned();
        let mut hub_headers = None;
        for _ in 0..=REDIRECTS_MAX {
            let mut request = self.agent.get(&url);
            if let Some(range) = range {
                request = request.set("Range", range);
            }
            if let Some(token) = &self.token
                && origin(&url) == origin(&self.endpoint)
            {
                request = request.set("Authorization", &format!("Bearer {token}"));
            }
            let response = match request.call() {
                Ok(response) => response,
                Err(ureq::Error::Status(status, _)) if status == 429 || status >= 500 => {
                    return Err(Failure::Transient(format!("HTTP {status} from {url}")));
                }
                Err(ureq::Error::Status(status, response)) => {
                    return Err(self.refusal(status, &response, target).into());
                }
                Err(ureq::Error::Transport(transport)) => return Err(Failure::Transient(transport.to_string())),
            };
            let hub_headers = hub_headers.get_or_insert_with(|| HubHeaders::of(&response));
            if !(300..400).contains(&response.status()) {
                return Ok((std::mem::take(hub_headers), response));
            }
            url =
                response.header("location").and_then(|location| redirect_target(&url, location)).ok_or_else(|| {
                    Error::HubMetadata {
                        name: target.name.to_string(),
                        reason: format!("{url} answered HTTP {} with no usable Location", response.status()),
                    }
                })?;
        }
        Err(Error::HubMetadata {
            name: target.name.to_string(),
            reason: format!("more than {REDIRECTS_MAX} redirects"),
        }
        .into())
    }

    /// What a 4xx answer means, from the hub's `X-Error-Code` (the codes
    /// huggingface_hub reads) or else its status, and what to do about it.
    fn refusal(&self, status: u16, response: &ureq::Response, target: &Target<'_>) -> Error {
        let endpoint = &self.endpoint;
        let repo = &target.name.repo;
        let revision = target.revision;
        let token = self.token.is_some();
        let file = target.file.unwrap_or("the file list");
        let page = format!("{endpoint}/{repo}");
        let mut reason = match (response.header("x-error-code").unwrap_or_default(), status) {
            ("RepoNotFound", _) if token => format!(
                "no repository {repo} on {endpoint} that HF_TOKEN can read (HTTP {status}): check the name, or the token's access"
            ),
            ("RepoNotFound", _) => format!(
                "no repository {repo} on {endpoint} (HTTP {status}): not found (or private: set HF_TOKEN to a token that can read it)"
            ),
            ("GatedRepo", _) if token => format!(
                "{repo} is gated and HF_TOKEN's account has no access to it (HTTP {status}): accept its terms at {page} with that account"
            ),
            ("GatedRepo", _) => format!(
                "{repo} is gated (HTTP {status}): accept its terms at {page}, then set HF_TOKEN to a token of that account"
            ),
            ("RevisionNotFound", _) => {
                format!(
                    "{repo} has no revision {revision} on {endpoint} (HTTP {status}): check the branch, tag or commit"
                )
            }
            ("EntryNotFound", _) => format!("{file} is not in {repo} at {revision} on {endpoint} (HTTP {status})"),
            (_, 401 | 403) => format!(
                "{endpoint} refused access to {repo} (HTTP {status}): a private or gated repository needs a token with access in HF_TOKEN"
            ),
            (_, 404) if target.file.is_some() => {
                format!("{file} is not in {repo} at {revision} on {endpoint} (HTTP 404)")
            }
            (_, 404) => {
                format!("no repository {} on {endpoint} (HTTP 404): check the name and the revision", target.name)
            }
            _ => format!("{endpoint} answered HTTP {status} for {file}"),
        };
        if let Some(message) = response.header("x-error-message") {
            reason.push_str(&format!("; the hub says {}", quoted_for_error(message, HUB_MESSAGE_CHARS_MAX)));
        }
        Error::HubRefused { name: target.name.to_string(), reason }
    }

    fn progress_bar(&self, request: &FileRequest<'_>) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(request.size_bytes);
        if let Ok(style) = ProgressStyle::with_template(
            "{msg:>30} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
        ) {
            bar.set_style(style);
        }
        bar.set_message(request.file.to_owned());
        bar
    }
}

/// The hub's headers on a file agree with its listing: the commit asked
/// for, the digest listed, the size listed. Checked before a byte is
/// written, and naming the value when not.
pub(super) fn check_hub_headers(headers: &HubHeaders, request: &FileRequest<'_>) -> Result<()> {
    let refuse = |reason: String| Err(Error::HubMetadata { name: request.name.to_string(), reason });
    let file = request.file;
    let quoted = |value: &str| quoted_for_error(value, HUB_MESSAGE_CHARS_MAX);
    if let Some(commit) = &headers.commit
        && !commit.eq_ignore_ascii_case(request.commit)
    {
        return refuse(format!(
            "the hub answered {file} with X-Repo-Commit {}, not the commit {} asked for",
            quoted(commit),
            request.commit
        ));
    }
    if let Some(etag) = &headers.etag {
        match names::etag_digest(etag, request.digest_hex.len()) {
            None => {
                return refuse(format!(
                    "the hub's ETag {} for {file} is not a digest of {} hex digits",
                    quoted(etag),
                    request.digest_hex.len()
                ));
            }
            Some(digest) if digest != request.digest_hex => {
                return refuse(format!(
                    "the hub's ETag for {file} names {digest}, but its file list {}",
                    request.digest_hex
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(size) = &headers.linked_size
        && size.trim() != request.size_bytes.to_string()
    {
        return refuse(format!(
            "the hub's X-Linked-Size {} for {file} is not the {} bytes of its file list",
            quoted(size),
            request.size_bytes
        ));
    }
    Ok(())
}

/// `scheme://host[:port]` of an absolute URL.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    url[after_scheme..].find('/').map_or(url, |i| &url[..after_scheme + i])
}

/// Where a redirect from `url` leads: an absolute `http(s)` URL, or a path
/// on `url`'s origin.
fn redirect_target(url: &str, location: &str) -> Option<String> {
    if location.starts_with("https://") || location.starts_with("http://") {
        Some(location.to_owned())
    } else if location.starts_with('/') && !location.starts_with("//") {
        Some(format!("{}{location}", origin(url)))
    } else {
        None
    }
}

/// `text` as a URL path: every byte but unreserved ones (and `/`, when
/// `keep_slash`) percent-encoded.
fn percent_encode(text: &str, keep_slash: bool) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) || (keep_slash && byte == b'/') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_stays_a_url_and_the_token_follows_only_the_hubs_origin() {
        assert_eq!(origin("https://huggingface.co/a/resolve/x/f"), "https://huggingface.co");
        assert_eq!(origin("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(
            redirect_target("http://127.0.0.1:8080/a/resolve/x/f", "/cdn/abc").as_deref(),
            Some("http://127.0.0.1:8080/cdn/abc")
        );
        assert_eq!(
            redirect_target("https://huggingface.co/x", "https://cdn-lfs.hf.co/y").as_deref(),
            Some("https://cdn-lfs.hf.co/y")
        );
        for bad in ["//evil.example/x", "file:///etc/passwd", "relative/path"] {
            assert_eq!(redirect_target("https://huggingface.co/x", bad), None, "{bad}");
        }
    }

    #[test]
    fn a_revision_with_a_slash_is_one_path_segment() {
        assert_eq!(percent_encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(percent_encode("org/a b#.json", true), "org/a%20b%23.json");
    }
}
