//! A latency histogram with fixed buckets and atomic counts: observing is a binary search
//! over twenty constants and two relaxed atomic adds, with no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets in microseconds, from 1 µs (an in-process decision takes
/// about that; a loopback Redis call about 100 µs) to 1 s (far past any timeout we set), in
/// 1–2.5–5 steps.
pub const BOUNDS_MICROS: [u64; 19] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
    250_000, 500_000, 1_000_000,
];

/// Durations counted per bucket; the last bucket is everything above the largest bound.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS_MICROS.len() + 1],
    sum_nanos: AtomicU64,
}

/// A histogram's values at one moment, as the exposition needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Observations at or below each bound of [`BOUNDS_MICROS`] (cumulative).
    pub cumulative: [u64; BOUNDS_MICROS.len()],
    pub count: u64,
    pub sum_nanos: u64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        // The first bound at or above the duration (a bound is inclusive): a duration
        // between two whole microseconds belongs above the lower one.
        let nanos = elapsed.as_nanos();
        let bucket = BOUNDS_MICROS.partition_point(|&bound| u128::from(bound) * 1_000 < nanos);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts, made cumulative; `count` is their total, so the `+Inf` bucket always
    /// equals `_count` even while observations go on.
    pub fn snapshot(&self) -> Snapshot {
        let mut cumulative = [0; BOUNDS_MICROS.len()];
        let mut running = 0u64;
        for (bucket, total) in self.buckets.iter().zip(cumulative.iter_mut()) {
            running = running.saturating_add(bucket.load(Ordering::Relaxed));
            *total = running;
        }
        let above = self.buckets[BOUNDS_MICROS.len()].load(Ordering::Relaxed);
        Snapshot {
            cumulative,
            count: running.saturating_add(above),
            sum_nanos: self.sum_nanos.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_is_inclusive_and_counts_are_cumulative() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(50));
        histogram.observe(Duration::from_micros(51));
        histogram.observe(Duration::from_secs(5));
        let snapshot = histogram.snapshot();
        let at = |bound: u64| {
            let index = BOUNDS_MICROS
                .iter()
                .position(|&b| b == bound)
                .expect("a bound");
            snapshot.cumulative[index]
        };
        assert_eq!((at(25), at(50), at(100)), (0, 1, 2));
        assert_eq!(snapshot.cumulative[BOUNDS_MICROS.len() - 1], 2);
        assert_eq!(snapshot.count, 3);
        assert_eq!(snapshot.sum_nanos, 5_000_101_000);
    }

    #[test]
    fn sub_microsecond_decisions_land_in_the_first_bucket_and_a_fraction_above_a_bound_goes_up() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_nanos(400));
        histogram.observe(Duration::from_nanos(1_000));
        histogram.observe(Duration::from_nanos(1_001));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.cumulative[0], 2, "up to 1 µs");
        assert_eq!(snapshot.cumulative[1], 3, "up to 2 µs");
    }
}
