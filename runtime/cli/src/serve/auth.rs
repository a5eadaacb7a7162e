//! `--api-key`: every route but GET /health wants `Authorization: Bearer
//! KEY`; anything else is OpenAI's 401 (`code: "invalid_api_key"`). The
//! key is compared in constant time, so the answer's timing does not tell
//! how much of a guess was right.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The key requests must bear.
pub struct ApiKey(Vec<u8>);

impl ApiKey {
    pub fn new(key: String) -> Result<ApiKey, String> {
        match key.trim().is_empty() {
            true => {
                Err("--api-key (or ARCHGEN_API_KEY) is empty; give a key, or leave it out".into())
            }
            false => Ok(ApiKey(key.into_bytes())),
        }
    }

    fn admits(&self, given: &[u8]) -> bool {
        // Lengths differ: unequal (a key's length is no secret worth keeping).
        bool::from(self.0.as_slice().ct_eq(given))
    }
}

/// The routes served without the key: a load balancer's health check.
fn open_route(path: &str) -> bool {
    path == "/health"
}

pub async fn require_key(State(key): State<Arc<ApiKey>>, request: Request, next: Next) -> Response {
    if open_route(request.uri().path()) {
        return next.run(request).await;
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|value| value.as_bytes())
        .and_then(|value| value.strip_prefix(b"Bearer "));
    let message = match bearer {
        Some(given) if key.admits(given) => return next.run(request).await,
        Some(_) => "the API key is not this server's; give the key it was started with (--api-key)",
        None => "this server wants an API key: send the header `Authorization: Bearer KEY`",
    };
    ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        param: None,
        code: Some("invalid_api_key"),
    }
    .into_response()
}
