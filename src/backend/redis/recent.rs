//! The least value seen lately: the quickest round trip, the largest clock offset (as the
//! least of its negation). Both estimates rest on one fact: the extreme of many samples is
//! the one least disturbed by queueing and scheduling, and it must follow a value that
//! drifts or steps, so old samples age out.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The least sample of the current epoch and of the last earlier epoch that had one, epochs
/// being consecutive spans of `epoch` on the local clock. A value seen now stays in force for
/// one to two epochs, and an idle gap keeps the last one.
pub(crate) struct RecentLeast {
    origin: Instant,
    epoch: Duration,
    samples: Mutex<Samples>,
}

#[derive(Default)]
struct Samples {
    epoch: u64,
    current: Option<i64>,
    previous: Option<i64>,
    /// How many samples each of the two epochs took.
    current_count: u64,
    previous_count: u64,
}

impl Samples {
    fn least(&self) -> Option<i64> {
        match (self.current, self.previous) {
            (Some(current), Some(previous)) => Some(current.min(previous)),
            (current, previous) => current.or(previous),
        }
    }
}

impl RecentLeast {
    pub fn new(epoch: Duration) -> Self {
        RecentLeast {
            origin: Instant::now(),
            epoch: epoch.max(Duration::from_millis(1)),
            samples: Mutex::new(Samples::default()),
        }
    }

    /// Takes `value`, seen at `at`.
    pub fn observe(&self, value: i64, at: Instant) {
        let epoch =
            (at.saturating_duration_since(self.origin).as_micros() / self.epoch.as_micros()) as u64;
        let mut samples = self.lock();
        if epoch > samples.epoch {
            if samples.current.is_some() {
                samples.previous = samples.current.take();
                samples.previous_count = std::mem::take(&mut samples.current_count);
            }
            samples.epoch = epoch;
        }
        samples.current = Some(samples.current.map_or(value, |least| least.min(value)));
        samples.current_count += 1;
    }

    /// The least value in force, when it rests on at least `count` samples: one sample may
    /// be one unlucky moment.
    pub fn least_of(&self, count: u64) -> Option<i64> {
        let samples = self.lock();
        let in_force = samples.current_count + samples.previous_count;
        (in_force >= count).then(|| samples.least()).flatten()
    }

    /// The least value in force; `None` before the first sample.
    pub fn least(&self) -> Option<i64> {
        self.lock().least()
    }

    /// `at` in µs since this estimate began, the local time scale its users share.
    pub fn local_micros(&self, at: Instant) -> i64 {
        let micros = at.saturating_duration_since(self.origin).as_micros();
        i64::try_from(micros).unwrap_or(i64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        self.samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn the_least_sample_of_the_last_two_epochs_is_in_force() {
        let recent = RecentLeast::new(EPOCH);
        let start = Instant::now();
        assert_eq!(recent.least(), None);
        recent.observe(7, start);
        recent.observe(3, start + Duration::from_secs(1));
        recent.observe(5, start + Duration::from_secs(2));
        assert_eq!(recent.least(), Some(3));
        recent.observe(9, start + EPOCH);
        assert_eq!(recent.least(), Some(3), "the previous epoch still counts");
        recent.observe(8, start + 2 * EPOCH);
        assert_eq!(
            recent.least(),
            Some(8),
            "two epochs on, the old minimum is gone"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_least_value_may_ask_for_enough_samples() {
        let recent = RecentLeast::new(EPOCH);
        let start = Instant::now();
        recent.observe(7, start);
        assert_eq!(recent.least_of(2), None);
        recent.observe(9, start + EPOCH);
        assert_eq!(recent.least_of(2), Some(7));
        recent.observe(8, start + 2 * EPOCH);
        assert_eq!(recent.least_of(3), None, "the first epoch's sample is gone");
        assert_eq!(recent.least_of(2), Some(8));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_gap_keeps_the_last_value() {
        let recent = RecentLeast::new(EPOCH);
        let start = Instant::now();
        recent.observe(4, start);
        recent.observe(6, start + 10 * EPOCH);
        assert_eq!(recent.least(), Some(4));
    }
}
