//! The backend: the counter store the settings name and, when `redis_per_second` names one,
//! a second store for the counters of per-second limits (upstream's `REDIS_PERSECOND`). A
//! request's hits of both kinds go to both stores at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::breaker::BreakerState;
use super::guarded::{AnsweredBy, Answers, Guarded};
use super::lease::LeaseCounts;
use super::{
    BackendError, BackendStats, Breaker, CacheCounts, CounterHit, MemoryBackend, OnReject,
    OverLimitCache, RemoteStore, Store, rejects,
};
use crate::limiter::{CounterKey, Decision, Limit, Unit};

/// The configured counter stores: the primary one, and where the counters of per-second
/// limits live instead when they have a store of their own (upstream's `REDIS_PERSECOND`).
#[derive(Clone)]
pub struct Backend {
    primary: Guarded,
    per_second: Option<Guarded>,
}

impl Backend {
    /// Which store holds the counters, as traces name it.
    pub fn kind(&self) -> &'static str {
        self.primary.store.kind()
    }

    pub fn memory(memory: Arc<MemoryBackend>) -> Self {
        let primary = Guarded {
            store: Store::Memory(memory),
            breaker: None,
            over_limit: None,
            leases: None,
            stats: Arc::default(),
        };
        Backend {
            primary,
            per_second: None,
        }
    }

    /// A remote store behind `breaker` (`None` for a store with breakers of its own: a Redis
    /// Cluster's, one per primary) and `over_limit`.
    pub fn remote(
        store: Arc<dyn RemoteStore>,
        breaker: Option<Breaker>,
        over_limit: OverLimitCache,
    ) -> Self {
        let primary = Guarded {
            store: Store::Remote(store),
            breaker: breaker.map(Arc::new),
            over_limit: Some(Arc::new(over_limit)),
            leases: Some(Arc::default()),
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

    /// The quickest round trip to the remote store lately, of the connection (or node, or
    /// store) where it is longest; `None` on memory and before the first was measured.
    pub fn round_trip(&self) -> Option<Duration> {
        (self.stores())
            .filter_map(|guarded| guarded.store.remote()?.round_trip())
            .max()
    }

    /// The most a request waits for the remote stores, whatever its caller's deadline;
    /// `None` on memory, which answers at once.
    pub fn max_wait(&self) -> Option<Duration> {
        (self.stores())
            .filter_map(|guarded| Some(guarded.store.remote()?.max_wait()))
            .max()
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

    /// What the stores' leases hold and did, added up.
    pub fn lease_counts(&self) -> LeaseCounts {
        (self.stores())
            .filter_map(|store| store.leases.as_ref())
            .map(|leases| leases.counts())
            .fold(LeaseCounts::default(), |total, counts| LeaseCounts {
                counters: total.counters + counts.counters,
                held: total.held + counts.held,
                decided: total.decided + counts.decided,
                takes: total.takes + counts.takes,
            })
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
        if let Some(remote) = self.primary.store.remote() {
            remote.open_at_start(error);
        }
    }

    /// Whether the backend answers: false while a breaker is open (on a Redis Cluster, while
    /// every primary's is).
    pub fn healthy(&self) -> bool {
        self.stores().all(|store| {
            let closed = (store.breaker.as_ref())
                .is_none_or(|breaker| breaker.state() == BreakerState::Closed);
            closed && store.store.remote().is_none_or(|remote| remote.healthy())
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

/// Whether `hit`'s counter lives in the per-second store, when there is one.
fn is_per_second(hit: &CounterHit<'_>) -> bool {
    hit.limit.unit == Unit::Second
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use super::*;
    use crate::backend::scripted::ScriptedStore;
    use crate::clock::ManualClock;
    use crate::limiter::Hits;

    const SECOND: u64 = 1_000_000;

    /// A remote backend over a fake link, its breaker opening after 2 failures in a second
    /// and probing after half a second, its over-limit cache on; the link and the clock.
    fn remote(clock: &Arc<ManualClock>) -> (Backend, Arc<ScriptedStore>) {
        let link = Arc::new(ScriptedStore::new(MemoryBackend::new(clock.clone(), 1_000)));
        let breaker = Breaker::new(
            2,
            Duration::from_secs(1),
            Duration::from_millis(500),
            clock.clone(),
        );
        let cache = OverLimitCache::new(100, clock.clone());
        let backend = Backend::remote(link.clone(), Some(breaker), cache);
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
        link.set_down(true);
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
        link.set_down(false);
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
        assert_eq!(backend.kind(), "scripted");
        assert_eq!(backend.round_trip(), None);
        assert_eq!(backend.max_wait(), Some(Duration::from_millis(40)));
    }
}
