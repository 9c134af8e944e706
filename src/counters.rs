//! The admin API's work (`edge/admin.rs` serves it): what a descriptor's counters hold, and
//! forgetting them. A descriptor resolves to its rule exactly as a request's would
//! ([`RateLimiter::descriptor_counters`]), and each of the rule's limits is one counter:
//! read with a check (cost 0, which changes nothing), reset by deleting its state everywhere
//! it may live (the store, the over-limit cache, and the `local` policy's counters).

use std::borrow::Cow;

use crate::backend::{BackendError, CounterHit};
use crate::limiter::{CounterKey, Decision, Limit};
use crate::rules::Entry;
pub use crate::service::NoCounters;
use crate::service::RateLimiter;

/// One limit's counter for a descriptor.
#[derive(Debug)]
pub struct CounterState {
    pub name: Option<String>,
    pub limit: Limit,
    /// What a check says of it now: remaining quota and time to reset.
    pub state: Result<Decision, BackendError>,
}

/// The counters of `domain`'s rule for the descriptor `entries`: the rule's id and each
/// limit's state, read without counting.
pub async fn read(
    limiter: &RateLimiter,
    domain: &str,
    entries: &[Entry],
) -> Result<(String, Vec<CounterState>), NoCounters> {
    let found = limiter.descriptor_counters(domain, entries)?;
    let checks: Vec<CounterHit<'_>> = (found.counters.iter())
        .map(|(_, key, limit)| CounterHit::check(key.clone(), Cow::Borrowed(limit)))
        .collect();
    let states = limiter.count(&checks, None).await;
    let states = (found.counters.into_iter())
        .zip(states)
        .map(|((name, _, limit), state)| CounterState { name, limit, state })
        .collect();
    Ok((found.rule, states))
}

/// Forgets the counters of `domain`'s rule for the descriptor `entries`, as if never hit;
/// the rule's id and how many states existed: in the store (on Redis, keys) and among the
/// `local` policy's counters, each counted once.
pub async fn reset(
    limiter: &RateLimiter,
    domain: &str,
    entries: &[Entry],
) -> Result<(String, Result<u64, BackendError>), NoCounters> {
    let found = limiter.descriptor_counters(domain, entries)?;
    let counters: Vec<(CounterKey, Limit)> = (found.counters.into_iter())
        .map(|(_, key, limit)| (key, limit))
        .collect();
    let stored = limiter.backend().reset(&counters).await;
    // With the memory backend `local` is the store itself: the reset above cleared and
    // counted its counters, and these removals find none of them again.
    let local = (counters.iter())
        .filter(|(key, _)| limiter.memory().remove(key))
        .count() as u64;
    Ok((found.rule, stored.map(|stored| stored + local)))
}
