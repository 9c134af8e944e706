//! Where counters live, behind one seam: [`Backend::hit_all`] takes every counter hit of a
//! request at once, so a remote backend can send them in one round trip.
//!
//! `memory` is the embedded backend; `redis` keeps counters in Redis, shared by every
//! replica.

pub mod memory;
pub mod redis;

use std::borrow::Cow;
use std::sync::Arc;

pub use memory::MemoryBackend;
pub use redis::{RedisBackend, RedisOptions};

use crate::limiter::{CounterKey, Decision, Hits, Limit};

/// One hit on one counter.
#[derive(Debug, Clone)]
pub struct CounterHit<'a> {
    pub key: CounterKey,
    pub limit: Cow<'a, Limit>,
    pub hits: Hits,
}

/// Why a backend could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The backend could not be reached or refused the call.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer within the command timeout.
    #[error("backend did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The backend answered something a script never returns.
    #[error("unexpected backend reply: {0}")]
    Protocol(String),
    /// The backend settings are unusable.
    #[error("backend settings: {0}")]
    Config(String),
}

/// The configured counter store.
#[derive(Clone)]
pub enum Backend {
    Memory(Arc<MemoryBackend>),
    Redis(Arc<RedisBackend>),
}

impl Backend {
    /// Applies every hit and answers each, in order. A remote backend may fail some or all
    /// of them; the caller applies each rule's `on_backend_error`.
    pub async fn hit_all(&self, hits: &[CounterHit<'_>]) -> Vec<Result<Decision, BackendError>> {
        match self {
            Backend::Memory(memory) => hits
                .iter()
                .map(|hit| Ok(memory.hit(&hit.key, &hit.limit, hit.hits)))
                .collect(),
            Backend::Redis(redis) => redis.hit_all(hits).await,
        }
    }
}
