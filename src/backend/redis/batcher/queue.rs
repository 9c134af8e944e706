//! What waits on a lane: a request's hits, its deadline and the channel its answer goes
//! back on, and its turn, which says once whether it was sent or gave up first.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::BackendError;
use crate::backend::redis::script::{Mode, RedisHit};
use crate::limiter::Decision;

/// One request's hits, waiting for their call.
pub(super) struct Request {
    pub(super) hits: Vec<RedisHit>,
    pub(super) mode: Mode,
    pub(super) admitted: Instant,
    /// When the caller stops waiting and answers the request another way.
    pub(super) deadline: Instant,
    /// Whether the request has gone to Redis, or its caller gave up before it did.
    pub(super) turn: Arc<Turn>,
    pub(super) reply: oneshot::Sender<Vec<Result<Decision, BackendError>>>,
}

/// A request's turn, settled once by whichever comes first: its call is sent (the driver),
/// or its caller stops waiting (its deadline). So a caller that gives up knows whether
/// nothing was sent, and a request given up is never sent afterwards.
#[derive(Default)]
pub(super) struct Turn(AtomicU8);

impl Turn {
    const WAITING: u8 = 0;
    const SENT: u8 = 1;
    const ABANDONED: u8 = 2;

    /// The driver sends the request: `false` if its caller has given up on it.
    pub(super) fn send(&self) -> bool {
        match (self.0).compare_exchange(
            Self::WAITING,
            Self::SENT,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(now) => now == Self::SENT,
        }
    }

    /// The caller gives up: `true` if the request was never sent (and now never will be).
    pub(super) fn abandon(&self) -> bool {
        (self.0)
            .compare_exchange(
                Self::WAITING,
                Self::ABANDONED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    pub(super) fn abandoned(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::ABANDONED
    }
}

/// `error` (made for each request) for every hit of every request.
pub(super) fn answer_all(
    requests: &[Request],
    error: impl Fn(&Request) -> BackendError,
) -> Vec<Vec<Result<Decision, BackendError>>> {
    (requests.iter())
        .map(|request| vec![Err(error(request)); request.hits.len()])
        .collect()
}
