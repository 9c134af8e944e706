//! The HTTP side: health for orchestrators, `POST /json` for callers without gRPC, and the
//! loaded rules for operators.
//!
//! - `GET /healthz`: 200 while the process runs.
//! - `GET /readyz`: 200 while serving, 503 once shutdown began (and, with
//!   `readiness_follows_backend`, while the backend fails: [`Readiness`], which the server
//!   chooses); the body says the backend's state.
//! - `GET /healthcheck`: `/readyz` as envoyproxy/ratelimit answers it (Envoy Gateway's and
//!   Istio's probes ask it): 200 `OK`, or 500 with the reason.
//! - `POST /json`: a protobuf-JSON `RateLimitRequest`, whatever the `content-type` says
//!   ([`crate::edge::json_body`]); 200 OK, 429 over limit, 400 bad request (with the reason), 503
//!   backend unavailable; the body is the JSON response.
//! - `GET /rlconfig`: the rules in force, one line per rule, stable order.
//! - `GET /metrics`: Prometheus metrics, text format 0.0.4.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::grpc;
use crate::edge::json_body::{BadBody, JsonBody};
use crate::metrics::{self, Endpoint};
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::service::{DecideError, RateLimiter};

/// What readiness (`/readyz`, gRPC health) reflects besides the server serving (its
/// listeners up, not shutting down). With the backend failing, each rule's
/// `on_backend_error` still answers, so by default the replica stays in the Service and its
/// policies get to answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Also unready while the backend's circuit is open (`readiness_follows_backend`).
    pub follows_backend: bool,
    /// Also unready while no rule is loaded (`readiness_needs_rules`, upstream's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`): a replica started before its rules came
    /// (an xDS server's first snapshot, an empty rules directory) gets no traffic yet.
    pub needs_rules: bool,
}

impl Readiness {
    /// Why a server that serves is not ready, if it is not: `backend_up` and `has_rules`
    /// as they are now.
    pub fn unready_because(self, backend_up: bool, has_rules: bool) -> Option<&'static str> {
        if self.needs_rules && !has_rules {
            Some("no rules loaded")
        } else if self.follows_backend && !backend_up {
            Some("backend unavailable")
        } else {
            None
        }
    }
}

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub limiter: Arc<RateLimiter>,
    /// False once shutdown began.
    pub ready: Arc<AtomicBool>,
    /// Whether the backend's state makes the server unready.
    pub readiness: Readiness,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(healthcheck))
        .route("/json", post(json))
        .route("/rlconfig", get(rlconfig))
        .route("/metrics", get(metrics_page))
        .with_state(state)
}

/// Only `GET /metrics`: upstream's separate Prometheus listener (`metrics_addr`).
pub fn metrics_router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .with_state(state)
}

/// Ready while serving; the body's second line is the backend's state either way.
async fn readyz(State(state): State<HttpState>) -> Response {
    match readiness(&state) {
        Ok(backend) => (StatusCode::OK, format!("ready\n{backend}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

/// `/readyz` as envoyproxy/ratelimit answers its health check: 200 `OK`, or 500.
async fn healthcheck(State(state): State<HttpState>) -> Response {
    match readiness(&state) {
        Ok(_) => (StatusCode::OK, "OK").into_response(),
        Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, why).into_response(),
    }
}

/// The backend's state when the server is ready; why not (with the backend's state)
/// otherwise.
fn readiness(state: &HttpState) -> Result<&'static str, String> {
    if !state.ready.load(Ordering::Acquire) {
        return Err("shutting down\n".into());
    }
    let backend_up = state.limiter.backend().healthy();
    let backend = if backend_up {
        "backend: up"
    } else {
        "backend: circuit open (each rule's on_backend_error answers)"
    };
    let has_rules = !state.limiter.rules().domains.is_empty();
    match state.readiness.unready_because(backend_up, has_rules) {
        Some(why) => Err(format!("{why}\n{backend}\n")),
        None => Ok(backend),
    }
}

async fn rlconfig(State(state): State<HttpState>) -> String {
    state.limiter.rules().dump()
}

async fn metrics_page(State(state): State<HttpState>) -> Response {
    let limiter = &state.limiter;
    let origin = &limiter.rules().origin;
    let page = (limiter.metrics()).render(origin, limiter.backend(), limiter.memory());
    ([(CONTENT_TYPE, metrics::CONTENT_TYPE)], page).into_response()
}

async fn json(
    State(state): State<HttpState>,
    body: Result<JsonBody<RateLimitRequest>, BadBody>,
) -> Response {
    let started = Instant::now();
    let requests = state.limiter.metrics().requests(Endpoint::HttpJson);
    let request = match body {
        Ok(JsonBody(request)) => request,
        Err(BadBody::Invalid { error, body }) => {
            requests.record(metrics::Code::InvalidArgument, started.elapsed());
            let message = explain_bad_number(&body).unwrap_or_else(|| error.to_string());
            return error_response(StatusCode::BAD_REQUEST, &format!("invalid JSON: {message}"));
        }
        Err(unread) => return unread.into_response(),
    };
    let result = state.limiter.should_rate_limit(&request).await;
    requests.record(grpc::code(&result), started.elapsed());
    match result {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            match serde_json::to_vec(&response) {
                Ok(body) => (status, [(CONTENT_TYPE, "application/json")], body).into_response(),
                Err(error) => error_response(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
            }
        }
        Err(DecideError::InvalidRequest(invalid)) => {
            error_response(StatusCode::BAD_REQUEST, &invalid.0)
        }
        Err(DecideError::Backend(failure)) => {
            let mut answer = error_response(StatusCode::SERVICE_UNAVAILABLE, &failure.to_string());
            if failure.nothing_counted {
                let (name, value) = grpc::NOTHING_COUNTED;
                (answer.headers_mut()).insert(name, axum::http::HeaderValue::from_static(value));
            }
            answer
        }
    }
}

/// The unsigned integer fields of a request, where JSON may give a number or its digits as a
/// string, as paths from the request: `None` stands for every descriptor.
const UNSIGNED_FIELDS: [(Option<&str>, &[&str]); 4] = [
    (None, &["hitsAddend"]),
    (Some("descriptors"), &["hitsAddend"]),
    (Some("descriptors"), &["limit", "requestsPerUnit"]),
    (Some("descriptors"), &["limit", "unitMultiplier"]),
];

/// What is wrong with a request whose JSON parses but does not deserialize, when it is an
/// unsigned integer field holding something else (a negative number, a fraction, text):
/// pbjson's own error for those names an internal enum, not the field.
fn explain_bad_number(body: &[u8]) -> Option<String> {
    let request: serde_json::Value = serde_json::from_slice(body).ok()?;
    let unsigned = |value: &serde_json::Value| match value {
        serde_json::Value::Number(number) => number.is_u64(),
        serde_json::Value::String(digits) => digits.parse::<u64>().is_ok(),
        _ => false,
    };
    let lookup = |mut value: &serde_json::Value, path: &[&str]| {
        for name in path {
            value = value.get(name)?;
        }
        Some(value.clone())
    };
    for (list, path) in UNSIGNED_FIELDS {
        let field = path.join(".");
        match list {
            None => {
                if let Some(value) = lookup(&request, path).filter(|v| !v.is_null() && !unsigned(v))
                {
                    return Some(format!(
                        "{field} must be a non-negative integer, got {value}"
                    ));
                }
            }
            Some(list) => {
                let items = request.get(list).and_then(serde_json::Value::as_array)?;
                for (index, item) in items.iter().enumerate() {
                    if let Some(value) = lookup(item, path).filter(|v| !v.is_null() && !unsigned(v))
                    {
                        return Some(format!(
                            "{list}[{index}].{field} must be a non-negative integer, got {value}"
                        ));
                    }
                }
            }
        }
    }
    None
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message });
    (
        status,
        [(CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
