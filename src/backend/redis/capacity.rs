//! How much work may wait on one Redis connection before new work is shed.
//!
//! A live Redis decides a bounded number of hits per second. Work sent faster than that only
//! queues, every queued hit waits longer, and once the wait passes the command timeout every
//! request fails, the ones Redis could have decided included. So each connection admits at
//! most `limit` hits in flight (queued here or sent and unanswered); a request that would
//! exceed it is shed at once, before it waits for anything, and its rules' `on_backend_error`
//! answers it.
//!
//! **What Redis takes, not what this server manages.** The limit follows Redis alone: each
//! answered call reports how long it waited before Redis ran it, from the moment it was sent
//! until the script started, read on Redis' own clock (the script reports when it started;
//! `deadline.rs` maps the send to Redis' clock). That wait holds the way there and Redis'
//! queue (other clients' commands, other replicas, a CPU quota's pauses, a CPU the machine
//! gives to others), and none of the time this server takes to get to the reply, nor the
//! script's own run, which grows with the call's size and says nothing about a queue: a
//! server short of CPU is slow at everything, and shedding would only turn work Redis could
//! do into failure answers. What the wait holds beyond the least wait seen lately (the way
//! there, the clocks' uncertainty) is Redis' queueing; a request that waited in this queue
//! behind an earlier call waited for that call's queueing too, which counts with its own.
//! Queueing above the target (the command timeout: past it Redis would run the call too late)
//! shrinks the limit by a quarter, at most once per target interval; queueing within it, on a
//! connection that used at least half its limit, grows it by a sixteenth, at most once per
//! target interval after any change (so the quick calls of a busy Redis' short pauses do not
//! undo a shrink). So admitted requests are answered by Redis, and a busy Redis never looks
//! like a dead one.
//!
//! **Deadlines.** A request whose deadline is nearer than the whole wait requests have lately
//! had (this server's share included; a request that ran out of time counts with what it
//! waited) would be answered too late whatever Redis does: it is
//! refused at once, unless the connection has fewer than [`FLOOR`] hits in flight. So few
//! make no queue to refuse for: their wait is the link's and this server's, which refusing
//! does not shorten. Clients that ask again at once would only make it longer, answering
//! a storm of refusals while the few admitted requests wait, and the refusals would last.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::recent::RecentLeast;

/// The smallest limit: a connection always admits this many hits, however slow Redis or
/// its calls look.
const FLOOR: usize = 32;
/// The largest limit: beyond it a Redis that answers fast gains nothing from more queueing.
const CEILING: usize = 1 << 20;
/// Where a new connection starts.
const INITIAL: usize = 4096;
/// What queueing above the target does to the limit.
const DECREASE: f64 = 0.75;
/// What queueing within the target does to a limit in use: a sixteenth more.
const INCREASE_SHARE: usize = 16;
/// How long the least wait before Redis ran a call is remembered: one to two of these.
const WAIT_EPOCH: Duration = Duration::from_secs(10);

/// The in-flight limit of one connection and the hits in flight on it.
pub struct Capacity {
    in_flight: AtomicUsize,
    limit: AtomicUsize,
    /// The queueing in Redis a call may meet before the limit shrinks.
    target: Duration,
    /// Recent waits of answered calls' oldest requests, and of requests that stopped waiting
    /// before their answer, smoothed (µs): what a new request can expect, whoever is slow.
    expected_wait_micros: AtomicU64,
    /// The least wait before Redis ran a call lately (µs): the part of every wait that is
    /// not queueing.
    quickest_wait: RecentLeast,
    /// When the limit last shrank, and last changed either way: it shrinks at most once per
    /// target interval, so one slow moment (many calls answered together) counts once, and
    /// grows at most once per target interval after any change, so a burst of quick calls
    /// (a busy Redis' short pauses) does not undo a shrink.
    changes: Mutex<Changes>,
}

/// When the limit last shrank, and last changed.
#[derive(Default)]
struct Changes {
    decreased: Option<Instant>,
    changed: Option<Instant>,
}

/// Why work was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// The connection is at its limit.
    Full,
    /// The request's deadline is nearer than the wait calls have had lately.
    TooLate,
}

/// What an answered call tells about the wait.
#[derive(Debug, Clone, Copy)]
pub struct CallTimes {
    /// How long the call's oldest request waited, from its admission to its answer; `None`
    /// for a call Redis ran too late, which answered nobody.
    pub waited: Option<Duration>,
    /// How long the call waited before Redis ran it, from its send to the script's start,
    /// on Redis' clock; `None` when that clock is not known yet.
    pub redis_wait: Option<Duration>,
    /// The same of the call before it, when the call's oldest request waited behind that
    /// one: its queueing too is what Redis made the request wait.
    pub redis_wait_before: Option<Duration>,
}

impl Capacity {
    /// A connection whose calls should meet no more than `target` of queueing in Redis.
    pub fn new(target: Duration) -> Self {
        Capacity {
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(INITIAL),
            target: target.max(Duration::from_micros(100)),
            expected_wait_micros: AtomicU64::new(0),
            quickest_wait: RecentLeast::new(WAIT_EPOCH),
            changes: Mutex::new(Changes::default()),
        }
    }

    /// Takes room for `hits` hits that must be answered by `deadline`, or refuses them. The
    /// room is given back with [`release`](Self::release).
    pub fn admit(&self, hits: usize, now: Instant, deadline: Instant) -> Result<(), ShedReason> {
        let limit = self.limit.load(Ordering::Relaxed);
        let before = self.in_flight.fetch_add(hits, Ordering::AcqRel);
        // One request is always admitted on an idle connection, whatever its size and
        // however long calls waited before: otherwise a lane that shed everything would
        // never learn that the wait is over.
        if before == 0 {
            return Ok(());
        }
        let refusal = if before + hits > limit {
            Some(ShedReason::Full)
        } else if before + hits <= FLOOR {
            None
        } else {
            let expected = self.expected_wait_micros.load(Ordering::Relaxed);
            (deadline.saturating_duration_since(now) < Duration::from_micros(expected))
                .then_some(ShedReason::TooLate)
        };
        match refusal {
            Some(refusal) => {
                self.in_flight.fetch_sub(hits, Ordering::AcqRel);
                Err(refusal)
            }
            None => Ok(()),
        }
    }

    /// Gives back the room of `hits` hits: answered, failed or abandoned.
    pub fn release(&self, hits: usize) {
        self.in_flight.fetch_sub(hits, Ordering::AcqRel);
    }

    /// A request stopped waiting after `waited` with no answer: it would have waited longer.
    /// Left out, the waits that ran longest would leave the estimate, and the more requests
    /// ran out of time the fewer would be refused.
    pub fn gave_up(&self, waited: Duration) {
        self.note_wait(waited);
    }

    /// Takes one wait into the expected wait: an exponentially weighted mean over the last
    /// ~8.
    fn note_wait(&self, waited: Duration) {
        let waited = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let expected = self.expected_wait_micros.load(Ordering::Relaxed);
        let smoothed = expected - expected / 8 + waited / 8;
        self.expected_wait_micros.store(smoothed, Ordering::Relaxed);
    }

    /// A call was answered at `now`, with `times`.
    pub fn answered(&self, times: CallTimes, now: Instant) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if let Some(waited) = times.waited {
            self.note_wait(waited);
        }

        let Some(wait) = times.redis_wait else {
            return;
        };
        let wait = i64::try_from(micros(wait)).unwrap_or(i64::MAX);
        self.quickest_wait.observe(wait, now);
        let quickest = self.quickest_wait.least().unwrap_or(wait);
        let beyond_quickest = |wait: i64| wait.saturating_sub(quickest).max(0).unsigned_abs();
        let before = (times.redis_wait_before).map_or(0, |before| {
            beyond_quickest(i64::try_from(micros(before)).unwrap_or(i64::MAX))
        });
        let queueing = Duration::from_micros(beyond_quickest(wait).saturating_add(before));
        let limit = self.limit.load(Ordering::Relaxed);
        let over = queueing > self.target;
        if !over && 2 * self.in_flight.load(Ordering::Relaxed) < limit {
            return; // Within the target and half unused: the limit is not what binds.
        }
        let mut changes = self
            .changes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = if over {
            changes.decreased
        } else {
            changes.changed
        };
        if last.is_some_and(|at| now.duration_since(at) < self.target) {
            return;
        }
        let changed = if over {
            changes.decreased = Some(now);
            ((limit as f64 * DECREASE) as usize).max(FLOOR)
        } else {
            (limit + (limit / INCREASE_SHARE).max(1)).min(CEILING)
        };
        changes.changed = Some(now);
        self.limit.store(changed, Ordering::Relaxed);
    }

    #[cfg(test)]
    fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Duration = Duration::from_millis(5);
    /// What Redis takes with a call that meets no queue: the way there and the run.
    const QUICK: Duration = Duration::from_micros(300);

    fn later(now: Instant, millis: u64) -> Instant {
        now + Duration::from_millis(millis)
    }

    /// A call whose oldest request waited `waited` and which waited `wait` in Redis.
    fn times(waited: Duration, wait: Duration) -> CallTimes {
        CallTimes {
            waited: Some(waited),
            redis_wait: Some(wait),
            redis_wait_before: None,
        }
    }

    #[test]
    fn hits_beyond_the_limit_are_refused_until_room_is_given_back() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        let deadline = later(now, 15);
        capacity
            .admit(INITIAL, now, deadline)
            .expect("room for the limit");
        assert_eq!(capacity.admit(1, now, deadline), Err(ShedReason::Full));
        capacity.release(1);
        assert_eq!(capacity.admit(1, now, deadline), Ok(()));
        assert_eq!(capacity.in_flight(), INITIAL);
    }

    #[test]
    fn an_idle_connection_admits_one_request_of_any_size() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        assert_eq!(capacity.admit(10 * INITIAL, now, later(now, 15)), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn queueing_in_redis_shrinks_the_limit_once_per_target_interval_down_to_the_floor() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        capacity.answered(times(QUICK, QUICK), now);
        let queued = QUICK + TARGET * 2;
        capacity.answered(times(queued, queued), now);
        capacity.answered(times(queued, queued), later(now, 1));
        let once = (INITIAL as f64 * DECREASE) as usize;
        assert_eq!(capacity.limit(), once);
        for step in 1..200 {
            capacity.answered(times(queued, queued), later(now, 5 * step));
        }
        assert_eq!(capacity.limit(), FLOOR);
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_slow_to_read_its_replies_keeps_its_limit() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        capacity
            .admit(INITIAL / 2, now, later(now, 500))
            .expect("room");
        for step in 0..100 {
            // The requests waited 40 ms, but Redis ran each call as soon as it came.
            let waited = Duration::from_millis(40);
            capacity.answered(times(waited, QUICK), later(now, step));
        }
        assert!(capacity.limit() > INITIAL, "{}", capacity.limit());
    }

    #[tokio::test(start_paused = true)]
    async fn a_distant_redis_is_not_a_queueing_one() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        capacity
            .admit(INITIAL / 2, now, later(now, 500))
            .expect("room");
        // 8 ms there and back, above the target, every time: that is distance, not a queue.
        let distant = Duration::from_millis(8);
        for step in 0..100 {
            capacity.answered(times(distant, distant), later(now, 8 * step));
        }
        assert!(capacity.limit() > INITIAL, "{}", capacity.limit());
    }

    #[tokio::test(start_paused = true)]
    async fn queueing_of_the_call_a_request_waited_behind_counts_with_its_own() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        capacity.answered(times(QUICK, QUICK), now);
        // A quick call whose requests waited behind one that Redis queued for 3/4 of the
        // target, twice over: neither alone is over the target, together they are.
        let before = QUICK + TARGET * 3 / 4;
        let behind = CallTimes {
            redis_wait_before: Some(before),
            ..times(before + QUICK, QUICK + TARGET * 3 / 4)
        };
        capacity.answered(behind, later(now, 1));
        assert_eq!(capacity.limit(), (INITIAL as f64 * DECREASE) as usize);
    }

    #[tokio::test(start_paused = true)]
    async fn without_redis_time_the_limit_stays() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        capacity
            .admit(INITIAL / 2, now, later(now, 500))
            .expect("room");
        let unknown = CallTimes {
            waited: Some(TARGET * 4),
            redis_wait: None,
            redis_wait_before: None,
        };
        capacity.answered(unknown, now);
        assert_eq!(capacity.limit(), INITIAL);
    }

    #[tokio::test(start_paused = true)]
    async fn timely_answers_grow_a_limit_that_is_in_use() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        capacity.answered(times(TARGET / 2, QUICK), now);
        assert_eq!(capacity.limit(), INITIAL, "an unused limit does not grow");
        capacity
            .admit(INITIAL / 2, now, later(now, 15))
            .expect("room");
        capacity.answered(times(TARGET / 2, QUICK), now);
        assert_eq!(capacity.limit(), INITIAL + INITIAL / INCREASE_SHARE);
        capacity.answered(times(TARGET / 2, QUICK), later(now, 1));
        assert_eq!(
            capacity.limit(),
            INITIAL + INITIAL / INCREASE_SHARE,
            "at most once per target interval"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_nearer_than_the_recent_wait_is_refused_at_once() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        for _ in 0..64 {
            capacity.answered(times(Duration::from_millis(4), QUICK), now);
        }
        capacity.admit(FLOOR, now, later(now, 10)).expect("room");
        assert_eq!(
            capacity.admit(1, now, later(now, 2)),
            Err(ShedReason::TooLate)
        );
        assert_eq!(capacity.admit(1, now, later(now, 10)), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_few_hits_in_flight_admits_any_deadline() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        for _ in 0..64 {
            capacity.answered(times(Duration::from_millis(40), QUICK), now);
        }
        for _ in 0..FLOOR {
            assert_eq!(capacity.admit(1, now, later(now, 2)), Ok(()));
        }
        assert_eq!(
            capacity.admit(1, now, later(now, 2)),
            Err(ShedReason::TooLate)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_admits_whatever_the_waits_before() {
        let capacity = Capacity::new(TARGET);
        let now = Instant::now();
        for _ in 0..64 {
            capacity.answered(times(Duration::from_millis(40), QUICK), now);
        }
        assert_eq!(capacity.admit(1, now, later(now, 2)), Ok(()));
    }
}
