//! A tower layer that asks floodgate before an HTTP request reaches the service it guards.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::client::Client;
use crate::descriptor::Descriptor;
use crate::error::Error;

/// Rate-limits any `tower::Service<http::Request<B>>` (an axum router, a tonic server, a
/// hyper service) with a [`Client`]:
///
/// - the extractor turns a request into descriptors; `None` (or none at all) lets the
///   request through unchecked;
/// - over limit: `429 Too Many Requests` with the server's headers (`RateLimit*`,
///   `Retry-After`), and the inner service is not called;
/// - allowed: the inner service's response, with the server's headers added;
/// - descriptors the server refuses (a value too long, an empty key): `400 Bad Request`,
///   since letting the request through would let a client skip its limit;
/// - server down or slow: the client's [`FailureMode`](crate::FailureMode) decides;
/// - any other error ([`Error::Status`](crate::Error::Status): a server that is not a
///   rate-limit service, refused credentials): `500 Internal Server Error`, since the
///   limiter is misconfigured and neither letting through nor refusing would be right.
///
/// Every request counts one hit.
pub struct RateLimitLayer<F> {
    client: Client,
    domain: Arc<str>,
    extractor: Arc<F>,
}

impl<F> RateLimitLayer<F> {
    /// A layer asking `client` about `domain`, with descriptors from `extractor`.
    pub fn new(client: Client, domain: impl Into<Arc<str>>, extractor: F) -> Self {
        RateLimitLayer {
            client,
            domain: domain.into(),
            extractor: Arc::new(extractor),
        }
    }
}

impl<F> Clone for RateLimitLayer<F> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            client: self.client.clone(),
            domain: self.domain.clone(),
            extractor: self.extractor.clone(),
        }
    }
}

impl<S, F> Layer<S> for RateLimitLayer<F> {
    type Service = RateLimitService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            limiter: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `S`.
pub struct RateLimitService<S, F> {
    inner: S,
    limiter: RateLimitLayer<F>,
}

impl<S: Clone, F> Clone for RateLimitService<S, F> {
    fn clone(&self) -> Self {
        RateLimitService {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, F, B, ResBody> Service<Request<B>> for RateLimitService<S, F>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    F: Fn(&Request<B>) -> Option<Vec<Descriptor>> + Send + Sync + 'static,
    B: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone is not ready; the instance polled ready is the one that must serve.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let descriptors = (self.limiter.extractor)(&request).filter(|found| !found.is_empty());
        let Some(descriptors) = descriptors else {
            return Box::pin(inner.call(request));
        };
        let client = self.limiter.client.clone();
        let domain = self.limiter.domain.clone();
        Box::pin(async move {
            match client.should_rate_limit(&domain, &descriptors, 1).await {
                Ok(decision) if decision.allowed => {
                    let mut response = inner.call(request).await?;
                    add_headers(response.headers_mut(), &decision.headers);
                    Ok(response)
                }
                Ok(decision) => Ok(refusal(StatusCode::TOO_MANY_REQUESTS, &decision.headers)),
                Err(Error::InvalidArgument(_)) => Ok(refusal(StatusCode::BAD_REQUEST, &[])),
                Err(_) => Ok(refusal(StatusCode::INTERNAL_SERVER_ERROR, &[])),
            }
        })
    }
}

/// An empty response with `status` and the server's `headers`.
fn refusal<ResBody: Default>(
    status: StatusCode,
    headers: &[(String, String)],
) -> Response<ResBody> {
    let mut response = Response::new(ResBody::default());
    *response.status_mut() = status;
    add_headers(response.headers_mut(), headers);
    response
}

/// Appends the server's headers; one that is not valid HTTP is left out rather than failing
/// the request.
fn add_headers(headers: &mut HeaderMap, added: &[(String, String)]) {
    for (name, value) in added {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
}
