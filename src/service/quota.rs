//! The Rate Limit Quota Service's accounting (`crate::quota` speaks the protocol): a
//! bucket's entries matched to a rule, the usage a data plane reports charged to the very
//! counters `ShouldRateLimit` counts on, and what is left of the rule's limit.

use std::borrow::Cow;
use std::time::Duration;

use super::RateLimiter;
use crate::backend::{BackendError, CounterHit, OnReject};
use crate::limiter::{Algorithm, CounterKey, Hits, Limit, Unit};
use crate::rules::{Domain, Match, Policy};

/// How far back a bucket's demand is counted, across every replica: two of Envoy's 5 s
/// report intervals, so that every instance that reports the bucket is in it.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);

/// Buckets with more entries than this are matched in their given and sorted orders only:
/// trying every order of more would cost too much per report (8! = 40,320 lookups).
const ORDERS_TRIED_UP_TO: usize = 6;

/// What is left of a bucket's limit once its usage is charged.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketQuota {
    /// No rule of the domain matches the bucket (or the domain is unknown): like a
    /// descriptor no rule matches, it is not limited.
    NoRule,
    /// `unlimited: true`.
    Unlimited,
    /// The rule's tightest limit after the charge: `remaining` hits until `reset_micros`;
    /// and the requests (allowed and denied) every data plane reported for the bucket over
    /// the last [`DEMAND_WINDOW`], on every replica.
    Counted {
        limit: Limit,
        remaining: u64,
        reset_micros: u64,
        demand: u64,
    },
    /// The backend could not count; nothing is known of the quota.
    Failed(BackendError),
}

impl RateLimiter {
    /// The order of `entries` (a bucket's, which has none of its own) that is a path of
    /// `domain`'s rules ending at a rule; `None` when no order is. The given order is tried
    /// first, then the sorted one, then (up to [`ORDERS_TRIED_UP_TO`] entries) every other.
    pub fn bucket_descriptor(
        &self,
        domain: &str,
        entries: &[(String, String)],
    ) -> Option<Vec<(String, String)>> {
        let rules = self.rules();
        let domain = rules.domain(domain)?;
        let matches = |order: &Vec<(String, String)>| matched_rule(domain, order).is_some();
        let mut sorted = entries.to_vec();
        sorted.sort();
        if let Some(order) = [entries.to_vec(), sorted].into_iter().find(matches) {
            return Some(order);
        }
        if entries.len() > ORDERS_TRIED_UP_TO {
            return None;
        }
        permutations(entries).into_iter().find(matches)
    }

    /// Charges `allowed` requests (already let through by a data plane) to the counters of
    /// the rule `entries` (in rule order, see [`RateLimiter::bucket_descriptor`]) matches in
    /// `domain`, counted in full even past the limit, and adds `requests` (allowed and
    /// denied) to the bucket's demand, in the same backend call; answers what is left.
    pub async fn charge_bucket(
        &self,
        domain: &str,
        entries: &[(String, String)],
        allowed: u64,
        requests: u64,
    ) -> BucketQuota {
        let rules = self.rules();
        let Some(found) = rules.domain(domain).and_then(|d| matched_rule(d, entries)) else {
            return BucketQuota::NoRule;
        };
        let Policy::Limited(limits) = &found.rule.policy else {
            return BucketQuota::Unlimited;
        };
        let hits: Vec<CounterHit<'_>> = (limits.iter().enumerate())
            .map(|(index, named)| CounterHit {
                key: CounterKey::new(
                    domain,
                    found.rule.id.as_str(),
                    index,
                    &named.limit,
                    found.entries.iter().copied(),
                ),
                // Usage already let through: counted whatever the count, as an overshoot.
                limit: Cow::Owned(Limit {
                    overshoot: true,
                    ..named.limit.clone()
                }),
                hits: Hits::take(allowed),
                binding: false,
            })
            .chain(std::iter::once(demand_hit(domain, &found, requests)))
            .collect();
        let answers = self.backend().hit_all(&hits, OnReject::Consume, None).await;
        let mut results = answers.results;
        let demand = match results.pop() {
            Some(Ok(decision)) => u64::from(u32::MAX).saturating_sub(decision.remaining),
            Some(Err(error)) => return BucketQuota::Failed(error),
            None => 0,
        };
        let mut tightest: Option<BucketQuota> = None;
        for (hit, result) in hits.iter().zip(results) {
            let decision = match result {
                Ok(decision) => decision,
                Err(error) => return BucketQuota::Failed(error),
            };
            let remaining = if decision.allowed {
                decision.remaining
            } else {
                0
            };
            let tighter = match &tightest {
                Some(BucketQuota::Counted {
                    remaining: least, ..
                }) => remaining < *least,
                _ => true,
            };
            if tighter {
                tightest = Some(BucketQuota::Counted {
                    limit: Limit {
                        overshoot: false,
                        ..hit.limit.clone().into_owned()
                    },
                    remaining,
                    reset_micros: decision.reset_micros,
                    demand,
                });
            }
        }
        tightest.unwrap_or(BucketQuota::Unlimited)
    }
}

/// The hit that adds `requests` to the demand of the bucket `found` counts: a sliding
/// window of [`DEMAND_WINDOW`] that never refuses, beside the rule's own counters (its key
/// names the rule with a suffix no rule id has).
fn demand_hit<'a>(domain: &str, found: &Match<'_>, requests: u64) -> CounterHit<'a> {
    let limit = Limit {
        requests_per_unit: u32::MAX,
        unit: Unit::Second,
        unit_multiplier: DEMAND_WINDOW.as_secs() as u32,
        algorithm: Algorithm::SlidingWindow,
        burst: None,
        timezone: None,
        overshoot: true,
    };
    let rule = format!("{}~rlqs-demand", found.rule.id);
    CounterHit {
        key: CounterKey::new(domain, &rule, 0, &limit, found.entries.iter().copied()),
        limit: Cow::Owned(limit),
        hits: Hits::take(requests),
        binding: false,
    }
}

/// The rule `entries`, in this order, lead to in `domain`, with the entries its counter is
/// keyed by (a `share_threshold` wildcard's pattern in place of the value).
fn matched_rule<'a>(domain: &'a Domain, entries: &'a [(String, String)]) -> Option<Match<'a>> {
    domain.find(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// Every order of `items` (Heap's algorithm, iteratively).
fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    let mut items = items.to_vec();
    let mut orders = vec![items.clone()];
    let mut counters = vec![0; items.len()];
    let mut i = 1;
    while i < items.len() {
        if counters[i] < i {
            let swap = if i % 2 == 0 { 0 } else { counters[i] };
            items.swap(swap, i);
            orders.push(items.clone());
            counters[i] += 1;
            i = 1;
        } else {
            counters[i] = 0;
            i += 1;
        }
    }
    orders
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_order_is_tried_once() {
        let orders = permutations(&[1, 2, 3]);
        assert_eq!(orders.len(), 6);
        let distinct: std::collections::BTreeSet<_> = orders.into_iter().collect();
        assert_eq!(distinct.len(), 6);
    }
}
