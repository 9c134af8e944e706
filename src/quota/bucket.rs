//! What a stream knows of one bucket between reports: the rule's descriptor it is charged
//! on, its last report and share, the window of its last assignment (when the window
//! resets before the next report, the stream sends the new window's assignment then), and
//! what that assignment let through at most (so that a report spanning a reset charges the
//! new window only what was let through after it).

use std::sync::Arc;
use std::time::Duration;

use super::charge::{BucketQuota, DemandReport, DemandSeen};
use crate::limiter::{Algorithm, Limit};
use crate::rules::Entry;

use super::assign::{self, Assignment};

/// How long after a window's reset its new assignment is sent: the backend's clock and this
/// process' may differ by a few milliseconds, and the new window must have begun there.
pub(super) const AFTER_RESET: Duration = Duration::from_millis(20);

/// A bucket a stream charges: its rule's descriptor, its last report, and its window.
pub(super) struct Bucket {
    /// Its entries in its rule's order (the descriptor it is charged on), or `None` once the
    /// rules changed: then it is matched again at its next report.
    pub(super) descriptor: Option<Arc<[Entry]>>,
    /// When it was last reported (µs on the stream's clock), and the interval that report
    /// covered.
    pub(super) reported_at: u64,
    pub(super) interval: Duration,
    /// This stream's share of the bucket's demand, at its last report.
    pub(super) share: f64,
    /// The demand this stream added for the bucket: the period it went to, and how much.
    pub(super) demand_added: Option<DemandReport>,
    /// The limit its last assignment came from, and when that limit's window resets (at the
    /// earliest: [`Bucket::follow`]).
    pub(super) window: Option<(Limit, u64)>,
    /// What the assignment made at its last report lets through at most: so many at once
    /// and so many a second (`None`: no bound, `ALLOW_ALL` or none sent). At once, a full
    /// bucket: unless the data plane kept its bucket (the same assignment again) after
    /// refusing requests, which emptied it.
    pub(super) allowance: Option<(f64, f64)>,
    /// The assignment the data plane holds (the last sent).
    pub(super) holds: Option<Assignment>,
    /// The same of the assignment sent at the window's reset since, and when it was sent.
    pub(super) pushed: Option<(f64, f64, u64)>,
    /// When the stream sends the bucket a new assignment unasked (its window resets before
    /// its next report).
    pub(super) push_at: Option<u64>,
}

impl Bucket {
    /// Of `allowed` requests let through (and `refused` refused) between the bucket's last
    /// report and `now`, those let through before its fixed window last reset: that window
    /// is over, and they are not charged to the new one.
    pub(super) fn let_through_before_reset(&self, allowed: u64, refused: u64, now: u64) -> u64 {
        let Some((limit, resets_at)) = &self.window else {
            return 0;
        };
        if limit.algorithm != Algorithm::FixedWindow || now <= self.reported_at {
            return 0;
        }
        // The resets are `resets_at` give or take whole windows: the last one up to now.
        let window = i128::from(limit.window_micros().max(1));
        let (now, since) = (i128::from(now), i128::from(self.reported_at));
        let last_reset = now - (now - i128::from(*resets_at)).rem_euclid(window);
        if last_reset <= since {
            return 0;
        }
        let before = (last_reset - since) as f64 / (now - since) as f64;
        let even = (allowed as f64 * before).round();
        // Within what each side's assignment could let through. A data plane that refused
        // requests took all it was given, on both sides: the split is what each allowed,
        // a bucket that replaced a drained one starting drained. Otherwise the requests are
        // taken to have come evenly, within what each side allowed.
        let saturated = refused > 0;
        let most = self.allowance.map_or(f64::INFINITY, |(burst, rate)| {
            (burst + rate * (last_reset - since) as f64 / 1e6).floor()
        });
        if saturated && most.is_finite() {
            return (most as u64).min(allowed);
        }
        // After the reset: the old assignment until the new one arrived, then the new one.
        let old_rate = self.allowance.map_or(0.0, |(_, rate)| rate);
        let after_most = self.pushed.map_or(f64::INFINITY, |(burst, rate, at)| {
            let at = i128::from(at);
            let old = old_rate * (at - last_reset).max(0) as f64 / 1e6;
            old + burst + rate * (now - at).max(0) as f64 / 1e6
        });
        let least = (allowed as f64 - after_most.ceil()).max(0.0);
        even.min(most).max(least).min(allowed as f64) as u64
    }
}

/// When the backend counted a bucket's charge, as the stream saw it: after `sent_at` (its
/// call went out) and before `read_at` (its answer was read), µs on the stream's clock. A
/// call waits its turn for a connection and travels both ways, so the two can be a Redis
/// round trip apart, or more.
#[derive(Debug, Clone, Copy)]
pub(super) struct CountedBetween {
    pub(super) sent_at: u64,
    pub(super) read_at: u64,
}

impl Bucket {
    /// Follows the window of `quota`: when it resets before `next_report` (and the reset
    /// changes what is left: a fixed window, or an exhausted limit), the stream sends the new
    /// window's assignment then. The reset the backend names (time left when it counted) lies
    /// between the call's two instants plus that time, and each use takes the side that
    /// cannot go wrong:
    ///
    /// - the push is placed from `read_at`, late: a push before the reset would send what
    ///   is left of the old window and none after it;
    /// - the next report is split at the reset placed from `sent_at`, early: a report read
    ///   after the reset but before a late estimate of it would be charged whole to the new
    ///   window, which the backend counts it in, its old window's requests with it (a Redis
    ///   40 ms away took that many requests from every window whose reports came just
    ///   after its reset). Early, the requests of the last moments before the reset are
    ///   the ones left uncharged, in a window that is over.
    pub(super) fn follow(
        &mut self,
        quota: &BucketQuota,
        counted: CountedBetween,
        next_report: u64,
    ) {
        self.window = None;
        self.push_at = None;
        let BucketQuota::Counted {
            limit,
            remaining,
            reset_micros,
            ..
        } = quota
        else {
            return;
        };
        let latest = counted.read_at.saturating_add(*reset_micros);
        let resetting = limit.algorithm == Algorithm::FixedWindow || *remaining == 0;
        if resetting && !assign::paced_alone(limit) && latest <= next_report {
            self.push_at = Some(latest + micros(AFTER_RESET));
        }
        let earliest = counted.sent_at.saturating_add(*reset_micros);
        self.window = Some((limit.clone(), earliest));
    }
}

/// A stream's share of a bucket's demand: its rate now (`demand`) against its rate and the
/// others'. The others' are what the period it reports in holds (every stream's rate of the
/// period before) or, when more, what the next one holds so far (streams that reported
/// since, a newcomer among them), each without this stream's own (`added` before this
/// report, and this report's). All of it when nobody asked for anything.
pub(super) fn share(demand: DemandReport, added: Option<DemandReport>, seen: DemandSeen) -> f64 {
    let own = |period: u64| {
        added
            .filter(|added| added.period == period)
            .map_or(0, |a| a.rate)
    };
    let in_period = seen.period.saturating_sub(own(demand.period));
    let own_next = own(demand.period + 1).saturating_add(demand.rate);
    let in_next = seen.next.saturating_sub(own_next);
    let total = in_period.max(in_next).saturating_add(demand.rate);
    if total == 0 {
        1.0
    } else {
        demand.rate as f64 / total as f64
    }
}

/// `duration` in microseconds.
pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Unit;

    const SECOND: u64 = 1_000_000;

    /// A bucket of a 10 s fixed window reported at 8 s, assigned a bucket of `burst` filling
    /// `rate` a second; its window resets at 10 s.
    fn reported_at_eight(burst: f64, rate: f64) -> Bucket {
        let limit = Limit {
            unit_multiplier: 10,
            ..Limit::per(5, Unit::Second)
        };
        Bucket {
            descriptor: None,
            reported_at: 8 * SECOND,
            interval: assign::REPORT_INTERVAL,
            share: 1.0,
            demand_added: None,
            window: Some((limit, 10 * SECOND)),
            allowance: Some((burst, rate)),
            holds: None,
            pushed: None,
            push_at: None,
        }
    }

    #[test]
    fn a_saturated_instance_let_through_before_the_reset_what_it_was_given() {
        // Refusals say it took all it could: its bucket of 2 and 2 s at 1 a second.
        let bucket = reported_at_eight(2.0, 1.0);
        assert_eq!(bucket.let_through_before_reset(9, 30, 13 * SECOND), 4);
    }

    #[test]
    fn an_instance_that_refused_nothing_is_split_by_time_within_what_each_side_allowed() {
        let mut bucket = reported_at_eight(2.0, 1.0);
        // 5 over 5 s, 2 s of them before the reset: 2.
        assert_eq!(bucket.let_through_before_reset(5, 0, 13 * SECOND), 2);
        // 10 over 5 s, where the old assignment allowed 4 before the reset: at most 4.
        assert_eq!(bucket.let_through_before_reset(10, 0, 13 * SECOND), 4);
        // The new window's assignment (none full, 1 a second from 10.02 s) allowed 3 after
        // it: of 6, at least 3 came before.
        bucket.pushed = Some((0.0, 1.0, 10 * SECOND + 20_000));
        assert_eq!(bucket.let_through_before_reset(6, 0, 13 * SECOND), 3);
    }

    #[test]
    fn the_push_follows_the_latest_reset_and_the_split_the_earliest() {
        // Reported at 5 s, Redis 40 ms away: it counted at 5.04 s, 4.96 s before the reset.
        let mut bucket = reported_at_eight(2.0, 20.0);
        bucket.reported_at = 5 * SECOND;
        let quota = BucketQuota::Counted {
            limit: bucket.window.clone().expect("a window").0,
            remaining: 5,
            reset_micros: 4_960_000,
            demand: None,
        };
        let counted = CountedBetween {
            sent_at: 5 * SECOND,
            read_at: 5 * SECOND + 80_000,
        };
        bucket.follow(&quota, counted, 11 * SECOND);
        assert_eq!(bucket.push_at, Some(10 * SECOND + 40_000 + 20_000));
        // A report 10 ms after the true reset is split: its 50 came before it.
        let before = bucket.let_through_before_reset(50, 0, 10 * SECOND + 10_000);
        assert_eq!(before, 50);
    }

    #[test]
    fn a_report_within_one_window_is_all_charged() {
        let bucket = reported_at_eight(2.0, 1.0);
        assert_eq!(bucket.let_through_before_reset(7, 0, 9 * SECOND), 0);
    }

    #[test]
    fn a_lone_stream_has_all_of_the_demand_and_two_share_by_rate() {
        let now = DemandReport {
            period: 7,
            rate: 20_000,
        };
        // Its own rate of the period before was 18 a second: the period holds only that.
        let added = Some(DemandReport {
            period: 7,
            rate: 18_000,
        });
        let alone = DemandSeen {
            period: 18_000,
            next: 20_000,
        };
        assert_eq!(share(now, added, alone), 1.0);
        // Another stream asked 60 a second in the period before.
        let shared = DemandSeen {
            period: 78_000,
            next: 20_000,
        };
        assert_eq!(share(now, added, shared), 0.25);
    }
}
