//! One counter's state on the memory backend, for whichever algorithm its limit uses.
//!
//! The rules common to every algorithm live here, once: a limit that admits nothing, and a
//! state left by another algorithm. Everything else is the algorithm's own math, in its file.

use super::{Algorithm, Decision, Hits, Limit};
use super::{fixed_window, gcra, sliding_log, sliding_window, tally, token_bucket};

/// One counter's state, for whichever algorithm its limit uses. A new counter is one that
/// was never hit.
#[derive(Debug, Clone, Default)]
pub struct Counter(State);

#[derive(Debug, Clone, Default)]
enum State {
    #[default]
    New,
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    /// Boxed: the log is the largest state, and every other counter would pay for its size.
    SlidingLog(Box<sliding_log::State>),
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
    Tally(tally::State),
}

impl Counter {
    pub fn new() -> Self {
        Counter(State::New)
    }

    /// Applies one hit at `now_micros` and answers it.
    ///
    /// A limit that admits nothing (`requests_per_unit` 0, or a token_bucket / gcra burst of
    /// 0) answers without touching the state: a hit that costs something is rejected, a check
    /// or a give-back is allowed, remaining is 0 and reset is one window.
    pub fn hit(&mut self, limit: &Limit, now_micros: u64, hits: Hits) -> Decision {
        if admits_nothing(limit) {
            return Decision {
                allowed: hits.amount == 0 || hits.negative,
                remaining: 0,
                reset_micros: limit.window_micros(),
            };
        }
        let now = now_micros;
        match (&mut self.0, limit.algorithm) {
            (State::FixedWindow(state), Algorithm::FixedWindow) => {
                fixed_window::hit(state, limit, now, hits)
            }
            (State::SlidingWindow(state), Algorithm::SlidingWindow) => {
                sliding_window::hit(state, limit, now, hits)
            }
            (State::SlidingLog(state), Algorithm::SlidingLog) => {
                sliding_log::hit(state, limit, now, hits)
            }
            (State::TokenBucket(state), Algorithm::TokenBucket) => {
                token_bucket::hit(state, limit, now, hits)
            }
            (State::Gcra(state), Algorithm::Gcra) => gcra::hit(state, limit, now, hits),
            (State::Tally(state), Algorithm::Tally) => tally::hit(state, limit, now, hits),
            // Never hit, or counted under another algorithm: start from that algorithm's
            // fresh state, which the arm above then matches.
            _ => {
                self.0 = State::fresh(limit, now);
                self.hit(limit, now, hits)
            }
        }
    }

    /// Forgets everything counted, as `Counter::new()` would, but keeps a sliding log's
    /// allocations for reuse.
    pub fn reset(&mut self) {
        match &mut self.0 {
            State::SlidingLog(log) => log.clear(),
            state => *state = State::New,
        }
    }

    /// After this instant the state is equivalent to `Counter::new()` and can be dropped.
    pub fn expires_at(&self) -> u64 {
        match &self.0 {
            State::New => 0,
            State::FixedWindow(state) => state.expires_at(),
            State::SlidingWindow(state) => state.expires_at(),
            State::SlidingLog(state) => state.expires_at(),
            State::TokenBucket(state) => state.expires_at(),
            State::Gcra(state) => state.expires_at(),
            State::Tally(state) => state.expires_at(),
        }
    }
}

impl State {
    fn fresh(limit: &Limit, now: u64) -> Self {
        match limit.algorithm {
            Algorithm::FixedWindow => State::FixedWindow(Default::default()),
            Algorithm::SlidingWindow => State::SlidingWindow(Default::default()),
            Algorithm::SlidingLog => State::SlidingLog(Box::default()),
            Algorithm::TokenBucket => State::TokenBucket(token_bucket::State::full(limit, now)),
            Algorithm::Gcra => State::Gcra(Default::default()),
            Algorithm::Tally => State::Tally(Default::default()),
        }
    }
}

fn admits_nothing(limit: &Limit) -> bool {
    let bucket = matches!(limit.algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
    limit.requests_per_unit == 0 || (bucket && limit.capacity() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{MAX_HITS, Unit};

    fn limit(algorithm: Algorithm, requests_per_unit: u32) -> Limit {
        Limit {
            algorithm,
            ..Limit::per(requests_per_unit, Unit::Second)
        }
    }

    #[test]
    fn a_limit_of_zero_leaves_the_state_untouched() {
        for algorithm in Algorithm::ALL {
            let mut counter = Counter::new();
            counter.hit(&limit(algorithm, 5), 10, Hits::take(2));
            let expires_at = counter.expires_at();
            let decision = counter.hit(&limit(algorithm, 0), 20, Hits::take(1));
            assert!(!decision.allowed, "{algorithm:?}");
            assert_eq!(counter.expires_at(), expires_at, "{algorithm:?}");
        }
    }

    #[test]
    fn a_burst_of_zero_admits_nothing() {
        for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let no_burst = Limit {
                burst: Some(0),
                ..limit(algorithm, 10)
            };
            let decision = Counter::new().hit(&no_burst, 0, Hits::take(1));
            assert_eq!(
                (decision.allowed, decision.remaining, decision.reset_micros),
                (false, 0, 1_000_000)
            );
        }
    }

    #[test]
    fn a_counter_never_hit_has_expired() {
        assert_eq!(Counter::new().expires_at(), 0);
    }

    #[test]
    fn a_check_on_a_new_counter_leaves_it_expired() {
        for algorithm in Algorithm::ALL {
            let mut counter = Counter::new();
            counter.hit(&limit(algorithm, 5), 1_000, Hits::take(0));
            assert!(counter.expires_at() <= 1_000, "{algorithm:?}");
        }
    }

    #[test]
    fn reset_forgets_everything_counted() {
        for algorithm in Algorithm::ALL {
            let mut counter = Counter::new();
            counter.hit(&limit(algorithm, 5), 0, Hits::take(5));
            counter.reset();
            let decision = counter.hit(&limit(algorithm, 5), 0, Hits::take(5));
            assert!(decision.allowed, "{algorithm:?}");
        }
    }

    #[test]
    fn a_state_of_another_algorithm_starts_over() {
        let mut counter = Counter::new();
        counter.hit(&limit(Algorithm::FixedWindow, 5), 0, Hits::take(5));
        let decision = counter.hit(&limit(Algorithm::Gcra, 5), 0, Hits::take(5));
        assert!(decision.allowed);
    }

    #[test]
    fn extreme_inputs_do_not_panic() {
        let huge = Limit {
            unit: Unit::Year,
            unit_multiplier: u32::MAX,
            burst: Some(u32::MAX),
            ..Limit::per(u32::MAX, Unit::Year)
        };
        let tiny = Limit::per(1, Unit::Second);
        for algorithm in Algorithm::ALL {
            for base in [&huge, &tiny] {
                let limit = Limit {
                    algorithm,
                    ..base.clone()
                };
                let mut counter = Counter::new();
                for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX, 3] {
                    for hits in [
                        Hits::take(MAX_HITS),
                        Hits::take(1),
                        Hits::give_back(MAX_HITS),
                    ] {
                        counter.hit(&limit, now, hits);
                        counter.expires_at();
                    }
                }
            }
        }
    }
}
