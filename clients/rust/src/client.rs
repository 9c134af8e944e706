//! The typed client: one call in, one [`Decision`] out, within a deadline, whatever the
//! server's state.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

use crate::decision::{Decision, FailureMode};
use crate::descriptor::Descriptor;
use crate::error::Error;
use crate::failure::Failure;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::retry::Retry;

/// A connection to a rate-limit service. Cheap to clone: clones share one HTTP/2 channel.
#[derive(Debug, Clone)]
pub struct Client {
    grpc: RateLimitServiceClient<Channel>,
    timeout: Duration,
    failure_mode: FailureMode,
    retry: Retry,
    retry_possibly_counted: bool,
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
            retry_possibly_counted: false,
        }
    }

    /// Sets the one deadline of each call: every attempt and every pause between attempts
    /// fits in it, each attempt getting what remains (and telling the server, in
    /// `grpc-timeout`). When it passes, the failure mode decides.
    pub fn timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// Sets what a call decides when the server cannot answer.
    pub fn failure_mode(mut self, mode: FailureMode) -> Client {
        self.failure_mode = mode;
        self
    }

    /// Sets the attempts and backoff ([`Retry::NONE`] turns retries off).
    pub fn retry(mut self, retry: Retry) -> Client {
        self.retry = retry;
        self
    }

    /// Whether an `UNAVAILABLE` that may already have been counted is sent again too.
    ///
    /// By default (`false`) only an `UNAVAILABLE` that counted nothing is retried: one that
    /// floodgate marks `floodgate-counted: none` (its circuit breaker was open, the request
    /// was shed, Redis could not be reached or ran nothing), or a connection that never
    /// opened. An unmarked one (a Redis timeout after the script may have run, a connection
    /// lost after the request went out) goes to the failure mode at once, since sending it
    /// again could count its hits twice. `true` retries every `UNAVAILABLE`, for callers
    /// who prefer an answer to an exact count.
    pub fn retry_possibly_counted(mut self, retry: bool) -> Client {
        self.retry_possibly_counted = retry;
        self
    }

    /// Asks whether a request described by `descriptors` may go ahead in `domain`, counting
    /// `hits` against each descriptor's limits (0 means 1; a descriptor's own
    /// [`hits`](Descriptor::hits) wins).
    ///
    /// Returns a decision whenever the server is unreachable, slow or unavailable (a
    /// degraded one, decided by the failure mode); the errors are a request the server
    /// refuses ([`Error::InvalidArgument`]) and answers no failure mode covers
    /// ([`Error::Status`]).
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
        match self.call_within_deadline(request).await {
            Ok(response) => Ok(Decision::from_wire(response)),
            Err(Failure::Fatal(status)) => Err(Error::from_status(status)),
            Err(_) => Ok(Decision::from_failure(self.failure_mode, descriptors.len())),
        }
    }

    /// Sends `request` until it is answered, fails in a way that may not be retried, runs
    /// out of attempts, or the next retry would start after the deadline.
    async fn call_within_deadline(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Failure> {
        let deadline = Instant::now() + self.timeout;
        let mut attempt = 1;
        loop {
            let failure = match self.attempt(request.clone(), deadline).await {
                Ok(response) => return Ok(response),
                Err(status) => Failure::of(status),
            };
            if attempt >= self.retry.attempts() || !self.may_send_again(&failure) {
                return Err(failure);
            }
            let resume = Instant::now() + self.retry.backoff(attempt);
            if resume >= deadline {
                return Err(failure);
            }
            tokio::time::sleep_until(resume).await;
            attempt += 1;
        }
    }

    /// Whether an attempt that ended in `failure` may be sent again.
    fn may_send_again(&self, failure: &Failure) -> bool {
        match failure {
            Failure::NotCounted => true,
            Failure::MaybeCounted => self.retry_possibly_counted,
            Failure::DeadlineExceeded | Failure::Fatal(_) => false,
        }
    }

    /// One attempt, abandoned at `deadline` (which the server is told as well).
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
