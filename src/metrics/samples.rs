//! A bounded sample of the values recorded between two reads, for a statsd timer: upstream's
//! client sends every response time, which at tens of thousands of requests a second would
//! be as many lines. Up to [`KEPT`] values are kept, each recorded value with the same
//! chance (reservoir sampling), and the reader is told how many were recorded, so that it can
//! send the kept ones with statsd's sample rate (`|@0.05`) and the server count them as all.
//!
//! Nothing is kept until the first read: with no statsd server, recording costs one atomic
//! load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// The most values kept between two reads.
pub const KEPT: usize = 1_000;

#[derive(Debug, Default)]
pub struct Samples {
    /// Set by the first read: someone is taking the samples.
    armed: AtomicBool,
    reservoir: Mutex<Reservoir>,
}

#[derive(Debug, Default)]
struct Reservoir {
    recorded: u64,
    kept: Vec<u64>,
}

/// What was recorded since the last read: the values kept, and how many were recorded.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sampled {
    pub kept: Vec<u64>,
    pub recorded: u64,
}

impl Samples {
    pub fn record(&self, value: u64) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let mut reservoir = self
            .reservoir
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        reservoir.recorded += 1;
        if reservoir.kept.len() < KEPT {
            reservoir.kept.push(value);
        } else {
            let slot = fastrand::u64(..reservoir.recorded);
            if let Some(kept) = usize::try_from(slot)
                .ok()
                .and_then(|slot| reservoir.kept.get_mut(slot))
            {
                *kept = value;
            }
        }
    }

    /// The sample since the last read, which starts a new one.
    pub fn take(&self) -> Sampled {
        self.armed.store(true, Ordering::Relaxed);
        let mut reservoir = self
            .reservoir
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let taken = std::mem::take(&mut *reservoir);
        Sampled {
            kept: taken.kept,
            recorded: taken.recorded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_kept_before_the_first_read() {
        let samples = Samples::default();
        samples.record(5);
        assert_eq!(samples.take(), Sampled::default());
        samples.record(5);
        samples.record(7);
        let sampled = samples.take();
        assert_eq!((sampled.kept, sampled.recorded), (vec![5, 7], 2));
        assert_eq!(samples.take(), Sampled::default(), "each read starts anew");
    }

    #[test]
    fn past_the_bound_every_value_has_the_same_chance() {
        let samples = Samples::default();
        samples.take();
        let recorded = 10 * KEPT as u64;
        for value in 0..recorded {
            samples.record(value);
        }
        let sampled = samples.take();
        assert_eq!((sampled.kept.len(), sampled.recorded), (KEPT, recorded));
        // A uniform sample of 0..10,000 has a mean near 5,000 (standard error ~91).
        let mean = sampled.kept.iter().sum::<u64>() / KEPT as u64;
        assert!((4_500..5_500).contains(&mean), "mean {mean}");
        let late = sampled.kept.iter().filter(|&&v| v >= recorded / 2).count();
        assert!((400..600).contains(&late), "{late} of the second half");
    }
}
