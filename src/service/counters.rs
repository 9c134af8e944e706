//! The admin side of the limiter: what a descriptor's counters hold, and forgetting them
//! (`src/admin.rs` serves both). A descriptor resolves to its rule exactly as a request's
//! would, and each of the rule's limits is one counter: read with a check (cost 0, which
//! changes nothing), reset by deleting its state everywhere it may live (the store, the
//! over-limit cache, and the `local` policy's counters).

use super::{RateLimiter, Resolution, resolve_all};
use crate::backend::{BackendError, CounterHit, OnReject};
use crate::limiter::{CounterKey, Decision, Hits, Limit};
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::rules::Entry;

/// One limit's counter for a descriptor.
#[derive(Debug)]
pub struct CounterState {
    pub name: Option<String>,
    pub limit: Limit,
    /// What a check says of it now: remaining quota and time to reset.
    pub state: Result<Decision, BackendError>,
}

/// Why a descriptor has no counters to show or reset.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoCounters {
    #[error("no rule of domain {domain:?} counts this descriptor")]
    NoRule { domain: String },
    #[error("the descriptor is invalid: {0}")]
    Invalid(String),
}

/// A descriptor's rule and the counters of its limits.
struct Resolved {
    rule: String,
    counters: Vec<(Option<String>, CounterKey, Limit)>,
}

impl RateLimiter {
    /// The counters of `domain`'s rule for the descriptor `entries`: the rule's id and each
    /// limit's state, read without counting.
    pub async fn counters(
        &self,
        domain: &str,
        entries: &[Entry],
    ) -> Result<(String, Vec<CounterState>), NoCounters> {
        let resolved = self.resolve(domain, entries)?;
        let hits: Vec<CounterHit<'_>> = (resolved.counters.iter())
            .map(|(_, key, limit)| CounterHit {
                key: key.clone(),
                limit: std::borrow::Cow::Borrowed(limit),
                hits: Hits::take(0),
                binding: false,
            })
            .collect();
        let answers = self.backend.hit_all(&hits, OnReject::Consume, None).await;
        let states = (resolved.counters.into_iter())
            .zip(answers.results)
            .map(|((name, _, limit), state)| CounterState { name, limit, state })
            .collect();
        Ok((resolved.rule, states))
    }

    /// Forgets the counters of `domain`'s rule for the descriptor `entries`, as if never
    /// hit; the rule's id and how many states existed: in the store (on Redis, keys) and
    /// among the `local` policy's counters, each counted once.
    pub async fn reset_counters(
        &self,
        domain: &str,
        entries: &[Entry],
    ) -> Result<(String, Result<u64, BackendError>), NoCounters> {
        let resolved = self.resolve(domain, entries)?;
        let counters: Vec<(CounterKey, Limit)> = (resolved.counters.into_iter())
            .map(|(_, key, limit)| (key, limit))
            .collect();
        let stored = self.backend.reset(&counters).await;
        // With the memory backend `local` is the store itself: the reset above cleared and
        // counted its counters, and these removals find none of them again.
        let local = (counters.iter())
            .filter(|(key, _)| self.local.remove(key))
            .count() as u64;
        Ok((resolved.rule, stored.map(|stored| stored + local)))
    }

    /// The rule `entries` resolve to in `domain`, and its counters' keys.
    fn resolve(&self, domain: &str, entries: &[Entry]) -> Result<Resolved, NoCounters> {
        let rules = self.rules.load();
        let no_rule = || NoCounters::NoRule {
            domain: domain.to_owned(),
        };
        let rules_domain = rules.domain(domain).ok_or_else(no_rule)?;
        let descriptor = RateLimitDescriptor {
            entries: entries.to_vec(),
            ..Default::default()
        };
        let descriptors = [descriptor];
        let resolutions = resolve_all(rules_domain, &descriptors)
            .map_err(|invalid| NoCounters::Invalid(invalid.to_string()))?;
        let Some(Resolution::Counted {
            rule: Some(rule),
            limits,
            entries,
        }) = resolutions.into_iter().next()
        else {
            return Err(no_rule());
        };
        let keys = CounterKey::of_rule(
            domain,
            &rule.id,
            limits.iter().map(|(_, l)| l.as_ref()),
            &entries,
        );
        let keys: Vec<CounterKey> = keys.collect();
        let counters = (limits.into_iter().zip(keys))
            .map(|((name, limit), key)| (name.map(str::to_owned), key, limit.into_owned()))
            .collect();
        Ok(Resolved {
            rule: rule.id.clone(),
            counters,
        })
    }
}
