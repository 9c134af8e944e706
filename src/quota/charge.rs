//! The Rate Limit Quota Service's accounting (the stream beside it, `quota/mod.rs`, speaks
//! the protocol): a bucket's entries matched to a rule, the usage a data plane reports charged to the very
//! counters `ShouldRateLimit` counts on, and what is left of the rule's limit.

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use crate::backend::{BackendError, CounterHit};
use crate::clock::Clock;
use crate::limiter::{Algorithm, CounterKey, Decision, Limit, Unit};
use crate::rules::{
    Domain, Entry, Judged, Match, NamedLimit, OnBackendError, Policy, Rule, RuleSet,
};
use crate::service::RateLimiter;

/// The periods a bucket's demand is summed over: Envoy reports every bucket once every 5 s,
/// so each period of that length holds one report of every stream. A stream adds its rate
/// to the period after the one it reports in, and reads the one it reports in, which
/// every other stream finished writing in the period before: the sum of every stream's
/// latest rate, whatever the phases of their reports.
pub const DEMAND_PERIOD: Duration = Duration::from_secs(5);

/// How long a period's demand is kept from its first write: written during the period
/// before it, read during it, with a period to spare for clocks apart.
const DEMAND_KEPT: Duration = Duration::from_secs(15);

/// What is left of a bucket's limit once its usage is charged.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketQuota {
    /// No rule of the domain matches the bucket (or the domain is unknown). The stream
    /// leaves such buckets unassigned before charging; a caller that charges without
    /// matching first gets this, and `crate::quota::assign` does not limit it.
    NoRule,
    /// `unlimited: true`.
    Unlimited,
    /// A shadow-mode rule, or global shadow mode: counted, never enforced.
    Shadowed,
    /// The rule's tightest limit after the charge: `remaining` hits until `reset_micros`;
    /// and the bucket's demand, when the charge read it.
    Counted {
        limit: Limit,
        remaining: u64,
        reset_micros: u64,
        demand: Option<DemandSeen>,
    },
    /// The backend could not count, and the rule's `on_backend_error` (not `local`, which
    /// counts in process instead) says what the data plane is told.
    Failed {
        error: BackendError,
        policy: OnBackendError,
    },
}

/// One bucket's report, to charge: its entries in rule order (see
/// [`bucket_descriptor`]), the requests the data plane let through in the window now
/// running (charged) and in an earlier one (counted in the rule's statistics only: that
/// window is over), the requests it refused, and the demand to add.
#[derive(Debug, Clone, Copy)]
pub struct BucketUsage<'a> {
    pub entries: &'a [Entry],
    pub allowed: u64,
    pub earlier: u64,
    pub refused: u64,
    /// The stream's demand, added to the bucket's; `None` reads and adds no demand (an
    /// assignment sent at a reset, with no report).
    pub demand: Option<DemandReport>,
}

impl BucketUsage<'_> {
    /// The requests the data plane let through, in this window and earlier ones.
    fn let_through(&self) -> u64 {
        self.allowed.saturating_add(self.earlier)
    }
}

/// A bucket's demand as a charge found it, in thousandths of a request a second summed over
/// the streams of every replica: in the period the report named (the rate each stream
/// reported in the period before), and in the next one (the rates reported so far in this
/// period, this report's included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DemandSeen {
    pub period: u64,
    pub next: u64,
}

/// A stream's demand for a bucket at one report: `rate` in thousandths of a request a
/// second, reported in `period` (the count of [`DEMAND_PERIOD`]s since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemandReport {
    pub period: u64,
    pub rate: u64,
}

/// Buckets charged in one backend call (each bucket is its rule's limits and its demand,
/// two hits or more): a report of 10,000 buckets is some eighty calls, and no call holds
/// Redis much longer than a request of many descriptors would.
const BUCKETS_PER_CALL: usize = 128;

/// How long a report's hits that a busy backend shed wait before they are asked again.
const SHED_PAUSE: Duration = Duration::from_millis(10);

/// Backend calls out at once for one report: a report of many buckets goes over several
/// connections, without taking them all from `ShouldRateLimit`.
const CALLS_AT_ONCE: usize = 4;

/// How long a report's calls may wait for their turn on a connection (each call, once sent,
/// still has the command timeout). A data plane reports every few seconds and waits for no
/// answer, so a large report on a busy or cold Redis is better late than uncounted.
const REPORT_DEADLINE: Duration = Duration::from_secs(1);

/// The order of `entries` (a bucket's, which has none of its own) that is a path of
/// `domain`'s rules in `rules` ending at a rule; `None` when no order is. The given order
/// is tried first, then the sorted one (a stream's buckets come sorted), then the others,
/// walking the rule tree
/// ([`Domain::order_matching`]): a bucket no rule matches costs about what one that
/// matches does.
pub fn bucket_descriptor(rules: &RuleSet, domain: &str, entries: &[Entry]) -> Option<Vec<Entry>> {
    let domain = rules.domain(domain)?;
    if matched_rule(domain, entries).is_some() {
        return Some(entries.to_vec());
    }
    if !entries.is_sorted() {
        let mut sorted = entries.to_vec();
        sorted.sort();
        if matched_rule(domain, &sorted).is_some() {
            return Some(sorted);
        }
    }
    let order = domain.order_matching(entries)?;
    Some(
        order
            .into_iter()
            .map(|index| entries[index].clone())
            .collect(),
    )
}

/// One backend call's answers, in the order of its buckets, and the instant (µs on the
/// stream's clock) the call went out: the backend counted after it, and before the answer
/// was read.
#[derive(Debug, Default)]
pub struct Answered {
    pub sent_at: u64,
    pub quotas: Vec<BucketQuota>,
}

/// Charges each bucket's `allowed` requests (already let through by a data plane) to the
/// counters of the rule its entries match in `domain` of `rules`, counted in full even past
/// the limit, and adds its `requests` to the bucket's demand; answers what is left of each,
/// in the order of `usages`, one backend call's buckets as they come: a caller that works on
/// one call's buckets meanwhile leaves the calls after it with the backend.
/// `BUCKETS_PER_CALL` buckets go in one backend call, `CALLS_AT_ONCE` calls at a time; each
/// call's instant is read on `clock`.
pub fn charge_in_turn<'a>(
    limiter: &'a RateLimiter,
    clock: &'a dyn Clock,
    rules: &'a RuleSet,
    domain: &'a str,
    usages: &'a [BucketUsage<'a>],
) -> impl Stream<Item = Answered> + Send + 'a {
    let Some(domain_rules) = rules.domain(domain) else {
        let unmatched = Answered {
            sent_at: clock.now_micros(),
            quotas: vec![BucketQuota::NoRule; usages.len()],
        };
        return futures_util::stream::iter([unmatched]).left_stream();
    };
    let deadline = Instant::now() + REPORT_DEADLINE;
    // Made here, not in the stream: a stream mapping a closure over borrowed chunks
    // trips the compiler's proof that the task is `Send`.
    let calls: Vec<_> = usages
        .chunks(BUCKETS_PER_CALL)
        .map(|chunk| charge_together(limiter, clock, domain_rules, domain, chunk, deadline))
        .collect();
    (futures_util::stream::iter(calls).buffered(CALLS_AT_ONCE)).right_stream()
}

/// [`charge_in_turn`] for buckets charged in one backend call, answered by `deadline`.
async fn charge_together(
    limiter: &RateLimiter,
    clock: &dyn Clock,
    rules: &Domain,
    domain: &str,
    usages: &[BucketUsage<'_>],
    deadline: Instant,
) -> Answered {
    // A large report is many calls; on the memory backend none of them waits, so each
    // lets the worker answer other requests first (a report of 1,000 buckets otherwise
    // held a worker for tens of milliseconds).
    tokio::task::yield_now().await;
    // Each bucket's hits: a look at each limit of its rule and its charge (the charge alone
    // when it charges nothing), then its demand.
    let mut hits: Vec<CounterHit<'_>> = Vec::with_capacity(4 * usages.len());
    let mut buckets = Vec::with_capacity(usages.len());
    for usage in usages {
        let first = hits.len();
        let charged = match matched_rule(rules, usage.entries) {
            None => Charged::Settled(BucketQuota::NoRule),
            Some(found) => match &found.rule.policy {
                Policy::Limited(limits) => {
                    hits.extend(charge_hits(domain, &found, limits, usage.allowed));
                    hits.extend(
                        usage
                            .demand
                            .into_iter()
                            .flat_map(|demand| demand_hits(domain, &found, demand)),
                    );
                    Charged::Counted {
                        rule: found.rule,
                        layout: Layout::of(limits.len(), usage.allowed),
                        policy: (found.rule.on_backend_error)
                            .unwrap_or(limiter.options().on_backend_error),
                        shadow: found.rule.shadow_mode || limiter.options().shadow_mode,
                    }
                }
                _ => {
                    record_usage(limiter, domain, found.rule, usage, Judged::Unlimited);
                    Charged::Settled(BucketQuota::Unlimited)
                }
            },
        };
        buckets.push((charged, first..hits.len()));
    }
    let sent_at = clock.now_micros();
    let results = if hits.is_empty() {
        Vec::new()
    } else {
        count_by(limiter, &hits, deadline).await
    };
    let quotas = (buckets.into_iter().zip(usages))
        .map(|((charged, span), usage)| match charged {
            Charged::Settled(quota) => quota,
            Charged::Counted {
                rule,
                layout,
                policy,
                shadow,
            } => {
                let (hits, results) = (&hits[span.clone()], &results[span]);
                let judged = judged(hits, results, layout, rule.shadow_mode);
                record_usage(limiter, domain, rule, usage, judged);
                let quota = quota_left(limiter, hits, results, layout, policy);
                if shadow { BucketQuota::Shadowed } else { quota }
            }
        })
        .collect();
    Answered { sent_at, quotas }
}

/// Counts `hits` by `deadline`. The hits a busy backend shed (refused before they were
/// sent, so counted nowhere) are asked again every [`SHED_PAUSE`] until the deadline: a
/// report's usage was let through already, and counted late is better than not at all.
async fn count_by(
    limiter: &RateLimiter,
    hits: &[CounterHit<'_>],
    deadline: Instant,
) -> Vec<Result<Decision, BackendError>> {
    let mut results = limiter.count(hits, Some(deadline)).await;
    loop {
        let shed: Vec<usize> = (results.iter().enumerate())
            .filter(|(_, result)| matches!(result, Err(BackendError::Overloaded(_))))
            .map(|(index, _)| index)
            .collect();
        if shed.is_empty() || Instant::now() + SHED_PAUSE >= deadline {
            return results;
        }
        tokio::time::sleep(SHED_PAUSE).await;
        let again: Vec<CounterHit<'_>> = shed.iter().map(|&index| hits[index].clone()).collect();
        let answers = limiter.count(&again, Some(deadline)).await;
        for (index, answer) in shed.into_iter().zip(answers) {
            results[index] = answer;
        }
    }
}

/// Counts a bucket's reported usage in its rule's statistics, as ShouldRateLimit counts
/// its requests: the requests let through in this window as the rule's counter `judged`
/// them, those let through in an earlier window within it (that window's assignment
/// made room for them), those the data plane refused over the limit.
fn record_usage(
    limiter: &RateLimiter,
    domain: &str,
    rule: &Rule,
    usage: &BucketUsage<'_>,
    judged: Judged,
) {
    if usage.let_through() == 0 && usage.refused == 0 {
        return;
    }
    let metrics = limiter.metrics();
    metrics.record_rule(domain, Some(rule), usage.entries, usage.allowed, judged);
    if usage.earlier > 0 {
        metrics.record_rule(
            domain,
            Some(rule),
            usage.entries,
            usage.earlier,
            Judged::Unlimited,
        );
    }
    if usage.refused > 0 {
        metrics.record_rule(
            domain,
            Some(rule),
            usage.entries,
            usage.refused,
            Judged::Refused,
        );
    }
}

/// What is left of one bucket's limit from the answers to its `hits` (laid out as `layout`
/// says), the hits the backend failed decided by the rule's `policy` when it is `local`.
fn quota_left(
    limiter: &RateLimiter,
    hits: &[CounterHit<'_>],
    results: &[Result<Decision, BackendError>],
    layout: Layout,
    policy: OnBackendError,
) -> BucketQuota {
    let left = match policy {
        OnBackendError::Local => {
            let decided: Vec<Result<Decision, BackendError>> = (hits.iter().zip(results))
                .map(|(hit, result)| match result {
                    Err(error) => limiter.on_failure(hit, policy, error.clone()),
                    Ok(decision) => Ok(*decision),
                })
                .collect();
            what_is_left(hits, &decided, layout)
        }
        _ => what_is_left(hits, results, layout),
    };
    left.unwrap_or_else(|error| BucketQuota::Failed { error, policy })
}

/// A bucket of a backend call: settled without the backend, or counted there for `rule`
/// (its hits laid out as `layout` says), under its `on_backend_error` and shadow mode.
enum Charged<'r> {
    Settled(BucketQuota),
    Counted {
        rule: &'r Rule,
        layout: Layout,
        policy: OnBackendError,
        shadow: bool,
    },
}

/// Where a bucket's hits lie: for each of its rule's `limits`, a look and the charge after
/// it, or the charge alone when it charges nothing (a charge of nothing is a look: an
/// assignment sent at a reset, a report that let nothing through); then its demand's, if
/// any.
#[derive(Debug, Clone, Copy)]
struct Layout {
    limits: usize,
    /// Hits a limit: 2, or 1 for a charge of nothing.
    each: usize,
}

impl Layout {
    fn of(limits: usize, allowed: u64) -> Layout {
        let each = if allowed == 0 { 1 } else { 2 };
        Layout { limits, each }
    }

    /// The hit that looked at limit `limit` before its charge.
    fn look(&self, limit: usize) -> usize {
        self.each * limit
    }

    /// The hit that charged limit `limit`.
    fn charge(&self, limit: usize) -> usize {
        self.each * limit + self.each - 1
    }

    /// The demand's first hit.
    fn demand(&self) -> usize {
        self.each * self.limits
    }
}

/// How the counters of a bucket's rule judged the requests charged to them, for the rule's
/// statistics: split at the limit found by the look before the charge, on the limit with
/// the least left, as ShouldRateLimit splits the same hits one by one; undecided when the
/// backend failed.
fn judged(
    hits: &[CounterHit<'_>],
    results: &[Result<Decision, BackendError>],
    layout: Layout,
    shadow: bool,
) -> Judged {
    let looks: Result<Vec<Decision>, _> = (0..layout.limits)
        .map(|limit| results[layout.look(limit)].clone())
        .collect();
    let Ok(looks) = looks else {
        return Judged::Undecided;
    };
    let left = |look: &Decision| if look.allowed { look.remaining } else { 0 };
    match (looks.iter().enumerate()).min_by_key(|(_, look)| left(look)) {
        Some((index, look)) => Judged::Charged {
            found_remaining: left(look),
            capacity: hits[layout.look(index)].limit.capacity(),
            shadow,
        },
        None => Judged::Undecided,
    }
}

/// The hits that charge `allowed` requests to each of `limits`, the limits of the rule
/// `found`, each after a look that costs nothing (what was left before): usage already let
/// through, so counted whatever the count, as an overshoot. The look is a usage of nothing,
/// so that it has its charge's limit: a backend call orders the hits of one limit as they
/// came, and no other report's charge of the counter falls between a look and its charge.
/// A charge of nothing goes alone: it is its own look ([`Layout`]).
fn charge_hits<'a>(
    domain: &str,
    found: &Match<'_>,
    limits: &[NamedLimit],
    allowed: u64,
) -> impl Iterator<Item = CounterHit<'a>> {
    let named = limits.iter().map(|named| &named.limit);
    let keys: Vec<CounterKey> =
        CounterKey::of_rule(domain, found.rule.id.as_str(), named, &found.entries).collect();
    (limits.iter().zip(keys)).flat_map(move |(named, key)| {
        let look = (allowed > 0).then(|| CounterHit::usage(key.clone(), &named.limit, 0));
        look.into_iter()
            .chain([CounterHit::usage(key, &named.limit, allowed)])
    })
}

/// What is left of one bucket's limit from the answers to its `hits` (laid out as `layout`
/// says, the demand's read and add last, if any): the tightest limit, with the demand seen;
/// the first error.
fn what_is_left(
    hits: &[CounterHit<'_>],
    results: &[Result<Decision, BackendError>],
    layout: Layout,
) -> Result<BucketQuota, BackendError> {
    if let Some(error) = results.iter().find_map(|result| result.as_ref().err()) {
        return Err(error.clone());
    }
    let decided = |index: usize| results[index].as_ref().ok();
    let total =
        |index: usize| decided(index).map(|d| u64::from(u32::MAX).saturating_sub(d.remaining));
    let demand = (results.len() >= layout.demand() + 2)
        .then(|| {
            Some(DemandSeen {
                period: total(layout.demand())?,
                next: total(layout.demand() + 1)?,
            })
        })
        .flatten();
    let mut tightest: Option<BucketQuota> = None;
    for index in 0..layout.limits {
        let charge = layout.charge(index);
        let (hit, Some(decision)) = (&hits[charge], decided(charge)) else {
            continue;
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
    Ok(tightest.unwrap_or(BucketQuota::Unlimited))
}

/// The hits that read the bucket `found`'s demand in `demand`'s period and add its rate to
/// the next period's: two tallies kept [`DEMAND_KEPT`] from their first write (a plain
/// count: one GET to read, one INCRBY to add, on Redis), beside the rule's own counters
/// (their keys name the rule and the period with a suffix no rule id has).
fn demand_hits<'a>(domain: &str, found: &Match<'_>, demand: DemandReport) -> [CounterHit<'a>; 2] {
    let limit = Limit {
        requests_per_unit: u32::MAX,
        unit: Unit::Second,
        unit_multiplier: DEMAND_KEPT.as_secs() as u32,
        algorithm: Algorithm::Tally,
        burst: None,
        timezone: None,
        overshoot: true,
        lease: false,
    };
    let mut rule = String::with_capacity(found.rule.id.len() + 32);
    let mut hit = |period: u64, amount: u64| {
        rule.clear();
        rule.push_str(found.rule.id.as_str());
        rule.push_str("~rlqs-demand-");
        rule.push_str(itoa::Buffer::new().format(period));
        let key = CounterKey::new(domain, &rule, 0, &limit, found.entries.iter().copied());
        CounterHit::usage(key, &limit, amount)
    };
    [
        hit(demand.period, 0),
        hit(demand.period.saturating_add(1), demand.rate),
    ]
}

/// The rule `entries`, in this order, lead to in `domain`, with the entries its counter is
/// keyed by (a `share_threshold` wildcard's pattern in place of the value).
fn matched_rule<'a>(domain: &'a Domain, entries: &'a [Entry]) -> Option<Match<'a>> {
    domain.find(entries)
}
