//! Where counters are kept: the memory store in this process, or a remote store behind the
//! [`RemoteStore`] seam (a standalone Redis, one Redis Sentinel names, a Redis Cluster).
//!
//! The memory store stays a plain arm: it answers at once, and its answers are built where
//! the request's future is, with no box and no dynamic call. A remote store's call is boxed
//! anyway (see [`Store::hit_all`]), so a trait object costs it nothing more.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::{BackendError, CounterHit, MemoryBackend, OnReject};
use crate::limiter::{CounterKey, Decision, Limit};

/// A counter store outside this process. What a new one implements: one file, one arm in
/// `setup.rs` and one settings section (docs/development.md, "Adding a counter store").
///
/// The breaker in front of it and the cache of counters it reported exhausted are not its
/// business: [`Backend`](super::Backend) puts them around every remote store.
pub trait RemoteStore: Send + Sync + 'static {
    /// How traces and logs name the store: `redis`, `redis-cluster`.
    fn kind(&self) -> &'static str;

    /// Applies every hit and answers each, in order, by `deadline` (the request's; the
    /// store's own command timeout from now when it has none). With `all_or_nothing`, a
    /// request whose binding hit is rejected changes no counter (atomically where the store
    /// can, by giving back otherwise). A hit the store could not decide is an error, and
    /// says whether it may have been counted ([`BackendError::counted_nothing`]).
    fn decide<'a>(
        &'a self,
        hits: &'a [CounterHit<'a>],
        all_or_nothing: bool,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Vec<Result<Decision, BackendError>>>;

    /// Forgets the state of `counters`; how many states (Redis: keys) existed.
    fn forget<'a>(
        &'a self,
        counters: &'a [(CounterKey, Limit)],
    ) -> BoxFuture<'a, Result<u64, BackendError>>;

    /// A cheap call that succeeds only when the store answers (and leaves it ready for the
    /// next requests: Redis' scripts loaded). The breaker's probe.
    fn probe(&self) -> BoxFuture<'_, Result<(), BackendError>>;

    /// Gets the store ready at start-up (connections opened, scripts loaded), so that the
    /// first requests wait for none of it; the first failure.
    fn prepare(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        self.probe()
    }

    /// The most a request waits for this store, whatever its caller's deadline
    /// (`redis_max_wait_ms`).
    fn max_wait(&self) -> Duration;

    /// The quickest round trip to the store lately, where it is longest (of its
    /// connections, or nodes); `None` before one was measured.
    fn round_trip(&self) -> Option<Duration> {
        None
    }

    /// Whether the store keeps circuit breakers of its own (a Redis Cluster: one per
    /// primary), so that none is put in front of it.
    fn own_breakers(&self) -> bool {
        false
    }

    /// Whether the store answers as far as its own breakers judge (always, without any).
    fn healthy(&self) -> bool {
        true
    }

    /// Probes what the store's own breakers keep closed off, where due.
    fn probe_own_breakers(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// The store did not answer `error` at start-up: its own breakers start open.
    fn open_at_start(&self, error: &dyn std::fmt::Display) {
        let _ = error;
    }
}

/// Where counters live.
#[derive(Clone)]
pub enum Store {
    Memory(Arc<MemoryBackend>),
    Remote(Arc<dyn RemoteStore>),
}

impl Store {
    /// How traces name the store.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Remote(remote) => remote.kind(),
        }
    }

    pub(super) async fn hit_all(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Vec<Result<Decision, BackendError>> {
        // One hit consumes nothing when it is rejected anyway: the plain path is exact.
        let all_or_nothing = on_reject == OnReject::ConsumeNothing && hits.len() > 1;
        match self {
            Store::Memory(memory) if all_or_nothing => (memory.hit_all_or_nothing(hits))
                .into_iter()
                .map(Ok)
                .collect(),
            Store::Memory(memory) => (hits.iter())
                .map(|hit| Ok(memory.hit(&hit.key, &hit.limit, hit.hits)))
                .collect(),
            // A remote call is boxed: its future (pipelines, timeouts, redirects) is
            // kilobytes, and left inline it would make every request's future that large,
            // memory backend included, to be copied as the request moves through the server
            // (measured: memcpy was 8–10% of the server's CPU).
            Store::Remote(remote) => remote.decide(hits, all_or_nothing, deadline).await,
        }
    }

    pub(super) async fn reset(
        &self,
        counters: &[(CounterKey, Limit)],
    ) -> Result<u64, BackendError> {
        match self {
            Store::Memory(memory) => {
                let removed = counters.iter().filter(|(key, _)| memory.remove(key));
                Ok(removed.count() as u64)
            }
            Store::Remote(remote) => remote.forget(counters).await,
        }
    }

    /// The remote store, if this is one.
    pub(super) fn remote(&self) -> Option<&dyn RemoteStore> {
        match self {
            Store::Memory(_) => None,
            Store::Remote(remote) => Some(remote.as_ref()),
        }
    }

    pub(super) async fn probe(&self) -> Result<(), BackendError> {
        match self.remote() {
            Some(remote) => remote.probe().await,
            None => Ok(()),
        }
    }
}
