//! How often, and how far apart, a call is sent again when the server is unavailable.

use std::time::Duration;

/// Retries with exponential backoff and jitter, used only for gRPC `UNAVAILABLE` (no
/// connection, or a server whose backend is down): the one answer where trying again soon
/// can succeed. Every other failure is final at once. Retries never outlast the client's
/// timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts after the first.
    pub max_retries: u32,
    /// The pause before the first retry; each later pause doubles, up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Retry {
    /// No retries: the first failure decides.
    pub const NONE: Retry = Retry {
        max_retries: 0,
        initial_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };

    /// The pause before retry number `retry` (0 for the first): between half and all of
    /// `initial_backoff × 2^retry` (capped at `max_backoff`), at random, so clients that
    /// failed together do not come back together.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let ceiling = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry))
            .min(self.max_backoff);
        ceiling.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

impl Default for Retry {
    /// Two retries after pauses of at most 2 ms then 4 ms: both fit in the default 20 ms
    /// timeout.
    fn default() -> Self {
        Retry {
            max_retries: 2,
            initial_backoff: Duration::from_millis(2),
            max_backoff: Duration::from_millis(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_at_most_half_taken_off() {
        let retry = Retry {
            max_retries: 10,
            initial_backoff: Duration::from_millis(4),
            max_backoff: Duration::from_millis(20),
        };
        for (attempt, ceiling_ms) in [(0, 4), (1, 8), (2, 16), (3, 20), (9, 20)] {
            let ceiling = Duration::from_millis(ceiling_ms);
            for _ in 0..100 {
                let pause = retry.backoff(attempt);
                assert!(
                    pause >= ceiling / 2 && pause <= ceiling,
                    "retry {attempt}: {pause:?} outside {:?}..={ceiling:?}",
                    ceiling / 2
                );
            }
        }
    }
}
