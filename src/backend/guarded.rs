//! One counter store, guarded: a remote one sits behind its circuit breaker and a cache of
//! the counters it reported exhausted, its leased counters are decided from their blocks
//! (`lease.rs`), and its calls are recorded in the stats.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::breaker::{Admission, BreakerState, CallEnd};
use super::lease::{self, GiveBack, Leases, Take};
use super::{
    BackendError, BackendStats, Breaker, CounterHit, OnReject, OverLimitCache, Store, rejects,
};
use crate::limiter::{CounterKey, Decision, Hits, Limit};

/// One counter store; a remote one sits behind its circuit breaker and a cache of the
/// counters it reported exhausted. Both stores of a backend share one set of stats.
#[derive(Clone)]
pub(super) struct Guarded {
    pub(super) store: Store,
    pub(super) breaker: Option<Arc<Breaker>>,
    pub(super) over_limit: Option<Arc<OverLimitCache>>,
    /// The blocks of leased counters this replica holds (a remote store's).
    pub(super) leases: Option<Arc<Leases>>,
    pub(super) stats: Arc<BackendStats>,
}

/// The backend's answers to a request's hits, in order, and where each came from.
#[derive(Debug)]
pub struct Answers {
    pub results: Vec<Result<Decision, BackendError>>,
    /// One per hit, or empty when every answer came from the store (the common case, kept
    /// free of an allocation).
    pub(super) origins: Vec<AnsweredBy>,
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
    pub(super) fn from_store(results: Vec<Result<Decision, BackendError>>) -> Self {
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

impl Guarded {
    /// [`Backend::hit_all`] on this store alone: the hits of leased counters from their
    /// blocks where they hold enough, the others by the store.
    pub(super) async fn hit_here(
        &self,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Answers {
        if let Some(leases) = &self.leases
            && hits.iter().any(lease::leasable)
        {
            return self.hit_leased(leases, hits, on_reject, deadline).await;
        }
        self.hit_unleased(hits, on_reject, deadline).await
    }

    /// [`Guarded::hit_here`] for a request with a leased hit. Each leased hit is decided
    /// from its counter's block when the block holds enough; the others go to the store.
    /// When the request is rejected (by a block's refusal or by the store) and must take
    /// nothing, the blocks get back what was allowed from them.
    async fn hit_leased(
        &self,
        leases: &Arc<Leases>,
        hits: &[CounterHit<'_>],
        on_reject: OnReject,
        deadline: Option<Instant>,
    ) -> Answers {
        if leases.first_use() {
            self.sweep_leases();
        }
        let now = Instant::now();
        let mut local = Vec::with_capacity(hits.len());
        for hit in hits {
            if !lease::leasable(hit) {
                local.push(None);
                continue;
            }
            let (decided, take) = leases.decide(&hit.key, &hit.limit, hit.hits.amount, now);
            if let Some(take) = take {
                self.take_in_background(leases.clone(), take);
            }
            local.push(decided);
        }
        let put_back = |local: &[Option<Decision>]| {
            for (hit, decided) in hits.iter().zip(local) {
                if decided.is_some_and(|decision| decision.allowed) {
                    leases.put_back(&hit.key, hit.hits.amount);
                }
            }
        };
        // A request a leased counter refused here takes nothing when it must not: what its
        // other leased hits took goes back, and the store is not asked (as with a rejection
        // the over-limit cache knows).
        let refused = || {
            (hits.iter().zip(&local))
                .any(|(hit, decided)| hit.binding && decided.is_some_and(|d| !d.allowed))
        };
        if on_reject == OnReject::ConsumeNothing && refused() {
            let decided: Vec<Result<Decision, BackendError>> = (local.iter())
                .map(|decided| Ok(decided.unwrap_or(NOT_CONSULTED)))
                .collect();
            if rejects(hits, &decided) {
                put_back(&local);
                let origins = (local.iter())
                    .map(|decided| match decided {
                        Some(_) => AnsweredBy::Store,
                        None => AnsweredBy::NotConsulted,
                    })
                    .collect();
                return Answers {
                    results: decided,
                    origins,
                };
            }
        }
        if local.iter().all(Option::is_some) {
            return Answers::from_store(local.into_iter().flatten().map(Ok).collect());
        }
        let pending: Vec<CounterHit<'_>> = (hits.iter().zip(&local))
            .filter(|(_, decided)| decided.is_none())
            .map(|(hit, _)| hit.clone())
            .collect();
        let mut fetched = Box::pin(self.hit_unleased(&pending, on_reject, deadline)).await;
        let too_far =
            (fetched.results.iter()).any(|r| matches!(r, Err(BackendError::TooFar { .. })));
        let from_block = if too_far {
            // Boxed: a wait's timer would otherwise grow every request's future.
            Box::pin(wait_for_blocks(leases, &pending, &mut fetched, deadline)).await
        } else {
            Vec::new()
        };
        if on_reject == OnReject::ConsumeNothing && rejects(&pending, &fetched.results) {
            put_back(&local);
            for (hit, taken) in pending.iter().zip(from_block) {
                if taken {
                    leases.put_back(&hit.key, hit.hits.amount);
                }
            }
        }
        let mut origins = Vec::new();
        let mut results = Vec::with_capacity(hits.len());
        let mut from_store = fetched.results.into_iter().enumerate();
        for decided in local {
            match decided {
                Some(decision) => {
                    results.push(Ok(decision));
                    origins.push(AnsweredBy::Store);
                }
                None => {
                    let (index, result) = from_store.next().unwrap_or_else(|| {
                        let missing = BackendError::Protocol("fewer answers than calls".into());
                        (usize::MAX, Err(missing))
                    });
                    results.push(result);
                    origins.push(fetched_origin(&fetched.origins, index));
                }
            }
        }
        Answers { results, origins }
    }

    /// Takes the block `take` names off the request path, asking again for less while the
    /// store refuses a block larger than what it has left.
    fn take_in_background(&self, leases: Arc<Leases>, take: Take) {
        let store = Guarded {
            leases: None,
            ..self.clone()
        };
        tokio::spawn(async move {
            let mut asked = take.asked;
            while asked > 0 {
                let hit = CounterHit::new(
                    take.key.clone(),
                    Cow::Borrowed(&take.limit),
                    Hits::take(asked),
                    false,
                );
                let sent = Instant::now();
                let deadline = Some(sent + lease::TAKE_WAIT);
                let answer = store.call(&[hit], OnReject::Consume, deadline).await;
                asked = match answer.into_iter().next() {
                    Some(Ok(decision)) => leases.took(&take.key, asked, decision, sent),
                    Some(Err(error)) => {
                        leases.failed(&take.key, &error);
                        0
                    }
                    None => {
                        leases.failed(&take.key, &BackendError::Protocol("no answer".into()));
                        0
                    }
                };
            }
        });
    }

    /// Gives back what `leases` holds idle, every quarter of [`lease::IDLE`], for as long
    /// as the leases are kept: started by the first leased hit.
    fn sweep_leases(&self) {
        let Some(leases) = &self.leases else {
            return;
        };
        let weak = Arc::downgrade(leases);
        let store = Guarded {
            leases: None,
            ..self.clone()
        };
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(lease::IDLE / 4);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(leases) = weak.upgrade() else {
                    return;
                };
                let back = leases.sweep(Instant::now());
                drop(leases);
                for give_back in back {
                    store.give_back_held(give_back).await;
                }
            }
        });
    }

    /// Returns a block's unspent quota to the shared count, by its deadline.
    async fn give_back_held(&self, back: GiveBack) {
        let GiveBack {
            key,
            limit,
            amount,
            deadline,
        } = back;
        let hit = CounterHit::new(key, Cow::Owned(limit), Hits::give_back(amount), false);
        let answer = self.call(&[hit], OnReject::Consume, deadline).await;
        if let Some(Err(error)) = answer.first() {
            tracing::debug!(%error, amount, "a lease's unspent quota could not be given back");
        }
    }

    /// [`Guarded::hit_here`] without leases.
    async fn hit_unleased(
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
    pub(super) async fn give_back(
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
        if self.store.remote().is_none() {
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

    pub(super) async fn reset_here(
        &self,
        counters: &[(CounterKey, Limit)],
    ) -> Result<u64, BackendError> {
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

    pub(super) async fn probe_own_if_due(&self) {
        if let Some(remote) = self.store.remote() {
            remote.probe_own_breakers().await;
        }
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

/// Decides the leased `hits` the store was too far to decide in time (`fetched` says so)
/// from the blocks their leases' takes are bringing, waiting for them until `deadline`: a
/// block that ran dry while the next was out on a Redis farther than the command timeout
/// left those hits to their policy, a round trip's worth of requests at each such gap.
/// Which of `hits` took quota from a block so.
async fn wait_for_blocks(
    leases: &Leases,
    hits: &[CounterHit<'_>],
    fetched: &mut Answers,
    deadline: Option<Instant>,
) -> Vec<bool> {
    let mut from_block = vec![false; hits.len()];
    let Some(deadline) = deadline else {
        return from_block;
    };
    for (index, hit) in hits.iter().enumerate() {
        let too_far = matches!(
            fetched.results.get(index),
            Some(Err(BackendError::TooFar { .. }))
        );
        if !too_far || !lease::leasable(hit) {
            continue;
        }
        let (key, limit, amount) = (&hit.key, &hit.limit, hit.hits.amount);
        if let Some(decision) = leases.wait_for_block(key, limit, amount, deadline).await {
            fetched.results[index] = Ok(decision);
            if let Some(origin) = fetched.origins.get_mut(index) {
                *origin = AnsweredBy::Store;
            }
            from_block[index] = decision.allowed;
        }
    }
    from_block
}

/// The answer to a hit of a request that the over-limit cache rejected before any backend
/// call: allowed, since nothing rejected it, and nothing known about its quota (remaining 0,
/// as a `fail_open` answer says).
const NOT_CONSULTED: Decision = Decision {
    allowed: true,
    remaining: 0,
    reset_micros: 0,
};

/// Where the store's answer `index` came from, by its `origins` (empty: the store).
fn fetched_origin(origins: &[AnsweredBy], index: usize) -> AnsweredBy {
    origins.get(index).copied().unwrap_or(AnsweredBy::Store)
}

/// Whether a cached answer (always a rejection) belongs to a binding hit, so the request is
/// rejected whatever the backend would say about the others.
fn cached_rejection_binds(hits: &[CounterHit<'_>], cached: &[Option<Decision>]) -> bool {
    hits.iter()
        .zip(cached)
        .any(|(hit, answer)| hit.binding && answer.is_some())
}
