//! The typed client: one call in, one [`Decision`] out, within a deadline, whatever the
//! server's state.

use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::decision::Decision;
use crate::descriptor::Descriptor;
use crate::error::Error;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::retry::Retry;

/// What a call decides when the server cannot answer in time (after the retries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Allow: an outage of the rate limiter does not become an outage of the service.
    /// Envoy's default (`failure_mode_deny: false`) too.
    #[default]
    Open,
    /// Reject: for limits that protect something that must not be overrun.
    Closed,
}

/// A connection to a rate-limit service. Cheap to clone: clones share one HTTP/2 channel.
#[derive(Debug, Clone)]
pub struct Client {
    grpc: RateLimitServiceClient<Channel>,
    timeout: Duration,
    failure_mode: FailureMode,
    retry: Retry,
}

impl Client {
    /// The bound on one [`should_rate_limit`](Self::should_rate_limit) call, retries included.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);

    /// Connects to `url` (`http://host:port`; TLS needs one of tonic's `tls-*` features and
    /// [`Client::new`]). Fails if the server cannot be reached now, so a misconfigured
    /// address shows at startup; use [`Client::new`] with [`Endpoint::connect_lazy`] to
    /// start while the server is down.
    pub async fn connect(url: impl Into<String>) -> Result<Client, Error> {
        let channel = Endpoint::from_shared(url.into())?.connect().await?;
        Ok(Client::new(channel))
    }

    /// A client on an existing channel, with the default timeout, failure mode and retries.
    pub fn new(channel: Channel) -> Client {
        Client {
            grpc: RateLimitServiceClient::new(channel),
            timeout: Self::DEFAULT_TIMEOUT,
            failure_mode: FailureMode::default(),
            retry: Retry::default(),
        }
    }

    /// Sets the bound on each call, retries included; when it passes, the failure mode
    /// decides. The server also receives it (`grpc-timeout`) and gives up in time.
    pub fn timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// Sets what a call decides when the server cannot answer.
    pub fn failure_mode(mut self, mode: FailureMode) -> Client {
        self.failure_mode = mode;
        self
    }

    /// Sets the retries on `UNAVAILABLE` ([`Retry::NONE`] turns them off).
    pub fn retry(mut self, retry: Retry) -> Client {
        self.retry = retry;
        self
    }

    /// Asks whether a request described by `descriptors` may go ahead in `domain`, counting
    /// `hits` against each descriptor's limits (0 means 1; a descriptor's own
    /// [`hits`](Descriptor::hits) wins).
    ///
    /// Returns a decision whenever the server is unreachable, slow or failing (a degraded
    /// one, decided by the failure mode); the only error is a request the server refuses.
    pub async fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: &[Descriptor],
        hits: u32,
    ) -> Result<Decision, Error> {
        let request = RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: descriptors.iter().map(Descriptor::to_wire).collect(),
            hits_addend: hits,
        };
        match self.call_with_retries(request).await {
            Ok(response) => Ok(Decision::from_wire(response)),
            Err(status) if status.code() == Code::InvalidArgument => {
                Err(Error::InvalidArgument(status.message().to_owned()))
            }
            Err(_) => Ok(Decision::from_failure(self.failure_mode, descriptors.len())),
        }
    }

    /// Sends `request` until it is answered, fails other than `UNAVAILABLE`, runs out of
    /// retries, or the next retry would start after the deadline.
    async fn call_with_retries(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let deadline = Instant::now() + self.timeout;
        let mut retries = 0;
        loop {
            let status = match self.attempt(request.clone(), deadline).await {
                Err(status) if status.code() == Code::Unavailable => status,
                settled => return settled,
            };
            if retries == self.retry.max_retries {
                return Err(status);
            }
            let resume = Instant::now() + self.retry.backoff(retries);
            if resume >= deadline {
                return Err(status);
            }
            tokio::time::sleep_until(resume).await;
            retries += 1;
        }
    }

    /// One call, abandoned at `deadline` (which the server is told as well).
    async fn attempt(
        &self,
        request: RateLimitRequest,
        deadline: Instant,
    ) -> Result<RateLimitResponse, Status> {
        let mut request = tonic::Request::new(request);
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        let mut grpc = self.grpc.clone();
        match tokio::time::timeout_at(deadline, grpc.should_rate_limit(request)).await {
            Ok(answer) => answer.map(tonic::Response::into_inner),
            Err(_) => Err(Status::deadline_exceeded(
                "no answer within the client's timeout",
            )),
        }
    }
}
