//! fixed_window: one count per window. The Rust twin of `lua/fixed_window.lua`.
//!
//! Windows are aligned on the epoch (`start = now - now % W`) or, when the limit has a time
//! zone, on the calendar. The count starts from zero in every window, so up to twice the
//! limit can pass around a boundary: the whole quota at the end of one window and again at
//! the start of the next.

use super::{Decision, Hits, Limit};

/// The count of one window. The window is identified by its end, which is also the instant
/// the state stops mattering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct State {
    window_end: u64,
    count: u64,
}

impl State {
    /// A count of zero is as good as no state (its twin deletes the key).
    pub(super) fn expires_at(&self) -> u64 {
        if self.count == 0 { 0 } else { self.window_end }
    }
}

/// Applies `hits` at `now`. Allowed iff `count + cost <= limit`; a give-back lowers the count,
/// never below zero. A hit that changes nothing writes nothing. With `overshoot` the cost is
/// counted whatever the answer (a check is refused once the count is past the limit).
pub(super) fn hit(state: &mut State, limit: &Limit, now: u64, hits: Hits) -> Decision {
    let quota = u64::from(limit.requests_per_unit);
    let window_end = window_end(limit, now);
    let count = if state.window_end == window_end {
        state.count
    } else {
        0
    };
    let (allowed, next) = if hits.negative {
        (true, count.saturating_sub(hits.amount))
    } else if limit.overshoot {
        let next = count.saturating_add(hits.amount);
        (next <= quota, next)
    } else {
        let next = count.saturating_add(hits.amount);
        if next <= quota || hits.amount == 0 {
            (true, next)
        } else {
            (false, count)
        }
    };
    if next != count {
        *state = State {
            window_end,
            count: next,
        };
    }
    Decision {
        allowed,
        remaining: quota.saturating_sub(next),
        reset_micros: window_end.saturating_sub(now),
    }
}

/// The end of the window containing `now`: epoch-aligned multiples of the window length, or
/// the calendar window of the limit's time zone.
fn window_end(limit: &Limit, now: u64) -> u64 {
    match &limit.timezone {
        Some(zone) => zone.window(limit.unit, now).1,
        None => {
            let length = limit.window_micros();
            (now - now % length).saturating_add(length)
        }
    }
}
