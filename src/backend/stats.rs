//! What the remote backend's calls cost and how they failed, recorded by [`super::Backend`]
//! and read by `metrics`.

use std::time::Duration;

use super::BackendError;
use crate::instruments::{Histogram, Tally};
use crate::limiter::Decision;

/// Why a remote backend call failed, as `floodgate_backend_errors_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Timeout,
    Unavailable,
    Protocol,
    Config,
    /// Not a call: the open circuit breaker refused it.
    CircuitOpen,
    /// Not a call: Redis' quickest round trip is above the command timeout.
    TooFar,
}

impl ErrorKind {
    const ALL: [ErrorKind; 6] = [
        ErrorKind::Timeout,
        ErrorKind::Unavailable,
        ErrorKind::Protocol,
        ErrorKind::Config,
        ErrorKind::CircuitOpen,
        ErrorKind::TooFar,
    ];

    /// The kind of a failed call; `None` for a request shed before any call, which
    /// `floodgate_backend_shed_total` counts instead.
    fn of(error: &BackendError) -> Option<Self> {
        match error {
            BackendError::Timeout(_)
            | BackendError::NotReady(_)
            | BackendError::Late
            | BackendError::Busy(_)
            | BackendError::Unsent { .. } => Some(ErrorKind::Timeout),
            BackendError::TooFar { .. } => Some(ErrorKind::TooFar),
            BackendError::Unavailable(_) | BackendError::NothingCounted(_) => {
                Some(ErrorKind::Unavailable)
            }
            BackendError::Protocol(_) => Some(ErrorKind::Protocol),
            BackendError::CircuitOpen(_) => Some(ErrorKind::CircuitOpen),
            BackendError::Config(_) => Some(ErrorKind::Config),
            BackendError::Overloaded(_) => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Config => "config",
            ErrorKind::CircuitOpen => "circuit_open",
            ErrorKind::TooFar => "too_far",
        }
    }
}

/// A remote backend's calls: their duration and their failures. Owned by the
/// [`Backend`](super::Backend), which records into it; `metrics` renders it.
#[derive(Debug, Default)]
pub struct BackendStats {
    calls: Histogram,
    errors: [Tally; ErrorKind::ALL.len()],
    shed: Tally,
}

impl BackendStats {
    /// One call to the store that took `elapsed` and answered `results`: each kind of
    /// failure among them counts once for the call.
    pub fn record_call(&self, elapsed: Duration, results: &[Result<Decision, BackendError>]) {
        self.calls.observe(elapsed);
        let mut seen = [false; ErrorKind::ALL.len()];
        for error in results.iter().filter_map(|result| result.as_ref().err()) {
            if let Some(kind) = ErrorKind::of(error) {
                seen[kind as usize] = true;
            }
        }
        for (kind, seen) in ErrorKind::ALL.into_iter().zip(seen) {
            if seen {
                self.errors[kind as usize].add(1);
            }
        }
    }

    /// A call the open circuit breaker refused.
    pub fn record_circuit_open(&self) {
        self.errors[ErrorKind::CircuitOpen as usize].add(1);
    }

    /// A request refused without a call, by `results`: Redis' quickest round trip is above
    /// the command timeout (`too_far`), a cluster primary's circuit is open (`circuit_open`),
    /// or else it was shed (the backend had as much in flight as it answers in time).
    pub fn record_unsent(&self, results: &[Result<Decision, BackendError>]) {
        let is = |wanted: fn(&BackendError) -> bool| {
            (results.iter()).any(|result| result.as_ref().err().is_some_and(wanted))
        };
        if is(|error| matches!(error, BackendError::TooFar { .. })) {
            self.errors[ErrorKind::TooFar as usize].add(1);
        } else if is(|error| matches!(error, BackendError::CircuitOpen(_))) {
            self.record_circuit_open();
        } else {
            self.shed.add(1);
        }
    }

    /// How long each call took.
    pub fn calls(&self) -> &Histogram {
        &self.calls
    }

    /// The failed calls by kind, under their `floodgate_backend_errors_total` labels.
    pub fn errors(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        (ErrorKind::ALL.into_iter()).map(|kind| (kind.name(), self.errors[kind as usize].get()))
    }

    /// Requests shed before their call.
    pub fn shed(&self) -> u64 {
        self.shed.get()
    }
}
