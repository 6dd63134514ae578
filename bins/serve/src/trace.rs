//! A request's span: an id (the client's `X-Request-Id` when it sends a
//! usable one, else a fresh one) returned in the response's `X-Request-Id`
//! and on every log line written while the request is handled or its body
//! streamed, ending with one line of its status and duration.

use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use tracing::Instrument as _;

/// The header that carries a request's id, both ways.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client-sent id kept; a longer one is replaced.
const CLIENT_ID_MAX_BYTES: usize = 64;

tokio::task_local! {
    /// The id of the request a handler runs for: the batcher names its
    /// jobs by it on its own thread, outside the request's span.
    static HANDLED_ID: String;
}

/// The id of the request being handled, `None` outside a request's task.
pub fn request_id() -> Option<String> {
    HANDLED_ID.try_with(String::clone).ok()
}

/// Runs the request inside its span and logs its end.
pub async fn trace_request(request: Request, next: Next) -> Response {
    let id = request.headers().get(&REQUEST_ID).and_then(client_id).unwrap_or_else(fresh_id);
    let span = tracing::info_span!("request", id = %id, method = %request.method(), path = %request.uri().path());
    // Polled every second by the page and by load balancers: their lines
    // would bury the API's.
    let polled = matches!(request.uri().path(), "/health" | "/metrics" | "/info");
    let started = Instant::now();
    let mut response = HANDLED_ID.scope(id.clone(), next.run(request)).instrument(span.clone()).await;
    // The id is made of header-safe characters (see `client_id`, `fresh_id`).
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status();
    response.map(|body| Body::new(Traced { body, end: End { span, started, status, polled } }))
}

/// A client's id, if it is one a log line can carry as it is: up to 64
/// letters, digits, `-`, `_`, `.` (a UUID, a proxy's id).
fn client_id(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    let usable = !text.is_empty()
        && text.len() <= CLIENT_ID_MAX_BYTES
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    usable.then(|| text.to_owned())
}

/// 16 hex digits, distinct for each request of this process and unlike
/// those of another run (the counter hashed with a per-process key).
fn fresh_id() -> String {
    static KEY: OnceLock<std::hash::RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", KEY.get_or_init(std::hash::RandomState::new).hash_one(n))
}

/// A response body polled inside its request's span (a stream's events are
/// logged as the request's), which logs the request's end when it is
/// dropped: sent whole, or abandoned by a client that went away.
struct Traced {
    body: Body,
    end: End,
}

impl axum::body::HttpBody for Traced {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let _entered = this.end.span.enter();
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

struct End {
    span: tracing::Span,
    started: Instant,
    status: StatusCode,
    /// Logged at debug.
    polled: bool,
}

impl Drop for End {
    fn drop(&mut self) {
        let duration_ms = self.started.elapsed().as_secs_f64() * 1e3;
        let status = self.status.as_u16();
        self.span.in_scope(|| {
            if self.polled {
                tracing::debug!(status, duration_ms, "done");
            } else {
                tracing::info!(status, duration_ms, "done");
            }
        });
    }
}
