//! gcra: the generic cell rate algorithm. One timestamp per counter, the theoretical arrival
//! time (TAT): the instant the counter would be empty again if nothing else arrived. The
//! Rust twin of `lua/gcra.lua`.
//!
//! With `T` = [`Limit::token_interval_micros`] and `B` = [`Limit::capacity`], it admits exactly
//! what a token bucket of `B` tokens refilled every `T` admits, in one number instead of two.

use super::{Decision, Hits, Limit, MAX_SPAN_MICROS};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct State {
    /// A TAT at or before now is a full allowance, the same as a counter never hit.
    tat: u64,
}

impl State {
    pub(super) fn expires_at(&self) -> u64 {
        self.tat
    }
}

/// Applies `hits` at `now`:
///
/// ```text
/// new_tat  = max(tat, now) + cost * T
/// allow_at = new_tat - B * T        allowed iff allow_at <= now, then tat = new_tat
/// ```
///
/// A give-back moves the TAT back by `cost * T`, never before now, and leaves a full
/// allowance as it is. With `overshoot` the TAT always moves on by the cost, and a hit (a
/// check too) is allowed iff `tat - B * T <= now` after it.
pub(super) fn hit(state: &mut State, limit: &Limit, now: u64, hits: Hits) -> Decision {
    let capacity = limit.capacity();
    let interval = limit.token_interval_micros();
    let burst_span = capacity.saturating_mul(interval);
    let cost_span = hits.amount.saturating_mul(interval);
    let allowed = if hits.amount == 0 && !limit.overshoot {
        true
    } else if hits.negative {
        // A full allowance stays as it was: raising an old TAT to now would take quota back
        // from the hits of a clock that then steps back.
        if state.tat > now {
            state.tat = state.tat.saturating_sub(cost_span).max(now);
        }
        true
    } else if limit.overshoot {
        // Charged whatever the answer; the answer is whether the allowance was not overdrawn.
        if hits.amount > 0 {
            // At most 100 years owed, so the TAT stays exact in the twin's doubles.
            let owed = state.tat.max(now).saturating_add(cost_span);
            state.tat = owed.min(now.saturating_add(MAX_SPAN_MICROS));
        }
        state.tat.saturating_sub(burst_span) <= now
    } else {
        let new_tat = state.tat.max(now).saturating_add(cost_span);
        let allowed = new_tat.saturating_sub(burst_span) <= now;
        if allowed {
            state.tat = new_tat;
        }
        allowed
    };
    let remaining = remaining(state.tat, capacity, interval, burst_span, now);
    Decision {
        allowed,
        remaining,
        reset_micros: until_next_unit(state.tat, capacity, interval, remaining, now),
    }
}

/// `min(B, (now + B*T - tat) / T)`, 0 when the TAT is more than a whole burst ahead (possible
/// after a reload lowers the burst).
fn remaining(tat: u64, capacity: u64, interval: u64, burst_span: u64, now: u64) -> u64 {
    match tat.checked_sub(now) {
        None | Some(0) => capacity,
        Some(ahead) => (burst_span.saturating_sub(ahead) / interval).min(capacity),
    }
}

/// The allowance grows from `remaining` to `remaining + 1` when the TAT is only
/// `(B - remaining - 1) * T` ahead of the clock; 0 when the allowance is full.
fn until_next_unit(tat: u64, capacity: u64, interval: u64, remaining: u64, now: u64) -> u64 {
    if tat <= now {
        return 0;
    }
    let ahead_then = capacity
        .saturating_sub(remaining)
        .saturating_sub(1)
        .saturating_mul(interval);
    (tat - now).saturating_sub(ahead_then)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    fn gcra(per_second: u32) -> Limit {
        Limit {
            algorithm: Algorithm::Gcra,
            ..Limit::per(per_second, Unit::Second)
        }
    }

    #[test]
    fn expires_at_the_theoretical_arrival_time() {
        let mut state = State::default();
        hit(&mut state, &gcra(10), 1_000, Hits::take(3));
        assert_eq!(state.expires_at(), 301_000);
    }

    #[test]
    fn a_give_back_never_moves_the_tat_before_now() {
        let mut state = State::default();
        hit(&mut state, &gcra(10), 1_000, Hits::take(3));
        hit(&mut state, &gcra(10), 2_000, Hits::give_back(100));
        assert_eq!(state.expires_at(), 2_000);
    }

    #[test]
    fn a_give_back_on_a_full_allowance_changes_nothing() {
        let mut state = State::default();
        hit(&mut state, &gcra(10), 5_000, Hits::give_back(1));
        assert_eq!(state, State::default());
        // Had the TAT moved up to 5_000, a clock stepping back would find quota missing.
        assert!(hit(&mut state, &gcra(10), 4_000, Hits::take(10)).allowed);
    }

    #[test]
    fn a_tat_beyond_a_lowered_burst_leaves_nothing_and_does_not_fail() {
        let mut state = State::default();
        hit(&mut state, &gcra(10), 0, Hits::take(10));
        let lowered = Limit {
            burst: Some(2),
            ..gcra(10)
        };
        let decision = hit(&mut state, &lowered, 0, Hits::take(1));
        // The TAT is 1 s ahead; the next unit of a 2-token burst comes back 0.1 s before it.
        assert_eq!(
            (decision.allowed, decision.remaining, decision.reset_micros),
            (false, 0, 900_000)
        );
    }

    #[test]
    fn partial_intervals_count_toward_the_next_unit() {
        let mut state = State::default();
        hit(&mut state, &gcra(10), 0, Hits::take(10));
        let decision = hit(&mut state, &gcra(10), 250_000, Hits::take(0));
        assert_eq!((decision.remaining, decision.reset_micros), (2, 50_000));
    }
}
