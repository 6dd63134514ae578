//! The router: routes, the guards every request passes (Host allowlist, API
//! key, CORS, body limit), and the small endpoints (`/health`, `/metrics`,
//! `/info`, the chat page).

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::error::{ApiError, Style};
use crate::state::SharedApp;
use crate::{anthropic, openai, page, trace};

/// The server's routes and guards.
pub fn router(app: SharedApp, max_body_bytes: usize, cors_origins: &[String]) -> anyhow::Result<Router> {
    let mut router = Router::new()
        .route("/", get(page::index))
        .route("/app.js", get(page::script))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/info", get(info))
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{id}", get(openai::get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(from_fn_with_state(app.clone(), require_key));
    if !cors_origins.is_empty() {
        router = router.layer(cors(cors_origins)?);
    }
    // A request for a host we do not answer to gets nothing else; but its
    // id and log line, outermost.
    Ok(router.layer(from_fn_with_state(app.clone(), check_host)).layer(from_fn(trace::trace_request)).with_state(app))
}

fn cors(origins: &[String]) -> anyhow::Result<CorsLayer> {
    let allow_origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| HeaderValue::from_str(o).map_err(|_| anyhow::anyhow!("--cors-origin {o:?} is not a valid origin")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(CorsLayer::new().allow_origin(allow_origin).allow_methods([Method::GET, Method::POST]).allow_headers([
        header::AUTHORIZATION,
        header::CONTENT_TYPE,
        header::HeaderName::from_static("x-api-key"),
        header::HeaderName::from_static("anthropic-version"),
    ]))
}

/// Whether a Host header names this server. DNS rebinding points a name
/// the attacker controls at 127.0.0.1, so the browser sends that name:
/// refusing names we were not told about defeats it. IP literals cannot be
/// rebound, and `localhost` is ours.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').is_some_and(|(ip, port)| {
            ip.parse::<Ipv6Addr>().is_ok() && (port.is_empty() || port.strip_prefix(':').is_some_and(is_port))
        });
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return false,
        None => host,
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name.parse::<Ipv4Addr>().is_ok() || name == "localhost" || name.ends_with(".localhost") || allowed.contains(&name)
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

async fn check_host(State(app): State<SharedApp>, request: Request, next: Next) -> Response {
    // HTTP/1.1 and browsers always send Host; HTTP/2 sends :authority,
    // which hyper exposes as the URI's authority.
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok().map(str::to_owned))
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    if let Some(host) = host
        && !host_allowed(&host, &app.allowed_hosts)
    {
        let style = Style::for_path(request.uri().path());
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!("the Host `{host}` is not allowed; start serve with --allowed-host to accept it"),
        )
        .code("host_not_allowed")
        .style(style)
        .into_response();
    }
    next.run(request).await
}

/// Paths open without the API key: the chat page (a browser cannot send a
/// header when it navigates; the page asks for the key itself) and the
/// health check (load balancers).
fn is_open(path: &str) -> bool {
    matches!(path, "/" | "/app.js" | "/health")
}

async fn require_key(State(app): State<SharedApp>, request: Request, next: Next) -> Response {
    let Some(key) = &app.api_key else { return next.run(request).await };
    if request.method() == Method::OPTIONS || is_open(request.uri().path()) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")));
    // Anthropic's clients send the key as `x-api-key`.
    let x_api_key = headers.get("x-api-key").and_then(|h| h.to_str().ok());
    let given = bearer.or(x_api_key);
    if given.is_some_and(|g| same(g.trim().as_bytes(), key.as_bytes())) {
        return next.run(request).await;
    }
    let message = if given.is_some() {
        "incorrect API key provided"
    } else {
        "this server needs an API key: send `Authorization: Bearer KEY`"
    };
    ApiError::new(StatusCode::UNAUTHORIZED, message)
        .code("invalid_api_key")
        .style(Style::for_path(request.uri().path()))
        .into_response()
}

/// Equality in time independent of where the inputs differ, so the key
/// cannot be guessed a byte at a time from response times.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path().to_owned();
    ApiError::new(StatusCode::NOT_FOUND, format!("no route for {} {path}", request.method()))
        .code("not_found")
        .style(Style::for_path(&path))
        .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    let path = request.uri().path().to_owned();
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{} is not allowed on {path}", request.method()))
        .style(Style::for_path(&path))
        .into_response()
}

async fn health(State(app): State<SharedApp>) -> Response {
    if app.batcher.is_running() {
        Json(json!({ "status": "ok", "model": app.model_name })).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "status": "stopped", "model": app.model_name }))).into_response()
    }
}

async fn metrics(State(app): State<SharedApp>) -> Response {
    let text = app.metrics.render(
        app.batcher.queue_depth() as u64,
        app.batcher.queue_capacity() as u64,
        app.info.expert_cache_bytes,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The model, the limits and live counters, for the chat page's panel.
async fn info(State(app): State<SharedApp>) -> Response {
    Json(json!({
        "model": app.model_name,
        "version": env!("CARGO_PKG_VERSION"),
        "info": app.info,
        "limits": {
            "max_batch": app.max_batch,
            "queue": app.batcher.queue_capacity(),
            "context_tokens": app.context_tokens,
            "max_tokens": app.max_tokens_limit,
        },
        "defaults": app.defaults,
        "chat_template": app.template.is_some(),
        "live": app.metrics.live(app.batcher.queue_depth() as u64),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_checked_against_rebinding() {
        let allowed = vec!["my.box".to_owned()];
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "10.0.0.2",
            "[::1]:8080",
            "[::1]",
            "my.box:80",
            "MY.BOX",
            "app.localhost:1",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "[::1",
            "[nope]:80",
            "localhost:x",
            "my.box.evil:1",
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn keys_compare_whole() {
        assert!(same(b"secret", b"secret"));
        assert!(!same(b"secret", b"secreT"));
        assert!(!same(b"secret", b"secret2"));
        assert!(!same(b"", b"x"));
    }
}
