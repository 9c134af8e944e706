//! Deadlines on Redis' clock: a call that reaches Redis after its requests were answered
//! another way must count nothing.
//!
//! A request that times out gets its rule's failure policy (an error, fail_open,
//! fail_closed, or a local decision that counts the hit in memory). Its script call may still
//! be on its way, or waiting behind a slow command, and Redis would run it later: the hit
//! would be counted although the request was answered otherwise. So each call carries its
//! deadline and the script decides nothing when it runs past it (`lua/batch.lua`).
//!
//! **Which clock.** The script reads Redis' `TIME`; the deadline is an instant of this
//! process's monotonic clock. [`RedisClock`] maps one to the other from the instants the
//! script itself reports: every reply carries the `TIME` it ran at, and a reply received at
//! local instant `r` for a script that ran at Redis time `t` says that Redis' clock reads at
//! least `t - r` more than ours (the script ran before its reply came back). The largest such
//! `t - r` seen lately, θ, is therefore never above the true offset δ, and falls short of it
//! by the quickest return trip seen (tens of µs on a LAN). A deadline sent as `local + θ`
//! makes the script refuse whenever it runs after `local - (δ - θ)`, that is, no later than
//! the local deadline and at most one quick return trip before it: no call runs after its
//! requests were answered, and a call refused as late would have had its reply arrive after
//! the deadline anyway. No clock synchronisation is assumed, only that the two clocks do
//! not drift apart by much within [`EPOCH`] (NTP keeps drift to a few ms a day).
//!
//! **What remains.** A script that ran in time but whose reply was delayed on its way back
//! past the deadline has counted a hit whose request timed out: the one case no deadline can
//! close (the reply is the only news of the run). A lane that has heard nothing from its
//! server yet reads `TIME` before its first call, so that no call goes out without a
//! deadline.

use std::time::Duration;

use tokio::time::Instant;

use super::recent::RecentLeast;

/// How long one estimate of θ is kept: the largest sample of the current epoch and of the
/// last epoch that had one. Long enough to hold a quick return trip, short enough that
/// drift (or Redis' clock stepping back) makes the deadline lenient for seconds only.
pub(super) const EPOCH: Duration = Duration::from_secs(10);

/// What Redis' clock reads when ours reads a given instant, estimated from below. One per
/// server, shared by every connection to it: what one connection learns serves them all,
/// and a new connection needs no clock reading of its own.
pub(super) struct RedisClock {
    /// The least `local - redis` seen lately, in µs: minus the largest offset θ.
    behind: RecentLeast,
}

impl RedisClock {
    pub fn new() -> Self {
        RedisClock {
            behind: RecentLeast::new(EPOCH),
        }
    }

    /// Learns from a reply received at `received` for a script that was still running at
    /// `redis_micros` on Redis' clock.
    pub fn observe(&self, redis_micros: u64, received: Instant) {
        let Ok(redis) = i64::try_from(redis_micros) else {
            return;
        };
        let local = self.behind.local_micros(received);
        self.behind.observe(local.saturating_sub(redis), received);
    }

    /// How much later than the quickest reply seen lately a reply received at `received`,
    /// for a script still running at `redis_micros`, came back: the time this process took
    /// to get to it, beyond the way back (`None` before the first reply).
    pub fn lag(&self, redis_micros: u64, received: Instant) -> Option<Duration> {
        let redis = i64::try_from(redis_micros).ok()?;
        let behind = self.behind.local_micros(received).saturating_sub(redis);
        let late = behind.saturating_sub(self.behind.least()?);
        Some(Duration::from_micros(late.unsigned_abs()))
    }

    /// Whether a reply has been seen, so that [`Self::redis_time_at`] has an answer.
    pub fn knows_offset(&self) -> bool {
        self.behind.least().is_some()
    }

    /// Redis' time at the local instant `deadline`, estimated from below; `None` before the
    /// first reply.
    pub fn redis_time_at(&self, deadline: Instant) -> Option<u64> {
        let behind = self.behind.least()?;
        u64::try_from(self.behind.local_micros(deadline).saturating_sub(behind)).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    #[tokio::test(start_paused = true)]
    async fn no_estimate_before_the_first_reply() {
        let clock = RedisClock::new();
        assert!(!clock.knows_offset());
        assert_eq!(clock.redis_time_at(Instant::now()), None);
        clock.observe(5 * MS, Instant::now());
        assert!(clock.knows_offset());
    }

    #[tokio::test(start_paused = true)]
    async fn the_quickest_return_trip_gives_the_estimate() {
        let clock = RedisClock::new();
        let start = Instant::now();
        // Redis' clock is 5 s ahead; replies take 3 ms, then 1 ms, then 2 ms to come back.
        let ahead = 5_000 * MS;
        for (ran, back) in [(10, 3), (20, 1), (30, 2)] {
            let received = start + Duration::from_millis(ran + back);
            clock.observe(ahead + ran * MS, received);
        }
        let deadline = start + Duration::from_millis(100);
        assert_eq!(clock.redis_time_at(deadline), Some(ahead + 100 * MS - MS));
    }

    #[tokio::test(start_paused = true)]
    async fn the_estimate_never_passes_the_true_offset() {
        let clock = RedisClock::new();
        let start = Instant::now();
        let behind: u64 = 1_000_000 * MS; // Redis' clock reads 1,000 s at our start.
        for step in 0..50u64 {
            let ran = step * 7 * MS;
            let back = 1 + step % 5; // ms on the way back
            clock.observe(behind + ran, start + Duration::from_millis(step * 7 + back));
            let at = start + Duration::from_millis(step * 7 + 500);
            let estimate = clock.redis_time_at(at).expect("an estimate");
            assert!(estimate <= behind + (step * 7 + 500) * MS);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_epoch_is_forgotten_once_two_newer_ones_have_samples() {
        let clock = RedisClock::new();
        let start = Instant::now();
        let epoch = EPOCH.as_millis() as u64;
        // A sample with a quick return trip, then Redis' clock steps back 2 s.
        clock.observe(10_000 * MS, start);
        let stepped = 8_000 * MS;
        let later = |ms| start + Duration::from_millis(ms);
        clock.observe(stepped + epoch * MS, later(epoch));
        let at = later(epoch);
        assert_eq!(clock.redis_time_at(at), Some(10_000 * MS + epoch * MS));
        clock.observe(stepped + 2 * epoch * MS, later(2 * epoch));
        assert_eq!(
            clock.redis_time_at(later(2 * epoch)),
            Some(stepped + 2 * epoch * MS)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_gap_keeps_the_last_estimate() {
        let clock = RedisClock::new();
        let start = Instant::now();
        clock.observe(3_000 * MS, start);
        let much_later = start + 10 * EPOCH;
        assert_eq!(
            clock.redis_time_at(much_later),
            Some(3_000 * MS + 10 * EPOCH.as_micros() as u64)
        );
    }
}
