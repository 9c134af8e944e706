//! What a rule counts of its hits, with envoyproxy/ratelimit's meaning, and the slot a rule
//! keeps them in once found (the registry that finds them by series is `metrics`').

use std::sync::{Arc, OnceLock};

use crate::instruments::Tally;
use crate::limiter::Decision;

/// One rule's hit counts, each in hits (a request's cost), not requests.
#[derive(Debug, Default)]
pub struct RuleStats {
    pub total_hits: Tally,
    pub over_limit: Tally,
    /// Hits that brought the count above `near_limit_ratio` × limit, over the limit or not.
    pub near_limit: Tally,
    pub within_limit: Tally,
    /// Over-limit hits that a `shadow_mode` rule let through.
    pub shadow_mode: Tally,
    /// Over-limit hits answered from the over-limit cache, without the backend.
    pub over_limit_with_local_cache: Tally,
}

/// How a descriptor's hits were judged, for its rule's statistics.
#[derive(Debug, Clone, Copy)]
pub enum Judged {
    /// A counter decided, against a limit of `capacity` (requests per unit, or the burst).
    Counted {
        decision: Decision,
        capacity: u64,
        shadow: bool,
    },
    /// The over-limit cache rejected the hits without asking the backend.
    FromCache { shadow: bool },
    /// `unlimited: true`: always within.
    Unlimited,
    /// No counter decided (the backend failed and the rule's policy answered, or the request
    /// was rejected before this counter was asked): only a hit.
    Undecided,
    /// Refused by a data plane on its own, from the quota floodgate assigned it (RLQS):
    /// over the limit, as far as floodgate is concerned.
    Refused,
    /// Let through by a data plane and charged after the fact (RLQS) to a counter that had
    /// `found_remaining` of `capacity` left: the hits that fitted are within the limit (and
    /// near it above the threshold), the rest over it, as the same hits sent one by one
    /// through ShouldRateLimit would be counted.
    Charged {
        found_remaining: u64,
        capacity: u64,
        shadow: bool,
    },
}

impl RuleStats {
    /// Counts `hits` as envoyproxy/ratelimit does. A counter's count before and after the
    /// hits comes from the decision: an allowed hit left `remaining`, a rejected one was not
    /// counted and found `remaining`. Hits crossing a threshold are split at it: 3 rejected hits
    /// that would take a count of 4 to 7 against a limit of 5 (near-limit threshold 4) are
    /// 2 over the limit and 1 near it. As upstream, hits of a rejection never count within.
    pub fn record(&self, hits: u64, judged: Judged, near_limit_ratio: f64) {
        self.total_hits.add(hits);
        match judged {
            Judged::Undecided => {}
            Judged::Refused => self.over_limit.add(hits),
            Judged::Unlimited => self.within_limit.add(hits),
            Judged::FromCache { shadow } => {
                self.over_limit.add(hits);
                self.over_limit_with_local_cache.add(hits);
                if shadow {
                    self.shadow_mode.add(hits);
                }
            }
            Judged::Charged {
                found_remaining,
                capacity,
                shadow,
            } => {
                let near = (capacity as f64 * near_limit_ratio) as u64;
                let before = capacity.saturating_sub(found_remaining);
                let fitted_to = before.saturating_add(hits).min(capacity);
                let within = fitted_to - before;
                self.within_limit.add(within);
                if fitted_to > near {
                    self.near_limit.add(fitted_to - before.max(near));
                }
                self.over_limit.add(hits - within);
                if shadow {
                    self.shadow_mode.add(hits - within);
                }
            }
            Judged::Counted {
                decision,
                capacity,
                shadow,
            } => {
                // Truncated toward zero, as upstream's floor.
                let near = (capacity as f64 * near_limit_ratio) as u64;
                if decision.allowed {
                    let after = capacity.saturating_sub(decision.remaining);
                    let before = after.saturating_sub(hits);
                    self.within_limit.add(hits);
                    if after > near {
                        self.near_limit.add(after - before.max(near));
                    }
                } else {
                    let before = capacity.saturating_sub(decision.remaining);
                    let after = before.saturating_add(hits);
                    if before >= capacity {
                        self.over_limit.add(hits);
                    } else {
                        self.over_limit.add(after - capacity);
                        self.near_limit.add(capacity - before.max(near));
                    }
                    if shadow {
                        self.shadow_mode.add(hits);
                    }
                }
            }
        }
    }
}

/// Where a rule keeps its statistics once found, so later hits skip the registry. Not part
/// of the rule's identity: two rules compare equal whatever their slots hold.
#[derive(Debug, Default, Clone)]
pub struct StatsSlot(OnceLock<Arc<RuleStats>>);

impl StatsSlot {
    pub(crate) fn get_or_init(&self, find: impl FnOnce() -> Arc<RuleStats>) -> &RuleStats {
        self.0.get_or_init(find)
    }
}

impl PartialEq for StatsSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(allowed: bool, remaining: u64) -> Judged {
        Judged::Counted {
            decision: Decision {
                allowed,
                remaining,
                reset_micros: 1,
            },
            capacity: 5,
            shadow: false,
        }
    }

    fn counts(stats: &RuleStats) -> [u64; 4] {
        [
            stats.total_hits.get(),
            stats.within_limit.get(),
            stats.near_limit.get(),
            stats.over_limit.get(),
        ]
    }

    #[test]
    fn usage_charged_after_the_fact_is_split_as_single_hits_would_be() {
        // 10 let through on a count of 97 of 100 (near from 80): 3 fitted, all 3 near the
        // limit, 7 over it, as ten ShouldRateLimit calls would have been counted.
        let stats = RuleStats::default();
        let charged = Judged::Charged {
            found_remaining: 3,
            capacity: 100,
            shadow: false,
        };
        stats.record(10, charged, 0.8);
        assert_eq!(counts(&stats), [10, 3, 3, 7]);
        // On a count already past the limit, all over; well below it, all within.
        let stats = RuleStats::default();
        let over = Judged::Charged {
            found_remaining: 0,
            capacity: 100,
            shadow: false,
        };
        stats.record(4, over, 0.8);
        let within = Judged::Charged {
            found_remaining: 90,
            capacity: 100,
            shadow: false,
        };
        stats.record(5, within, 0.8);
        assert_eq!(counts(&stats), [9, 5, 0, 4]);
    }

    #[test]
    fn seven_single_hits_on_a_limit_of_five() {
        let stats = RuleStats::default();
        for remaining in (0..5).rev() {
            stats.record(1, counted(true, remaining), 0.8);
        }
        stats.record(1, counted(false, 0), 0.8);
        stats.record(1, counted(false, 0), 0.8);
        // near threshold 4: only the fifth hit (count 4 → 5) is near.
        assert_eq!(counts(&stats), [7, 5, 1, 2]);
    }

    #[test]
    fn hits_crossing_the_limit_are_split_at_it() {
        let stats = RuleStats::default();
        // Count 3, then a cost of 4 rejected: 3 → 7 against 5 is 2 over; 4 → 5 near.
        stats.record(4, counted(false, 2), 0.8);
        assert_eq!(counts(&stats), [4, 0, 1, 2]);
    }

    #[test]
    fn allowed_hits_crossing_the_near_threshold_count_only_above_it() {
        let stats = RuleStats::default();
        // 2 → 5 with a near threshold of 4: one near-limit hit.
        stats.record(3, counted(true, 0), 0.8);
        assert_eq!(counts(&stats), [3, 3, 1, 0]);
    }

    #[test]
    fn cache_answers_are_over_limit_and_shadow_rules_count_shadow_hits() {
        let stats = RuleStats::default();
        stats.record(2, Judged::FromCache { shadow: true }, 0.8);
        assert_eq!(stats.over_limit_with_local_cache.get(), 2);
        assert_eq!(stats.shadow_mode.get(), 2);
        assert_eq!(counts(&stats), [2, 0, 0, 2]);
    }
}
