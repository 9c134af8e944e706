//! token_bucket: a bucket of `B` tokens refilled one token every `T` µs, in whole tokens. The
//! Rust twin of `lua/token_bucket.lua`.
//!
//! `B` is the limit's capacity (burst, else requests_per_unit) and `T` its
//! [`Limit::token_interval_micros`]. Refill only ever adds whole tokens and moves `last` by
//! whole intervals, so the partial interval already elapsed is kept, not lost to rounding.

use super::{Decision, Hits, Limit, MAX_SPAN_MICROS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct State {
    /// Below zero only with `overshoot`: a debt that refilling pays back first.
    tokens: i64,
    /// The instant the last whole token was added (or the bucket was seen full).
    last: u64,
    /// When the bucket is full again, if nothing is taken meanwhile.
    full_at: u64,
}

impl State {
    /// A bucket never hit is full.
    pub(super) fn full(limit: &Limit, now: u64) -> Self {
        State {
            tokens: signed(limit.capacity()),
            last: now,
            full_at: now,
        }
    }

    /// Once full, the bucket is indistinguishable from one never hit.
    pub(super) fn expires_at(&self) -> u64 {
        self.full_at
    }
}

/// Applies `hits` at `now`: refill, then allowed iff `cost <= tokens`, then take. A give-back
/// adds tokens up to the capacity. With `overshoot` the cost is taken whatever the answer,
/// leaving a debt that refilling pays back first, and a hit (a check too) is allowed iff no
/// debt is left after it.
pub(super) fn hit(state: &mut State, limit: &Limit, now: u64, hits: Hits) -> Decision {
    let capacity = signed(limit.capacity());
    let interval = limit.token_interval_micros();
    let amount = signed(hits.amount);
    let (tokens, last) = refill(state, capacity, interval, now);
    let (allowed, next) = if hits.negative {
        (true, tokens.saturating_add(amount).min(capacity))
    } else if limit.overshoot {
        // At most 100 years of refill owed, so every instant stays exact in the twin's
        // doubles.
        let deepest = -signed(MAX_SPAN_MICROS / interval);
        let next = tokens.saturating_sub(amount).max(deepest.min(tokens));
        (next >= 0, next)
    } else if amount <= tokens {
        (true, tokens - amount)
    } else {
        (false, tokens)
    };
    // Refilling alone need not be written: refilling twice gives what refilling once does.
    if next != tokens {
        let missing = capacity.saturating_sub(next).unsigned_abs();
        *state = State {
            tokens: next,
            last,
            full_at: last.saturating_add(missing.saturating_mul(interval)),
        };
    }
    // The next unit of quota comes with the token that makes one: in debt, after it is paid.
    let intervals = 1i64.saturating_sub(next).max(1).unsigned_abs();
    Decision {
        allowed,
        remaining: next.max(0).unsigned_abs(),
        reset_micros: if next >= capacity {
            0
        } else {
            last.saturating_add(intervals.saturating_mul(interval))
                .saturating_sub(now)
        },
    }
}

/// The (tokens, last) after adding the whole intervals elapsed since `last`. A full bucket
/// restarts its interval at `now`: no token accrues while there is no room for it.
fn refill(state: &State, capacity: i64, interval: u64, now: u64) -> (i64, u64) {
    let gained = now.saturating_sub(state.last) / interval;
    let tokens = state.tokens.saturating_add(signed(gained));
    if tokens >= capacity {
        (capacity, now)
    } else {
        (tokens, state.last + gained * interval)
    }
}

/// A count of tokens as a signed number (every count here is at most 2^32).
fn signed(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    fn bucket(per_second: u32) -> Limit {
        Limit {
            algorithm: Algorithm::TokenBucket,
            ..Limit::per(per_second, Unit::Second)
        }
    }

    #[test]
    fn refill_keeps_the_partial_interval() {
        // T = 100 ms. 250 ms after emptying, 2 tokens are back and the third is 50 ms away,
        // not 100 ms: `last` moves by whole intervals, not to `now`.
        let limit = bucket(10);
        let mut state = State::full(&limit, 0);
        hit(&mut state, &limit, 0, Hits::take(10));
        let decision = hit(&mut state, &limit, 250_000, Hits::take(0));
        assert_eq!((decision.remaining, decision.reset_micros), (2, 50_000));
        let decision = hit(&mut state, &limit, 300_000, Hits::take(0));
        assert_eq!(decision.remaining, 3);
    }

    #[test]
    fn interval_is_truncated_so_refill_is_never_slower_than_the_rate() {
        // 3 per second: T = 333_333 µs, so all 3 tokens are back 1 µs before the second ends.
        let limit = bucket(3);
        let mut state = State::full(&limit, 0);
        hit(&mut state, &limit, 0, Hits::take(3));
        assert_eq!(hit(&mut state, &limit, 999_998, Hits::take(0)).remaining, 2);
        assert_eq!(hit(&mut state, &limit, 999_999, Hits::take(0)).remaining, 3);
    }

    #[test]
    fn rates_above_one_per_microsecond_refill_one_token_per_microsecond() {
        let limit = bucket(5_000_000);
        assert_eq!(limit.token_interval_micros(), 1);
        let mut state = State::full(&limit, 0);
        hit(&mut state, &limit, 0, Hits::take(5_000_000));
        assert_eq!(hit(&mut state, &limit, 10, Hits::take(0)).remaining, 10);
    }

    #[test]
    fn expires_when_full_again() {
        let limit = bucket(10);
        let mut state = State::full(&limit, 1_000);
        hit(&mut state, &limit, 1_000, Hits::take(3));
        assert_eq!(state.expires_at(), 301_000);
    }

    #[test]
    fn a_full_bucket_expires_at_once() {
        let limit = bucket(10);
        assert_eq!(State::full(&limit, 7).expires_at(), 7);
    }
}
