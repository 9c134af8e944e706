//! The failures a caller has to handle. A server that cannot answer is not one of them: the
//! failure mode turns that into a degraded [`Decision`](crate::Decision).

/// Why a call produced no decision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request itself (an empty domain or key, a value too long, too
    /// many descriptors): sending it again would fail again, so no failure mode applies.
    #[error("invalid rate-limit request: {0}")]
    InvalidArgument(String),
    /// [`Client::connect`](crate::Client::connect) got a bad URL or could not connect.
    #[error("cannot connect to the rate-limit service: {0}")]
    Connect(#[from] tonic::transport::Error),
}
