//! How many attempts a call may make, and how far apart.

use std::time::Duration;

/// Attempts and backoff for the failures that may be sent again (see
/// [`Client::retry_possibly_counted`](crate::Client::retry_possibly_counted) for which those
/// are). Every attempt and every pause fits in the client's one timeout: a retry whose pause
/// would end after it is not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all, the first included: 1 turns retries off. 0 is taken as 1 and anything
    /// above [`Retry::MAX_ATTEMPTS`] as that, as gRPC's own retry policy does.
    pub max_attempts: u32,
    /// The ceiling of the pause before the first retry; each later ceiling doubles, up to
    /// `max_backoff`. The pause itself is drawn at random below its ceiling.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Retry {
    /// No retries: the first failure decides.
    pub const NONE: Retry = Retry {
        max_attempts: 1,
        initial_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };

    /// The most attempts one call makes, whatever `max_attempts` says (gRPC's limit too).
    pub const MAX_ATTEMPTS: u32 = 5;

    /// `max_attempts` within 1..=[`Retry::MAX_ATTEMPTS`].
    pub(crate) fn attempts(&self) -> u32 {
        self.max_attempts.clamp(1, Self::MAX_ATTEMPTS)
    }

    /// The pause before retry number `retry` (1 for the first): anywhere from zero to
    /// `initial_backoff × 2^(retry-1)` capped at `max_backoff` ("full jitter", as gRPC's retry
    /// policy draws it), so clients that failed together do not come back together.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        self.ceiling(retry).mul_f64(fastrand::f64())
    }

    fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1);
        self.initial_backoff
            .saturating_mul(2u32.saturating_pow(doublings))
            .min(self.max_backoff)
    }
}

impl Default for Retry {
    /// Three attempts, the retries after pauses of at most 2 ms then 4 ms: all of it fits in
    /// the default 20 ms timeout.
    fn default() -> Self {
        Retry {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_drawn_below_a_ceiling_that_doubles_up_to_the_cap() {
        let retry = Retry {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(4),
            max_backoff: Duration::from_millis(20),
        };
        for (number, ceiling_ms) in [(1, 4), (2, 8), (3, 16), (4, 20), (9, 20)] {
            let ceiling = Duration::from_millis(ceiling_ms);
            let pauses: Vec<Duration> = (0..200).map(|_| retry.backoff(number)).collect();
            assert!(
                pauses.iter().all(|pause| *pause <= ceiling),
                "retry {number}: a pause above {ceiling:?} in {pauses:?}"
            );
            assert!(
                pauses.iter().any(|pause| *pause < ceiling / 2),
                "retry {number}: full jitter reaches below half the ceiling"
            );
        }
    }

    #[test]
    fn attempts_stay_between_one_and_grpcs_limit() {
        let with = |max_attempts| Retry {
            max_attempts,
            ..Retry::default()
        };
        assert_eq!(with(0).attempts(), 1);
        assert_eq!(with(3).attempts(), 3);
        assert_eq!(with(50).attempts(), Retry::MAX_ATTEMPTS);
    }
}
