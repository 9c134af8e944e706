//! The Rate Limit Quota Service's accounting (`crate::quota` speaks the protocol): a
//! bucket's entries matched to a rule, the usage a data plane reports charged to the very
//! counters `ShouldRateLimit` counts on, and what is left of the rule's limit.

use std::borrow::Cow;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use super::RateLimiter;
use super::response::most_restrictive;
use crate::backend::{BackendError, CounterHit, OnReject};
use crate::limiter::{Algorithm, CounterKey, Decision, Hits, Limit, Unit};
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::rules::{Domain, Judged, Match, NamedLimit, OnBackendError, Policy, Rule, RuleSet};

/// How far back a bucket's demand is counted, across every replica: two of Envoy's 5 s
/// report intervals, so that every instance that reports the bucket is in it.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(10);

/// Buckets with more entries than this are matched in their given and sorted orders only:
/// trying every order of more would cost too much per report (8! = 40,320 lookups).
const ORDERS_TRIED_UP_TO: usize = 6;

/// What is left of a bucket's limit once its usage is charged.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketQuota {
    /// No rule of the domain matches the bucket (or the domain is unknown). The stream
    /// refuses such buckets before charging; a caller that charges without matching first
    /// gets this, and `crate::quota::assign` does not limit it.
    NoRule,
    /// `unlimited: true`.
    Unlimited,
    /// A shadow-mode rule, or global shadow mode: counted, never enforced.
    Shadowed,
    /// The rule's tightest limit after the charge: `remaining` hits until `reset_micros`;
    /// and the requests (allowed and denied) every data plane reported for the bucket over
    /// the last [`DEMAND_WINDOW`], on every replica.
    Counted {
        limit: Limit,
        remaining: u64,
        reset_micros: u64,
        demand: u64,
    },
    /// The backend could not count, and the rule's `on_backend_error` (not `local`, which
    /// counts in process instead) says what the data plane is told.
    Failed {
        error: BackendError,
        policy: OnBackendError,
    },
}

/// One bucket's report, to charge: its entries in rule order (see
/// [`bucket_descriptor`]), the requests the data plane let through, and every
/// request it was asked (allowed and denied).
#[derive(Debug, Clone, Copy)]
pub struct BucketUsage<'a> {
    pub entries: &'a [(String, String)],
    pub allowed: u64,
    pub requests: u64,
}

/// Buckets charged in one backend call (each bucket is its rule's limits and its demand,
/// two hits or more): a report of 10,000 buckets is some eighty calls, and no call holds
/// Redis much longer than a request of many descriptors would.
const BUCKETS_PER_CALL: usize = 128;

/// Backend calls out at once for one report: a report of many buckets goes over several
/// connections, without taking them all from `ShouldRateLimit`.
const CALLS_AT_ONCE: usize = 4;

/// How long a report's calls may wait for their turn on a connection (each call, once sent,
/// still has the command timeout). A data plane reports every few seconds and waits for no
/// answer, so a large report on a busy or cold Redis is better late than uncounted.
const REPORT_DEADLINE: Duration = Duration::from_secs(1);

/// The order of `entries` (a bucket's, which has none of its own) that is a path of
/// `domain`'s rules in `rules` ending at a rule; `None` when no order is. The given
/// order is tried first, then the sorted one, then (up to `ORDERS_TRIED_UP_TO`
/// entries) every other.
pub fn bucket_descriptor(
    rules: &RuleSet,
    domain: &str,
    entries: &[(String, String)],
) -> Option<Vec<(String, String)>> {
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

impl RateLimiter {
    /// Charges each bucket's `allowed` requests (already let through by a data plane) to
    /// the counters of the rule its entries match in `domain` of `rules`, counted in full
    /// even past the limit, and adds its `requests` to the bucket's demand; answers what is
    /// left of each, in the order of `usages`. `BUCKETS_PER_CALL` buckets go in one
    /// backend call, `CALLS_AT_ONCE` calls at a time.
    pub async fn charge_buckets(
        &self,
        rules: &RuleSet,
        domain: &str,
        usages: &[BucketUsage<'_>],
    ) -> Vec<BucketQuota> {
        let Some(domain_rules) = rules.domain(domain) else {
            return vec![BucketQuota::NoRule; usages.len()];
        };
        let deadline = Instant::now() + REPORT_DEADLINE;
        // Made here, not in the stream: a stream mapping a closure over borrowed chunks
        // trips the compiler's proof that the task is `Send`.
        let calls: Vec<_> = usages
            .chunks(BUCKETS_PER_CALL)
            .map(|chunk| self.charge_together(domain_rules, domain, chunk, deadline))
            .collect();
        let charged: Vec<Vec<BucketQuota>> = futures_util::stream::iter(calls)
            .buffered(CALLS_AT_ONCE)
            .collect()
            .await;
        charged.into_iter().flatten().collect()
    }

    /// [`RateLimiter::charge_buckets`] for buckets charged in one backend call, answered by
    /// `deadline`.
    async fn charge_together(
        &self,
        rules: &Domain,
        domain: &str,
        usages: &[BucketUsage<'_>],
        deadline: Instant,
    ) -> Vec<BucketQuota> {
        // Each bucket's hits: its rule's limits, then its demand.
        let mut hits: Vec<CounterHit<'static>> = Vec::new();
        let mut buckets = Vec::with_capacity(usages.len());
        for usage in usages {
            let first = hits.len();
            let charged = match matched_rule(rules, usage.entries) {
                None => Charged::Settled(BucketQuota::NoRule),
                Some(found) => match &found.rule.policy {
                    Policy::Limited(limits) => {
                        hits.extend(charge_hits(domain, &found, limits, usage.allowed));
                        hits.push(demand_hit(domain, &found, usage.requests));
                        Charged::Counted {
                            rule: found.rule,
                            policy: (found.rule.on_backend_error)
                                .unwrap_or(self.options.on_backend_error),
                            shadow: found.rule.shadow_mode || self.options.shadow_mode,
                        }
                    }
                    _ => {
                        self.record_usage(domain, found.rule, usage, Judged::Unlimited);
                        Charged::Settled(BucketQuota::Unlimited)
                    }
                },
            };
            buckets.push((charged, first..hits.len()));
        }
        let results = if hits.is_empty() {
            Vec::new()
        } else {
            let backend = self.backend();
            let answers = backend.hit_all(&hits, OnReject::Consume, Some(deadline));
            answers.await.results
        };
        (buckets.into_iter().zip(usages))
            .map(|((charged, span), usage)| match charged {
                Charged::Settled(quota) => quota,
                Charged::Counted {
                    rule,
                    policy,
                    shadow,
                } => {
                    let (hits, results) = (&hits[span.clone()], &results[span]);
                    let judged = judged(hits, results, rule.shadow_mode);
                    self.record_usage(domain, rule, usage, judged);
                    let quota = self.quota_left(hits, results, policy);
                    if shadow { BucketQuota::Shadowed } else { quota }
                }
            })
            .collect()
    }

    /// Counts a bucket's reported usage in its rule's statistics, as ShouldRateLimit counts
    /// its requests: the requests let through as the rule's counter `judged` them, those
    /// the data plane refused over the limit.
    fn record_usage(&self, domain: &str, rule: &Rule, usage: &BucketUsage<'_>, judged: Judged) {
        let entries: Vec<Entry> = (usage.entries.iter())
            .map(|(key, value)| Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        let metrics = &self.metrics;
        metrics.record_rule(domain, Some(rule), &entries, usage.allowed, judged);
        let refused = usage.requests.saturating_sub(usage.allowed);
        if refused > 0 {
            metrics.record_rule(domain, Some(rule), &entries, refused, Judged::Refused);
        }
    }

    /// What is left of one bucket's limit from the answers to its `hits`, the hits the
    /// backend failed decided by the rule's `policy` when it is `local`.
    fn quota_left(
        &self,
        hits: &[CounterHit<'_>],
        results: &[Result<Decision, BackendError>],
        policy: OnBackendError,
    ) -> BucketQuota {
        let left = match policy {
            OnBackendError::Local => {
                let decided: Vec<Result<Decision, BackendError>> = (hits.iter().zip(results))
                    .map(|(hit, result)| match result {
                        Err(error) => self.fallback(hit, policy, error.clone()),
                        Ok(decision) => Ok(*decision),
                    })
                    .collect();
                what_is_left(hits, &decided)
            }
            _ => what_is_left(hits, results),
        };
        left.unwrap_or_else(|error| BucketQuota::Failed { error, policy })
    }
}

/// A bucket of a backend call: settled without the backend, or counted there for `rule`,
/// under its `on_backend_error` and shadow mode.
enum Charged<'r> {
    Settled(BucketQuota),
    Counted {
        rule: &'r Rule,
        policy: OnBackendError,
        shadow: bool,
    },
}

/// How the counter of a bucket's rule judged the requests charged to it, for the rule's
/// statistics: its tightest limit's decision, or undecided when the backend failed.
fn judged(
    hits: &[CounterHit<'_>],
    results: &[Result<Decision, BackendError>],
    shadow: bool,
) -> Judged {
    let limits = results.len().saturating_sub(1);
    let decisions: Result<Vec<Decision>, _> = results[..limits].iter().cloned().collect();
    let Ok(decisions) = decisions else {
        return Judged::Undecided;
    };
    match most_restrictive(&decisions) {
        Some((index, decision)) => Judged::Counted {
            decision,
            capacity: hits[index].limit.capacity(),
            shadow,
        },
        None => Judged::Undecided,
    }
}

/// The hits that charge `allowed` requests to each of `limits`, the limits of the rule
/// `found`: usage already let through, so counted whatever the count, as an overshoot.
fn charge_hits<'a>(
    domain: &str,
    found: &Match<'_>,
    limits: &[NamedLimit],
    allowed: u64,
) -> impl Iterator<Item = CounterHit<'a>> {
    (limits.iter().enumerate()).map(move |(index, named)| CounterHit {
        key: CounterKey::new(
            domain,
            found.rule.id.as_str(),
            index,
            &named.limit,
            found.entries.iter().copied(),
        ),
        limit: Cow::Owned(Limit {
            overshoot: true,
            ..named.limit.clone()
        }),
        hits: Hits::take(allowed),
        binding: false,
    })
}

/// What is left of one bucket's limit from the answers to its `hits` (its limits', then its
/// demand's): the tightest limit, with the demand counted; the first error.
fn what_is_left(
    hits: &[CounterHit<'_>],
    results: &[Result<Decision, BackendError>],
) -> Result<BucketQuota, BackendError> {
    let Some((demand, limits)) = results.split_last() else {
        return Ok(BucketQuota::Unlimited);
    };
    let demand = match demand {
        Ok(decision) => u64::from(u32::MAX).saturating_sub(decision.remaining),
        Err(error) => return Err(error.clone()),
    };
    let mut tightest: Option<BucketQuota> = None;
    for (hit, result) in hits.iter().zip(limits) {
        let decision = result.as_ref().map_err(Clone::clone)?;
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
    Ok(tightest.unwrap_or(BucketQuota::Unlimited))
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
