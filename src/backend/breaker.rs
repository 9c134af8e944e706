//! A circuit breaker: stop calling a backend that keeps failing, probe it now and then, and
//! close again when it answers.
//!
//! Closed, every request calls the backend. After `threshold` requests fail in a row the
//! breaker opens: requests fail at once (each rule's `on_backend_error` decides) instead of
//! waiting out the command timeout, so a dead Redis costs nothing and nothing piles up.
//! Once `cooldown` has passed, exactly one request (or the background probe) is let through;
//! its success closes the breaker, its failure opens it for another cooldown.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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

/// What health checks report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
}

pub struct Breaker {
    threshold: u32,
    cooldown_micros: u64,
    clock: Arc<dyn Clock>,
    /// Requests failed in a row while closed.
    failures: AtomicU32,
    /// When the open breaker next admits a probe; 0 while closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration, clock: Arc<dyn Clock>) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cooldown_micros: u64::try_from(cooldown.as_micros()).unwrap_or(u64::MAX),
            clock,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    pub fn admit(&self) -> Admission {
        let open_until = self.open_until.load(Ordering::Acquire);
        if open_until == 0 {
            return Admission::Call;
        }
        if self.clock.now_micros() < open_until {
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

    /// Records how an admitted call (or probe) ended.
    pub fn record(&self, admission: Admission, succeeded: bool) {
        if succeeded {
            self.failures.store(0, Ordering::Release);
            if self.open_until.swap(0, Ordering::AcqRel) != 0 {
                tracing::info!("backend answers again; circuit closed");
            }
            self.probing.store(false, Ordering::Release);
            return;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if admission == Admission::Probe || failures >= self.threshold {
            let until = self
                .clock
                .now_micros()
                .saturating_add(self.cooldown_micros)
                .max(1);
            if self.open_until.swap(until, Ordering::AcqRel) == 0 {
                tracing::warn!(failures, "backend keeps failing; circuit open");
            }
            self.probing.store(false, Ordering::Release);
        }
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

    fn breaker() -> (Arc<ManualClock>, Breaker) {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let breaker = Breaker::new(3, Duration::from_millis(500), clock.clone());
        (clock, breaker)
    }

    fn fail(breaker: &Breaker, times: usize) {
        for _ in 0..times {
            let admission = breaker.admit();
            breaker.record(admission, false);
        }
    }

    #[test]
    fn opens_after_threshold_failures_in_a_row() {
        let (_, breaker) = breaker();
        fail(&breaker, 2);
        assert_eq!(breaker.admit(), Admission::Call);
        fail(&breaker, 1);
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(breaker.admit(), Admission::Reject);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let (_, breaker) = breaker();
        fail(&breaker, 2);
        breaker.record(Admission::Call, true);
        fail(&breaker, 2);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn after_the_cooldown_exactly_one_probe_goes_through() {
        let (clock, breaker) = breaker();
        fail(&breaker, 3);
        clock.advance(500_000);
        assert_eq!(breaker.admit(), Admission::Probe);
        assert_eq!(breaker.admit(), Admission::Reject);
    }

    #[test]
    fn a_successful_probe_closes_and_a_failed_one_reopens() {
        let (clock, breaker) = breaker();
        fail(&breaker, 3);
        clock.advance(500_000);
        let probe = breaker.admit();
        breaker.record(probe, false);
        assert_eq!(breaker.admit(), Admission::Reject);
        clock.advance(500_000);
        let probe = breaker.admit();
        assert_eq!(probe, Admission::Probe);
        breaker.record(probe, true);
        assert_eq!(breaker.state(), BreakerState::Closed);
        assert_eq!(breaker.admit(), Admission::Call);
    }
}
