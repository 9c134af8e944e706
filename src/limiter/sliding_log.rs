//! sliding_log: every counted hit with its timestamp. Exact: at any instant, the hits of the
//! last window never exceed the limit (unless the limit overshoots, when they are all
//! counted). The Rust twin of `lua/sliding_log.lua`.
//!
//! Hits of the same microsecond share one entry, whatever they cost, so memory is
//! O(distinct timestamps in one window).

use std::collections::VecDeque;

use super::{Decision, Hits, Limit};

/// The most hits a log holds: an overshooting charge past it counts only up to it, as a
/// sliding window's count saturates (the twin's doubles stay exact far beyond).
const MAX_TOTAL: u64 = u32::MAX as u64;

/// The counted hits of the last window, oldest first, with their running total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct State {
    /// (timestamp, hits at that microsecond); timestamps strictly increase.
    entries: VecDeque<(u64, u64)>,
    total: u64,
    window_micros: u64,
}

impl State {
    /// One window after the newest hit, every hit has left the log.
    pub(super) fn expires_at(&self) -> u64 {
        self.entries
            .back()
            .map_or(0, |&(at, _)| at.saturating_add(self.window_micros))
    }

    /// Empties the log, keeping its allocation.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.total = 0;
    }
}

/// Applies `hits` at `now`. Hits at or before `now - W` are evicted; allowed iff
/// `total + cost <= limit`, then the cost is logged at `now`. A give-back removes the newest
/// hits first. A check (cost 0) reads without evicting. With `overshoot` the cost is logged
/// whatever the answer, and a hit (a check too) is allowed iff `total <= limit` after it.
pub(super) fn hit(state: &mut State, limit: &Limit, now: u64, hits: Hits) -> Decision {
    let quota = u64::from(limit.requests_per_unit);
    let w = limit.window_micros();
    let is_live = |at: u64| at.saturating_add(w) > now;
    if hits.amount == 0 {
        let live = state.entries.iter().skip_while(|&&(at, _)| !is_live(at));
        let total = live.clone().map(|&(_, count)| count).sum();
        let allowed = !limit.overshoot || total <= quota;
        return decision(allowed, quota, total, live, w, now);
    }
    state.window_micros = w;
    while let Some(&(at, count)) = state.entries.front()
        && !is_live(at)
    {
        state.entries.pop_front();
        state.total -= count;
    }
    let allowed = if hits.negative {
        give_back(state, hits.amount);
        true
    } else if limit.overshoot {
        let counted = hits.amount.min(MAX_TOTAL.saturating_sub(state.total));
        if counted > 0 {
            log(state, now, counted);
        }
        state.total <= quota
    } else if state.total.saturating_add(hits.amount) <= quota {
        log(state, now, hits.amount);
        true
    } else {
        false
    };
    decision(allowed, quota, state.total, &state.entries, w, now)
}

/// Logs `amount` hits at `now`, or at the newest timestamp if the clock stepped back, so the
/// log stays in order and eviction stays a pop from the front.
fn log(state: &mut State, now: u64, amount: u64) {
    state.total += amount;
    match state.entries.back_mut() {
        Some((at, count)) if *at >= now => *count += amount,
        _ => state.entries.push_back((now, amount)),
    }
}

fn give_back(state: &mut State, mut amount: u64) {
    while amount > 0 {
        let Some((_, count)) = state.entries.back_mut() else {
            break;
        };
        let taken = amount.min(*count);
        *count -= taken;
        state.total -= taken;
        amount -= taken;
        if *count == 0 {
            state.entries.pop_back();
        }
    }
}

/// The answer for a log of `total` hits in `entries` (live, oldest first). The next unit of
/// quota comes back when the oldest entries holding `total - limit + 1` hits (at least one)
/// have left the window: the oldest entry's exit, unless an overshooting log is past its
/// limit.
fn decision<'a>(
    allowed: bool,
    quota: u64,
    total: u64,
    entries: impl IntoIterator<Item = &'a (u64, u64)>,
    w: u64,
    now: u64,
) -> Decision {
    let leaving = total.saturating_sub(quota) + 1;
    let mut held = 0;
    let back_at = entries.into_iter().find_map(|&(at, count)| {
        held += count;
        (held >= leaving).then_some(at)
    });
    Decision {
        allowed,
        remaining: quota.saturating_sub(total),
        reset_micros: back_at.map_or(0, |at| at.saturating_add(w).saturating_sub(now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Unit};

    fn per_second(quota: u32) -> Limit {
        Limit {
            algorithm: Algorithm::SlidingLog,
            ..Limit::per(quota, Unit::Second)
        }
    }

    #[test]
    fn hits_of_the_same_microsecond_share_one_entry() {
        let mut state = State::default();
        for _ in 0..5 {
            hit(&mut state, &per_second(10), 42, Hits::take(2));
        }
        assert_eq!(state.entries, [(42, 10)]);
    }

    #[test]
    fn a_clock_stepping_back_logs_at_the_newest_timestamp() {
        let mut state = State::default();
        hit(&mut state, &per_second(10), 500, Hits::take(1));
        hit(&mut state, &per_second(10), 400, Hits::take(1));
        assert_eq!(state.entries, [(500, 2)]);
    }

    #[test]
    fn expires_one_window_after_the_newest_hit() {
        let mut state = State::default();
        hit(&mut state, &per_second(10), 100, Hits::take(1));
        hit(&mut state, &per_second(10), 700, Hits::take(1));
        assert_eq!(state.expires_at(), 1_000_700);
    }

    #[test]
    fn a_check_does_not_evict() {
        let mut state = State::default();
        hit(&mut state, &per_second(10), 100, Hits::take(1));
        let decision = hit(&mut state, &per_second(10), 5_000_000, Hits::take(0));
        assert_eq!((decision.remaining, state.entries.len()), (10, 1));
    }

    #[test]
    fn empty_log_has_expired() {
        assert_eq!(State::default().expires_at(), 0);
    }
}
