//! Where counters live, behind one seam: [`Backend::hit_all`] takes every counter hit of a
//! request at once, so a remote backend can send them in one round trip.
//!
//! `memory` is the embedded backend; `redis` keeps counters in Redis, shared by every
//! replica.

mod bounded;
pub mod breaker;
mod capacity;
pub mod memory;
mod over_limit;
mod recent;
pub mod redis;
mod setup;
mod stats;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

pub use breaker::Breaker;
use breaker::{Admission, BreakerState, CallEnd};
pub use memory::MemoryBackend;
pub use over_limit::{CacheCounts, OverLimitCache};
pub use redis::{RedisBackend, RedisClusterBackend, RedisOptions, RedisTls};
pub use stats::BackendStats;

use crate::limiter::{CounterKey, Decision, Hits, Limit, Unit};

/// One hit on one counter.
#[derive(Debug, Clone)]
pub struct CounterHit<'a> {
    pub key: CounterKey,
    pub limit: Cow<'a, Limit>,
    pub hits: Hits,
    /// Whether this hit's rejection rejects the whole request (not a shadow-mode or
    /// quota-mode rule, no global shadow mode). Only binding rejections undo the request's
    /// other hits under [`OnReject::ConsumeNothing`].
    pub binding: bool,
}

/// What a rejected request does to the counters of its other hits: the `consume_on_reject`
/// setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnReject {
    /// Every hit is counted on its own, whatever the others decide (envoyproxy/ratelimit).
    #[default]
    Consume,
    /// A request with a rejected binding hit changes no counter: atomic on the memory
    /// backend and on a standalone Redis, best effort (a give-back) on a Redis Cluster.
    ConsumeNothing,
}

impl OnReject {
    pub fn from_setting(consume_on_reject: bool) -> Self {
        if consume_on_reject {
            OnReject::Consume
        } else {
            OnReject::ConsumeNothing
        }
    }
}

/// Whether `results` reject the request: a binding hit was answered with a rejection.
pub(crate) fn rejects(hits: &[CounterHit<'_>], results: &[Result<Decision, BackendError>]) -> bool {
    hits.iter()
        .zip(results)
        .any(|(hit, result)| hit.binding && matches!(result, Ok(decision) if !decision.allowed))
}

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

/// Where counters live.
#[derive(Clone)]
pub enum Store {
    Memory(Arc<MemoryBackend>),
    Redis(Arc<RedisBackend>),
    RedisCluster(Arc<RedisClusterBackend>),
    /// A link the unit tests below script: the one seam a test may fake (the integration
    /// tests run real Redis).
    #[cfg(test)]
    Fake(Arc<tests::FakeLink>),
}

impl Store {
    async fn hit_all(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Vec<Result<Decision, BackendError>> {
        // One hit consumes nothing when it is rejected anyway: the plain path is exact.
        let all_or_nothing = on_reject == OnReject::ConsumeNothing && hits.len() > 1;
        // A remote call is boxed: its future (pipelines, timeouts, redirects) is kilobytes,
        // and left inline it would make every request's future that large, memory backend
        // included, to be copied as the request moves through the server (measured: memcpy
        // was 8–10% of the server's CPU).
        let remote: BoxFuture<'_, Vec<Result<Decision, BackendError>>> = match self {
            Store::Memory(memory) if all_or_nothing => {
                return memory
                    .hit_all_or_nothing(hits)
                    .into_iter()
                    .map(Ok)
                    .collect();
            }
            Store::Memory(memory) => {
                return hits
                    .iter()
                    .map(|hit| Ok(memory.hit(&hit.key, &hit.limit, hit.hits)))
                    .collect();
            }
            Store::Redis(redis) => Box::pin(redis.hit_all(hits, all_or_nothing, deadline)),
            Store::RedisCluster(cluster) if all_or_nothing => {
                Box::pin(cluster.hit_all_or_give_back(hits, deadline))
            }
            Store::RedisCluster(cluster) => Box::pin(cluster.hit_all(hits, deadline)),
            #[cfg(test)]
            Store::Fake(link) => return link.hit_all(hits, all_or_nothing),
        };
        remote.await
    }

    /// Forgets the state of `counters`; how many states (Redis: keys) existed.
    async fn reset(&self, counters: &[(CounterKey, Limit)]) -> Result<u64, BackendError> {
        match self {
            Store::Memory(memory) => {
                let removed = counters.iter().filter(|(key, _)| memory.remove(key));
                Ok(removed.count() as u64)
            }
            Store::Redis(redis) => {
                let keys: Vec<(String, Limit)> = (counters.iter())
                    .map(|(key, limit)| (redis.full_key(key.as_str()), limit.clone()))
                    .collect();
                redis.delete(&keys).await
            }
            Store::RedisCluster(cluster) => {
                let keys: Vec<(String, Limit)> = (counters.iter())
                    .map(|(key, limit)| (cluster.full_key(key.as_str()), limit.clone()))
                    .collect();
                cluster.delete(&keys).await
            }
            #[cfg(test)]
            Store::Fake(link) => Ok(counters
                .iter()
                .filter(|(key, _)| link.memory.remove(key))
                .count() as u64),
        }
    }

    /// Gets the store ready to answer at start-up (connections opened, scripts loaded), so
    /// that the first requests wait for none of it; the first failure.
    async fn prepare(&self) -> Result<(), BackendError> {
        match self {
            Store::Redis(redis) => redis.prepare().await,
            other => other.probe().await,
        }
    }

    /// Whether the store answers as far as it judges itself: a Redis Cluster, with a breaker
    /// per primary, while any primary's is closed (or, before it was ever reached, while it
    /// answered at start-up). The other stores are judged by their breaker.
    fn healthy(&self) -> bool {
        match self {
            Store::RedisCluster(cluster) => cluster.healthy(),
            _ => true,
        }
    }

    /// Probes what the store's own breakers keep closed off, where due (a cluster's primaries).
    async fn probe_own_breakers(&self) {
        if let Store::RedisCluster(cluster) = self {
            cluster.probe_if_due().await;
        }
    }

    /// A cheap call that succeeds only when the store answers (and leaves the scripts
    /// loaded, so the first requests after a recovery need no NOSCRIPT round).
    async fn probe(&self) -> Result<(), BackendError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(redis) => redis.load_scripts().await,
            Store::RedisCluster(cluster) => cluster.load_scripts().await,
            #[cfg(test)]
            Store::Fake(link) => link.probe(),
        }
    }
}

/// The configured counter stores: the primary one, and where the counters of per-second
/// limits live instead when they have a store of their own (upstream's `REDIS_PERSECOND`).
#[derive(Clone)]
pub struct Backend {
    primary: Guarded,
    per_second: Option<Guarded>,
}

/// One counter store; a remote one sits behind its circuit breaker and a cache of the
/// counters it reported exhausted. Both stores of a backend share one set of stats.
#[derive(Clone)]
struct Guarded {
    store: Store,
    breaker: Option<Arc<Breaker>>,
    over_limit: Option<Arc<OverLimitCache>>,
    stats: Arc<BackendStats>,
}

/// The backend's answers to a request's hits, in order, and where each came from.
#[derive(Debug)]
pub struct Answers {
    pub results: Vec<Result<Decision, BackendError>>,
    /// One per hit, or empty when every answer came from the store (the common case, kept
    /// free of an allocation).
    origins: Vec<AnsweredBy>,
}

/// Where one answer came from, for the rule statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredBy {
    /// The store counted the hit (or failed to).
    Store,
    /// The over-limit cache rejected it without the store.
    OverLimitCache,
    /// No counter decided it: another hit's cached rejection settled the request first.
    NotConsulted,
}

impl Answers {
    fn from_store(results: Vec<Result<Decision, BackendError>>) -> Self {
        Answers {
            results,
            origins: Vec::new(),
        }
    }

    pub fn origin(&self, index: usize) -> AnsweredBy {
        self.origins
            .get(index)
            .copied()
            .unwrap_or(AnsweredBy::Store)
    }
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

impl Backend {
    /// Which store holds the counters, as traces name it.
    pub fn kind(&self) -> &'static str {
        match self.primary.store {
            Store::Memory(_) => "memory",
            Store::Redis(_) => "redis",
            Store::RedisCluster(_) => "redis-cluster",
            #[cfg(test)]
            Store::Fake(_) => "fake",
        }
    }

    pub fn memory(memory: Arc<MemoryBackend>) -> Self {
        let primary = Guarded {
            store: Store::Memory(memory),
            breaker: None,
            over_limit: None,
            stats: Arc::default(),
        };
        Backend {
            primary,
            per_second: None,
        }
    }

    /// A remote store behind `breaker` (`None` for a store with breakers of its own: a Redis
    /// Cluster's, one per primary) and `over_limit`.
    pub fn remote(store: Store, breaker: Option<Breaker>, over_limit: OverLimitCache) -> Self {
        let primary = Guarded {
            store,
            breaker: breaker.map(Arc::new),
            over_limit: Some(Arc::new(over_limit)),
            stats: Arc::default(),
        };
        Backend {
            primary,
            per_second: None,
        }
    }

    /// This backend, with the counters of per-second limits kept in `per_second` instead
    /// (a second Redis sized for their rate). A request's hits of both kinds go to both
    /// stores at once.
    pub fn with_per_second(self, per_second: Backend) -> Self {
        let per_second = Guarded {
            stats: self.primary.stats.clone(),
            ..per_second.primary
        };
        Backend {
            per_second: Some(per_second),
            ..self
        }
    }

    /// The stores the counters live in: the primary one, and the per-second one if any.
    fn stores(&self) -> impl Iterator<Item = &Guarded> {
        std::iter::once(&self.primary).chain(self.per_second.as_ref())
    }

    /// Forgets what the backend said about exhausted counters, so that a limit a rule reload
    /// raised applies at once instead of when the remembered rejection expires.
    pub fn forget_exhausted(&self) {
        for cache in self.stores().filter_map(|store| store.over_limit.as_ref()) {
            cache.clear();
        }
    }

    /// Applies every hit and answers each, in order. A remote backend may fail some or all
    /// of them; the caller applies each rule's `on_backend_error`. Counters known to be
    /// exhausted are answered without the backend; while the breaker is open every other
    /// hit fails at once. Under [`OnReject::ConsumeNothing`] a request with a rejected
    /// binding hit changes no counter, and one whose rejection the cache already knows is not
    /// sent to the backend at all. `deadline` is the request's own, when it has one shorter
    /// than the backend's command timeout.
    pub async fn hit_all(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Answers {
        match &self.per_second {
            Some(per_second) if hits.iter().any(is_per_second) => {
                // Boxed, as a remote call is: the common path's future stays small.
                let split = self.hit_split(per_second, hits, on_reject, deadline);
                Box::pin(split).await
            }
            _ => self.primary.hit_here(hits, on_reject, deadline).await,
        }
    }

    /// The per-second hits on `per_second`, the others on the primary store, both at once;
    /// the answers in the order of `hits`. Under [`OnReject::ConsumeNothing`] each store
    /// counts its part all or nothing, and a part a binding rejection in the other part
    /// overrules is given back (best effort, as on a Redis Cluster: the two stores share no
    /// transaction).
    async fn hit_split(
        &self,
        per_second: &Guarded,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Answers {
        let (seconds, others): (Vec<usize>, Vec<usize>) =
            (0..hits.len()).partition(|&i| is_per_second(&hits[i]));
        let part = |indices: &[usize]| -> Vec<CounterHit<'_>> {
            indices.iter().map(|&i| hits[i].clone()).collect()
        };
        let (second_hits, other_hits) = (part(&seconds), part(&others));
        let (mut second_answers, mut other_answers) = futures_util::join!(
            per_second.hit_here(&second_hits, on_reject, deadline),
            self.primary.hit_here(&other_hits, on_reject, deadline),
        );
        if on_reject == OnReject::ConsumeNothing {
            if rejects(&second_hits, &second_answers.results) {
                self.primary
                    .give_back(&other_hits, &mut other_answers.results, deadline)
                    .await;
            } else if rejects(&other_hits, &other_answers.results) {
                (per_second.give_back(&second_hits, &mut second_answers.results, deadline)).await;
            }
        }
        let mut merged: Vec<Option<(Result<Decision, BackendError>, AnsweredBy)>> =
            (0..hits.len()).map(|_| None).collect();
        for (indices, answers) in [(seconds, second_answers), (others, other_answers)] {
            let origins: Vec<AnsweredBy> = (0..indices.len()).map(|j| answers.origin(j)).collect();
            for ((i, result), origin) in indices.into_iter().zip(answers.results).zip(origins) {
                merged[i] = Some((result, origin));
            }
        }
        let (results, origins): (Vec<_>, Vec<_>) = (merged.into_iter())
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    let missing = BackendError::Protocol("fewer answers than calls".into());
                    (Err(missing), AnsweredBy::Store)
                })
            })
            .unzip();
        Answers { results, origins }
    }

    /// The remote calls' duration and failures.
    pub fn stats(&self) -> &BackendStats {
        &self.primary.stats
    }

    /// The quickest round trip to Redis lately, of the connection (or primary, or store)
    /// where it is longest; `None` on memory and before the first was measured.
    pub fn redis_round_trip(&self) -> Option<Duration> {
        self.stores().filter_map(Guarded::redis_round_trip).max()
    }

    /// Whether the circuit breaker is open (never, without one).
    pub fn circuit_open(&self) -> bool {
        !self.healthy()
    }

    /// Forgets `counters` as if never hit (the admin API's reset): their state in the
    /// store, and any rejection remembered for them; how many states existed.
    pub async fn reset(&self, counters: &[(CounterKey, Limit)]) -> Result<u64, BackendError> {
        let Some(per_second) = &self.per_second else {
            return self.primary.reset_here(counters).await;
        };
        let (seconds, others): (Vec<_>, Vec<_>) =
            (counters.iter().cloned()).partition(|(_, limit)| limit.unit == Unit::Second);
        let removed = per_second.reset_here(&seconds).await?;
        Ok(removed + self.primary.reset_here(&others).await?)
    }

    /// How many exhausted counters the over-limit caches remember (0 without one).
    pub fn over_limit_cache_len(&self) -> usize {
        (self.stores())
            .filter_map(|store| store.over_limit.as_ref())
            .map(|cache| cache.len())
            .sum()
    }

    /// The over-limit caches' counts, added up; `None` without an enabled one.
    pub fn over_limit_counts(&self) -> Option<CacheCounts> {
        (self.stores())
            .filter_map(|store| store.over_limit.as_ref())
            .filter(|cache| cache.enabled())
            .map(|cache| cache.counts())
            .reduce(|total, counts| total + counts)
    }

    /// Opens the primary store's breaker (not the per-second store's): it did not answer
    /// `error` at start-up.
    pub fn open_at_start(&self, error: &dyn std::fmt::Display) {
        if let Some(breaker) = &self.primary.breaker {
            breaker.open_at_start(error);
        }
        if let Store::RedisCluster(cluster) = &self.primary.store {
            cluster.open_at_start(error);
        }
    }

    /// Whether the backend answers: false while a breaker is open (on a Redis Cluster, while
    /// every primary's is).
    pub fn healthy(&self) -> bool {
        self.stores().all(|store| {
            let closed = (store.breaker.as_ref())
                .is_none_or(|breaker| breaker.state() == BreakerState::Closed);
            closed && store.store.healthy()
        })
    }

    /// While the breaker is open and its cooldown is over, probes the store once; a store
    /// that answers closes the breaker. This is what brings a backend back when no traffic
    /// comes (readiness may have sent it elsewhere).
    pub async fn probe_if_due(&self) {
        for store in self.stores() {
            store.probe_own_if_due().await;
        }
    }
}

impl Guarded {
    /// [`Backend::hit_all`] on this store alone.
    async fn hit_here(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Answers {
        let Some(cache) = &self.over_limit else {
            return Answers::from_store(self.call(hits, on_reject, deadline).await);
        };
        // An overshoot charge is counted even on an exhausted counter: never answered here.
        let cached: Vec<Option<Decision>> = hits
            .iter()
            .map(|hit| {
                let charge = hit.limit.overshoot && !hit.hits.negative && hit.hits.amount > 0;
                (!charge)
                    .then(|| cache.answer(&hit.key, hit.hits))
                    .flatten()
            })
            .collect();
        // Redis computes the time left after this; from it, the entry can only end early.
        let asked = cache.now_micros();
        let mut origins = Vec::new();
        let results = if cached.iter().all(Option::is_none) {
            self.call(hits, on_reject, deadline).await
        } else if on_reject == OnReject::ConsumeNothing && cached_rejection_binds(hits, &cached) {
            origins = (cached.iter())
                .map(|answer| match answer {
                    Some(_) => AnsweredBy::OverLimitCache,
                    None => AnsweredBy::NotConsulted,
                })
                .collect();
            cached
                .into_iter()
                .map(|answer| Ok(answer.unwrap_or(NOT_CONSULTED)))
                .collect()
        } else {
            origins = (cached.iter())
                .map(|answer| match answer {
                    Some(_) => AnsweredBy::OverLimitCache,
                    None => AnsweredBy::Store,
                })
                .collect();
            let pending: Vec<CounterHit<'_>> = hits
                .iter()
                .zip(&cached)
                .filter(|(_, answer)| answer.is_none())
                .map(|(hit, _)| hit.clone())
                .collect();
            let mut fetched = self.call(&pending, on_reject, deadline).await.into_iter();
            cached
                .into_iter()
                .map(|answer| match answer {
                    Some(decision) => Ok(decision),
                    None => fetched.next().unwrap_or_else(|| {
                        Err(BackendError::Protocol("fewer answers than calls".into()))
                    }),
                })
                .collect()
        };
        let answers = Answers { results, origins };
        for (i, (hit, result)) in hits.iter().zip(&answers.results).enumerate() {
            if let (Ok(decision), AnsweredBy::Store) = (result, answers.origin(i)) {
                cache.observe(&hit.key, decision, asked);
            }
        }
        answers
    }

    /// Returns the quota `hits` took (by `results`) to this store, and leaves in `results`
    /// the counters as the give-back left them.
    async fn give_back(
        &self,
        hits: &[CounterHit<'_>],
        results: &mut [Result<Decision, BackendError>],
        deadline: Option<Instant>,
    ) {
        let (taken, give_backs) = give_backs(hits, results);
        let returned = self.call(&give_backs, OnReject::Consume, deadline).await;
        settle_give_backs(results, taken, returned);
    }

    /// The store's answers, through the breaker when there is one (a Redis Cluster has one
    /// per primary, inside the store), the call recorded in the stats.
    async fn call(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Vec<Result<Decision, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        if matches!(self.store, Store::Memory(_)) {
            return self.store.hit_all(hits, on_reject, deadline).await;
        }
        let admission = self.breaker.as_ref().map(|breaker| breaker.admit());
        if admission == Some(Admission::Reject) {
            self.stats.record_circuit_open();
            let open = BackendError::CircuitOpen("the backend keeps failing".into());
            return vec![Err(open); hits.len()];
        }
        let started = Instant::now();
        let since = self.breaker.as_ref().map(|breaker| breaker.now());
        let results = self.store.hit_all(hits, on_reject, deadline).await;
        let ended = outcome(&results);
        match ended {
            Some(_) => self.stats.record_call(started.elapsed(), &results),
            // Nothing was sent (shed, Redis too far, a cluster primary's circuit open):
            // nothing is learnt about the backend.
            None => self.stats.record_unsent(&results),
        }
        if let (Some(breaker), Some(admission), Some(since)) = (&self.breaker, admission, since) {
            match ended {
                Some(ended) => {
                    if ended != CallEnd::Answered
                        && let Some(error) = results.iter().find_map(|result| result.as_ref().err())
                    {
                        breaker.note_error(error);
                    }
                    breaker.record(admission, ended, since);
                }
                None if admission == Admission::Probe => {
                    breaker.record(admission, CallEnd::TimedOut, since);
                }
                None => {}
            }
        }
        results
    }

    /// The quickest round trip to this store's Redis lately; `None` on memory.
    fn redis_round_trip(&self) -> Option<Duration> {
        match &self.store {
            Store::Memory(_) => None,
            Store::Redis(redis) => redis.quickest_round_trip(),
            Store::RedisCluster(cluster) => cluster.quickest_round_trip(),
            #[cfg(test)]
            Store::Fake(_) => None,
        }
    }

    async fn reset_here(&self, counters: &[(CounterKey, Limit)]) -> Result<u64, BackendError> {
        if counters.is_empty() {
            return Ok(0);
        }
        if let Some(cache) = &self.over_limit {
            for (key, _) in counters {
                cache.forget(key);
            }
        }
        self.store.reset(counters).await
    }

    async fn probe_own_if_due(&self) {
        self.store.probe_own_breakers().await;
        let Some(breaker) = &self.breaker else {
            return;
        };
        if breaker.state() == BreakerState::Closed {
            return;
        }
        let admission = breaker.admit();
        if admission == Admission::Probe {
            let since = breaker.now();
            let outcome = match self.store.probe().await {
                Ok(()) => CallEnd::Answered,
                Err(error) => {
                    breaker.note_error(&error);
                    match error {
                        BackendError::Timeout(_) | BackendError::NotReady(_) => CallEnd::TimedOut,
                        _ => CallEnd::Failed,
                    }
                }
            };
            breaker.record(admission, outcome, since);
        }
    }
}

/// Whether `hit`'s counter lives in the per-second store, when there is one.
fn is_per_second(hit: &CounterHit<'_>) -> bool {
    hit.limit.unit == Unit::Second
}

/// The hits of a rejected request that took quota (by `results`), by index, and the
/// give-backs that return it: an allowed hit that costs something (a give-back of the
/// request is not taken again).
pub(crate) fn give_backs<'a>(
    hits: &[CounterHit<'a>],
    results: &[Result<Decision, BackendError>],
) -> (Vec<usize>, Vec<CounterHit<'a>>) {
    let took_quota = |(hit, result): &(&CounterHit<'_>, &Result<Decision, BackendError>)| {
        !hit.hits.negative && hit.hits.amount > 0 && matches!(result, Ok(d) if d.allowed)
    };
    (hits.iter().zip(results).enumerate())
        .filter(|(_, pair)| took_quota(pair))
        .map(|(i, (hit, _))| {
            let give_back = CounterHit {
                hits: Hits::give_back(hit.hits.amount),
                ..hit.clone()
            };
            (i, give_back)
        })
        .unzip()
}

/// Puts the counters as the give-backs of hits `taken` left them into `results` (still
/// allowed: the request's rejection comes from another hit).
pub(crate) fn settle_give_backs(
    results: &mut [Result<Decision, BackendError>],
    taken: Vec<usize>,
    returned: Vec<Result<Decision, BackendError>>,
) {
    for (i, result) in taken.into_iter().zip(returned) {
        match result {
            Ok(after) => {
                results[i] = Ok(Decision {
                    allowed: true,
                    ..after
                })
            }
            Err(error) => {
                tracing::warn!(%error, "a rejected request's hit could not be given back");
            }
        }
    }
}

/// What a call's results say about the backend, for the breaker: answered when any hit got
/// an answer (a hit's own error is an answer too), failed when the call failed as a whole,
/// timed out when no answer came in time; `None` when it was shed before it was sent.
pub(crate) fn outcome(results: &[Result<Decision, BackendError>]) -> Option<CallEnd> {
    let mut outcome = None;
    for result in results {
        let this = match result {
            Ok(_)
            | Err(
                BackendError::Protocol(_)
                | BackendError::Late
                | BackendError::Busy(_)
                | BackendError::Unsent {
                    answering: true, ..
                },
            ) => {
                return Some(CallEnd::Answered);
            }
            // Not sent: nothing learnt about the backend.
            Err(
                BackendError::Overloaded(_)
                | BackendError::TooFar { .. }
                | BackendError::CircuitOpen(_),
            ) => continue,
            Err(
                BackendError::Timeout(_)
                | BackendError::NotReady(_)
                | BackendError::Unsent {
                    answering: false, ..
                },
            ) => CallEnd::TimedOut,
            Err(
                BackendError::Unavailable(_)
                | BackendError::NothingCounted(_)
                | BackendError::Config(_),
            ) => CallEnd::Failed,
        };
        // A failure says more than a timeout: the backend refused, not just took long.
        if outcome != Some(CallEnd::Failed) {
            outcome = Some(this);
        }
    }
    outcome
}

/// The answer to a hit of a request that the over-limit cache rejected before any backend
/// call: allowed, since nothing rejected it, and nothing known about its quota (remaining 0,
/// as a `fail_open` answer says).
const NOT_CONSULTED: Decision = Decision {
    allowed: true,
    remaining: 0,
    reset_micros: 0,
};

/// Whether a cached answer (always a rejection) belongs to a binding hit, so the request is
/// rejected whatever the backend would say about the others.
fn cached_rejection_binds(hits: &[CounterHit<'_>], cached: &[Option<Decision>]) -> bool {
    hits.iter()
        .zip(cached)
        .any(|(hit, answer)| hit.binding && answer.is_some())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Hits, Limit};

    /// A store's link a test scripts: up (counting in memory) or down (every hit fails),
    /// and how many calls reached it.
    pub struct FakeLink {
        pub(super) memory: MemoryBackend,
        down: AtomicBool,
        calls: AtomicUsize,
    }

    impl FakeLink {
        pub(super) fn hit_all(
            &self,
            hits: &[CounterHit<'_>],
            all_or_nothing: bool,
        ) -> Vec<Result<Decision, BackendError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                let down = BackendError::Unavailable("the link is down".into());
                return vec![Err(down); hits.len()];
            }
            if all_or_nothing {
                return self
                    .memory
                    .hit_all_or_nothing(hits)
                    .into_iter()
                    .map(Ok)
                    .collect();
            }
            (hits.iter())
                .map(|hit| Ok(self.memory.hit(&hit.key, &hit.limit, hit.hits)))
                .collect()
        }

        pub(super) fn probe(&self) -> Result<(), BackendError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.down.load(Ordering::SeqCst) {
                true => Err(BackendError::Unavailable("the link is down".into())),
                false => Ok(()),
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    const SECOND: u64 = 1_000_000;

    /// A remote backend over a fake link, its breaker opening after 2 failures in a second
    /// and probing after half a second, its over-limit cache on; the link and the clock.
    fn remote(clock: &Arc<ManualClock>) -> (Backend, Arc<FakeLink>) {
        let link = Arc::new(FakeLink {
            memory: MemoryBackend::new(clock.clone(), 1_000),
            down: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        });
        let breaker = Breaker::new(
            2,
            Duration::from_secs(1),
            Duration::from_millis(500),
            clock.clone(),
        );
        let cache = OverLimitCache::new(100, clock.clone());
        let backend = Backend::remote(Store::Fake(link.clone()), Some(breaker), cache);
        (backend, link)
    }

    fn hit(value: &str, limit: &Limit) -> CounterHit<'static> {
        let entries = [("user", value)];
        CounterHit {
            key: CounterKey::new("d", "r", 0, limit, entries),
            limit: Cow::Owned(limit.clone()),
            hits: Hits::take(1),
            binding: true,
        }
    }

    fn allowed(answers: &Answers) -> Vec<bool> {
        (answers.results.iter())
            .map(|result| result.as_ref().is_ok_and(|decision| decision.allowed))
            .collect()
    }

    #[tokio::test]
    async fn an_exhausted_counter_is_answered_by_the_cache_without_a_call() {
        let clock = Arc::new(ManualClock::new(100 * SECOND));
        let (backend, link) = remote(&clock);
        let limit = Limit::per(2, Unit::Minute);
        let one = [hit("alice", &limit)];
        for expected in [true, true, false] {
            let answers = backend.hit_all(&one, OnReject::Consume, None).await;
            assert_eq!(allowed(&answers), [expected]);
            assert_eq!(answers.origin(0), AnsweredBy::Store);
        }
        let calls = link.calls();
        let answers = backend.hit_all(&one, OnReject::Consume, None).await;
        assert_eq!(allowed(&answers), [false]);
        assert_eq!(answers.origin(0), AnsweredBy::OverLimitCache);
        assert_eq!(link.calls(), calls, "the cache answered: no call");
        // The next window: the cache forgets, the store counts again.
        clock.set(161 * SECOND);
        let answers = backend.hit_all(&one, OnReject::Consume, None).await;
        assert_eq!(
            (allowed(&answers), answers.origin(0)),
            (vec![true], AnsweredBy::Store)
        );
    }

    #[tokio::test]
    async fn a_dead_link_opens_the_breaker_and_a_probe_closes_it_once_the_link_answers() {
        let clock = Arc::new(ManualClock::new(100 * SECOND));
        let (backend, link) = remote(&clock);
        let limit = Limit::per(10, Unit::Minute);
        link.down.store(true, Ordering::SeqCst);
        for value in ["a", "b"] {
            let answers = backend
                .hit_all(&[hit(value, &limit)], OnReject::Consume, None)
                .await;
            assert!(matches!(
                answers.results[0],
                Err(BackendError::Unavailable(_))
            ));
        }
        assert!(
            !backend.healthy(),
            "two failures in a second open the breaker"
        );
        let calls = link.calls();
        let answers = backend
            .hit_all(&[hit("c", &limit)], OnReject::Consume, None)
            .await;
        assert!(matches!(
            answers.results[0],
            Err(BackendError::CircuitOpen(_))
        ));
        assert_eq!(link.calls(), calls, "open: no call reaches the link");
        let refused = (backend.stats().errors()).find(|(kind, _)| *kind == "circuit_open");
        assert_eq!(refused, Some(("circuit_open", 1)));
        // A probe before the cooldown is not due; after it, one goes out and fails.
        backend.probe_if_due().await;
        assert_eq!(link.calls(), calls);
        clock.set(100 * SECOND + SECOND / 2);
        backend.probe_if_due().await;
        assert_eq!(link.calls(), calls + 1);
        assert!(!backend.healthy());
        // The link comes back: the next due probe closes the breaker.
        link.down.store(false, Ordering::SeqCst);
        clock.set(101 * SECOND + SECOND / 2);
        backend.probe_if_due().await;
        assert!(backend.healthy());
        let answers = backend
            .hit_all(&[hit("c", &limit)], OnReject::Consume, None)
            .await;
        assert_eq!(allowed(&answers), [true]);
    }

    #[tokio::test]
    async fn per_second_hits_go_to_their_own_store_and_a_rejection_there_gives_back_the_rest() {
        let clock = Arc::new(ManualClock::new(100 * SECOND));
        let (primary, primary_link) = remote(&clock);
        let (per_second, second_link) = remote(&clock);
        let backend = primary.with_per_second(per_second);
        let second = Limit::per(1, Unit::Second);
        let minute = Limit::per(5, Unit::Minute);
        let request = [hit("alice", &second), hit("alice", &minute)];
        let answers = backend
            .hit_all(&request, OnReject::ConsumeNothing, None)
            .await;
        assert_eq!(allowed(&answers), [true, true]);
        assert_eq!((primary_link.calls(), second_link.calls()), (1, 1));
        // The per-second limit rejects the second request within the second: the minute's
        // count it took is given back, so the minute still has 4 left.
        let answers = backend
            .hit_all(&request, OnReject::ConsumeNothing, None)
            .await;
        assert_eq!(allowed(&answers), [false, true]);
        let minute_key = &request[1].key;
        let look = primary_link.memory.hit(minute_key, &minute, Hits::take(0));
        assert_eq!(look.remaining, 4);
        // Hits without a per-second limit never reach the per-second store.
        let calls = second_link.calls();
        backend
            .hit_all(&request[1..], OnReject::Consume, None)
            .await;
        assert_eq!(second_link.calls(), calls);
        assert_eq!(backend.kind(), "fake");
        assert_eq!(backend.redis_round_trip(), None);
    }
}
