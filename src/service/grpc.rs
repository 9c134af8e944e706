//! The tonic adapter: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::{DecideError, RateLimiter};
use crate::metrics::{Code, Endpoint};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code as WireCode;

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
        let result = self.0.should_rate_limit(request.get_ref()).await;
        (self.0.metrics().requests(Endpoint::GrpcShouldRateLimit))
            .record(code(&result), started.elapsed());
        result.map(Response::new).map_err(Status::from)
    }
}

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
            DecideError::Backend(backend) => Status::unavailable(backend.to_string()),
        }
    }
}
