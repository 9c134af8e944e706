//! The tonic adapter: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tonic::{Request, Response, Status};

use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::metrics::{Code, Endpoint};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code as WireCode;
use crate::service::{DecideError, RateLimiter};

/// Serves a [`RateLimiter`] over gRPC.
#[derive(Clone)]
pub struct GrpcService(pub Arc<RateLimiter>);

#[tonic::async_trait]
impl RateLimitService for GrpcService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        // The caller's deadline counts from when the request arrived, however long this
        // server took to get to it; one already past is refused before any work.
        let arrived = request
            .extensions()
            .get::<Arrived>()
            .map_or(started, |a| a.0);
        let deadline = answer_by(&request, arrived);
        if deadline.is_some_and(|deadline| deadline <= started) {
            let metrics = self.0.metrics().requests(Endpoint::GrpcShouldRateLimit);
            metrics.record(Code::DeadlineExceeded, started.elapsed());
            return Err(Status::deadline_exceeded(
                "the caller's deadline passed before floodgate got to the request; nothing was \
                 counted",
            ));
        }
        let span = (self.0.telemetry()).map(|telemetry| {
            let asked = request.get_ref();
            telemetry.decision(
                SHOULD_RATE_LIMIT,
                request.metadata().as_ref(),
                &asked.domain,
                asked.descriptors.len(),
            )
        });
        let result = self
            .0
            .should_rate_limit_by(request.get_ref(), deadline, span.as_ref())
            .await;
        let code = code(&result);
        (self.0.metrics().requests(Endpoint::GrpcShouldRateLimit)).record(code, started.elapsed());
        if let Some(span) = span {
            span.finish(code);
        }
        result.map(Response::new).map_err(Status::from)
    }
}

/// When a request's headers arrived: stamped by [`StampArrival`] before the request waits
/// for a task of its own, so that an overloaded server measures the caller's deadline from
/// when the caller sent it.
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);

/// A layer's service that stamps every request with [`Arrived`] as the connection hands it
/// over.
#[derive(Debug, Clone)]
pub struct StampArrival<S>(pub S);

impl<S, B> tower::Service<http::Request<B>> for StampArrival<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(Arrived(Instant::now()));
        self.0.call(request)
    }
}

/// A layer's service that holds every call to its deadline: the caller's `grpc-timeout`
/// (answered DEADLINE_EXCEEDED once it passes: the caller has stopped waiting) or, if sooner
/// or absent, the server's `request_timeout` (answered CANCELLED), its body included.
#[derive(Debug, Clone)]
pub struct CallDeadline<S> {
    pub inner: S,
    pub request_timeout: Duration,
}

impl<S, B> tower::Service<http::Request<B>> for CallDeadline<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let callers = (request.headers().get("grpc-timeout"))
            .and_then(|value| value.to_str().ok())
            .and_then(parse_grpc_timeout)
            .filter(|&waits| waits < self.request_timeout);
        let limit = callers.unwrap_or(self.request_timeout);
        let call = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(limit, call).await {
                Ok(answer) => answer,
                Err(_) if callers.is_some() => Ok(Status::deadline_exceeded(
                    "the caller's grpc-timeout passed before the call was answered",
                )
                .into_http()),
                Err(_) => Ok(Status::cancelled(
                    "the call took longer than connection_limits.request_timeout_ms",
                )
                .into_http()),
            }
        })
    }
}

/// What an UNAVAILABLE answer carries when no hit of the request was counted, so that a
/// client may send it again without counting twice (`docs/clients.md`).
pub const NOTHING_COUNTED: (&str, &str) = ("floodgate-counted", "none");

/// The decision span's name: the RPC, as OpenTelemetry's conventions name server spans.
const SHOULD_RATE_LIMIT: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// How a decision is answered, for the request counts of `/metrics`.
pub(crate) fn code(result: &Result<RateLimitResponse, DecideError>) -> Code {
    match result {
        Ok(response) if response.overall_code == WireCode::OverLimit as i32 => Code::OverLimit,
        Ok(_) => Code::Ok,
        Err(DecideError::InvalidRequest(_)) => Code::InvalidArgument,
        Err(DecideError::Backend(_)) => Code::Unavailable,
    }
}

impl From<DecideError> for Status {
    fn from(error: DecideError) -> Self {
        match error {
            DecideError::InvalidRequest(invalid) => Status::invalid_argument(invalid.0),
            // Envoy applies its failure_mode_deny to any gRPC error.
            DecideError::Backend(failure) => {
                let mut status = Status::unavailable(failure.to_string());
                if failure.nothing_counted {
                    let none = tonic::metadata::MetadataValue::from_static(NOTHING_COUNTED.1);
                    status.metadata_mut().insert(NOTHING_COUNTED.0, none);
                }
                status
            }
        }
    }
}

/// When the backend must have answered for the caller to get the answer in time: most of the
/// time the caller said it waits (`grpc-timeout`, which Envoy sets from its filter timeout),
/// leaving the rest for the answer's way back. `None` when the caller set no deadline.
fn answer_by<T>(request: &Request<T>, received: Instant) -> Option<Instant> {
    let header = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let waits = parse_grpc_timeout(header)?;
    Some(received + waits.mul_f64(ANSWER_SHARE))
}

/// The share of the caller's deadline the backend may use.
const ANSWER_SHARE: f64 = 0.8;

/// A `grpc-timeout` value: at most eight digits and a unit (gRPC over HTTP/2: `H`ours,
/// `M`inutes, `S`econds, `m`illis, `u`micros, `n`anos).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_in_every_unit_are_read() {
        assert_eq!(parse_grpc_timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("500u"), Some(Duration::from_micros(500)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
    }

    #[test]
    fn malformed_grpc_timeouts_are_ignored() {
        for value in ["", "m", "20", "20x", "123456789m", "-5m", "1.5S", "٣m"] {
            assert_eq!(parse_grpc_timeout(value), None, "{value:?}");
        }
    }

    #[test]
    fn the_backend_gets_most_of_the_callers_deadline() {
        let mut request = Request::new(());
        let received = Instant::now();
        assert_eq!(answer_by(&request, received), None);
        request
            .metadata_mut()
            .insert("grpc-timeout", "20m".parse().expect("ascii"));
        assert_eq!(
            answer_by(&request, received),
            Some(received + Duration::from_millis(16))
        );
    }
}
