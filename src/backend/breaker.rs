//! A circuit breaker: stop calling a backend that is down, probe it now and then, and close
//! again when it answers.
//!
//! It opens for a backend that is down or erroring, never for one that is merely busy:
//!
//! - **Failures over a window.** A call that fails outright (connection refused or reset, an
//!   error reply for the whole call) is a failure. When at least `threshold` calls failed
//!   within the last `window`, and no more answers than failures came in since the oldest of
//!   them, the breaker opens. Requests that were in flight together when a failure was
//!   counted fail with it (a dropped connection fails every request it carried): they are
//!   one failure, not one each, so a connection killed under load costs the requests on it,
//!   not the breaker.
//! - **Silence over a window.** A call that runs out of time is not a failure: a busy Redis
//!   answers late, and its replies keep coming. But when calls keep running out of time and
//!   nothing at all has been answered for a whole `window` since the first of them went out,
//!   the backend is frozen or cut off, and the breaker opens. A request shed before it called
//!   (see `capacity.rs`) says nothing either way.
//!
//! Open, requests fail at once (each rule's `on_backend_error` decides) instead of waiting out
//! the command timeout, so a dead Redis costs nothing and nothing piles up. Once `cooldown`
//! has passed, exactly one request (or the background probe) is let through; an answer closes
//! the breaker, a failure or a timeout opens it for another cooldown.
//!
//! **Logged with its cause.** Opening logs the error of the last failure (a wrong password,
//! a refused connection), and a backend that keeps failing its probes logs that it still
//! does, with the error: at most one line per [`LOG_INTERVAL`] for the same error, per
//! [`CHANGED_ERROR_INTERVAL`] for a new one, the rest counted into the next line, so a
//! flapping or long outage cannot flood the log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::Clock;

/// Whether a request may call the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: call.
    Call,
    /// Open, cooldown over: this request is the one probe.
    Probe,
    /// Open: fail at once.
    Reject,
}

/// How an admitted call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// The backend answered (a decision, or an error of one hit's own).
    Answered,
    /// The backend could not be reached, dropped the connection, or refused the whole call.
    Failed,
    /// The caller stopped waiting before an answer came.
    TimedOut,
}

/// What health checks report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
}

/// A breaker's settings (`redis_breaker_*`): what [`Breaker::new`] takes, kept to make one
/// breaker per unit that fails on its own (a cluster's primaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    pub failures: u32,
    pub window: Duration,
    pub cooldown: Duration,
}

impl BreakerSettings {
    /// A closed breaker with these settings; `of` names what it guards in its log lines.
    pub fn build(&self, clock: Arc<dyn Clock>, of: Option<String>) -> Breaker {
        let mut breaker = Breaker::new(self.failures, self.window, self.cooldown, clock);
        breaker.of = of;
        breaker
    }
}

pub struct Breaker {
    /// What it guards, when not the whole backend (a cluster primary's address): in its log
    /// lines.
    of: Option<String>,
    threshold: usize,
    window_micros: u64,
    cooldown_micros: u64,
    clock: Arc<dyn Clock>,
    /// Answers ever recorded: the failures' record compares against it.
    answers: AtomicU64,
    /// The latest `threshold` failures: when each happened, and `answers` at that moment.
    failures: Mutex<VecDeque<(u64, u64)>>,
    /// When the latest failure counted was recorded: a request that started before it was
    /// in flight with it, and its failure is the same one.
    last_failure: AtomicU64,
    /// When the first call that timed out since the last answer went out; 0 when none.
    silent_since: AtomicU64,
    /// When the open breaker next admits a probe; 0 while closed.
    open_until: AtomicU64,
    probing: AtomicBool,
    /// The error of the latest failure or timeout, for the log line that says why.
    last_error: Mutex<Option<String>>,
    /// When a line about an opening or a failed probe was last logged, and its error; how
    /// many went unlogged since.
    logged: Mutex<Option<(u64, String)>>,
    unlogged: AtomicU64,
}

/// The least time between two log lines about the breaker opening or staying open, for
/// the same error.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The same, when the error changed (a refused connection turned into a refused password).
pub const CHANGED_ERROR_INTERVAL: Duration = Duration::from_secs(1);

impl Breaker {
    pub fn new(
        threshold: u32,
        window: Duration,
        cooldown: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let threshold = usize::try_from(threshold.max(1)).unwrap_or(usize::MAX);
        Breaker {
            of: None,
            threshold,
            window_micros: micros(window).max(1),
            cooldown_micros: micros(cooldown),
            clock,
            answers: AtomicU64::new(0),
            failures: Mutex::new(VecDeque::with_capacity(threshold.min(1024))),
            last_failure: AtomicU64::new(0),
            silent_since: AtomicU64::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            last_error: Mutex::new(None),
            logged: Mutex::new(None),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Keeps `error`, the cause of a call's failure or timeout, for the next log line.
    pub fn note_error(&self, error: &dyn std::fmt::Display) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.to_string());
    }

    /// Opens now: the backend did not answer `error` when the server started. Requests get
    /// their rules' policy at once, and readiness that follows the backend waits, until a
    /// probe after the cooldown gets an answer.
    pub fn open_at_start(&self, error: &dyn std::fmt::Display) {
        self.note_error(error);
        self.open(
            self.clock.now_micros(),
            "the backend did not answer at start-up",
        );
    }

    /// This breaker's clock: when a call starts, for [`record`](Self::record).
    pub fn now(&self) -> u64 {
        self.clock.now_micros()
    }

    /// Whether a call may go out now. A call that goes out must be [`record`](Self::record)ed.
    pub fn admit(&self) -> Admission {
        let now = self.clock.now_micros();
        let open_until = self.open_until.load(Ordering::Acquire);
        if open_until == 0 {
            if self.silent_for(now) < self.window_micros {
                return Admission::Call;
            }
            self.open(now, "the backend answered nothing for a whole window");
            return Admission::Reject;
        }
        if now < open_until {
            return Admission::Reject;
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Admission::Probe,
            Err(_) => Admission::Reject,
        }
    }

    /// Records how an admitted call (or probe) that started at `started` ended.
    pub fn record(&self, admission: Admission, outcome: CallEnd, started: u64) {
        let now = self.clock.now_micros();
        match outcome {
            CallEnd::Answered => {
                self.answers.fetch_add(1, Ordering::AcqRel);
                self.silent_since.store(0, Ordering::Release);
                if self.open_until.swap(0, Ordering::AcqRel) != 0 {
                    let of = self.of.as_deref().unwrap_or("the backend");
                    tracing::info!(of, "backend answers again; circuit closed");
                }
                self.probing.store(false, Ordering::Release);
            }
            _ if admission == Admission::Probe => {
                self.open(now, "the probe got no answer");
            }
            CallEnd::Failed => {
                // The call ended, so it no longer waits: failures have their own rule.
                self.silent_since.store(0, Ordering::Release);
                let counted_last = self.last_failure.fetch_max(now, Ordering::AcqRel);
                if started < counted_last {
                    // In flight when the last failure was counted: the same failure.
                    return;
                }
                if self.failed_too_often(now) {
                    self.open(now, "calls keep failing");
                }
            }
            CallEnd::TimedOut => {
                // Silence starts with the first call that got no answer in time.
                self.silent_since
                    .compare_exchange(0, started.max(1), Ordering::AcqRel, Ordering::Acquire)
                    .ok();
                if self.silent_for(now) >= self.window_micros {
                    self.open(now, "the backend answered nothing for a whole window");
                }
            }
        }
    }

    /// Counts a failure at `now`; whether `threshold` of them fell within the window with no
    /// more answers than failures since the oldest.
    fn failed_too_often(&self, now: u64) -> bool {
        let answers = self.answers.load(Ordering::Acquire);
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        if failures.len() == self.threshold {
            failures.pop_front();
        }
        failures.push_back((now, answers));
        let Some(&(oldest, answers_then)) = failures.front() else {
            return false;
        };
        failures.len() == self.threshold
            && now.saturating_sub(oldest) <= self.window_micros
            && answers - answers_then <= self.threshold as u64
    }

    /// How long calls have been waiting with nothing answered (0 when none waits).
    fn silent_for(&self, now: u64) -> u64 {
        match self.silent_since.load(Ordering::Acquire) {
            0 => 0,
            since => now.saturating_sub(since),
        }
    }

    fn open(&self, now: u64, why: &'static str) {
        let until = now.saturating_add(self.cooldown_micros).max(1);
        let was_closed = self.open_until.swap(until, Ordering::AcqRel) == 0;
        self.log_opening(now, why, was_closed);
        self.silent_since.store(0, Ordering::Release);
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.probing.store(false, Ordering::Release);
    }

    /// Logs an opening (or, while open, a failed probe) with the last error, unless a line
    /// went out within [`LOG_INTERVAL`] ([`CHANGED_ERROR_INTERVAL`] when the error is not the
    /// one last logged): then it is counted into the next one.
    fn log_opening(&self, now: u64, why: &'static str, opened: bool) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let error = (self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
        .clone()
        .unwrap_or_else(|| "none recorded".into());
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        let due = match &*logged {
            None => true,
            Some((at, same)) if *same == error => now.saturating_sub(*at) >= micros(LOG_INTERVAL),
            Some((at, _)) => now.saturating_sub(*at) >= micros(CHANGED_ERROR_INTERVAL),
        };
        if !due {
            self.unlogged.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let unlogged = self.unlogged.swap(0, Ordering::AcqRel);
        let of = self.of.as_deref().unwrap_or("the backend");
        if opened {
            tracing::warn!(
                reason = why,
                %error,
                unlogged,
                of,
                "circuit open: answering by each rule's on_backend_error"
            );
        } else {
            tracing::warn!(%error, unlogged, of, "backend still failing: circuit stays open");
        }
        *logged = Some((now, error));
    }

    pub fn state(&self) -> BreakerState {
        if self.open_until.load(Ordering::Acquire) == 0 {
            BreakerState::Closed
        } else {
            BreakerState::Open
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const WINDOW: u64 = 1_000_000;

    fn breaker() -> (Arc<ManualClock>, Breaker) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let breaker = Breaker::new(
            3,
            Duration::from_micros(WINDOW),
            Duration::from_millis(500),
            clock.clone(),
        );
        (clock, breaker)
    }

    fn call(breaker: &Breaker, outcome: CallEnd) {
        let started = breaker.now();
        let admission = breaker.admit();
        breaker.record(admission, outcome, started);
    }

    fn calls(breaker: &Breaker, outcome: CallEnd, times: usize) {
        for _ in 0..times {
            call(breaker, outcome);
        }
    }

    #[test]
    fn threshold_failures_within_the_window_open_it() {
        let (clock, breaker) = breaker();
        calls(&breaker, CallEnd::Failed, 2);
        clock.advance(WINDOW / 2);
        assert_eq!(breaker.admit(), Admission::Call);
        call(&breaker, CallEnd::Failed);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(breaker.admit(), Admission::Reject);
    }

    #[test]
    fn requests_in_flight_together_fail_together_once() {
        let (clock, breaker) = breaker();
        // Ten requests go out on one connection, which is then dropped: one failure.
        let started = breaker.now();
        let admitted: Vec<Admission> = (0..10).map(|_| breaker.admit()).collect();
        clock.advance(100);
        for admission in admitted {
            breaker.record(admission, CallEnd::Failed, started);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
        // Requests sent after it fail on their own: two more make three.
        clock.advance(100);
        call(&breaker, CallEnd::Failed);
        assert_eq!(breaker.state(), BreakerState::Closed);
        clock.advance(100);
        call(&breaker, CallEnd::Failed);
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn failures_spread_over_more_than_the_window_do_not() {
        let (clock, breaker) = breaker();
        for _ in 0..10 {
            call(&breaker, CallEnd::Failed);
            clock.advance(WINDOW / 2 + 1);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn failures_among_more_answers_do_not_open_it() {
        let (_, breaker) = breaker();
        for _ in 0..10 {
            call(&breaker, CallEnd::Failed);
            calls(&breaker, CallEnd::Answered, 2);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn timeouts_of_a_backend_that_keeps_answering_never_open_it() {
        let (clock, breaker) = breaker();
        for _ in 0..1000 {
            let started = breaker.now();
            let slow = breaker.admit();
            let fast = breaker.admit();
            clock.advance(WINDOW / 10);
            breaker.record(fast, CallEnd::Answered, started);
            breaker.record(slow, CallEnd::TimedOut, started);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn a_whole_window_without_an_answer_opens_it() {
        let (clock, breaker) = breaker();
        call(&breaker, CallEnd::Answered);
        let started = breaker.now();
        let first = breaker.admit();
        clock.advance(WINDOW / 2);
        breaker.record(first, CallEnd::TimedOut, started);
        assert_eq!(breaker.state(), BreakerState::Closed);
        let started = breaker.now();
        let second = breaker.admit();
        clock.advance(WINDOW / 2);
        breaker.record(second, CallEnd::TimedOut, started);
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn silence_is_noticed_when_the_next_call_asks_to_go_out() {
        let (clock, breaker) = breaker();
        let started = breaker.now();
        let waiting = breaker.admit();
        clock.advance(WINDOW / 10);
        breaker.record(waiting, CallEnd::TimedOut, started);
        clock.advance(WINDOW);
        assert_eq!(breaker.admit(), Admission::Reject);
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    #[test]
    fn calls_that_never_went_out_are_no_silence() {
        let (clock, breaker) = breaker();
        // Admitted, then shed before any call: nothing is recorded.
        assert_eq!(breaker.admit(), Admission::Call);
        clock.advance(10 * WINDOW);
        assert_eq!(breaker.admit(), Admission::Call);
    }

    #[test]
    fn an_idle_backend_is_not_silent() {
        let (clock, breaker) = breaker();
        call(&breaker, CallEnd::Answered);
        clock.advance(10 * WINDOW);
        assert_eq!(breaker.admit(), Admission::Call);
    }

    #[test]
    fn after_the_cooldown_exactly_one_probe_goes_through() {
        let (clock, breaker) = breaker();
        calls(&breaker, CallEnd::Failed, 3);
        clock.advance(500_000);
        assert_eq!(breaker.admit(), Admission::Probe);
        assert_eq!(breaker.admit(), Admission::Reject);
    }

    #[test]
    fn an_answered_probe_closes_and_a_timed_out_one_reopens() {
        let (clock, breaker) = breaker();
        calls(&breaker, CallEnd::Failed, 3);
        clock.advance(500_000);
        let probe = breaker.admit();
        breaker.record(probe, CallEnd::TimedOut, breaker.now());
        assert_eq!(breaker.admit(), Admission::Reject);
        clock.advance(500_000);
        let probe = breaker.admit();
        assert_eq!(probe, Admission::Probe);
        breaker.record(probe, CallEnd::Answered, breaker.now());
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.admit(), Admission::Call);
    }
}
