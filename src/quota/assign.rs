//! What a data plane is told for one bucket, from what is left of the bucket's limit: the
//! whole decision of the Rate Limit Quota Service, without the protocol.
//!
//! An instance is given a token bucket that admits its share of the quota left, spread over
//! what is left of the window: `remaining × share / max(time left, interval)` requests a
//! second, with one interval's worth as its burst. Its share is its reported demand against
//! the demand of every stream reporting the bucket, on every replica (a counter beside the
//! rule's). Every request an instance admits is
//! charged to the limit's counter at its next report, so an exhausted limit is seen within
//! one interval, and every instance is told `DENY_ALL` until the window resets at its next
//! report: the overshoot is what the instances admit in one interval (and a round trip)
//! after the quota ran out, at rates set when little of it was left.

use std::time::Duration;

use crate::rules::OnBackendError;
use crate::service::quota::BucketQuota;

/// The reporting interval assumed for a bucket's first report, which has no elapsed time:
/// Envoy 1.40 reports every 5 s whatever the bucket's `reporting_interval` says.
pub const FIRST_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest and the longest interval a report is taken to cover, whatever its
/// `time_elapsed` says: Envoy counts it in whole seconds, and a data plane that claims
/// hours would get an assignment that outlives any change of the quota (or overflows).
const SHORTEST_INTERVAL: Duration = Duration::from_secs(1);
const LONGEST_INTERVAL: Duration = Duration::from_secs(60);

/// How long an assignment holds, in reporting intervals: long enough that a late or lost
/// report changes nothing, short enough that a data plane whose server went away falls back
/// to its `expired_assignment_behavior` soon.
const TTL_INTERVALS: u32 = 3;

/// A bucket's demand: its requests per second on this stream, and on every stream of every
/// replica that reports it (this one included).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Demand {
    pub this: f64,
    pub total: f64,
}

impl Demand {
    /// This stream's share of the bucket: all of it when nobody asked for anything.
    fn share(self) -> f64 {
        if self.total <= 0.0 || self.this >= self.total {
            1.0
        } else {
            (self.this / self.total).max(0.0)
        }
    }
}

/// The action for one bucket.
#[derive(Debug, Clone, PartialEq)]
pub enum Assignment {
    /// Every request passes (no rule limits the bucket), until `ttl`.
    AllowAll { ttl: Duration },
    /// Every request is refused until the window resets, `ttl` from now.
    DenyAll { ttl: Duration },
    /// A token bucket: `tokens_per_fill` every `fill_interval`, at most `max_tokens` held.
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval: Duration,
        ttl: Duration,
    },
}

/// The interval a report covers, from its `time_elapsed`: within `SHORTEST_INTERVAL` and
/// `LONGEST_INTERVAL`, and [`FIRST_INTERVAL`] for a first report (none, zero, or below
/// zero).
pub fn interval(elapsed: Option<&pbjson_types::Duration>) -> Duration {
    match elapsed.and_then(|elapsed| Duration::try_from(*elapsed).ok()) {
        Some(elapsed) if !elapsed.is_zero() => elapsed.clamp(SHORTEST_INTERVAL, LONGEST_INTERVAL),
        _ => FIRST_INTERVAL,
    }
}

/// What to tell the instance that reported `quota` every `interval` with `demand`; `None`
/// when the backend could not count (the instance keeps its assignment until it expires,
/// then applies its own `expired_assignment_behavior`).
pub fn assign(quota: &BucketQuota, interval: Duration, demand: Demand) -> Option<Assignment> {
    let ttl = whole_seconds(interval * TTL_INTERVALS);
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
            remaining: 0,
            reset_micros,
            ..
        } => Some(Assignment::DenyAll {
            ttl: whole_seconds(Duration::from_micros(*reset_micros)),
        }),
        BucketQuota::Counted {
            remaining,
            reset_micros,
            ..
        } => {
            let left = Duration::from_micros(*reset_micros).max(interval);
            let rate = *remaining as f64 * demand.share() / left.as_secs_f64();
            Some(token_bucket(rate, interval, ttl))
        }
    }
}

/// `duration` rounded up to whole seconds, at least one: Envoy 1.40 reads only the
/// seconds of an assignment's time to live, so a `DENY_ALL` 0.3 s from its reset would
/// expire at once, and 4.5 s would be 4.
fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}

/// A token bucket that admits `rate` requests a second, holding one `interval`'s worth.
/// The fill interval is whole seconds: Envoy 1.40 fills a bucket whose interval is under a
/// second without limit (observed: a 250 ms interval let every request through).
fn token_bucket(rate: f64, interval: Duration, ttl: Duration) -> Assignment {
    let per_interval = (rate * interval.as_secs_f64()).ceil().max(1.0);
    let max_tokens = per_interval.min(f64::from(u32::MAX)) as u32;
    // Below one a second, one token every so many whole seconds; else so many a second.
    let (tokens_per_fill, fill_interval) = if rate >= 1.0 {
        (rate.round(), Duration::from_secs(1))
    } else {
        let seconds = (1.0 / rate.max(f64::MIN_POSITIVE)).round().max(1.0);
        (
            1.0,
            Duration::from_secs_f64(seconds.min(ttl.as_secs_f64().max(1.0))),
        )
    };
    Assignment::TokenBucket {
        max_tokens,
        tokens_per_fill: tokens_per_fill.min(f64::from(max_tokens)) as u32,
        fill_interval,
        ttl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;
    use crate::limiter::{Limit, Unit};

    fn counted(remaining: u64, reset_secs: u64) -> BucketQuota {
        BucketQuota::Counted {
            limit: Limit::per(100, Unit::Minute),
            remaining,
            reset_micros: reset_secs * 1_000_000,
            demand: 0,
        }
    }

    const ALONE: Demand = Demand {
        this: 10.0,
        total: 10.0,
    };

    #[test]
    fn the_quota_left_is_spread_over_the_window_left() {
        // 60 left for 30 s: 2 a second, one 5 s report's worth held.
        let assignment = assign(&counted(60, 30), Duration::from_secs(5), ALONE);
        assert_eq!(
            assignment,
            Some(Assignment::TokenBucket {
                max_tokens: 10,
                tokens_per_fill: 2,
                fill_interval: Duration::from_secs(1),
                ttl: Duration::from_secs(15),
            })
        );
    }

    #[test]
    fn a_slow_rate_is_a_token_every_few_whole_seconds() {
        // 10 left for 40 s: one every 4 s.
        let Some(Assignment::TokenBucket {
            tokens_per_fill,
            fill_interval,
            ..
        }) = assign(&counted(10, 40), Duration::from_secs(5), ALONE)
        else {
            panic!("a token bucket");
        };
        assert_eq!(
            (tokens_per_fill, fill_interval),
            (1, Duration::from_secs(4))
        );
    }

    #[test]
    fn instances_share_by_demand() {
        let busy = Demand {
            this: 30.0,
            total: 40.0,
        };
        let Some(Assignment::TokenBucket {
            tokens_per_fill, ..
        }) = assign(&counted(80, 10), Duration::from_secs(1), busy)
        else {
            panic!("a token bucket");
        };
        // 80 × 3/4 over 10 s: 6 a second.
        assert_eq!(tokens_per_fill, 6);
    }

    #[test]
    fn an_exhausted_limit_denies_until_it_resets() {
        assert_eq!(
            assign(&counted(0, 12), Duration::from_secs(1), ALONE),
            Some(Assignment::DenyAll {
                ttl: Duration::from_secs(12)
            })
        );
    }

    #[test]
    fn times_to_live_are_whole_seconds_rounded_up() {
        let deny_ttl = |reset_micros| match assign(
            &BucketQuota::Counted {
                limit: Limit::per(100, Unit::Minute),
                remaining: 0,
                reset_micros,
                demand: 0,
            },
            Duration::from_secs(5),
            ALONE,
        ) {
            Some(Assignment::DenyAll { ttl }) => ttl,
            other => panic!("a DENY_ALL: {other:?}"),
        };
        assert_eq!(deny_ttl(300_000), Duration::from_secs(1));
        assert_eq!(deny_ttl(12_400_000), Duration::from_secs(13));
        assert_eq!(deny_ttl(0), Duration::from_secs(1));
        let Some(Assignment::TokenBucket { ttl, .. }) =
            assign(&counted(60, 30), Duration::from_millis(1_500), ALONE)
        else {
            panic!("a token bucket");
        };
        assert_eq!(ttl, Duration::from_secs(5), "3 × 1.5 s, rounded up");
    }

    #[test]
    fn no_rule_allows_and_a_failed_backend_follows_the_rules_policy() {
        let interval = Duration::from_secs(5);
        assert_eq!(
            assign(&BucketQuota::NoRule, interval, ALONE),
            Some(Assignment::AllowAll {
                ttl: Duration::from_secs(15)
            })
        );
        let failed = |policy| BucketQuota::Failed {
            error: BackendError::Timeout(Duration::from_millis(15)),
            policy,
        };
        assert_eq!(
            assign(&failed(OnBackendError::Error), interval, ALONE),
            None
        );
        let ttl = Duration::from_secs(15);
        assert_eq!(
            assign(&failed(OnBackendError::FailOpen), interval, ALONE),
            Some(Assignment::AllowAll { ttl })
        );
        assert_eq!(
            assign(&failed(OnBackendError::FailClosed), interval, ALONE),
            Some(Assignment::DenyAll { ttl })
        );
    }
}
