//! The Lua scripts and their Rust twins decide alike: seeded random histories of hits go
//! through both `floodgate::limiter::Counter` and the script on a real `redis-server`, and
//! every step must get the same Decision. A failure names the algorithm, the seed and the
//! step, so `history(algorithm, seed)` replays it.

mod lua_support;
mod redis_harness;

use floodgate::backend::redis::script::Scripts;
use floodgate::limiter::{
    Algorithm, Counter, CounterKey, Hits, Limit, MAX_HITS, SECOND_MICROS, Timezone, Unit,
};
use redis_harness::RedisServer;

/// Histories per algorithm, and hits per history.
const SEEDS: u64 = 40;
const STEPS: usize = 250;

/// 2023-11-15T00:00:00Z.
const T0: u64 = 1_700_006_400 * SECOND_MICROS;
/// 2024-03-30T12:00:00+01:00, half a day before Paris moves to summer time.
const PARIS_BEFORE_DST: u64 = 1_711_796_400 * SECOND_MICROS;

#[tokio::test]
async fn fixed_window_lua_decides_like_rust() {
    assert_twins_agree(Algorithm::FixedWindow).await;
}

#[tokio::test]
async fn sliding_window_lua_decides_like_rust() {
    assert_twins_agree(Algorithm::SlidingWindow).await;
}

#[tokio::test]
async fn sliding_log_lua_decides_like_rust() {
    assert_twins_agree(Algorithm::SlidingLog).await;
}

#[tokio::test]
async fn token_bucket_lua_decides_like_rust() {
    assert_twins_agree(Algorithm::TokenBucket).await;
}

#[tokio::test]
async fn gcra_lua_decides_like_rust() {
    assert_twins_agree(Algorithm::Gcra).await;
}

#[tokio::test]
async fn tally_lua_decides_like_rust() {
    assert_twins_agree(Algorithm::Tally).await;
}

/// One random limit and the hits it receives.
struct History {
    limit: Limit,
    hits: Vec<(u64, Hits)>,
}

async fn assert_twins_agree(algorithm: Algorithm) {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let scripts = Scripts::new();
    lua_support::load(&mut connection, &scripts).await;
    for seed in 0..SEEDS {
        let history = history(algorithm, seed);
        let key = CounterKey::new("differential", &seed.to_string(), 0, &history.limit, []);
        let mut counter = Counter::new();
        for (step, &(now, hits)) in history.hits.iter().enumerate() {
            let rust = counter.hit(&history.limit, now, hits);
            let lua = lua_support::hit(
                &mut connection,
                &scripts,
                key.as_str(),
                &history.limit,
                hits,
                now,
            )
            .await;
            assert_eq!(
                lua.as_ref(),
                Ok(&rust),
                "{} seed {seed} step {step}: {hits:?} at {now} on {:?}",
                algorithm.name(),
                history.limit
            );
        }
    }
}

/// The history of `seed`: a limit (burst different from the rate, unit multipliers, a
/// calendar window now and then) and hits whose times advance by random amounts, zero
/// included, across window boundaries.
///
/// Time never steps back here (and a tally's history stays within one window). The twins agree on a state's meaning only from the instant
/// it is written: Redis drops a state once it has expired (`DEL`, or its TTL) where a bare
/// `Counter` keeps it, and the two differ only if the clock later steps back before that
/// expiry.
fn history(algorithm: Algorithm, seed: u64) -> History {
    let mut rng = fastrand::Rng::with_seed(seed);
    let limit = random_limit(&mut rng, algorithm);
    let window = limit.window_micros();
    let interval = limit.token_interval_micros();
    let mut now = match limit.timezone {
        Some(_) => PARIS_BEFORE_DST + rng.u64(0..window),
        None => T0 + rng.u64(0..3 * window),
    };
    let quota = u64::from(limit.requests_per_unit.max(limit.burst.unwrap_or(0)));
    let hits = (0..STEPS)
        .map(|_| {
            now += match rng.u32(0..20) {
                // A tally ends by Redis' expiry, which the supplied clock never reaches: its
                // history stays within one window (`tests/lua_contract.rs` waits one out).
                _ if algorithm == Algorithm::Tally => rng.u64(0..=window / STEPS as u64),
                0..=3 => 0,
                4..=7 => rng.u64(1..=1_000),
                8..=11 => rng.u64(0..=2 * interval),
                12..=15 => rng.u64(0..=2 * window),
                // Exactly onto the edges: a whole interval or window later, or the next
                // epoch-aligned boundary.
                16 => interval,
                17 => window,
                _ => window - now % window,
            };
            let amount = if rng.u32(0..50) == 0 {
                MAX_HITS
            } else {
                rng.u64(0..=quota + 2)
            };
            let hits = if rng.u32(0..6) == 0 {
                Hits::give_back(amount)
            } else {
                Hits::take(amount)
            };
            (now, hits)
        })
        .collect();
    History { limit, hits }
}

fn random_limit(rng: &mut fastrand::Rng, algorithm: Algorithm) -> Limit {
    let requests_per_unit = if rng.u32(0..15) == 0 {
        0
    } else {
        rng.u32(1..=12)
    };
    let bucket = matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra);
    // A third of the limits count every charge in full.
    let overshoot = rng.u32(0..3) == 0;
    if algorithm == Algorithm::FixedWindow && rng.u32(0..3) == 0 {
        let paris = Timezone::parse("Europe/Paris").expect("Europe/Paris is in every tz database");
        return Limit {
            algorithm,
            timezone: Some(paris),
            overshoot,
            ..Limit::per(requests_per_unit, Unit::Day)
        };
    }
    Limit {
        algorithm,
        overshoot,
        unit: if rng.bool() {
            Unit::Second
        } else {
            Unit::Minute
        },
        unit_multiplier: rng.u32(1..=3),
        burst: (bucket && rng.bool()).then(|| rng.u32(1..=20)),
        ..Limit::per(requests_per_unit, Unit::Second)
    }
}
