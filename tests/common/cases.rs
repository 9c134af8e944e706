//! The algorithm cases: what every backend (memory, and the Redis Lua scripts) must answer,
//! step by step, for one counter. Data only; each expectation is worked out by hand from the
//! definitions in `docs/algorithms.md`, never by running the code under test.
//!
//! Times are absolute microseconds since the epoch, so a backend that takes its clock from
//! elsewhere (Redis `TIME`) can be driven to the same instants.

use floodgate::limiter::{Algorithm, Decision, Hits, Limit, Timezone, Unit};

/// One counter's history: a limit and the hits it receives, in order.
pub struct Case {
    pub name: String,
    pub limit: Limit,
    pub steps: Vec<Step>,
}

/// One hit at an instant, and the answer it must get.
pub struct Step {
    pub at_micros: u64,
    pub hits: Hits,
    pub expect: Decision,
}

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// 2023-11-15T00:00:00Z, a Wednesday: a multiple of every epoch-aligned window used here.
const T0: u64 = 1_700_006_400 * SECOND;
/// 2023-11-15T00:00:00+01:00: local midnight in Paris, an hour before `T0`.
const PARIS_NOV_15: u64 = 1_700_002_800 * SECOND;
/// 2024-03-31T00:00:00+01:00: the day Paris moves to summer time at 02:00.
const PARIS_MAR_31: u64 = 1_711_839_600 * SECOND;
/// 2024-02-01T00:00:00+01:00 and 2024-03-01T00:00:00+01:00 in Paris.
const PARIS_FEB_1: u64 = 1_706_742_000 * SECOND;
const PARIS_MAR_1: u64 = 1_709_247_600 * SECOND;

pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(fixed_window());
    cases.extend(sliding_window());
    cases.extend(sliding_log());
    cases.extend(bucket(Algorithm::TokenBucket));
    cases.extend(bucket(Algorithm::Gcra));
    cases.extend(tally());
    cases.extend(Algorithm::COUNTED.map(zero_requests_per_unit));
    cases
}

fn fixed_window() -> Vec<Case> {
    let fixed = |rate, unit| limit(Algorithm::FixedWindow, rate, unit);
    vec![
        case(
            "fixed_window_overshoot_counts_a_charge_past_the_limit",
            overshoot(fixed(5, Unit::Second)),
            vec![
                step(T0, take(3), allow(2, SECOND)),
                // 3 + 4 = 7: over the limit, and counted.
                step(T0 + 1, take(4), reject(0, 999_999)),
                step(T0 + 2, take(0), reject(0, 999_998)),
                step(T0 + 3, give(3), allow(1, 999_997)),
                step(T0 + 4, take(0), allow(1, 999_996)),
                step(T0 + SECOND, take(1), allow(4, SECOND)),
            ],
        ),
        case(
            "fixed_window_allows_exactly_the_limit_then_rejects",
            fixed(3, Unit::Second),
            vec![
                step(T0, take(1), allow(2, SECOND)),
                step(T0 + 100, take(1), allow(1, 999_900)),
                step(T0 + 200, take(1), allow(0, 999_800)),
                step(T0 + 300, take(1), reject(0, 999_700)),
            ],
        ),
        case(
            "fixed_window_counts_the_cost_of_a_hit",
            fixed(3, Unit::Second),
            vec![
                step(T0, take(2), allow(1, SECOND)),
                step(T0 + 1, take(1), allow(0, 999_999)),
            ],
        ),
        case(
            "fixed_window_rejected_hit_is_not_counted",
            fixed(3, Unit::Second),
            vec![
                step(T0, take(2), allow(1, SECOND)),
                step(T0 + 10, take(2), reject(1, 999_990)),
                step(T0 + 20, take(1), allow(0, 999_980)),
            ],
        ),
        case(
            "fixed_window_cost_zero_only_checks",
            fixed(3, Unit::Second),
            vec![
                step(T0, take(0), allow(3, SECOND)),
                step(T0 + 5, take(3), allow(0, 999_995)),
                step(T0 + 6, take(0), allow(0, 999_994)),
            ],
        ),
        case(
            "fixed_window_cost_above_the_limit_is_rejected",
            fixed(3, Unit::Second),
            vec![
                step(T0, take(4), reject(3, SECOND)),
                step(T0, take(3), allow(0, SECOND)),
            ],
        ),
        case(
            "fixed_window_negative_hits_give_back_never_below_empty",
            fixed(3, Unit::Second),
            vec![
                step(T0, take(3), allow(0, SECOND)),
                step(T0 + 1, give(2), allow(2, 999_999)),
                step(T0 + 2, give(5), allow(3, 999_998)),
                step(T0 + 3, take(3), allow(0, 999_997)),
                step(T0 + 4, take(1), reject(0, 999_996)),
            ],
        ),
        case(
            "fixed_window_allows_twice_the_limit_across_a_boundary",
            fixed(3, Unit::Second),
            vec![
                step(T0 + 999_999, take(3), allow(0, 1)),
                step(T0 + SECOND, take(3), allow(0, SECOND)),
                step(T0 + SECOND + 1, take(1), reject(0, 999_999)),
            ],
        ),
        case(
            "fixed_window_unit_multiplier_stretches_the_window",
            times(5, fixed(2, Unit::Second)),
            vec![
                step(T0 + 4 * SECOND, take(2), allow(0, SECOND)),
                step(T0 + 5 * SECOND - 1, take(1), reject(0, 1)),
                step(T0 + 5 * SECOND, take(1), allow(1, 5 * SECOND)),
            ],
        ),
        case(
            "fixed_window_day_starts_at_local_midnight_in_paris",
            in_paris(fixed(2, Unit::Day)),
            vec![
                step(PARIS_NOV_15 - 1, take(2), allow(0, 1)),
                step(PARIS_NOV_15, take(1), allow(1, DAY)),
                // UTC midnight is 01:00 in Paris: still the same day.
                step(T0, take(1), allow(0, 23 * HOUR)),
                step(PARIS_NOV_15 + DAY - 1, take(1), reject(0, 1)),
                step(PARIS_NOV_15 + DAY, take(1), allow(1, DAY)),
            ],
        ),
        case(
            "fixed_window_spring_forward_day_in_paris_lasts_23_hours",
            in_paris(fixed(1, Unit::Day)),
            vec![
                step(PARIS_MAR_31, take(1), allow(0, 23 * HOUR)),
                step(PARIS_MAR_31 + 23 * HOUR - 1, take(1), reject(0, 1)),
                step(PARIS_MAR_31 + 23 * HOUR, take(1), allow(0, DAY)),
            ],
        ),
        case(
            "fixed_window_month_in_paris_is_the_calendar_month",
            in_paris(fixed(1, Unit::Month)),
            vec![
                step(PARIS_FEB_1 - 1, take(1), allow(0, 1)),
                // February 2024 has 29 days; March loses an hour to summer time.
                step(PARIS_FEB_1, take(1), allow(0, 29 * DAY)),
                step(PARIS_MAR_1 - 1, take(1), reject(0, 1)),
                step(PARIS_MAR_1, take(1), allow(0, 31 * DAY - HOUR)),
            ],
        ),
    ]
}

/// weighted = cur + floor(prev * ((W - elapsed) / W)). With nothing left of the previous
/// window, the weighted count next drops 1 µs into the next window, hence resets of W + 1.
fn sliding_window() -> Vec<Case> {
    let sliding = |rate, unit| limit(Algorithm::SlidingWindow, rate, unit);
    vec![
        case(
            "sliding_window_overshoot_counts_a_charge_past_the_limit_until_it_weighs_less",
            overshoot(sliding(4, Unit::Second)),
            vec![
                step(T0, take(3), allow(1, SECOND + 1)),
                step(T0 + 1, take(5), reject(0, SECOND)),
                step(T0 + 2, take(0), reject(0, 999_999)),
                // The next window: the previous 8 still weigh 8, then 4 at half the window.
                step(T0 + SECOND, take(0), reject(0, 1)),
                step(T0 + SECOND + 500_000, take(0), allow(0, 1)),
                step(T0 + SECOND + 500_000, take(1), reject(0, 1)),
            ],
        ),
        case(
            "sliding_window_allows_exactly_the_limit_then_rejects",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(9), allow(1, SECOND + 1)),
                step(T0 + 1, take(1), allow(0, SECOND)),
                step(T0 + 2, take(1), reject(0, 999_999)),
            ],
        ),
        case(
            "sliding_window_counts_the_cost_of_a_hit",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(4), allow(6, SECOND + 1)),
                step(T0, take(6), allow(0, SECOND + 1)),
            ],
        ),
        case(
            "sliding_window_rejected_hit_is_not_counted",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(7), allow(3, SECOND + 1)),
                step(T0 + 1, take(4), reject(3, SECOND)),
                step(T0 + 2, take(3), allow(0, 999_999)),
            ],
        ),
        case(
            "sliding_window_cost_zero_only_checks",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(0), allow(10, 0)),
                step(T0, take(10), allow(0, SECOND + 1)),
                step(T0 + 1, take(0), allow(0, SECOND)),
            ],
        ),
        case(
            "sliding_window_cost_above_the_limit_is_rejected",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(11), reject(10, 0)),
                step(T0, take(10), allow(0, SECOND + 1)),
            ],
        ),
        case(
            "sliding_window_weighs_the_previous_window_by_its_overlap",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(10), allow(0, SECOND + 1)),
                // Midpoint of the next window: half of the previous 10 still counts, and
                // floor(10 * 0.499999) = 4 one microsecond later.
                step(T0 + 1_500_000, take(0), allow(5, 1)),
                step(T0 + 1_500_000, take(5), allow(0, 1)),
                step(T0 + 1_500_000, take(1), reject(0, 1)),
                // 5 + 4 = 9; the share next drops to 3 past 60% of the window.
                step(T0 + 1_500_001, take(1), allow(0, 100_000)),
            ],
        ),
        case(
            "sliding_window_forgets_a_window_once_it_no_longer_overlaps",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(10), allow(0, SECOND + 1)),
                step(T0 + SECOND, take(1), reject(0, 1)),
                // floor(10 * 1e-6) = 0: the previous window weighs nothing any more.
                step(T0 + 2 * SECOND - 1, take(0), allow(10, 0)),
                step(T0 + 2 * SECOND, take(10), allow(0, SECOND + 1)),
            ],
        ),
        case(
            "sliding_window_negative_hits_take_from_the_current_window_first",
            sliding(10, Unit::Second),
            vec![
                step(T0, take(4), allow(6, SECOND + 1)),
                // 60% into the next window: floor(4 * 0.4) = 1, dropping to 0 past 75%.
                step(T0 + 1_600_000, take(5), allow(4, 150_001)),
                // cur 5 -> 2; prev stays 4.
                step(T0 + 1_600_000, give(3), allow(7, 150_001)),
                // cur 2 -> 0 and prev 4 -> 3: floor(3 * 0.4) = 1, 0 from 666_667 µs in.
                step(T0 + 1_600_000, give(3), allow(9, 66_667)),
                step(T0 + 1_600_000, give(100), allow(10, 0)),
            ],
        ),
        case(
            "sliding_window_unit_multiplier_stretches_the_window",
            times(2, sliding(4, Unit::Minute)),
            vec![
                step(T0, take(4), allow(0, 2 * MINUTE + 1)),
                // A third into the next window: floor(4 * 2/3) = 2, dropping to 1 past half.
                step(T0 + 160 * SECOND, take(2), allow(0, 20 * SECOND + 1)),
                step(T0 + 160 * SECOND, take(1), reject(0, 20 * SECOND + 1)),
            ],
        ),
    ]
}

fn sliding_log() -> Vec<Case> {
    let log = |rate, unit| limit(Algorithm::SlidingLog, rate, unit);
    vec![
        case(
            "sliding_log_overshoot_counts_a_charge_past_the_limit_until_enough_hits_leave",
            overshoot(log(5, Unit::Second)),
            vec![
                step(T0, take(3), allow(2, SECOND)),
                // 7 of 5, counted: a unit comes back once the 3 of T0 have left.
                step(T0 + 1, take(4), reject(0, 999_999)),
                step(T0 + 2, take(0), reject(0, 999_998)),
                // 9 of 5: once 5 hits have left, those of T0 and T0 + 1.
                step(T0 + 500_000, take(2), reject(0, 500_001)),
                // The 3 of T0 have left: 6 of 5 until the 4 of T0 + 1 leave.
                step(T0 + SECOND, take(0), reject(0, 1)),
                step(T0 + SECOND + 1, take(0), allow(3, 499_999)),
                // 2 + 4 = 6, counted; 3 given back from the newest.
                step(T0 + SECOND + 1, take(4), reject(0, 499_999)),
                step(T0 + SECOND + 2, give(3), allow(2, 499_998)),
            ],
        ),
        case(
            "sliding_log_overshoot_saturates_at_u32_max",
            overshoot(log(5, Unit::Second)),
            vec![
                step(T0, take(1 << 32), reject(0, SECOND)),
                step(T0 + 1, take(1), reject(0, 999_999)),
                step(T0 + SECOND, take(1), allow(4, SECOND)),
            ],
        ),
        case(
            "sliding_log_allows_exactly_the_limit_then_rejects",
            log(3, Unit::Second),
            vec![
                step(T0, take(1), allow(2, SECOND)),
                step(T0 + 100, take(1), allow(1, 999_900)),
                step(T0 + 200, take(1), allow(0, 999_800)),
                step(T0 + 300, take(1), reject(0, 999_700)),
            ],
        ),
        case(
            "sliding_log_evicts_hits_one_window_old",
            log(3, Unit::Second),
            vec![
                step(T0, take(1), allow(2, SECOND)),
                step(T0 + 100, take(1), allow(1, 999_900)),
                step(T0 + 200, take(1), allow(0, 999_800)),
                step(T0 + SECOND, take(1), allow(0, 100)),
                step(T0 + SECOND + 99, take(1), reject(0, 1)),
                step(T0 + SECOND + 100, take(1), allow(0, 100)),
            ],
        ),
        case(
            "sliding_log_counts_the_cost_of_a_hit",
            log(3, Unit::Second),
            vec![
                step(T0, take(2), allow(1, SECOND)),
                step(T0, take(1), allow(0, SECOND)),
                step(T0 + SECOND, take(3), allow(0, SECOND)),
            ],
        ),
        case(
            "sliding_log_rejected_hit_is_not_counted",
            log(3, Unit::Second),
            vec![
                step(T0, take(2), allow(1, SECOND)),
                step(T0 + 10, take(2), reject(1, 999_990)),
                step(T0 + 20, take(1), allow(0, 999_980)),
            ],
        ),
        case(
            "sliding_log_cost_zero_only_checks",
            log(3, Unit::Second),
            vec![
                step(T0, take(0), allow(3, 0)),
                step(T0, take(3), allow(0, SECOND)),
                step(T0 + 5, take(0), allow(0, 999_995)),
            ],
        ),
        case(
            "sliding_log_cost_above_the_limit_is_rejected",
            log(3, Unit::Second),
            vec![
                step(T0, take(4), reject(3, 0)),
                step(T0, take(3), allow(0, SECOND)),
            ],
        ),
        case(
            "sliding_log_negative_hits_remove_the_newest_first",
            log(3, Unit::Second),
            vec![
                step(T0, take(1), allow(2, SECOND)),
                step(T0 + 500_000, take(2), allow(0, 500_000)),
                step(T0 + 600_000, give(1), allow(1, 400_000)),
                // The hit at T0 has left the window; one of T0 + 0.5 s is still counted.
                step(T0 + SECOND, take(0), allow(2, 500_000)),
                step(T0 + SECOND, give(5), allow(3, 0)),
            ],
        ),
        case(
            "sliding_log_unit_multiplier_stretches_the_window",
            times(5, log(2, Unit::Second)),
            vec![
                step(T0, take(1), allow(1, 5 * SECOND)),
                step(T0 + 3 * SECOND, take(1), allow(0, 2 * SECOND)),
                step(T0 + 5 * SECOND - 1, take(1), reject(0, 1)),
                step(T0 + 5 * SECOND, take(1), allow(0, 3 * SECOND)),
            ],
        ),
    ]
}

/// token_bucket and gcra admit the same hits and report the same remaining and reset: a
/// GCRA TAT `d` µs ahead of the clock is a bucket `d / T` whole tokens short of full.
fn bucket(algorithm: Algorithm) -> Vec<Case> {
    let name = |behaviour: &str| format!("{}_{behaviour}", algorithm.name());
    let rate = |rate, unit| limit(algorithm, rate, unit);
    let with_burst = |burst, limit: Limit| Limit {
        burst: Some(burst),
        ..limit
    };
    // 10 per second: one token every 100 ms, 10 at most.
    const T: u64 = 100_000;
    vec![
        Case {
            name: name("allows_exactly_the_capacity_then_rejects"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(9), allow(1, T)),
                step(T0, take(1), allow(0, T)),
                step(T0, take(1), reject(0, T)),
            ],
        },
        Case {
            name: name("refills_one_token_per_interval"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(10), allow(0, T)),
                // 2.5 intervals: 2 tokens, the third 50 ms away.
                step(T0 + 250_000, take(1), allow(1, 50_000)),
                step(T0 + 299_999, take(2), reject(1, 1)),
                step(T0 + 300_000, take(2), allow(0, T)),
                step(T0 + 10 * SECOND, take(0), allow(10, 0)),
            ],
        },
        Case {
            name: name("counts_the_cost_of_a_hit"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(4), allow(6, T)),
                step(T0, take(6), allow(0, T)),
            ],
        },
        Case {
            name: name("rejected_hit_is_not_counted"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(7), allow(3, T)),
                step(T0, take(4), reject(3, T)),
                step(T0, take(3), allow(0, T)),
            ],
        },
        Case {
            name: name("cost_zero_only_checks"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(0), allow(10, 0)),
                step(T0, take(10), allow(0, T)),
                step(T0 + 1, take(0), allow(0, T - 1)),
            ],
        },
        Case {
            name: name("cost_above_the_capacity_is_rejected"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(11), reject(10, 0)),
                step(T0, take(10), allow(0, T)),
            ],
        },
        Case {
            name: name("negative_hits_give_back_never_above_full"),
            limit: rate(10, Unit::Second),
            steps: vec![
                step(T0, take(10), allow(0, T)),
                step(T0 + 50_000, give(3), allow(3, 50_000)),
                step(T0 + 50_000, give(20), allow(10, 0)),
                step(T0 + 50_000, take(10), allow(0, T)),
            ],
        },
        Case {
            name: name("burst_above_the_rate_allows_the_burst_then_the_rate"),
            limit: with_burst(5, rate(2, Unit::Second)),
            steps: vec![
                step(T0, take(5), allow(0, 500_000)),
                step(T0, take(1), reject(0, 500_000)),
                step(T0 + 500_000, take(1), allow(0, 500_000)),
                step(T0 + SECOND, take(2), reject(1, 500_000)),
                step(T0 + 3 * SECOND, take(0), allow(5, 0)),
            ],
        },
        Case {
            name: name("burst_below_the_rate_caps_what_accumulates"),
            limit: with_burst(2, rate(10, Unit::Second)),
            steps: vec![
                step(T0, take(2), allow(0, T)),
                step(T0, take(1), reject(0, T)),
                step(T0 + SECOND, take(3), reject(2, 0)),
                step(T0 + SECOND, take(2), allow(0, T)),
            ],
        },
        Case {
            name: name("interval_is_the_window_over_the_rate_rounded_down"),
            limit: rate(3, Unit::Second),
            steps: vec![
                // T = 333_333 µs: all 3 tokens are back 1 µs before the second is over.
                step(T0, take(3), allow(0, 333_333)),
                step(T0 + 999_999, take(3), allow(0, 333_333)),
            ],
        },
        Case {
            // Capacity 4, a token every 500 ms: 3 taken, then 4 more leave a debt of 3,
            // paid back by 1.5 s of refill before the next token.
            name: name("overshoot_counts_a_charge_past_the_allowance_as_a_debt"),
            limit: overshoot(with_burst(4, rate(2, Unit::Second))),
            steps: vec![
                step(T0, take(3), allow(1, 500_000)),
                step(T0 + 100, take(4), reject(0, 1_999_900)),
                step(T0 + 100, take(0), reject(0, 1_999_900)),
                step(T0 + 1_500_000, take(0), allow(0, 500_000)),
                step(T0 + 2_000_000, take(1), allow(0, 500_000)),
            ],
        },
        Case {
            name: name("unit_multiplier_stretches_the_window"),
            limit: times(2, rate(4, Unit::Minute)),
            steps: vec![
                step(T0, take(4), allow(0, 30 * SECOND)),
                step(T0 + 30 * SECOND - 1, take(1), reject(0, 1)),
                step(T0 + 30 * SECOND, take(1), allow(0, 30 * SECOND)),
            ],
        },
    ]
}

/// A limit of 0 rejects whatever costs something, without counting; checks and give-backs
/// pass. Nothing ever comes back, so reset is one window.
/// The tally within one window of its first hit (a test-supplied clock cannot reach Redis'
/// expiry: `tests/lua_contract.rs` waits it out in real time).
fn tally() -> Vec<Case> {
    let tally = times(15, limit(Algorithm::Tally, 100, Unit::Second));
    let window = 15 * SECOND;
    vec![case(
        "tally_counts_every_hit_as_one_sum_across_epoch_windows",
        tally,
        vec![
            step(T0 + 3 * SECOND, take(0), allow(100, window)),
            step(T0 + 3 * SECOND, take(30), allow(70, window)),
            // Past the limit, counted; and past T0 + 15 s, an epoch multiple of the window:
            // the same sum (it started at T0 + 3 s).
            step(T0 + 14 * SECOND, take(80), reject(0, window)),
            step(T0 + 15 * SECOND, take(0), reject(0, window)),
            step(T0 + 16 * SECOND, give(50), allow(40, window)),
            step(T0 + 16 * SECOND, give(500), allow(100, window)),
            step(T0 + 17 * SECOND, take(5), allow(95, window)),
        ],
    )]
}

fn zero_requests_per_unit(algorithm: Algorithm) -> Case {
    Case {
        name: format!(
            "{}_zero_requests_per_unit_rejects_every_hit",
            algorithm.name()
        ),
        limit: limit(algorithm, 0, Unit::Second),
        steps: vec![
            step(T0, take(1), reject(0, SECOND)),
            step(T0, take(0), allow(0, SECOND)),
            step(T0 + 1, give(1), allow(0, SECOND)),
            step(T0 + 2, take(1), reject(0, SECOND)),
        ],
    }
}

fn case(name: &str, limit: Limit, steps: Vec<Step>) -> Case {
    Case {
        name: name.to_owned(),
        limit,
        steps,
    }
}

fn limit(algorithm: Algorithm, requests_per_unit: u32, unit: Unit) -> Limit {
    Limit {
        algorithm,
        ..Limit::per(requests_per_unit, unit)
    }
}

fn overshoot(limit: Limit) -> Limit {
    Limit {
        overshoot: true,
        ..limit
    }
}

fn times(unit_multiplier: u32, limit: Limit) -> Limit {
    Limit {
        unit_multiplier,
        ..limit
    }
}

fn in_paris(limit: Limit) -> Limit {
    let paris = Timezone::parse("Europe/Paris").expect("Europe/Paris is in every tz database");
    Limit {
        timezone: Some(paris),
        ..limit
    }
}

fn step(at_micros: u64, hits: Hits, expect: Decision) -> Step {
    Step {
        at_micros,
        hits,
        expect,
    }
}

fn take(amount: u64) -> Hits {
    Hits::take(amount)
}

fn give(amount: u64) -> Hits {
    Hits::give_back(amount)
}

fn allow(remaining: u64, reset_micros: u64) -> Decision {
    Decision {
        allowed: true,
        remaining,
        reset_micros,
    }
}

fn reject(remaining: u64, reset_micros: u64) -> Decision {
    Decision {
        allowed: false,
        remaining,
        reset_micros,
    }
}
