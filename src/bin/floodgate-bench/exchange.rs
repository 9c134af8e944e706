//! One request of the load: what it asks, and its timed round trip. Both loops send
//! through here, so they measure alike.

use std::time::{Duration, Instant};

use tonic::Status;

use super::connection::Client;
use super::outcome::Sample;
use floodgate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;

/// What every request asks: `descriptors` descriptors in `domain`, each `key` with a value
/// drawn uniformly from `k0` … `k<keys-1>`.
#[derive(Debug, Clone)]
pub struct RequestShape {
    pub domain: String,
    pub key: String,
    pub keys: u32,
    pub descriptors: usize,
}

impl RequestShape {
    /// A fresh request, its values drawn anew.
    pub fn request(&self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: (0..self.descriptors)
                .map(|_| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: self.key.clone(),
                        value: format!("k{}", fastrand::u32(0..self.keys)),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }
}

/// Sends `request` now and waits for its answer, at most `timeout`: the server learns the
/// deadline from the `grpc-timeout` header, and the generator gives up on its own when it
/// passes (answering itself DEADLINE_EXCEEDED), so an unanswered request cannot hold its
/// slot forever. `due` is when the request should have left (see [`Sample::latency`]).
pub async fn exchange(
    client: &mut Client,
    request: RateLimitRequest,
    timeout: Duration,
    due: Instant,
) -> Sample {
    let mut request = tonic::Request::new(request);
    request.set_timeout(timeout);
    let sent = Instant::now();
    let answer = match tokio::time::timeout(timeout, client.should_rate_limit(request)).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(
            "no answer within --timeout-ms (the load generator gave up)",
        )),
    };
    Sample::new(&answer, due, sent, Instant::now())
}
