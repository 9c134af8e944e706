//! What a data plane is told for one bucket, from what is left of the bucket's limit: the
//! whole decision of the Rate Limit Quota Service, without the protocol.
//!
//! An instance is paced: it gets a token bucket that admits its share of the quota left,
//! spread over what is left of the window (`R × s / T` requests a second), never faster than
//! its share of the rule's own pace (`s × limit / W`), holding about a second of tokens. Its
//! share `s` is its demand against the demand of every stream that reports the bucket, on
//! every replica. What it admits is charged to the rule's counter at its next report, so an
//! exhausted limit is seen within one report interval; then it is told `DENY_ALL`, and
//! at the reset the stream sends the new window's assignment without waiting for a report
//! (`crate::quota`). A rule whose window is shorter than the report interval cannot be
//! steered by its counter (a report spans several windows): the instance gets its share of
//! the rule's pace alone.
//!
//! Every assignment lives [`TTL_INTERVALS`] report intervals, so that no assignment runs
//! out while floodgate and the stream are healthy, a late report included: Envoy applies its
//! `expired_assignment_behavior` only when floodgate has gone quiet. docs/algorithms.md
//! ("RLQS assignments") derives the bound that follows.

use std::time::Duration;

use super::charge::BucketQuota;
use crate::limiter::Limit;
use crate::rules::OnBackendError;

/// How often Envoy 1.40 reports, whatever a bucket's `reporting_interval` says: every
/// bucket of a filter goes in one report on one 5 s timer.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest and the longest interval a report is taken to cover, whatever its
/// `time_elapsed` says: Envoy counts it in whole seconds, and a data plane that claims
/// hours would get an assignment that outlives any change of the quota (or overflows).
const SHORTEST_INTERVAL: Duration = Duration::from_secs(1);
const LONGEST_INTERVAL: Duration = Duration::from_secs(60);

/// How long an assignment holds, in report intervals (of at least [`REPORT_INTERVAL`]): past
/// the next report with a whole interval to spare, so one late or lost report changes
/// nothing, and short enough that a data plane whose server went away falls back to its
/// `expired_assignment_behavior` within a quarter of a minute.
pub const TTL_INTERVALS: u32 = 3;

/// The seconds of tokens an instance may hold (its burst): a tenth of a second of its rate,
/// and two tokens at least. Envoy 1.40 starts a new token bucket as full as the one it
/// replaces (full when it replaces none), so an instance that takes all it is given starts
/// each assignment empty, and one that takes less may let this much through at once.
const BURST_SECONDS: f64 = 0.1;

/// How many times its share of the rule's pace an instance may be assigned: enough to
/// spend near the reset what it left earlier, not so much that one report interval past a
/// reset (a stream broken before the new window's assignment) spends a window's worth.
const PACE_CAP: f64 = 2.0;

/// The time left in a window that the quota left is spread over, at the least.
const SHORTEST_LEFT: f64 = 0.1;

/// The part of a window an instance paced alone (a window shorter than a report) may take
/// at once: its bucket holds this part of its share of the limit, and fills at the rest of
/// it, so that no window sees more than the share and two tokens.
const SHORT_WINDOW_BURST: f64 = 0.05;

/// The fill intervals a token bucket may have, shortest first: the first in which the rate
/// comes to [`FILL_PRECISION`] tokens is taken (the longest when none does). Envoy refills
/// continuously at `tokens_per_fill / fill_interval`, reading whole seconds of the interval:
/// a long one lets `tokens_per_fill` say a slow rate to within a token a day.
const FILL_SECONDS: [u64; 4] = [1, 60, 3_600, 86_400];

/// The tokens per fill that say a rate to within 0.1% (rounded down).
const FILL_PRECISION: f64 = 1_000.0;

/// The action for one bucket.
#[derive(Debug, Clone, PartialEq)]
pub enum Assignment {
    /// Every request passes (no rule limits the bucket), until `ttl`.
    AllowAll { ttl: Duration },
    /// Every request is refused until a new assignment (at the reset, or the next report),
    /// or `ttl`.
    DenyAll { ttl: Duration },
    /// A token bucket: `tokens_per_fill` every `fill_interval`, at most `max_tokens` held.
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval: Duration,
        ttl: Duration,
    },
}

impl Assignment {
    /// Whether a data plane holding `held` keeps its token bucket, tokens and all, when it
    /// is sent this: Envoy 1.40 compares a bucket's size, its tokens per fill and the
    /// nanoseconds of its fill interval (not the seconds).
    pub fn keeps_bucket_of(&self, held: &Assignment) -> bool {
        match (self, held) {
            (
                Assignment::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_interval,
                    ..
                },
                Assignment::TokenBucket {
                    max_tokens: held_max,
                    tokens_per_fill: held_fill,
                    fill_interval: held_interval,
                    ..
                },
            ) => {
                (max_tokens, tokens_per_fill, fill_interval.subsec_nanos())
                    == (held_max, held_fill, held_interval.subsec_nanos())
            }
            _ => false,
        }
    }

    /// The most it lets through: a bucket's worth at once, and so many a second; `None`
    /// for no bound (`ALLOW_ALL`).
    pub fn allowance(&self) -> Option<(f64, f64)> {
        match self {
            Assignment::AllowAll { .. } => None,
            Assignment::DenyAll { .. } => Some((0.0, 0.0)),
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval,
                ..
            } => Some((
                f64::from(*max_tokens),
                f64::from(*tokens_per_fill) / fill_interval.as_secs_f64().max(1.0),
            )),
        }
    }
}

/// The interval a report covers: `measured` between this stream's reports of the bucket
/// when it reported it before, else its `time_elapsed`; within `SHORTEST_INTERVAL` and
/// `LONGEST_INTERVAL`, and [`REPORT_INTERVAL`] for a first report (none, zero, or below
/// zero).
pub fn interval(measured: Option<Duration>, elapsed: Option<&pbjson_types::Duration>) -> Duration {
    let reported = elapsed.and_then(|elapsed| Duration::try_from(*elapsed).ok());
    match measured.or(reported) {
        Some(interval) if !interval.is_zero() => {
            interval.clamp(SHORTEST_INTERVAL, LONGEST_INTERVAL)
        }
        _ => REPORT_INTERVAL,
    }
}

/// How long an assignment made for a report of `interval` holds.
pub fn time_to_live(interval: Duration) -> Duration {
    whole_seconds(interval.max(REPORT_INTERVAL) * TTL_INTERVALS)
}

/// Whether `limit`'s window is shorter than a report interval: then the counter cannot
/// steer the instances (each report spans several windows), and they are paced alone.
pub fn paced_alone(limit: &Limit) -> bool {
    Duration::from_micros(limit.window_micros()) < REPORT_INTERVAL
}

/// What to tell an instance with `share` of the bucket's demand, which reported `quota`
/// after an `interval`; `None` when the backend could not count (the instance keeps its
/// assignment until it expires, then applies its own `expired_assignment_behavior`).
pub fn assign(quota: &BucketQuota, interval: Duration, share: f64) -> Option<Assignment> {
    let ttl = time_to_live(interval);
    let share = if share.is_finite() {
        share.clamp(0.0, 1.0)
    } else {
        1.0
    };
    match quota {
        BucketQuota::NoRule | BucketQuota::Unlimited | BucketQuota::Shadowed => {
            Some(Assignment::AllowAll { ttl })
        }
        // The rule's `on_backend_error`, as ShouldRateLimit would answer: `error` leaves the
        // data plane's assignment to run out (then its `expired_assignment_behavior`).
        BucketQuota::Failed { policy, .. } => match policy {
            OnBackendError::FailOpen => Some(Assignment::AllowAll { ttl }),
            OnBackendError::FailClosed => Some(Assignment::DenyAll { ttl }),
            OnBackendError::Error | OnBackendError::Local => None,
        },
        BucketQuota::Counted {
            limit,
            remaining,
            reset_micros,
            ..
        } => {
            let window = limit.window_micros() as f64 / 1e6;
            let quota = f64::from(limit.requests_per_unit) * share;
            if paced_alone(limit) {
                // The bucket's tokens and its fill over one window come to the share and
                // two tokens at most.
                let burst = burst(quota * SHORT_WINDOW_BURST, 2.0);
                let rate = (quota + 2.0 - burst).min(quota) / window;
                return Some(token_bucket(rate, burst, ttl));
            }
            if *remaining == 0 {
                return Some(Assignment::DenyAll { ttl });
            }
            // What the bucket fills until the reset comes to the share of what is left and a
            // token (so that the last one is not due just as the window ends), at no more
            // than twice the share of the rule's pace.
            let left = (*reset_micros as f64 / 1e6).max(SHORTEST_LEFT);
            let share_left = *remaining as f64 * share;
            let rate = ((share_left + 1.0) / left).min(PACE_CAP * quota / window);
            let burst = burst(rate * BURST_SECONDS, *remaining as f64);
            Some(token_bucket(rate, burst, ttl))
        }
    }
}

/// A bucket's capacity: `tokens` rounded up, and two at least when two are left (`most`):
/// a bucket of one token drops what it fills while full, so requests that come as fast as
/// its rate would get every other token.
fn burst(tokens: f64, most: f64) -> f64 {
    let floor = if most >= 2.0 { 2.0 } else { 1.0 };
    tokens.ceil().max(floor)
}

/// `duration` rounded up to whole seconds, at least one: Envoy 1.40 reads only the
/// seconds of an assignment's time to live, so 4.5 s would be 4.
fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}

/// A token bucket that admits `rate` requests a second (never more: the rate is rounded
/// down to what whole-second fills can say), holding `burst` tokens (at least one). Envoy
/// 1.40 takes the fill interval in whole seconds (under a second it fills without limit).
fn token_bucket(rate: f64, burst: f64, ttl: Duration) -> Assignment {
    let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
    let max_tokens = burst.clamp(1.0, f64::from(u32::MAX)) as u32;
    let fill = (FILL_SECONDS.into_iter())
        .find(|seconds| rate * *seconds as f64 >= FILL_PRECISION)
        .unwrap_or(FILL_SECONDS[FILL_SECONDS.len() - 1]);
    let tokens = (rate * fill as f64).floor();
    let (tokens_per_fill, fill_interval) = if tokens >= 1.0 {
        let tokens = tokens.min(f64::from(u32::MAX)) as u32;
        (tokens, Duration::from_secs(fill))
    } else {
        // Below one a day: one token every so many whole seconds, at most a year apart.
        let seconds = (1.0 / rate.max(1e-9)).ceil().min(365.0 * 86_400.0) as u64;
        (1, Duration::from_secs(seconds))
    };
    Assignment::TokenBucket {
        max_tokens,
        tokens_per_fill,
        fill_interval,
        ttl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;
    use crate::limiter::Unit;

    fn counted(limit: Limit, remaining: u64, reset_secs: u64) -> BucketQuota {
        BucketQuota::Counted {
            limit,
            remaining,
            reset_micros: reset_secs * 1_000_000,
            demand: None,
        }
    }

    fn per_minute(remaining: u64, reset_secs: u64) -> BucketQuota {
        counted(Limit::per(100, Unit::Minute), remaining, reset_secs)
    }

    const FIVE: Duration = Duration::from_secs(5);

    /// The rate a token bucket admits, as Envoy reads it (whole seconds of fill).
    fn rate(assignment: &Option<Assignment>) -> f64 {
        match assignment {
            Some(Assignment::TokenBucket {
                tokens_per_fill,
                fill_interval,
                ..
            }) => f64::from(*tokens_per_fill) / fill_interval.as_secs() as f64,
            other => panic!("a token bucket: {other:?}"),
        }
    }

    #[test]
    fn the_quota_left_is_spread_over_the_window_left() {
        // 29 left for 30 s: 29 and a token over 30 s, one a second; two tokens held (a tenth
        // of a second's worth, two at least), for three intervals.
        let assignment = assign(&per_minute(29, 30), FIVE, 1.0);
        assert_eq!(
            assignment,
            Some(Assignment::TokenBucket {
                max_tokens: 2,
                tokens_per_fill: 3_600,
                fill_interval: Duration::from_secs(3_600),
                ttl: Duration::from_secs(15),
            })
        );
    }

    #[test]
    fn no_instance_goes_faster_than_twice_its_share_of_the_rules_pace() {
        // 100 left with 2 s to go: twice the rule's pace (100 a minute), not 50 a second.
        let assignment = assign(&per_minute(100, 2), FIVE, 1.0);
        assert!((rate(&assignment) - 200.0 / 60.0).abs() < 0.01);
        let half = assign(&per_minute(100, 2), FIVE, 0.5);
        assert!((rate(&half) - 100.0 / 60.0).abs() < 0.01);
    }

    #[test]
    fn rates_are_rounded_down_never_up() {
        for (remaining, reset) in [(7, 30), (13, 17), (99, 59), (1, 55)] {
            let quota = per_minute(remaining, reset);
            let exact = ((remaining + 1) as f64 / reset as f64).min(200.0 / 60.0);
            let given = rate(&assign(&quota, FIVE, 1.0));
            assert!(
                given <= exact + 1e-9,
                "{remaining}/{reset}: {given} > {exact}"
            );
            assert!(
                given >= exact * 0.9,
                "{remaining}/{reset}: {given} ≪ {exact}"
            );
        }
    }

    #[test]
    fn a_slow_rate_is_a_token_every_few_whole_seconds() {
        // 1 left for 3 days: one and a token over 3 days, one every 129,600 s.
        let week = Limit {
            unit_multiplier: 7,
            ..Limit::per(100, Unit::Day)
        };
        let quota = counted(week, 1, 3 * 86_400);
        let assignment = assign(&quota, FIVE, 1.0);
        let Some(Assignment::TokenBucket {
            tokens_per_fill,
            fill_interval,
            max_tokens,
            ..
        }) = assignment
        else {
            panic!("a token bucket");
        };
        assert_eq!((max_tokens, tokens_per_fill), (1, 1));
        assert!((129_600..=129_601).contains(&fill_interval.as_secs()));
        // 10 left for 3,000 s: 13.2 an hour, said as 316 a day.
        let quota = counted(Limit::per(100, Unit::Hour), 10, 3_000);
        let hourly = rate(&assign(&quota, FIVE, 1.0)) * 3_600.0;
        assert!((13.1..=13.2).contains(&hourly), "{hourly}");
    }

    #[test]
    fn an_exhausted_limit_denies_past_the_next_report() {
        // 2 s before the reset: DENY_ALL for 15 s all the same, since the stream sends the
        // new window's assignment at the reset, and a DENY_ALL that ran out would leave
        // Envoy to its expired_assignment_behavior until its next report.
        assert_eq!(
            assign(&per_minute(0, 2), FIVE, 1.0),
            Some(Assignment::DenyAll {
                ttl: Duration::from_secs(15)
            })
        );
    }

    #[test]
    fn every_assignment_outlives_the_next_report_and_one_late_one() {
        for interval in [1, 2, 4, 5, 7, 60] {
            let interval = Duration::from_secs(interval);
            for quota in [per_minute(0, 1), per_minute(50, 30), BucketQuota::Unlimited] {
                let ttl = match assign(&quota, interval, 1.0) {
                    Some(Assignment::DenyAll { ttl } | Assignment::AllowAll { ttl }) => ttl,
                    Some(Assignment::TokenBucket { ttl, .. }) => ttl,
                    None => panic!("an assignment"),
                };
                assert!(ttl >= 2 * interval.max(REPORT_INTERVAL) + REPORT_INTERVAL / 2);
            }
        }
    }

    #[test]
    fn a_window_shorter_than_a_report_is_paced_alone() {
        // 10 a second, even when the count of this second is spent: a report covers five
        // such windows, and the rule's pace is what holds over them.
        let limit = Limit::per(10, Unit::Second);
        for remaining in [0, 3, 10] {
            let assignment = assign(&counted(limit.clone(), remaining, 1), FIVE, 0.5);
            assert!((rate(&assignment) - 5.0).abs() < 1e-9);
        }
    }

    #[test]
    fn the_interval_is_measured_when_it_can_be_and_bounded_either_way() {
        let reported = pbjson_types::Duration {
            seconds: 4,
            nanos: 0,
        };
        let measured = Some(Duration::from_millis(5_002));
        assert_eq!(
            interval(measured, Some(&reported)),
            Duration::from_millis(5_002)
        );
        assert_eq!(interval(None, Some(&reported)), Duration::from_secs(4));
        assert_eq!(interval(None, None), REPORT_INTERVAL);
        let hours = pbjson_types::Duration {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(interval(None, Some(&hours)), LONGEST_INTERVAL);
        assert_eq!(interval(Some(Duration::ZERO), None), REPORT_INTERVAL);
    }

    #[test]
    fn no_rule_allows_and_a_failed_backend_follows_the_rules_policy() {
        let ttl = Duration::from_secs(15);
        assert_eq!(
            assign(&BucketQuota::NoRule, FIVE, 1.0),
            Some(Assignment::AllowAll { ttl })
        );
        let failed = |policy| BucketQuota::Failed {
            error: BackendError::Timeout(Duration::from_millis(15)),
            policy,
        };
        assert_eq!(assign(&failed(OnBackendError::Error), FIVE, 1.0), None);
        assert_eq!(
            assign(&failed(OnBackendError::FailOpen), FIVE, 1.0),
            Some(Assignment::AllowAll { ttl })
        );
        assert_eq!(
            assign(&failed(OnBackendError::FailClosed), FIVE, 1.0),
            Some(Assignment::DenyAll { ttl })
        );
    }
}
