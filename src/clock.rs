//! Time as the counters see it: microseconds since the Unix epoch.
//!
//! Every algorithm takes `now` from a [`Clock`] instead of reading the system time, so tests
//! drive time by hand and the Redis backend can use Redis' own clock for the same math.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_micros(&self) -> u64;
}

/// The machine's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // A clock before 1970 is a broken machine; counting from 0 keeps the service answering.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to: for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(now_micros: u64) -> Self {
        Self(AtomicU64::new(now_micros))
    }

    pub fn set(&self, now_micros: u64) {
        self.0.store(now_micros, Ordering::SeqCst);
    }

    pub fn advance(&self, micros: u64) {
        self.0.fetch_add(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
