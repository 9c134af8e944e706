//! The instruments every layer counts with: a monotonic [`Tally`] and a latency
//! [`Histogram`], each a few relaxed atomics. The layers that count (rules, backend, service)
//! own their instruments; `metrics` reads them to render `/metrics` and statsd.

mod histogram;

use std::sync::atomic::{AtomicU64, Ordering};

pub use histogram::{BOUNDS_MICROS, Histogram, Snapshot};

/// A monotonically increasing count, which stops at `u64::MAX` rather than wrap (a data
/// plane may report that many requests at once).
#[derive(Debug, Default)]
pub struct Tally(AtomicU64);

impl Tally {
    pub fn add(&self, amount: u64) {
        if amount > 0 {
            let previous = self.0.fetch_add(amount, Ordering::Relaxed);
            if previous.checked_add(amount).is_none() {
                // Wrapped: what the other adds did since is lost in a count this large.
                self.0.store(u64::MAX, Ordering::Relaxed);
            }
        }
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
