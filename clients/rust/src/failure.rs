//! What a failed attempt means for the call: send it again, let the failure mode decide, or
//! hand an error to the caller. The same table as the Python and TypeScript clients
//! (docs/clients.md).

use std::error::Error as StdError;

use tonic::{Code, Status};

/// The trailer floodgate puts on an `UNAVAILABLE` when no hit of the request was counted
/// (the circuit breaker was open, the request was shed, no Redis connection could be made,
/// or Redis ran nothing), with the value [`NOTHING_COUNTED`].
pub(crate) const COUNTED_KEY: &str = "floodgate-counted";
pub(crate) const NOTHING_COUNTED: &str = "none";

/// A failed attempt, sorted by what may follow it.
#[derive(Debug)]
pub(crate) enum Failure {
    /// `UNAVAILABLE` that counted nothing: floodgate's marker says so, or the connection
    /// never opened, so the request never left. Sending it again cannot count twice.
    NotCounted,
    /// `UNAVAILABLE` that may have counted (a Redis timeout after the script ran, a
    /// connection lost after the request went out, a server that does not mark).
    MaybeCounted,
    /// The call's deadline passed.
    DeadlineExceeded,
    /// Anything else: a request the server refuses, a server that is not a rate-limit
    /// service, refused credentials, a server bug. It would repeat, and failing open on it
    /// would hide it, so the caller gets it.
    Fatal(Status),
}

impl Failure {
    /// Sorts the status an attempt ended with.
    pub(crate) fn of(status: Status) -> Failure {
        if never_sent(&status) {
            return Failure::NotCounted;
        }
        match status.code() {
            Code::Unavailable if marked_not_counted(&status) => Failure::NotCounted,
            Code::Unavailable => Failure::MaybeCounted,
            Code::DeadlineExceeded => Failure::DeadlineExceeded,
            // tonic reports a connection lost mid-call as UNKNOWN or CANCELLED with the
            // transport's error as the source; grpcio and grpc-js call it UNAVAILABLE.
            _ if lost_in_transport(&status) => Failure::MaybeCounted,
            _ => Failure::Fatal(status),
        }
    }
}

/// Whether floodgate said that nothing was counted.
fn marked_not_counted(status: &Status) -> bool {
    status
        .metadata()
        .get(COUNTED_KEY)
        .is_some_and(|value| value == NOTHING_COUNTED)
}

/// Whether the channel could not open a connection (refused, no address, a failed TLS
/// handshake): tonic then fails the call before sending anything.
fn never_sent(status: &Status) -> bool {
    sources(status).any(|source| source.is::<tonic::ConnectError>())
}

/// Whether the status stands for a transport failure rather than an answer: a status the
/// server sent has no source.
fn lost_in_transport(status: &Status) -> bool {
    sources(status).any(|source| source.is::<tonic::transport::Error>())
}

fn sources(status: &Status) -> impl Iterator<Item = &(dyn StdError + 'static)> {
    std::iter::successors(status.source(), |error| (*error).source())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable_with(counted: &str) -> Status {
        let mut status = Status::unavailable("backend unavailable");
        let value = counted.parse().expect("an ASCII value");
        status.metadata_mut().insert(COUNTED_KEY, value);
        status
    }

    #[test]
    fn only_the_none_marker_makes_an_unavailable_safe_to_send_again() {
        assert!(matches!(
            Failure::of(unavailable_with("none")),
            Failure::NotCounted
        ));
        assert!(matches!(
            Failure::of(unavailable_with("some")),
            Failure::MaybeCounted
        ));
        assert!(matches!(
            Failure::of(Status::unavailable("redis timeout")),
            Failure::MaybeCounted
        ));
    }

    #[test]
    fn the_marker_on_another_code_changes_nothing() {
        let mut status = Status::invalid_argument("empty key");
        let value = NOTHING_COUNTED.parse().expect("an ASCII value");
        status.metadata_mut().insert(COUNTED_KEY, value);
        assert!(matches!(Failure::of(status), Failure::Fatal(_)));
    }

    #[test]
    fn codes_outside_the_fail_open_set_are_fatal() {
        for status in [
            Status::invalid_argument("x"),
            Status::unimplemented("x"),
            Status::unauthenticated("x"),
            Status::permission_denied("x"),
            Status::internal("x"),
            Status::unknown("x"),
            Status::resource_exhausted("x"),
        ] {
            let code = status.code();
            assert!(matches!(Failure::of(status), Failure::Fatal(_)), "{code:?}");
        }
        assert!(matches!(
            Failure::of(Status::deadline_exceeded("x")),
            Failure::DeadlineExceeded
        ));
    }
}
