//! The tonic adapter: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::{DecideError, RateLimiter};

/// Serves a [`RateLimiter`] over gRPC.
#[derive(Clone)]
pub struct GrpcService(pub Arc<RateLimiter>);

#[tonic::async_trait]
impl RateLimitService for GrpcService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.0
            .should_rate_limit(request.get_ref())
            .await
            .map(Response::new)
            .map_err(Status::from)
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
