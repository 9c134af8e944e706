//! Why a backend could not decide, and what each failure says about counting.

/// Why a backend could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend could not be reached or refused the call; it may have counted the hits
    /// (a connection that broke after the call was sent).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend counted none of the hits: the call was never sent (the circuit is open,
    /// no connection could be made) or Redis answered that it ran nothing (past the call's
    /// deadline). A request failed only this way may be sent again without counting twice.
    #[error("backend unavailable: {0}")]
    NothingCounted(String),
    /// The backend did not answer within the command timeout (or the request's own
    /// deadline, when that came first).
    #[error("backend did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// No connection was ready within the request's wait (or the connection's set-up ran
    /// out of time): nothing was sent. For the breaker a silence, like a timeout; for the
    /// caller, safe to send again.
    #[error("backend connection not ready within {0:?}; nothing was sent")]
    NotReady(std::time::Duration),
    /// The request's deadline passed while the backend, answering other calls, had not yet
    /// answered this one: it may still count it. For the breaker an answer (the backend is
    /// alive, only slow); for the caller, like a timeout.
    #[error("backend busy: no answer within {0:?}")]
    Busy(std::time::Duration),
    /// Redis ran the call after the request's deadline and decided nothing. Redis is alive
    /// (it answered): for the breaker an answer; for the caller, safe to send again.
    #[error("backend ran the call past its deadline; nothing was counted")]
    Late,
    /// The request's wait ended while it still waited for its turn on the connection: its
    /// call was never sent, and never will be. `answering`: replies came back meanwhile
    /// (for the breaker an answer, a busy backend; otherwise a silence, like a timeout).
    #[error("backend gave no turn within {waited:?}; nothing was sent")]
    Unsent {
        waited: std::time::Duration,
        answering: bool,
    },
    /// Refused without a call: Redis' quickest round trip lately is above the command
    /// timeout, so no call could be answered in time. Not a failure for the breaker.
    #[error(
        "redis is too far: its quickest round trip lately ({round_trip:?}) is above \
         redis_command_timeout_ms ({timeout:?}); nothing was sent"
    )]
    TooFar {
        round_trip: std::time::Duration,
        timeout: std::time::Duration,
    },
    /// Refused without a call: the circuit breaker of the store (or of the cluster primary
    /// that serves the hit's slot) is open, because it keeps failing.
    #[error("backend unavailable: circuit open: {0}")]
    CircuitOpen(String),
    /// Shed before any wait: the backend already had as much work in flight as it answers
    /// in time. The backend is alive; the request gets its rules' failure policy at once.
    #[error("backend overloaded: request shed before calling it ({0})")]
    Overloaded(&'static str),
    /// The backend answered something a script never returns.
    #[error("unexpected backend reply: {0}")]
    Protocol(String),
    /// The backend settings are unusable.
    #[error("backend settings: {0}")]
    Config(String),
}

impl BackendError {
    /// Whether the hit was certainly not counted (shed, never sent, refused by settings, or
    /// run past its deadline), so that sending it again cannot count it twice.
    pub fn counted_nothing(&self) -> bool {
        matches!(
            self,
            BackendError::NothingCounted(_)
                | BackendError::NotReady(_)
                | BackendError::Unsent { .. }
                | BackendError::TooFar { .. }
                | BackendError::Late
                | BackendError::CircuitOpen(_)
                | BackendError::Overloaded(_)
                | BackendError::Config(_)
        )
    }
}
