//! Where counters live, behind one seam: [`Backend::hit_all`] takes every counter hit of a
//! request at once, so a remote store can send them in one round trip.
//!
//! The rooms: `store.rs` names the stores (the embedded `memory.rs`, or a [`RemoteStore`]:
//! `redis/` keeps counters in Redis, shared by every replica); `guarded.rs` puts a remote
//! store behind its circuit breaker (`breaker.rs`) and the cache of counters it reported
//! exhausted (`over_limit.rs`); `per_second.rs` is the [`Backend`] the service holds, with a
//! second store for per-second limits when the settings name one; `setup.rs` builds it from
//! the settings; `error.rs` says why a store could not decide.

mod bounded;
pub mod breaker;
mod error;
mod guarded;
pub mod lease;
pub mod memory;
mod over_limit;
mod per_second;
pub mod redis;
#[cfg(test)]
mod scripted;
mod setup;
mod stats;
mod store;

use std::borrow::Cow;

pub use breaker::Breaker;
pub use error::BackendError;
pub use guarded::{AnsweredBy, Answers};
pub(crate) use guarded::{give_backs, outcome, settle_give_backs};
pub use lease::LeaseCounts;
pub use memory::MemoryBackend;
pub use over_limit::{CacheCounts, OverLimitCache};
pub use per_second::Backend;
pub use stats::BackendStats;
pub use store::{RemoteStore, Store};

use crate::limiter::{CounterKey, Decision, Hits, Limit};

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

impl<'a> CounterHit<'a> {
    /// `hits` on the counter `key` under `limit`; `binding` when its rejection rejects the
    /// request. Every counter hit is built here: a request's (ShouldRateLimit), or one of
    /// the two below.
    pub fn new(key: CounterKey, limit: Cow<'a, Limit>, hits: Hits, binding: bool) -> Self {
        CounterHit {
            key,
            limit,
            hits,
            binding,
        }
    }

    /// A check: reads the counter `key` under `limit` and changes nothing (cost 0); it
    /// rejects no request (the admin API's read, an RLQS bucket's look before its charge).
    pub fn check(key: CounterKey, limit: Cow<'a, Limit>) -> Self {
        CounterHit::new(key, limit, Hits::take(0), false)
    }

    /// Usage let through already (an RLQS report's `amount`): counted on `key` whatever the
    /// count, as an overshoot, rejecting no request.
    pub fn usage(key: CounterKey, limit: &Limit, amount: u64) -> Self {
        let limit = Limit {
            overshoot: true,
            ..limit.clone()
        };
        CounterHit::new(key, Cow::Owned(limit), Hits::take(amount), false)
    }
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
