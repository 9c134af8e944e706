//! A remote store the unit tests script: it counts in memory while it is up and fails every
//! call while it is down, and tells how many calls reached it. The whole of what a new store
//! implements is here ([`RemoteStore`]); the breaker, the over-limit cache and the
//! per-second split around it are the real ones.

use std::sync::Arc;
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

    /// The store the settings' `scripted` section describes, counting in memory on the
    /// system clock.
    pub fn from_settings(settings: &crate::settings::ScriptedSettings) -> Self {
        let clock = Arc::new(crate::clock::SystemClock);
        let store = ScriptedStore::new(MemoryBackend::new(clock, 1_000));
        store.set_down(settings.down);
        store
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::Arc;

    use crate::backend::{Backend, BackendError, CounterHit, MemoryBackend, OnReject};
    use crate::clock::SystemClock;
    use crate::limiter::{CounterKey, Hits, Limit, Unit};
    use crate::settings::Settings;

    /// A backend built from settings that name the scripted store, with `more` settings.
    async fn from_settings(more: &[(&str, &str)]) -> Backend {
        let env = [("FLOODGATE_BACKEND", "scripted")].iter().chain(more);
        let env = env.map(|(name, value)| (name.to_string(), value.to_string()));
        let settings = Settings::load_from(None, env, Default::default()).expect("settings");
        let clock = Arc::new(SystemClock);
        let memory = Arc::new(MemoryBackend::new(clock.clone(), 1_000));
        (Backend::from_settings(&settings, clock, &memory).await).expect("a backend")
    }

    fn hit(limit: &Limit) -> CounterHit<'static> {
        CounterHit {
            key: CounterKey::new("d", "r", 0, limit, [("user", "alice")]),
            limit: Cow::Owned(limit.clone()),
            hits: Hits::take(1),
            binding: true,
        }
    }

    /// A store is one file, one arm in `setup.rs` and one settings section: named in the
    /// settings, this one is built, sits behind the breaker and the cache every remote store
    /// gets, counts, and reads its own section.
    #[tokio::test]
    async fn the_store_the_settings_name_is_built_with_its_own_section() {
        let limit = Limit::per(1, Unit::Minute);
        let backend = from_settings(&[]).await;
        assert_eq!(backend.kind(), "scripted");
        assert_eq!(allowed(&backend, &limit).await, Ok(true));
        assert_eq!(allowed(&backend, &limit).await, Ok(false));
        let down = from_settings(&[("FLOODGATE_SCRIPTED__DOWN", "true")]).await;
        assert!(matches!(
            allowed(&down, &limit).await,
            Err(BackendError::Unavailable(_))
        ));
    }

    /// Whether one hit on `limit` is allowed, or the error that failed it.
    async fn allowed(backend: &Backend, limit: &Limit) -> Result<bool, BackendError> {
        let answers = backend
            .hit_all(&[hit(limit)], OnReject::Consume, None)
            .await;
        answers.results[0].clone().map(|decision| decision.allowed)
    }
}
