//! sliding_window: two fixed-window counts, the previous one weighted by how much of it the
//! sliding window still covers. The Rust twin of `lua/sliding_window.lua`.
//!
//! The weight is the one unavoidable fraction in the algorithms. It is computed in `f64` in
//! exactly this order, which Lua 5.1 (whose numbers are doubles) reproduces bit for bit:
//!
//! ```text
//! share    = floor(prev * ((W - elapsed) / W))
//! weighted = cur + share
//! ```
//!
//! `prev`, `W` and `W - elapsed` are integers below 2^53, so each conversion is exact and each
//! operation is one correctly rounded IEEE operation.

use super::{Decision, Hits, Limit};

/// The counts of the current and the previous epoch-aligned window. A count only grows
/// while it stays within the limit, a `u32`, so `u32` holds it and keeps every counter of
/// the memory backend 8 bytes smaller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct State {
    window_start: u64,
    window_micros: u64,
    prev: u32,
    cur: u32,
}

impl State {
    /// Two windows after the current one started, both counts have rotated out.
    pub(super) fn expires_at(&self) -> u64 {
        self.window_start
            .saturating_add(self.window_micros.saturating_mul(2))
    }
}

/// Applies `hits` at `now`. Allowed iff `weighted + cost <= limit`, then the cost is added to
/// the current window. A give-back takes from the current window first, then the previous.
/// With `overshoot` the cost is added whatever the answer (a check is refused once the
/// weighted count is past the limit); a count saturates at `u32::MAX`, as its twin's does.
pub(super) fn hit(state: &mut State, limit: &Limit, now: u64, hits: Hits) -> Decision {
    let quota = u64::from(limit.requests_per_unit);
    let w = limit.window_micros();
    let window_start = now - now % w;
    let elapsed = now - window_start;
    let (prev, cur) = if state.window_start == window_start {
        (u64::from(state.prev), u64::from(state.cur))
    } else if state.window_start.checked_add(w) == Some(window_start) {
        (u64::from(state.cur), 0)
    } else {
        (0, 0)
    };
    let weighted = cur.saturating_add(share(prev, elapsed, w));
    let (allowed, next_prev, next_cur) = if hits.negative {
        let from_cur = cur.min(hits.amount);
        (
            true,
            prev.saturating_sub(hits.amount - from_cur),
            cur - from_cur,
        )
    } else if limit.overshoot {
        let within = weighted.saturating_add(hits.amount) <= quota;
        (within, prev, cur.saturating_add(hits.amount))
    } else if hits.amount == 0 || weighted.saturating_add(hits.amount) <= quota {
        (true, prev, cur.saturating_add(hits.amount))
    } else {
        (false, prev, cur)
    };
    if (next_prev, next_cur) != (prev, cur) {
        *state = State {
            window_start,
            window_micros: w,
            prev: saturate(next_prev),
            cur: saturate(next_cur),
        };
    }
    let weighted = next_cur.saturating_add(share(next_prev, elapsed, w));
    Decision {
        allowed,
        remaining: quota.saturating_sub(weighted),
        reset_micros: until_next_drop(next_prev, next_cur, elapsed, w),
    }
}

/// Counts stay within the limit (a `u32`), but for `overshoot` charges: those saturate.
fn saturate(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The part of a window count of `count` that still weighs `elapsed` µs into the next window.
/// Non-increasing in `elapsed` (IEEE division and multiplication are monotonic), `count` at
/// 0 and 0 at `w`.
fn share(count: u64, elapsed: u64, w: u64) -> u64 {
    // `as` saturates on the way back, and the product never exceeds `count`.
    (count as f64 * ((w - elapsed) as f64 / w as f64)).floor() as u64
}

/// Microseconds until the weighted count drops by at least one, 0 if it never will. Within
/// this window only the previous window's share shrinks; once it is 0, the next drop is the
/// current count starting to shrink in the next window.
fn until_next_drop(prev: u64, cur: u64, elapsed: u64, w: u64) -> u64 {
    if share(prev, elapsed, w) > 0 {
        first_drop(prev, elapsed, w) - elapsed
    } else if cur > 0 {
        (w - elapsed).saturating_add(first_drop(cur, 0, w))
    } else {
        0
    }
}

/// The smallest `x` in `(from, w]` with `share(count, x) < share(count, from)`, for a count
/// whose share at `from` is positive (so it exists: the share is 0 at `w`).
///
/// The real-number solution, `w - share * w / count`, is only a first guess: the answer has
/// to match the rounded `share` exactly, so the guess is corrected by stepping (a few steps at
/// most, since both roundings are within a few ulps). The result depends only on `share`, so
/// the Lua twin finds the same instant whatever rounding its guess has.
fn first_drop(count: u64, from: u64, w: u64) -> u64 {
    let target = share(count, from, w);
    let guess = w as f64 - target as f64 * w as f64 / count as f64;
    let mut x = (guess.floor() as u64).saturating_add(1).clamp(from + 1, w);
    while x > from + 1 && share(count, x - 1, w) < target {
        x -= 1;
    }
    while x < w && share(count, x, w) >= target {
        x += 1;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    const W: u64 = 1_000_000;

    fn per_second(quota: u32) -> Limit {
        Limit {
            algorithm: Algorithm::SlidingWindow,
            ..Limit::per(quota, Unit::Second)
        }
    }

    #[test]
    fn share_is_the_floored_overlap_of_the_previous_window() {
        assert_eq!(share(10, 0, W), 10);
        assert_eq!(share(10, 250_000, W), 7);
        assert_eq!(share(10, 500_000, W), 5);
        assert_eq!(share(10, W, W), 0);
    }

    #[test]
    fn first_drop_matches_the_rounded_share_exactly() {
        // 3 * 333_334 / 10^6 = 1.000002 and 3 * 333_333 / 10^6 = 0.999999: the share of 3
        // drops from 1 to 0 at 666_667, although the real solution is 666_666.67.
        assert_eq!(first_drop(3, 600_000, W), 666_667);
        for (count, from) in [
            (7, 0),
            (10, 123_456),
            (1_000, 999_000),
            (u32::MAX.into(), 5),
        ] {
            let drop = first_drop(count, from, W);
            assert!(share(count, drop, W) < share(count, from, W));
            assert_eq!(share(count, drop - 1, W), share(count, from, W));
        }
    }

    #[test]
    fn reset_counts_into_the_next_window_when_the_previous_share_is_gone() {
        // Only `cur` is left; it starts to weigh less one microsecond into the next window.
        assert_eq!(until_next_drop(0, 4, 300_000, W), 700_001);
        assert_eq!(until_next_drop(0, 0, 300_000, W), 0);
    }

    #[test]
    fn expires_two_windows_after_the_current_one_started() {
        let mut state = State::default();
        hit(&mut state, &per_second(10), 3_500_000, Hits::take(1));
        assert_eq!(state.expires_at(), 5_000_000);
    }

    #[test]
    fn a_check_does_not_write_the_rotated_state() {
        let mut state = State::default();
        hit(&mut state, &per_second(10), 100, Hits::take(4));
        let before = state.clone();
        hit(&mut state, &per_second(10), 1_500_000, Hits::take(0));
        assert_eq!(state, before);
    }

    #[test]
    fn a_clock_stepping_back_starts_over_instead_of_failing() {
        let mut state = State::default();
        hit(&mut state, &per_second(10), 5_000_000, Hits::take(10));
        let decision = hit(&mut state, &per_second(10), 1_000_000, Hits::take(1));
        assert!(decision.allowed);
    }
}
