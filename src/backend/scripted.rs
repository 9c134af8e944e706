//! A remote store the unit tests script: it counts in memory while it is up and fails every
//! call while it is down, and tells how many calls reached it. The whole of what a new store
//! implements is here ([`RemoteStore`]); the breaker, the over-limit cache and the
//! per-second split around it are the real ones.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::{BackendError, CounterHit, MemoryBackend, RemoteStore};
use crate::limiter::{CounterKey, Decision, Limit};

/// A store that is up (counting in `memory`) or down (every call fails).
pub struct ScriptedStore {
    pub memory: MemoryBackend,
    down: AtomicBool,
    calls: AtomicUsize,
}

impl ScriptedStore {
    /// An answering store whose counters live in `memory`.
    pub fn new(memory: MemoryBackend) -> Self {
        ScriptedStore {
            memory,
            down: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        }
    }

    /// From now on every call fails (`true`), or is answered (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// How many calls (hits and probes) reached the store.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Counts a call; whether the store answers it.
    fn reached(&self) -> Result<(), BackendError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.down.load(Ordering::SeqCst) {
            true => Err(BackendError::Unavailable(
                "the scripted store is down".into(),
            )),
            false => Ok(()),
        }
    }
}

impl RemoteStore for ScriptedStore {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    fn decide<'a>(
        &'a self,
        hits: &'a [CounterHit<'a>],
        all_or_nothing: bool,
        _deadline: Option<Instant>,
    ) -> BoxFuture<'a, Vec<Result<Decision, BackendError>>> {
        let results = match self.reached() {
            Err(down) => vec![Err(down); hits.len()],
            Ok(()) if all_or_nothing => (self.memory.hit_all_or_nothing(hits))
                .into_iter()
                .map(Ok)
                .collect(),
            Ok(()) => (hits.iter())
                .map(|hit| Ok(self.memory.hit(&hit.key, &hit.limit, hit.hits)))
                .collect(),
        };
        Box::pin(async move { results })
    }

    fn forget<'a>(
        &'a self,
        counters: &'a [(CounterKey, Limit)],
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        let forgotten = self.reached().map(|()| {
            let removed = counters.iter().filter(|(key, _)| self.memory.remove(key));
            removed.count() as u64
        });
        Box::pin(async move { forgotten })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        let answered = self.reached();
        Box::pin(async move { answered })
    }

    fn max_wait(&self) -> Duration {
        Duration::from_millis(40)
    }
}
