//! Where counters live, behind one seam: [`Backend::hit_all`] takes every counter hit of a
//! request at once, so a remote backend can send them in one round trip.
//!
//! `memory` is the embedded backend. Redis and Redis Cluster join as further variants.

pub mod memory;

use std::borrow::Cow;
use std::sync::Arc;

pub use memory::MemoryBackend;

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
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// The configured counter store.
#[derive(Clone)]
pub enum Backend {
    Memory(Arc<MemoryBackend>),
}

impl Backend {
    /// Applies every hit and answers each, in order.
    pub async fn hit_all(&self, hits: &[CounterHit<'_>]) -> Result<Vec<Decision>, BackendError> {
        match self {
            Backend::Memory(memory) => Ok(hits
                .iter()
                .map(|hit| memory.hit(&hit.key, &hit.limit, hit.hits))
                .collect()),
        }
    }
}
