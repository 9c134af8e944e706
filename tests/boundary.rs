//! What each algorithm admits at its edges, through the real Lua scripts on a real
//! `redis-server`, at instants the test chooses (`ScriptClock::Fixed`):
//!
//! - `fixed_window` admits `L` per window, and exactly `2L` across a boundary;
//! - `sliding_log` never admits more than `L` in any window of length `W`;
//! - `sliding_window` stays within the error bound of docs/algorithms.md, and reaches it;
//! - `token_bucket` and `gcra` never admit more than `B + ⌊elapsed / T⌋` in any interval.
//!
//! Arrivals are seeded random (dense: most hits are rejected); a failure names the seed.
//!
//! **Fixed instants, real TTLs.** A script given a fixed instant decides with it, but the TTL
//! it sets (`expires_at − now`) runs on Redis' real clock. A state written 1 µs before its
//! expiry lives 1 ms, and can die while the rest of a burst at that same instant is still
//! on its way, handing out a fresh counter: a fixed window of 100 per hour admitted 122
//! hits in its last microsecond that way, something Redis' own clock, which runs TTLs and
//! windows alike, never does. (Redis 7 takes a fresh time snapshot for every script, even
//! inside MULTI/EXEC, and libfaketime cannot freeze a jemalloc `redis-server`.) So every
//! state written here must outlive its history in real time: windows and token intervals
//! are at least [`SAFE_TTL`], fixed-window arrivals stay out of the last [`SAFE_TTL`] of
//! their window, every history is checked for real time running that far ahead of its
//! instants, and the one test that hits the last microsecond is built so that an early
//! expiry cannot change its outcome.

mod redis_harness;

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use floodgate::backend::redis::script::{RedisHit, ScriptClock, Scripts, add_call, decision};
use floodgate::limiter::{Algorithm, CounterKey, Hits, Limit, SECOND_MICROS, Unit};
use redis_harness::RedisServer;

/// 2023-11-15T00:00:00Z: a whole number of days, so every window here starts on it.
const T0: u64 = 1_700_006_400 * SECOND_MICROS;
/// Random histories per property.
const SEEDS: u64 = 30;
/// The shortest life, in µs of the test's instants, of any state the histories write; so
/// also the most real time may run ahead of those instants (see the module comment).
const SAFE_TTL: u64 = SECOND_MICROS;
/// Script calls per pipeline.
const BATCH: usize = 500;

/// A hit of `cost` units at `at` µs.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: u64,
    cost: u64,
}

/// A redis-server with the scripts loaded, and a fresh counter key per history.
struct Lua {
    _server: RedisServer,
    connection: redis::aio::MultiplexedConnection,
    scripts: Scripts,
    keys: u64,
}

impl Lua {
    async fn start() -> Lua {
        let server = RedisServer::start();
        let mut connection = server.connection().await;
        let scripts = Scripts::new();
        for script in scripts.all() {
            script
                .load_async(&mut connection)
                .await
                .expect("SCRIPT LOAD succeeds");
        }
        Lua {
            _server: server,
            connection,
            scripts,
            keys: 0,
        }
    }

    /// Sends `arrivals` (in time order) to a new counter of `limit`, pipelined, each at its
    /// own instant; returns the admitted ones.
    async fn admitted(&mut self, limit: &Limit, arrivals: &[Arrival]) -> Vec<Arrival> {
        self.keys += 1;
        let key = CounterKey::new("boundary", &self.keys.to_string(), 0, limit, []);
        let mut admitted = Vec::new();
        let mut pipelines = Vec::new();
        for chunk in arrivals.chunks(BATCH) {
            let sent = Instant::now();
            let mut pipe = redis::pipe();
            for arrival in chunk {
                let hit = RedisHit {
                    key: key.as_str().to_owned(),
                    limit: limit.clone(),
                    hits: Hits::take(arrival.cost),
                    binding: true,
                };
                let clock = ScriptClock::Fixed(arrival.at);
                add_call(&mut pipe, &self.scripts, &hit, clock, None, arrival.at);
            }
            let replies: Vec<redis::Value> = pipe
                .query_async(&mut self.connection)
                .await
                .expect("EVALSHA pipeline");
            for (arrival, reply) in chunk.iter().zip(&replies) {
                let decision = decision(reply).unwrap_or_else(|e| panic!("{arrival:?}: {e}"));
                if decision.allowed {
                    admitted.push(*arrival);
                }
            }
            pipelines.push(Pipeline {
                sent,
                received: Instant::now(),
                first: chunk[0].at,
                last: chunk[chunk.len() - 1].at,
            });
        }
        assert_no_state_died_early(&pipelines);
        admitted
    }
}

/// When one pipeline of a history went and came back, and the instants of its calls.
struct Pipeline {
    sent: Instant,
    received: Instant,
    first: u64,
    last: u64,
}

/// A state written at instant `t` expires at `t + life`, `life ≥ SAFE_TTL`, after `life` µs
/// of real time. A later call at instant `u < t + life` finds it gone only if more than
/// `life > max(SAFE_TTL, u − t)` µs of real time passed in between. Checks, for every pair of
/// pipelines, that real time never ran that far ahead of the instants.
fn assert_no_state_died_early(pipelines: &[Pipeline]) {
    for (i, earlier) in pipelines.iter().enumerate() {
        for later in &pipelines[i..] {
            let real = later.received.duration_since(earlier.sent);
            let fixed = later.first.saturating_sub(earlier.last);
            assert!(
                real <= Duration::from_micros(SAFE_TTL.max(fixed)),
                "{real:?} of real time between calls {fixed} µs apart: a state may have \
                 expired in real time before its instant (a loaded machine?)"
            );
        }
    }
}

/// `count` hits of cost 1 at `at`.
fn burst(at: u64, count: u64) -> impl Iterator<Item = Arrival> {
    (0..count).map(move |_| Arrival { at, cost: 1 })
}

/// Dense random traffic over `[start, start + horizon)`: about `8 × expected` units, half
/// spread uniformly, half in bursts of up to `2 × quota` hits at one instant, so that most
/// hits are rejected and every counter is pushed to its limit again and again. Costs are 1,
/// and 2 or 3 when `costly`.
fn dense(
    rng: &mut fastrand::Rng,
    start: u64,
    horizon: u64,
    quota: u64,
    expected: u64,
    costly: bool,
) -> Vec<Arrival> {
    let mut arrivals = Vec::new();
    let cost = |rng: &mut fastrand::Rng| {
        if costly && rng.u8(..5) == 0 {
            rng.u64(2..=3)
        } else {
            1
        }
    };
    for _ in 0..4 * expected {
        let at = start + rng.u64(0..horizon);
        arrivals.push(Arrival {
            at,
            cost: cost(rng),
        });
    }
    let mut in_bursts = 0;
    while in_bursts < 4 * expected {
        let at = start + rng.u64(0..horizon);
        for _ in 0..rng.u64(1..=2 * quota) {
            let cost = cost(rng);
            arrivals.push(Arrival { at, cost });
            in_bursts += cost;
        }
    }
    arrivals.sort_by_key(|arrival| arrival.at);
    arrivals
}

fn units(arrivals: &[Arrival]) -> u64 {
    arrivals.iter().map(|arrival| arrival.cost).sum()
}

/// A random limit of `algorithm`, 1 to 30 per window, whose states all live at least
/// [`SAFE_TTL`]: windows of a minute or more for `fixed_window` (whose arrivals also keep out
/// of the last second), of a second or more for the sliding algorithms, and for the buckets
/// token intervals of two seconds or more, with a burst of their own half of the time.
fn random_limit(rng: &mut fastrand::Rng, algorithm: Algorithm) -> Limit {
    let (unit, unit_multiplier) = match (algorithm, rng.bool()) {
        (Algorithm::SlidingLog | Algorithm::SlidingWindow, true) => (Unit::Second, rng.u32(1..=3)),
        (_, true) => (Unit::Minute, rng.u32(1..=3)),
        (_, false) => (Unit::Hour, 1),
    };
    let bucket = matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
    let limit = Limit {
        algorithm,
        unit_multiplier,
        burst: (bucket && rng.bool()).then(|| rng.u32(1..=40)),
        ..Limit::per(rng.u32(1..=30), unit)
    };
    assert!(limit.window_micros() >= SAFE_TTL);
    assert!(!bucket || limit.token_interval_micros() >= SAFE_TTL);
    limit
}

#[tokio::test]
async fn fixed_window_admits_exactly_twice_the_limit_across_a_boundary() {
    let mut lua = Lua::start().await;
    for requests_per_unit in [1, 7, 100] {
        let limit = Limit::per(requests_per_unit, Unit::Hour);
        let (l, w) = (u64::from(requests_per_unit), limit.window_micros());
        let boundary = T0 + 10 * w;
        let count = |admitted: &[Arrival], at: u64| -> u64 {
            units(
                &admitted
                    .iter()
                    .copied()
                    .filter(|a| a.at == at)
                    .collect::<Vec<_>>(),
            )
        };

        // 3L hits a second before a window ends, 3L as the next begins, 3L a second before
        // that one ends: L, L and none.
        let arrivals: Vec<Arrival> = burst(boundary - SAFE_TTL, 3 * l)
            .chain(burst(boundary, 3 * l))
            .chain(burst(boundary + w - SAFE_TTL, 3 * l))
            .collect();
        let admitted = lua.admitted(&limit, &arrivals).await;
        assert_eq!(
            [boundary - SAFE_TTL, boundary, boundary + w - SAFE_TTL].map(|at| count(&admitted, at)),
            [l, l, 0],
            "{limit:?}: L at the end of a window, L at the start of the next, no more in it"
        );

        // The last microsecond: L hits there all pass (if their 1 ms TTL fires between two
        // of them, the next still finds room, so the outcome is the same), and 3L in the
        // first microsecond of the next window admit L more: 2L within 2 µs.
        let arrivals: Vec<Arrival> = burst(boundary - 1, l)
            .chain(burst(boundary, 3 * l))
            .collect();
        let admitted = lua.admitted(&limit, &arrivals).await;
        assert_eq!(
            [boundary - 1, boundary].map(|at| count(&admitted, at)),
            [l, l],
            "{limit:?}: L in the last µs of a window, L in the first µs of the next"
        );
    }
}

#[tokio::test]
async fn fixed_window_admits_the_limit_per_window_and_at_most_twice_it_in_any_window() {
    let mut lua = Lua::start().await;
    for seed in 0..SEEDS {
        let mut rng = fastrand::Rng::with_seed(seed);
        let limit = random_limit(&mut rng, Algorithm::FixedWindow);
        let (l, w) = (u64::from(limit.requests_per_unit), limit.window_micros());
        let mut arrivals = dense(&mut rng, T0, 6 * w, l, 6 * l, false);
        arrivals.retain(|a| w - a.at % w > SAFE_TTL);
        let admitted = lua.admitted(&limit, &arrivals).await;
        for window in 0..6 {
            let start = T0 + window * w;
            let inside = |a: &&Arrival| (start..start + w).contains(&a.at);
            let offered = arrivals.iter().filter(inside).count() as u64;
            let taken = admitted.iter().filter(inside).count() as u64;
            assert_eq!(
                taken,
                offered.min(l),
                "seed {seed}, {limit:?}, window {window}: the first L hits pass, no more"
            );
        }
        let most = most_in_any_window(&admitted, w);
        assert!(
            most <= 2 * l,
            "seed {seed}, {limit:?}: {most} in one window of length W"
        );
    }
}

/// The most units `admitted` (in time order) holds in any window `[t, t + W)`.
fn most_in_any_window(admitted: &[Arrival], w: u64) -> u64 {
    let mut most = 0;
    let mut end = 0;
    let mut inside = 0;
    for (start, first) in admitted.iter().enumerate() {
        while end < admitted.len() && admitted[end].at < first.at + w {
            inside += admitted[end].cost;
            end += 1;
        }
        most = most.max(inside);
        // The next window starts at the next arrival: this one leaves.
        inside -= admitted[start].cost;
    }
    most
}

#[tokio::test]
async fn sliding_log_never_admits_more_than_the_limit_in_any_window() {
    let mut lua = Lua::start().await;
    for seed in 0..SEEDS {
        let mut rng = fastrand::Rng::with_seed(seed);
        let limit = random_limit(&mut rng, Algorithm::SlidingLog);
        let (l, w) = (u64::from(limit.requests_per_unit), limit.window_micros());
        let start = T0 + rng.u64(0..w);
        let arrivals = dense(&mut rng, start, 6 * w, l, 6 * l, true);
        let admitted = lua.admitted(&limit, &arrivals).await;
        // Windows [t, t + W) starting at an admitted hit hold the most: any other window
        // holds a subset of the one starting at its first admitted hit.
        let most = most_in_any_window(&admitted, w);
        assert_eq!(
            most,
            l,
            "seed {seed}, {limit:?}: the fullest window of length W holds {most} units \
             ({} of {} offered admitted)",
            units(&admitted),
            units(&arrivals)
        );
    }
}

/// The bound of docs/algorithms.md for a window `(t − W, t]` whose end `t` lies `e` µs into
/// its fixed window, when the previous fixed window counted `prev`: `L + prev − share(e)`,
/// with `share` computed as the algorithm computes it.
fn sliding_window_bound(l: u64, prev: u64, e: u64, w: u64) -> u64 {
    let share = (prev as f64 * ((w - e) as f64 / w as f64)).floor() as u64;
    l + prev - share
}

/// For every window `(t − W, t]` ending at an admitted hit (the fullest windows end at one),
/// checks the documented bound; returns the most any window holds, and how many windows
/// hold exactly their bound while it is above `L`.
fn check_sliding_window(seed: u64, limit: &Limit, admitted: &[Arrival]) -> (u64, usize) {
    let (l, w) = (u64::from(limit.requests_per_unit), limit.window_micros());
    let units_in = |from: u64, to: u64| -> u64 {
        let lo = admitted.partition_point(|a| a.at < from);
        let hi = admitted.partition_point(|a| a.at < to);
        units(&admitted[lo..hi])
    };
    let mut most = 0;
    let mut at_bound = 0;
    for arrival in admitted {
        let t = arrival.at;
        let start = t - t % w;
        let prev = units_in(start.saturating_sub(w), start);
        let holds = units_in(t + 1 - w, t + 1);
        let bound = sliding_window_bound(l, prev, t - start, w);
        assert!(
            holds <= bound && bound <= 2 * l,
            "seed {seed}, {limit:?}: the window ending at {t} ({} µs into its fixed window, \
             previous window {prev}) holds {holds}, bound {bound}, 2L = {}",
            t - start,
            2 * l
        );
        most = most.max(holds);
        if holds == bound && bound > l {
            at_bound += 1;
        }
    }
    (most, at_bound)
}

/// Histories, and fixed windows per history, of the sliding-window bound test.
const SLIDING_SEEDS: u64 = 12;
const SLIDING_WINDOWS: u64 = 100;

#[tokio::test]
async fn sliding_window_stays_within_its_documented_error_bound_and_reaches_it() {
    let mut lua = Lua::start().await;
    // The fullest window of any history, as (units, L, seed).
    let mut worst = (0, 1, 0);
    for seed in 0..SLIDING_SEEDS {
        let mut rng = fastrand::Rng::with_seed(seed);
        let limit = Limit {
            algorithm: Algorithm::SlidingWindow,
            ..Limit::per(rng.u32(20..=40), Unit::Second)
        };
        let (l, w) = (u64::from(limit.requests_per_unit), limit.window_micros());
        // One to three bursts of up to 2L hits per window at uniformly random instants. The
        // worst case needs a burst late in one window, then one a little earlier in the
        // next, when the first still weighs little: the fullest window of each of these
        // histories holds 1.69 L to 1.92 L.
        let mut arrivals = Vec::new();
        for window in 0..SLIDING_WINDOWS {
            for _ in 0..rng.u64(1..=3) {
                let at = T0 + window * w + rng.u64(0..w);
                arrivals.extend(burst(at, rng.u64(1..=2 * l)));
            }
        }
        arrivals.sort_by_key(|arrival| arrival.at);
        let admitted = lua.admitted(&limit, &arrivals).await;
        let (most, at_bound) = check_sliding_window(seed, &limit, &admitted);
        assert!(
            at_bound > 0,
            "seed {seed}, {limit:?}: no window above L reaches its bound L + prev − share(e)"
        );
        if most * worst.1 > worst.0 * l {
            worst = (most, l, seed);
        }
    }
    let (most, l, seed) = worst;
    eprintln!(
        "sliding_window: the fullest window of length W held {most} with L = {l}: {:.3} L, \
         bound 2L (seed {seed})",
        most as f64 / l as f64
    );
    // Measured: 1.92 L. Within 10 % of 2L shows the bound is the right one, not merely a
    // safe one, without depending on the exact seeds.
    assert!(
        most * 10 >= 2 * l * 9,
        "random bursts never came within 10 % of 2L: at most {most} with L = {l}"
    );
}

#[tokio::test]
async fn sliding_window_admits_twice_the_limit_when_hits_bunch_at_window_ends() {
    let mut lua = Lua::start().await;
    let limit = Limit {
        algorithm: Algorithm::SlidingWindow,
        ..Limit::per(10, Unit::Second)
    };
    let (l, w) = (u64::from(limit.requests_per_unit), limit.window_micros());
    let start = T0 + 5 * w;
    // L in the last µs of one window; then, 2 µs before the next window ends, the previous
    // window weighs floor(L × 2/W) = 0: L more pass, W − 1 µs after the first L.
    let arrivals: Vec<Arrival> = burst(start - 1, 2 * l)
        .chain(burst(start + w - 2, 2 * l))
        .collect();
    let admitted = lua.admitted(&limit, &arrivals).await;
    assert_eq!(units(&admitted), 2 * l);
    assert_eq!(check_sliding_window(0, &limit, &admitted).0, 2 * l);
}

/// For every interval `[a, b]` between two admitted hits, checks that it holds at most
/// `B + ⌊(b − a) / T⌋` units, and that some interval holds exactly that.
///
/// The bound: at `a` the bucket holds at most `B` tokens. If it is full, its interval
/// restarts at `a` and `⌊(b − a)/T⌋` tokens come back by `b`; if not, at most `B − 1` are
/// there and at most `⌈(b − a)/T⌉ ≤ ⌊(b − a)/T⌋ + 1` come back. `T` is the truncated
/// interval (`Limit::token_interval_micros`), so the rate is `1/T`, at least `L/W`.
fn check_bucket(seed: u64, limit: &Limit, admitted: &[Arrival]) {
    let (b, t) = (limit.capacity(), limit.token_interval_micros());
    let mut groups: Vec<(u64, u64)> = Vec::new();
    for arrival in admitted {
        match groups.last_mut() {
            Some((at, units)) if *at == arrival.at => *units += arrival.cost,
            _ => groups.push((arrival.at, arrival.cost)),
        }
    }
    let mut tightest = i64::MIN;
    for (i, &(from, _)) in groups.iter().enumerate() {
        let mut held = 0;
        for &(to, units) in &groups[i..] {
            held += units;
            let bound = b + (to - from) / t;
            assert!(
                held <= bound,
                "seed {seed}, {limit:?}: [{from}, {to}] holds {held} units, bound {bound}"
            );
            tightest = tightest.max(held as i64 - bound as i64);
        }
    }
    assert_eq!(
        tightest, 0,
        "seed {seed}, {limit:?}: no interval reaches the bound"
    );
}

async fn assert_bucket_bound(algorithm: Algorithm) {
    let mut lua = Lua::start().await;
    for seed in 0..SEEDS {
        let mut rng = fastrand::Rng::with_seed(seed);
        let limit = random_limit(&mut rng, algorithm);
        let (b, t) = (limit.capacity(), limit.token_interval_micros());
        // Long enough for the bucket to empty and refill several times.
        let horizon = 4 * limit.window_micros() + 3 * b * t;
        let expected = b + horizon / t;
        let start = T0 + rng.u64(0..t);
        let arrivals = dense(&mut rng, start, horizon, b, expected, true);
        let admitted = lua.admitted(&limit, &arrivals).await;
        check_bucket(seed, &limit, &admitted);
    }
}

#[tokio::test]
async fn token_bucket_never_admits_more_than_burst_plus_rate_times_elapsed() {
    assert_bucket_bound(Algorithm::TokenBucket).await;
}

#[tokio::test]
async fn gcra_never_admits_more_than_burst_plus_rate_times_elapsed() {
    assert_bucket_bound(Algorithm::Gcra).await;
}
