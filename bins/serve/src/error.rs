//! Errors as HTTP answers: OpenAI's error body everywhere, Anthropic's on
//! `/v1/messages` (each API's clients parse their own).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API's error body to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Style {
    #[default]
    OpenAi,
    Anthropic,
}

impl Style {
    /// The style of the endpoint at `path`.
    pub fn for_path(path: &str) -> Style {
        if path.starts_with("/v1/messages") { Style::Anthropic } else { Style::OpenAi }
    }
}

/// A request that cannot be served, and why.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `code` (`model_not_found`, `context_length_exceeded`...).
    pub code: Option<&'static str>,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// Seconds to wait before retrying (429, 503).
    pub retry_after: Option<u64>,
    pub style: Style,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), code: None, param: None, retry_after: None, style: Style::OpenAi }
    }

    /// 400: the request is wrong.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param), ..ApiError::invalid(message) }
    }

    /// 500: our fault. The whole message goes to the server's log; the
    /// client's copy names no file of the server (a damaged expert file's
    /// path says where models live and who runs them).
    pub fn internal(message: impl Into<String>) -> ApiError {
        let message = message.into();
        tracing::error!("{message}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, without_paths(&message))
    }

    pub fn code(self, code: &'static str) -> ApiError {
        ApiError { code: Some(code), ..self }
    }

    pub fn style(self, style: Style) -> ApiError {
        ApiError { style, ..self }
    }

    /// OpenAI's `type` for this status.
    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// Anthropic's `error.type` for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body alone (also sent as an SSE event when a stream fails).
    pub fn body(&self) -> serde_json::Value {
        match self.style {
            Style::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.openai_type(),
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Style::Anthropic => json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": self.message },
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// `message` with every absolute or home- or dot-relative path replaced by
/// `<path>` (punctuation around it kept).
fn without_paths(message: &str) -> String {
    let is_path = |word: &str| {
        let word = word.trim_start_matches(['(', '[', '"', '\'', '`']);
        (word.starts_with('/') && word.len() > 1) || word.starts_with("~/") || word.starts_with("./")
    };
    message
        .split(' ')
        .map(|word| {
            if !is_path(word) {
                return word.to_owned();
            }
            let start = word.find(['/', '~', '.']).expect("a path starts with one of these");
            let end = word.trim_end_matches([':', ',', ';', ')', ']', '"', '\'', '`']).len().max(start);
            format!("{}<path>{}", &word[..start], &word[end..])
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl From<strata_engine::Error> for ApiError {
    /// An engine error met while preparing a request is the request's fault
    /// when the engine says so; the rest are ours.
    fn from(e: strata_engine::Error) -> ApiError {
        match e {
            strata_engine::Error::InvalidRequest(reason) => ApiError::invalid(reason),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<strata_text::Error> for ApiError {
    /// Text errors met while preparing a request are the request's fault (a
    /// template refusing the conversation, text the tokenizer cannot take);
    /// the rest are ours.
    fn from(e: strata_text::Error) -> ApiError {
        // The reasons only: paths on the server are no business of clients.
        match e {
            strata_text::Error::Template { reason, .. } => ApiError::invalid(format!("chat template: {reason}")),
            strata_text::Error::Tokenizer { reason, .. } => ApiError::invalid(format!("tokenizer: {reason}")),
            strata_text::Error::InvalidRequest(reason) => ApiError::invalid(reason),
            strata_text::Error::Engine(e) => e.into(),
            other => ApiError::internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_show_clients_no_server_paths() {
        let cases = [
            (
                "/srv/models/m/experts/layer-003.bin: expert 7 of layer 3: CRC32C mismatch",
                "<path>: expert 7 of layer 3: CRC32C mismatch",
            ),
            ("reading (/home/me/.cache/strata/x) failed", "reading (<path>) failed"),
            ("opening '~/models/a b': denied", "opening '<path> b': denied"),
            ("cannot open ./dense.bin, retried", "cannot open <path>, retried"),
            ("1/2 of the experts; a / b", "1/2 of the experts; a / b"),
        ];
        for (message, shown) in cases {
            assert_eq!(ApiError::internal(message).message, shown, "{message}");
        }
    }
}
