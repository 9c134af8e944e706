//! A model of Envoy 1.40's RLQS client (the `rate_limit_quota` filter's global client), as
//! its source behaves, for tests that drive floodgate the way Envoy does at any phase of a
//! window, faster and at more phases than the real Envoy can be placed:
//!
//! - a bucket is created by its first request, which `no_assignment_behavior` decides, and
//!   reported at once (time elapsed 0); the report timer starts with the first bucket and
//!   fires every 5 s whatever `reporting_interval` says, each report carrying the requests
//!   let through and refused since the last and the whole seconds elapsed, truncated;
//! - an assignment holds for the whole seconds of its time to live, restarted by each new
//!   one; when it runs out, `expired_assignment_behavior` decides (`ALLOW_ALL` here, as in
//!   `examples/envoy/rlqs.yaml`);
//! - a token bucket fills continuously at `tokens_per_fill / fill_interval` (the interval's
//!   whole seconds), and is kept, state and all, when a new assignment has the same
//!   `max_tokens`, `tokens_per_fill` and `fill_interval` nanoseconds (Envoy compares no more
//!   than that); a new one starts as full as the one it replaces, in proportion to its
//!   size, and full when it replaces none (observed with the real Envoy 1.40: a drained
//!   bucket's successor starts drained);
//! - `ABANDON` forgets the bucket; its next request creates it anew.
//!
//! Times are seconds on the driver's clock; what the model let through is tallied by the
//! rule's windows, which start at multiples of the window length.

#![allow(dead_code)]

use std::collections::BTreeMap;

use floodgate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::BucketId;

/// Envoy 1.40's report period.
pub const REPORT_PERIOD: f64 = 5.0;

/// How long after a reset the new window's assignment may take to arrive: floodgate sends
/// it 20 ms after the reset, and it travels a round trip.
pub const RESET_GAP: f64 = 0.05;

/// One Envoy instance's view of one bucket.
#[derive(Debug)]
pub struct EnvoyModel {
    pub bucket: BucketId,
    /// The rule's window, in seconds, for the tally.
    window: f64,
    created: bool,
    held: Option<Held>,
    allowed: u64,
    denied: u64,
    last_report: f64,
    /// When the report timer fires next (it runs from the first request on).
    pub next_report: Option<f64>,
    pub tally: Tally,
}

/// What the instance let through and refused.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Let through in each window (its index: start / window length).
    pub let_through: BTreeMap<u64, u64>,
    /// Requests in each window, let through or not, but for those refused in the window's
    /// first [`RESET_GAP`] (the new window's assignment is on its way).
    pub arrived: BTreeMap<u64, u64>,
    /// Let through under `expired_assignment_behavior`: an assignment ran out.
    pub under_expired: u64,
    /// Let through under `no_assignment_behavior`: before the first assignment.
    pub unassigned: u64,
    pub refused: u64,
    /// Assignments received.
    pub assignments: u64,
    /// The rate of the last token bucket assigned, in tokens a second.
    pub last_rate: f64,
}

#[derive(Debug)]
struct Held {
    rule: Held1,
    expires_at: f64,
}

#[derive(Debug)]
enum Held1 {
    Allow,
    Deny,
    Tokens(Tokens),
}

/// Envoy's `AtomicTokenBucketImpl`: continuous fill, capped, starting full.
#[derive(Debug, Clone)]
struct Tokens {
    config: (u32, u32, i32),
    max: f64,
    rate: f64,
    tokens: f64,
    at: f64,
}

impl Tokens {
    fn take(&mut self, now: f64, wanted: u64) -> u64 {
        if self.rate.is_infinite() {
            return wanted;
        }
        self.tokens = (self.tokens + (now - self.at).max(0.0) * self.rate).min(self.max);
        self.at = now;
        let taken = (self.tokens.floor() as u64).min(wanted);
        self.tokens -= taken as f64;
        taken
    }
}

impl EnvoyModel {
    pub fn new(bucket: BucketId, window: f64) -> Self {
        EnvoyModel {
            bucket,
            window,
            created: false,
            held: None,
            allowed: 0,
            denied: 0,
            last_report: 0.0,
            next_report: None,
            tally: Tally::default(),
        }
    }

    /// Decides `count` requests arriving at `now`; the report to send at once when they
    /// created the bucket.
    pub fn requests(&mut self, now: f64, count: u64) -> Option<BucketQuotaUsage> {
        if count == 0 {
            return None;
        }
        let window = (now / self.window).floor() as u64;
        let in_gap = now - window as f64 * self.window < RESET_GAP;
        if !self.created {
            *self.tally.arrived.entry(window).or_default() += count;
            self.created = true;
            self.held = None;
            self.let_through(now, count);
            self.tally.unassigned += count;
            self.allowed += count;
            self.next_report.get_or_insert(now + REPORT_PERIOD);
            self.last_report = now;
            return Some(self.usage(0));
        }
        let expired = self
            .held
            .as_ref()
            .is_some_and(|held| now >= held.expires_at);
        let allowed = match self.held.as_mut() {
            None => {
                self.tally.unassigned += count;
                count
            }
            Some(_) if expired => {
                self.tally.under_expired += count;
                count
            }
            Some(held) => match &mut held.rule {
                Held1::Allow => count,
                Held1::Deny => 0,
                Held1::Tokens(tokens) => tokens.take(now, count),
            },
        };
        self.let_through(now, allowed);
        let counted = if in_gap { allowed } else { count };
        *self.tally.arrived.entry(window).or_default() += counted;
        self.allowed += allowed;
        self.denied += count - allowed;
        self.tally.refused += count - allowed;
        None
    }

    /// The periodic report at `now` (the timer's time), if the bucket exists.
    pub fn report(&mut self, now: f64) -> Option<BucketQuotaUsage> {
        self.next_report = Some(now + REPORT_PERIOD);
        if !self.created {
            return None;
        }
        let elapsed = (now - self.last_report).max(0.0) as i64;
        self.last_report = now;
        Some(self.usage(elapsed))
    }

    fn usage(&mut self, elapsed: i64) -> BucketQuotaUsage {
        let usage = BucketQuotaUsage {
            bucket_id: Some(self.bucket.clone()),
            time_elapsed: Some(pbjson_types::Duration {
                seconds: elapsed,
                nanos: 0,
            }),
            num_requests_allowed: self.allowed,
            num_requests_denied: self.denied,
        };
        self.allowed = 0;
        self.denied = 0;
        usage
    }

    /// Applies what the server sent for this bucket at `now`.
    pub fn apply(&mut self, action: &BucketAction, now: f64) {
        if action.bucket_id.as_ref() != Some(&self.bucket) {
            return;
        }
        match &action.bucket_action {
            Some(Action::AbandonAction(_)) => {
                self.created = false;
                self.held = None;
            }
            Some(Action::QuotaAssignmentAction(assigned)) => {
                let ttl = assigned
                    .assignment_time_to_live
                    .map_or(0, |ttl| ttl.seconds);
                let strategy = assigned.rate_limit_strategy.and_then(|s| s.strategy);
                let rule = match strategy {
                    Some(Strategy::BlanketRule(rule)) if rule == BlanketRule::DenyAll as i32 => {
                        Held1::Deny
                    }
                    Some(Strategy::BlanketRule(_)) => Held1::Allow,
                    Some(Strategy::TokenBucket(bucket)) => {
                        let fill = bucket.fill_interval.unwrap_or_default();
                        let per_fill = bucket.tokens_per_fill.map_or(0, |v| v.value);
                        let config = (bucket.max_tokens, per_fill, fill.nanos);
                        let max = f64::from(bucket.max_tokens);
                        self.tally.last_rate = f64::from(per_fill) / fill.seconds as f64;
                        match self.held.take() {
                            Some(Held {
                                rule: Held1::Tokens(kept),
                                ..
                            }) if kept.config == config => Held1::Tokens(kept),
                            held => {
                                let fullness = match held {
                                    Some(Held {
                                        rule: Held1::Tokens(mut old),
                                        ..
                                    }) => {
                                        old.take(now, 0);
                                        old.tokens / old.max
                                    }
                                    _ => 1.0,
                                };
                                Held1::Tokens(Tokens {
                                    config,
                                    max,
                                    rate: f64::from(per_fill) / fill.seconds as f64,
                                    tokens: max * fullness,
                                    at: now,
                                })
                            }
                        }
                    }
                    _ => return,
                };
                self.tally.assignments += 1;
                self.held = Some(Held {
                    rule,
                    expires_at: now + ttl as f64,
                });
            }
            None => {}
        }
    }

    fn let_through(&mut self, now: f64, count: u64) {
        if count > 0 {
            let window = (now / self.window).floor() as u64;
            *self.tally.let_through.entry(window).or_default() += count;
        }
    }
}
