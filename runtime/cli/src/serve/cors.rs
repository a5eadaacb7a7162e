//! `--allowed-origins`: CORS for browser clients (tower-http's
//! `CorsLayer`). With origins given, a preflight (OPTIONS) from one of them
//! is answered with the Access-Control-* headers and every response to it
//! carries `Access-Control-Allow-Origin`. Without, no CORS header is sent,
//! so a browser page on another origin cannot read the answers; its
//! preflight still gets a plain 204 with `Allow` (not a 405, which reads as
//! a missing route), and the browser reports the missing CORS permission.

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::request::{IGNORED_FIELDS_HEADER, SEED_HEADER};

/// What the server answers browsers.
pub enum Cors {
    /// No origin allowed: no CORS headers.
    Off,
    Allowed(Box<CorsLayer>),
}

impl Cors {
    pub fn new(origins: &[String]) -> Result<Cors, String> {
        if origins.is_empty() {
            return Ok(Cors::Off);
        }
        let allow = match origins.iter().any(|o| o == "*") {
            true => AllowOrigin::any(),
            false => AllowOrigin::list(
                origins
                    .iter()
                    .map(|o| {
                        HeaderValue::from_str(o.trim_end_matches('/')).map_err(|_| {
                            format!("--allowed-origins: `{o}` is not an origin like http://localhost:3000")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(Cors::Allowed(Box::new(
            CorsLayer::new()
                .allow_origin(allow)
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
                // Readable by a page's script: when to retry, what was
                // ignored, the seed that replays the answer.
                .expose_headers([header::RETRY_AFTER, IGNORED_FIELDS_HEADER, SEED_HEADER]),
        )))
    }

    pub fn wrap(self, app: Router) -> Router {
        match self {
            Cors::Allowed(layer) => app.layer(*layer),
            Cors::Off => app.layer(axum::middleware::from_fn(answer_options)),
        }
    }
}

/// Without CORS: OPTIONS is answered 204 with the methods served, and
/// without Access-Control-* headers.
async fn answer_options(request: Request, next: Next) -> Response {
    match request.method() == Method::OPTIONS {
        true => (
            StatusCode::NO_CONTENT,
            [(header::ALLOW, "GET, POST, OPTIONS")],
        )
            .into_response(),
        false => next.run(request).await,
    }
}
