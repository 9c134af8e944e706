//! The admin API: read and reset counters, on a listener of its own (`admin_addr`, off by
//! default), never open: every request carries `Authorization: Bearer <admin_token>` (the
//! scheme in any case, RFC 7235 §2.1), or comes over mutual TLS (`admin_tls.client_ca_file`:
//! a client without a certificate the CA signed is refused in the handshake), or both where
//! both are set.
//!
//! - `POST /admin/v1/counters`: `{"domain": "api", "descriptor": [{"key": "user", "value":
//!   "alice"}]}` answers the rule the descriptor resolves to and each of its limits: the
//!   quota left, the seconds until the next unit returns, and whether the limit would refuse
//!   the next hit now (`over_limit`), read without counting.
//! - `POST /admin/v1/counters/reset`: the same body; forgets those counters, as if never hit
//!   (store, over-limit cache and `local` counters alike), and answers how many states
//!   existed, each counted once (on Redis, keys).
//!
//! Bodies are JSON whatever their `content-type` says, as `POST /json` reads its own
//! ([`crate::edge::json_body`]); a request from a browser (with an `Origin` header) is 403, so
//! that a web page cannot send one as a simple cross-site request. A descriptor no rule counts is 404; a malformed body 400; a
//! missing or wrong token 401 (compared in constant time); a backend that cannot answer 503.
//!
//! The same two calls are a gRPC service on the same listener
//! (`floodgate.admin.v1.CounterAdmin`, `proto/floodgate/admin/v1/admin.proto`), behind the
//! same token (`authorization: Bearer …` metadata; a refusal is UNAUTHENTICATED).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, ORIGIN};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::json;

use tonic::server::NamedService;

use crate::counters::{self, CounterState, NoCounters};
use crate::edge::json_body::{BadBody, JsonBody};
use crate::limiter::SECOND_MICROS;
use crate::proto::floodgate::admin::v1::counter_admin_server::{CounterAdmin, CounterAdminServer};
use crate::proto::floodgate::admin::v1::{
    CounterRequest as GrpcCounterRequest, CountersReply, LimitCounter, ResetReply,
};
use crate::rules::Entry;
use crate::service::RateLimiter;
use crate::settings::Password;

/// What the admin handlers share.
#[derive(Clone)]
struct AdminState {
    limiter: Arc<RateLimiter>,
}

/// The admin router for `limiter`, guarded by `token` where one is given (the listener's
/// mutual TLS must guard it otherwise).
pub fn router(limiter: Arc<RateLimiter>, token: Option<Password>) -> Router {
    let state = AdminState { limiter };
    let grpc = CounterAdminServer::new(GrpcAdmin(state.limiter.clone()));
    let router = Router::new()
        .route("/admin/v1/counters", post(counters))
        .route("/admin/v1/counters/reset", post(reset))
        .route_service(
            &format!(
                "/{}/{{*method}}",
                <CounterAdminServer<GrpcAdmin> as NamedService>::NAME
            ),
            grpc,
        )
        .with_state(state);
    let router = match token {
        Some(token) => router.layer(middleware::from_fn_with_state(Arc::new(token), authorize)),
        None => router,
    };
    router.layer(middleware::from_fn(refuse_browsers))
}

/// One limit's counter as both forms of the API show it.
fn limit_counter(counter: &CounterState) -> LimitCounter {
    let limit = &counter.limit;
    let decision = counter.state.as_ref().ok();
    LimitCounter {
        name: counter.name.clone().unwrap_or_default(),
        algorithm: limit.algorithm.name().into(),
        unit: limit.unit.name().into(),
        unit_multiplier: limit.unit_multiplier,
        requests_per_unit: limit.requests_per_unit,
        remaining: decision.map_or(0, |d| d.remaining),
        reset_seconds: decision.map_or(0, |d| d.reset_micros.div_ceil(SECOND_MICROS)),
        // What an operator asks: would the next hit be refused now? A check costs nothing,
        // so it is allowed at exactly 0 left; a spent limit is over all the same.
        over_limit: decision.is_some_and(|d| !d.allowed || d.remaining == 0),
    }
}

/// The admin API's gRPC form.
struct GrpcAdmin(Arc<RateLimiter>);

#[tonic::async_trait]
impl CounterAdmin for GrpcAdmin {
    async fn get_counters(
        &self,
        request: tonic::Request<GrpcCounterRequest>,
    ) -> Result<tonic::Response<CountersReply>, tonic::Status> {
        let request = request.into_inner();
        let (rule, states) = counters::read(&self.0, &request.domain, &grpc_entries(&request))
            .await
            .map_err(no_counters_status)?;
        if let Some(Err(error)) = states.iter().map(|c| &c.state).find(|s| s.is_err()) {
            return Err(tonic::Status::unavailable(error.to_string()));
        }
        let limits = states.iter().map(limit_counter).collect();
        Ok(tonic::Response::new(CountersReply { rule, limits }))
    }

    async fn reset_counters(
        &self,
        request: tonic::Request<GrpcCounterRequest>,
    ) -> Result<tonic::Response<ResetReply>, tonic::Status> {
        let request = request.into_inner();
        let entries = grpc_entries(&request);
        let (rule, existed) = counters::reset(&self.0, &request.domain, &entries)
            .await
            .map_err(no_counters_status)?;
        let reset = existed.map_err(|error| tonic::Status::unavailable(error.to_string()))?;
        tracing::info!(domain = %request.domain, rule, ?entries, "counters reset");
        Ok(tonic::Response::new(ResetReply { rule, reset }))
    }
}

fn grpc_entries(request: &GrpcCounterRequest) -> Vec<Entry> {
    (request.descriptor.iter())
        .map(|entry| Entry::new(entry.key.clone(), entry.value.clone()))
        .collect()
}

fn no_counters_status(none: NoCounters) -> tonic::Status {
    match none {
        NoCounters::NoRule { .. } => tonic::Status::not_found(none.to_string()),
        NoCounters::Invalid(_) => tonic::Status::invalid_argument(none.to_string()),
    }
}

/// One descriptor of one domain.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CounterRequest {
    domain: String,
    descriptor: Vec<EntryBody>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    key: String,
    value: String,
}

impl CounterRequest {
    fn entries(&self) -> Vec<Entry> {
        (self.descriptor.iter())
            .map(|entry| Entry::new(entry.key.clone(), entry.value.clone()))
            .collect()
    }
}

async fn authorize(State(token): State<Arc<Password>>, request: Request, next: Next) -> Response {
    let given = (request.headers().get(AUTHORIZATION))
        .and_then(|value| value.to_str().ok())
        .and_then(bearer_token);
    match given {
        Some(given) if same(given.as_bytes(), token.expose().as_bytes()) => next.run(request).await,
        _ if is_grpc(&request) => {
            let status = tonic::Status::unauthenticated(REFUSED.trim_end());
            status.into_http::<axum::body::Body>()
        }
        _ => (StatusCode::UNAUTHORIZED, REFUSED).into_response(),
    }
}

/// The token of `Bearer <token>` credentials. The scheme's case is free and spaces may
/// separate it from the token (RFC 7235 §2.1); the token is taken as written.
fn bearer_token(credentials: &str) -> Option<&str> {
    let (scheme, token) = credentials.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Refuses what a browser sends: a request with an `Origin` header, which browsers add to
/// every POST and no admin client sends (curl, `floodgate counters`, gRPC). Bodies are read
/// whatever their content type, so a web page could POST a reset as `text/plain` with no
/// CORS preflight, and a browser holding an operator's client certificate would present it:
/// with mutual TLS alone, any page the operator opened could reset counters.
async fn refuse_browsers(request: Request, next: Next) -> Response {
    if request.headers().contains_key(ORIGIN) {
        return (StatusCode::FORBIDDEN, FROM_A_BROWSER).into_response();
    }
    next.run(request).await
}

/// What a request from a browser is told.
const FROM_A_BROWSER: &str = "admin API: requests with an `Origin` header (browsers) are refused\n";

/// What a request without the right token is told.
const REFUSED: &str = "admin API: `Authorization: Bearer <admin_token>` required\n";

/// A gRPC call, which must be refused with a gRPC status, not an HTTP one.
fn is_grpc(request: &Request) -> bool {
    (request.headers().get(axum::http::header::CONTENT_TYPE))
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// Byte strings compared in time that depends on their lengths only.
fn same(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

/// A request body as the handlers take it: the JSON (whatever its content type, as
/// `POST /json` reads its own), or why it is not one.
type Body = Result<JsonBody<CounterRequest>, BadBody>;

async fn counters(State(state): State<AdminState>, body: Body) -> Response {
    let request = match body {
        Ok(JsonBody(request)) => request,
        Err(bad) => return bad_body(bad),
    };
    match counters::read(&state.limiter, &request.domain, &request.entries()).await {
        Ok((rule, states)) => {
            let mut unavailable = false;
            let limits: Vec<serde_json::Value> = (states.iter())
                .map(|counter| {
                    let shown = limit_counter(counter);
                    let mut view = json!({
                        "name": counter.name,
                        "algorithm": shown.algorithm,
                        "unit": shown.unit,
                        "unit_multiplier": shown.unit_multiplier,
                        "requests_per_unit": shown.requests_per_unit,
                    });
                    match &counter.state {
                        Ok(_) => {
                            view["remaining"] = shown.remaining.into();
                            view["reset_seconds"] = shown.reset_seconds.into();
                            view["over_limit"] = shown.over_limit.into();
                        }
                        Err(error) => {
                            view["error"] = error.to_string().into();
                            unavailable = true;
                        }
                    }
                    view
                })
                .collect();
            let status = if unavailable {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            (status, Json(json!({ "rule": rule, "limits": limits }))).into_response()
        }
        Err(none) => no_counters(none),
    }
}

async fn reset(State(state): State<AdminState>, body: Body) -> Response {
    let request = match body {
        Ok(JsonBody(request)) => request,
        Err(bad) => return bad_body(bad),
    };
    let entries = request.entries();
    match counters::reset(&state.limiter, &request.domain, &entries).await {
        Ok((rule, Ok(existed))) => {
            tracing::info!(domain = %request.domain, rule, ?entries, "counters reset");
            Json(json!({ "rule": rule, "reset": existed })).into_response()
        }
        Ok((rule, Err(error))) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "rule": rule, "error": error.to_string() })),
        )
            .into_response(),
        Err(none) => no_counters(none),
    }
}

fn no_counters(none: NoCounters) -> Response {
    let status = match none {
        NoCounters::NoRule { .. } => StatusCode::NOT_FOUND,
        NoCounters::Invalid(_) => StatusCode::BAD_REQUEST,
    };
    (status, Json(json!({ "error": none.to_string() }))).into_response()
}

/// A body that is not JSON is told the shape expected; one not read, axum's answer.
fn bad_body(bad: BadBody) -> Response {
    if let BadBody::Unread(_) = bad {
        return bad.into_response();
    }
    let message = format!(
        "expected {{\"domain\": …, \"descriptor\": [{{\"key\": …, \"value\": …}}]}}: {bad}"
    );
    (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, same};

    #[test]
    fn the_bearer_scheme_is_any_case_and_the_token_as_written() {
        assert_eq!(bearer_token("Bearer s3cret"), Some("s3cret"));
        assert_eq!(bearer_token("bEARER   s3cret"), Some("s3cret"));
        assert_eq!(bearer_token("Bearer S3cret x"), Some("S3cret x"));
        assert_eq!(bearer_token("Bearers3cret"), None);
        assert_eq!(bearer_token("Basic s3cret"), None);
        assert_eq!(bearer_token("s3cret"), None);
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cret", b"s3creT"));
        assert!(!same(b"s3cre", b"s3cret"));
        assert!(!same(b"", b"s3cret"));
    }
}
