//! A generation request's body: `application/json` only, read within
//! `--body-timeout-secs`, at most `--max-body` bytes.
//!
//! JSON only, because a web page may send `text/plain` (or form) bodies to
//! any address without a CORS preflight: requiring `application/json` makes
//! the browser ask first, so a page cannot spend this server's compute
//! when no `--api-key` is set. The deadline covers the whole body, so a
//! client dribbling a byte at a time cannot hold a connection (and the
//! memory of its partial body) for long.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};

use crate::error::ApiError;
use crate::listen::Progress;
use crate::state::SharedApp;

/// The body, or the 4xx saying why there is none (never axum's plain-text
/// rejection: clients parse the error body).
pub struct JsonBody(pub Result<Bytes, ApiError>);

impl FromRequest<SharedApp> for JsonBody {
    type Rejection = Infallible;

    async fn from_request(request: Request, app: &SharedApp) -> Result<Self, Infallible> {
        Ok(JsonBody(read(request, app).await))
    }
}

async fn read(request: Request, app: &SharedApp) -> Result<Bytes, ApiError> {
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if !content_type.is_some_and(is_json) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "the body must be JSON sent with `Content-Type: application/json` (got {})",
                content_type.map_or_else(|| "no Content-Type".to_owned(), |t| format!("`{t}`"))
            ),
        ));
    }
    let progress = request.extensions().get::<Progress>().cloned();
    match tokio::time::timeout(app.body_timeout, Bytes::from_request(request, &())).await {
        Ok(Ok(bytes)) => {
            // From now on the connection is working, never displaced to
            // make room for a newcomer (`listen`).
            if let Some(progress) = progress {
                progress.body_arrived();
            }
            Ok(bytes)
        }
        Ok(Err(rejection)) => {
            let status = rejection.status();
            let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "the request body is larger than this server accepts (see --max-body)".to_owned()
            } else {
                rejection.body_text()
            };
            Err(ApiError::new(status, message))
        }
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {} s", app.body_timeout.as_secs()),
        )),
    }
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    media_type.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_media_types_are_json() {
        for ok in ["application/json", "application/json; charset=utf-8", "Application/JSON"] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "application/jsonx"] {
            assert!(!is_json(bad), "{bad}");
        }
    }
}
