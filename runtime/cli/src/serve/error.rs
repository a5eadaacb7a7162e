//! The server's error answers, in OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

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
        (self.status, Json(body)).into_response()
    }
}
