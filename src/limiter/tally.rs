//! tally: a sum kept for one window from the hit that starts it, then forgotten whole. The
//! Rust twin of `lua/tally.lua`.
//!
//! No rule counts with it (rule files cannot name it): it holds what the Rate Limit Quota
//! Service sums between reports, a bucket's demand in one period (`crate::quota::charge`),
//! where a write and the reads that follow it must meet in one count whatever the period's
//! phase, which an epoch-aligned window cannot promise. It never refuses: every hit is
//! counted, and a hit is allowed while the sum is within the limit.

use super::{Decision, Hits, Limit};

/// The sum, and when it is forgotten: one window after the hit that made it from nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct State {
    count: u64,
    forgotten_at: u64,
}

impl State {
    /// A sum of zero is as good as none (its twin deletes the key).
    pub(super) fn expires_at(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.forgotten_at
        }
    }
}

/// Applies `hits` at `now`: a take adds its cost, a give-back takes it away (never below
/// zero), a check reads. Remaining is what the limit leaves above the sum; reset is the
/// window, the longest the sum can take to be forgotten (its twin reads no expiry, which
/// would cost a command).
pub(super) fn hit(state: &mut State, limit: &Limit, now: u64, hits: Hits) -> Decision {
    if now >= state.expires_at() {
        *state = State::default();
    }
    let window = limit.window_micros();
    if hits.negative {
        state.count = state.count.saturating_sub(hits.amount);
    } else if hits.amount > 0 {
        if state.count == 0 {
            state.forgotten_at = now.saturating_add(window);
        }
        state.count = state.count.saturating_add(hits.amount);
    }
    let quota = u64::from(limit.requests_per_unit);
    Decision {
        allowed: state.count <= quota,
        remaining: quota.saturating_sub(state.count),
        reset_micros: window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    const SECOND: u64 = 1_000_000;

    fn limit() -> Limit {
        Limit {
            algorithm: Algorithm::Tally,
            unit_multiplier: 15,
            ..Limit::per(100, Unit::Second)
        }
    }

    #[test]
    fn a_sum_is_kept_one_window_from_its_first_hit_whatever_the_epoch() {
        let mut state = State::default();
        // Started 3 s before an epoch multiple of the window: still there 10 s after it.
        let start = 1_700_000_007 * SECOND;
        hit(&mut state, &limit(), start, Hits::take(30));
        hit(&mut state, &limit(), start + 4 * SECOND, Hits::take(50));
        let read = hit(&mut state, &limit(), start + 14 * SECOND, Hits::take(0));
        assert_eq!((read.allowed, read.remaining), (true, 20));
        let gone = hit(&mut state, &limit(), start + 15 * SECOND, Hits::take(0));
        assert_eq!(
            gone.remaining, 100,
            "forgotten one window after its first hit"
        );
    }

    #[test]
    fn every_hit_counts_past_the_limit_and_a_give_back_stops_at_zero() {
        let mut state = State::default();
        let over = hit(&mut state, &limit(), SECOND, Hits::take(130));
        assert_eq!((over.allowed, over.remaining), (false, 0));
        let back = hit(&mut state, &limit(), 2 * SECOND, Hits::give_back(200));
        assert_eq!((back.allowed, back.remaining), (true, 100));
        assert_eq!(state.expires_at(), 0, "an empty sum is no state");
    }
}
