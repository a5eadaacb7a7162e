//! The server's error answers, in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// Seconds a client told 429 (the queue is full) waits before it retries:
/// a queued request waits at least one scheduler step, and clients back off
/// further on their own.
const RETRY_AFTER_SECONDS: &str = "1";

/// An OpenAI-style error response.
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (its JSON path), when one is.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code`, when it has one for the case.
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// Any other status, with no field at fault.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // OpenAI answers a bad key and an unknown model as invalid requests,
        // told apart by `code`.
        let (kind, default_code) = match self.status {
            StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED => ("invalid_request_error", None),
            StatusCode::NOT_FOUND => ("not_found_error", None),
            StatusCode::TOO_MANY_REQUESTS => ("rate_limit_error", Some("queue_full")),
            _ => ("server_error", None),
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code.or(default_code),
        }});
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_429_says_when_to_retry_and_a_400_does_not() {
        let busy = ApiError::with_status(StatusCode::TOO_MANY_REQUESTS, "busy").into_response();
        assert_eq!(busy.headers()[header::RETRY_AFTER], RETRY_AFTER_SECONDS);
        let bad = ApiError::bad_request("no", Some("n")).into_response();
        assert!(bad.headers().get(header::RETRY_AFTER).is_none());
    }
}
