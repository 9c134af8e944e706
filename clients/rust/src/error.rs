//! The failures a caller has to handle. A server that cannot answer is not one of them: the
//! failure mode turns that into a degraded [`Decision`](crate::Decision).

use tonic::{Code, Status};

/// Why a call produced no decision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request itself (an empty domain or key, a value too long, too
    /// many descriptors): sending it again would fail again, so no failure mode applies.
    #[error("invalid rate-limit request: {0}")]
    InvalidArgument(String),
    /// An answer outside the failure mode's set (`UNAVAILABLE`, `DEADLINE_EXCEEDED`): a
    /// server that is not a rate-limit service (`UNIMPLEMENTED`), refused credentials
    /// (`UNAUTHENTICATED`, `PERMISSION_DENIED`), a server bug (`INTERNAL`, `UNKNOWN`). These
    /// repeat on every call, and failing open on them would hide them.
    #[error("rate-limit call failed: {}: {}", .0.code(), .0.message())]
    Status(Status),
    /// [`Client::connect`](crate::Client::connect) got a bad URL or could not connect.
    #[error("cannot connect to the rate-limit service: {0}")]
    Connect(#[from] tonic::transport::Error),
}

impl Error {
    /// The error for a status the failure mode does not cover.
    pub(crate) fn from_status(status: Status) -> Error {
        match status.code() {
            Code::InvalidArgument => Error::InvalidArgument(status.message().to_owned()),
            _ => Error::Status(status),
        }
    }
}
