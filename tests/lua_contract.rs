//! What `lua/README.md` promises beyond the decisions, checked on a real `redis-server`: every
//! key dies just after its state's useful life, hits that change nothing leave every key as
//! it was (and write nothing, but for a fixed window's rejection, which takes and gives back), the
//! scripts read Redis' clock and pick the calendar window of Redis' now, a flushed script
//! cache answers NOSCRIPT, an all-or-nothing call that is rejected leaves every key as it
//! was, byte for byte and with its expiry, a batch of many requests' hits decides each
//! exactly as separate calls in the same order would, and a call that runs past its deadline
//! decides nothing and writes nothing.

mod lua_support;
mod redis_harness;

use deadpool_redis::redis;
use floodgate::backend::redis::script::{
    Answer, Group, Mode, RanAt, RedisHit, ScriptClock, Scripts, add_call, log_keys, state_keys,
};
use floodgate::limiter::{
    Algorithm, Counter, CounterKey, Decision, Hits, Limit, MAX_HITS, SECOND_MICROS, Timezone, Unit,
};
use redis::aio::MultiplexedConnection;
use redis_harness::RedisServer;

/// 2023-11-15T00:00:00+01:00: local midnight in Paris.
const PARIS_NOV_15: u64 = 1_700_002_800 * SECOND_MICROS;
const DAY: u64 = 86_400 * SECOND_MICROS;
/// What the scripts add to a TTL when the caller supplies the time (lua/prelude.lua).
const SUPPLIED_CLOCK_SLACK_MS: i64 = 60_000;

/// Real time that may pass between a write and the PTTL that reads it, in milliseconds.
const SLACK_MS: i64 = 2_000;

/// A limit of 5 per second with a burst of 8 (used by token_bucket and gcra only).
fn limit(algorithm: Algorithm) -> Limit {
    Limit {
        algorithm,
        burst: Some(8),
        ..Limit::per(5, Unit::Second)
    }
}

fn counter_key(test: &str, limit: &Limit) -> CounterKey {
    CounterKey::new("lua-contract", test, 0, limit, [])
}

/// Every key a script may write for the counter `key` on a hit at `now`.
fn keys_of(key: &CounterKey, limit: &Limit, now: u64) -> Vec<String> {
    state_keys(key.as_str(), limit, now)
}

async fn start() -> (RedisServer, MultiplexedConnection, Scripts) {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let scripts = Scripts::new();
    lua_support::load(&mut connection, &scripts).await;
    (server, connection, scripts)
}

async fn pttl(connection: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(connection)
        .await
        .expect("PTTL")
}

/// How many writes the server has applied: INFO's `rdb_changes_since_last_save`, which
/// never resets with `--save ""`.
async fn writes(connection: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(connection)
        .await
        .expect("INFO persistence");
    info.lines()
        .find_map(|line| line.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("INFO persistence reports rdb_changes_since_last_save")
}

#[tokio::test]
async fn every_written_key_expires_just_after_its_state_stops_mattering() {
    let (_server, mut connection, scripts) = start().await;
    let now = 1_700_006_400 * SECOND_MICROS + 123_456;
    let history = [
        Hits::take(1),
        Hits::take(2),
        Hits::give_back(1),
        Hits::take(0),
        Hits::give_back(100),
        Hits::take(3),
    ];
    for algorithm in Algorithm::COUNTED {
        let limit = limit(algorithm);
        let key = counter_key("ttl", &limit);
        let mut counter = Counter::new();
        for (step, hits) in history.into_iter().enumerate() {
            counter.hit(&limit, now, hits);
            lua_support::hit(&mut connection, &scripts, key.as_str(), &limit, hits, now)
                .await
                .expect("a decision");
            // All hits are at one instant, so the TTL set by the last write is the state's
            // useful life from now, rounded up to the millisecond.
            let life_ms = counter.expires_at().saturating_sub(now).div_ceil(1_000);
            for name in keys_of(&key, &limit, now) {
                let ttl = pttl(&mut connection, &name).await;
                let at = format!("{} step {step} ({hits:?}): {name}", algorithm.name());
                if life_ms == 0 {
                    assert_eq!(ttl, -2, "{at}: no state, so no key");
                } else {
                    // A test-supplied clock gets a minute of slack (lua/prelude.lua).
                    let life_ms =
                        i64::try_from(life_ms).expect("a short life") + SUPPLIED_CLOCK_SLACK_MS;
                    assert!(
                        ttl > 0 && ttl <= life_ms && ttl > life_ms - SLACK_MS,
                        "{at}: PTTL {ttl} ms, state useful for {life_ms} ms"
                    );
                }
            }
        }
    }
}

#[tokio::test]
async fn a_check_on_a_new_counter_creates_no_key() {
    let (_server, mut connection, scripts) = start().await;
    for algorithm in Algorithm::COUNTED {
        let limit = limit(algorithm);
        let key = counter_key("check", &limit);
        let decision = lua_support::hit(
            &mut connection,
            &scripts,
            key.as_str(),
            &limit,
            Hits::take(0),
            PARIS_NOV_15,
        )
        .await
        .expect("a decision");
        assert!(decision.allowed, "{}", algorithm.name());
        for name in keys_of(&key, &limit, PARIS_NOV_15) {
            assert_eq!(pttl(&mut connection, &name).await, -2, "{name} exists");
        }
    }
}

#[tokio::test]
async fn a_hit_that_changes_nothing_writes_nothing() {
    let (_server, mut connection, scripts) = start().await;
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        let key = counter_key("unchanged", &limit);
        let now = PARIS_NOV_15;
        let before = writes(&mut connection).await;
        lua_support::hit(
            &mut connection,
            &scripts,
            key.as_str(),
            &limit,
            Hits::take(2),
            now,
        )
        .await
        .expect("a decision");
        let counted = writes(&mut connection).await;
        assert!(
            counted > before,
            "{}: a counted hit writes",
            algorithm.name()
        );
        let keys = state_keys(key.as_str(), &limit, now + 1);
        let state = snapshot(&mut connection, &keys).await;
        for hits in [Hits::take(0), Hits::take(1_000), Hits::give_back(0)] {
            let writes_before = writes(&mut connection).await;
            lua_support::hit(
                &mut connection,
                &scripts,
                key.as_str(),
                &limit,
                hits,
                now + 1,
            )
            .await
            .expect("a decision");
            let wrote = writes(&mut connection).await - writes_before;
            if takes_first(algorithm, hits) {
                assert_eq!(
                    wrote,
                    2,
                    "{}: {hits:?} takes and gives back",
                    algorithm.name()
                );
            } else {
                assert_eq!(wrote, 0, "{}: {hits:?} wrote", algorithm.name());
            }
            assert_eq!(
                snapshot(&mut connection, &keys).await,
                state,
                "{}: {hits:?} changed the state",
                algorithm.name()
            );
        }
        let fresh = counter_key("unchanged-new", &limit);
        let writes_before = writes(&mut connection).await;
        lua_support::hit(
            &mut connection,
            &scripts,
            fresh.as_str(),
            &limit,
            Hits::take(1_000),
            now,
        )
        .await
        .expect("a decision");
        let wrote = writes(&mut connection).await - writes_before;
        let expected = if takes_first(algorithm, Hits::take(1_000)) {
            2
        } else {
            0
        };
        assert_eq!(
            wrote,
            expected,
            "{}: a rejection on a new counter",
            algorithm.name()
        );
        for name in state_keys(fresh.as_str(), &limit, now) {
            assert_eq!(pttl(&mut connection, &name).await, -2, "{name} exists");
        }
    }
}

/// Whether `hits` on a counter of `algorithm` is decided by taking first (fixed_window's
/// INCRBY, lua/fixed_window.lua), so that a rejection writes and undoes instead of writing
/// nothing.
fn takes_first(algorithm: Algorithm, hits: Hits) -> bool {
    algorithm == Algorithm::FixedWindow && !hits.negative && hits.amount > 0
}

#[tokio::test]
async fn a_sliding_log_keeps_one_member_per_instant_whatever_the_cost() {
    let (_server, mut connection, scripts) = start().await;
    let limit = Limit {
        algorithm: Algorithm::SlidingLog,
        overshoot: true,
        ..Limit::per(1_200, Unit::Minute)
    };
    let key = counter_key("large-cost", &limit);
    let now = PARIS_NOV_15;
    let mut hit = async |hits, at| {
        lua_support::hit(&mut connection, &scripts, key.as_str(), &limit, hits, at)
            .await
            .expect("a decision")
    };
    assert_eq!(hit(Hits::take(1_000), now).await.remaining, 200);
    assert_eq!(hit(Hits::take(MAX_HITS), now).await.remaining, 0);
    assert_eq!(hit(Hits::give_back(700), now + 1).await.remaining, 0);
    let [log, total] = log_keys(key.as_str());
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(&log)
        .arg(0)
        .arg(-1)
        .query_async(&mut connection)
        .await
        .expect("ZRANGE");
    let held = u64::from(u32::MAX) - 700;
    assert_eq!(members, [format!("{now}:{held}")]);
    let total: u64 = redis::cmd("GET")
        .arg(&total)
        .query_async(&mut connection)
        .await
        .expect("GET");
    assert_eq!(total, held);
}

#[tokio::test]
async fn a_sliding_log_whose_total_redis_evicted_counts_its_entries_again() {
    let (_server, mut connection, scripts) = start().await;
    let limit = Limit {
        algorithm: Algorithm::SlidingLog,
        ..Limit::per(10, Unit::Minute)
    };
    let key = counter_key("evicted-total", &limit);
    let now = PARIS_NOV_15;
    let steps = [(Hits::take(3), 7), (Hits::take(4), 3), (Hits::take(0), 3)];
    for (i, (hits, remaining)) in steps.into_iter().enumerate() {
        let at = now + i as u64;
        let decision = lua_support::hit(&mut connection, &scripts, key.as_str(), &limit, hits, at)
            .await
            .expect("a decision");
        assert_eq!(decision.remaining, remaining, "{hits:?}");
    }
    // Under memory pressure Redis may evict one key of the two: the log counts again.
    let [_, total] = log_keys(key.as_str());
    let evicted: i64 = redis::cmd("DEL")
        .arg(&total)
        .query_async(&mut connection)
        .await
        .expect("DEL");
    assert_eq!(evicted, 1);
    for (hits, remaining) in [(Hits::take(0), 3), (Hits::take(1), 2)] {
        let decision = lua_support::hit(
            &mut connection,
            &scripts,
            key.as_str(),
            &limit,
            hits,
            now + 9,
        )
        .await
        .expect("a decision");
        assert_eq!(decision.remaining, remaining, "{hits:?} after the eviction");
    }
}

#[tokio::test]
async fn scripts_read_redis_time_when_no_instant_is_given() {
    let (_server, mut connection, scripts) = start().await;
    for algorithm in Algorithm::COUNTED {
        let limit = limit(algorithm);
        let key = counter_key("redis-time", &limit);
        let local_now = 0; // Only calendar windows read it.
        let decision = lua_support::call(
            &mut connection,
            &scripts,
            key.as_str(),
            &limit,
            Hits::take(1),
            ScriptClock::Redis,
            local_now,
        )
        .await
        .expect("a decision");
        assert!(decision.allowed, "{}", algorithm.name());
        assert!(
            decision.reset_micros > 0 && decision.reset_micros <= 2 * SECOND_MICROS,
            "{}: {decision:?}",
            algorithm.name()
        );
        // The state's key, whatever window Redis' clock put it in.
        let written: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{key}*"))
            .query_async(&mut connection)
            .await
            .expect("KEYS");
        let state = written
            .first()
            .unwrap_or_else(|| panic!("{}: no key in {written:?}", algorithm.name()));
        let ttl = pttl(&mut connection, state).await;
        assert!(ttl > 0 && ttl <= 2_000, "{}: PTTL {ttl}", algorithm.name());
    }
}

#[tokio::test]
async fn a_tally_is_forgotten_one_window_after_its_first_hit_by_redis_clock() {
    // Its expiry is Redis' (a test-supplied clock cannot reach it): waited out in real time.
    let (_server, mut connection, scripts) = start().await;
    let limit = Limit {
        algorithm: Algorithm::Tally,
        ..Limit::per(100, Unit::Second)
    };
    let key = counter_key("tally-expiry", &limit);
    let connection = &mut connection;
    let remaining = async |connection: &mut MultiplexedConnection, hits| {
        let clock = ScriptClock::Redis;
        let call = lua_support::call(connection, &scripts, key.as_str(), &limit, hits, clock, 0);
        call.await.expect("a decision").remaining
    };
    assert_eq!(remaining(connection, Hits::take(30)).await, 70);
    assert_eq!(remaining(connection, Hits::take(20)).await, 50, "one sum");
    let ttl = pttl(connection, key.as_str()).await;
    assert!(
        ttl > 0 && ttl <= 1_000,
        "kept a window from its first hit: PTTL {ttl}"
    );
    // Gone after the window, and read as nothing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pttl(connection, key.as_str()).await != -2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the tally outlived its window"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(remaining(connection, Hits::take(0)).await, 100);
}

#[tokio::test]
async fn a_calendar_window_is_the_one_containing_redis_now_not_the_local_clock() {
    let (_server, mut connection, scripts) = start().await;
    let paris = Timezone::parse("Europe/Paris").expect("Europe/Paris is in every tz database");
    let limit = Limit {
        timezone: Some(paris),
        ..Limit::per(1, Unit::Day)
    };
    let key = counter_key("calendar", &limit);
    let second = SECOND_MICROS;
    // (Redis' now, this process's now, expected decision).
    let steps = [
        // The local clock is already past midnight; Redis' is not: the day before counts.
        (PARIS_NOV_15 - 1, PARIS_NOV_15 + second, (true, 0, 1)),
        // Now Redis is past midnight and the local clock is not: a new day.
        (
            PARIS_NOV_15 + second,
            PARIS_NOV_15 - second,
            (true, 0, DAY - second),
        ),
        (
            PARIS_NOV_15 + 2 * second,
            PARIS_NOV_15 - second,
            (false, 0, DAY - 2 * second),
        ),
    ];
    for (step, (now, local_now, (allowed, remaining, reset_micros))) in
        steps.into_iter().enumerate()
    {
        let decision = lua_support::call(
            &mut connection,
            &scripts,
            key.as_str(),
            &limit,
            Hits::take(1),
            ScriptClock::Fixed(now),
            local_now,
        )
        .await;
        let expected = Decision {
            allowed,
            remaining,
            reset_micros,
        };
        assert_eq!(decision, Ok(expected), "step {step}");
    }
}

#[tokio::test]
async fn a_flushed_script_cache_answers_noscript() {
    let (_server, mut connection, scripts) = start().await;
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .exec_async(&mut connection)
        .await
        .expect("SCRIPT FLUSH");
    let limit = limit(Algorithm::Gcra);
    let mut pipe = redis::pipe();
    let key = counter_key("noscript", &limit);
    let hit = planned(key.as_str(), &limit, Hits::take(1));
    let clock = ScriptClock::Fixed(PARIS_NOV_15);
    add_call(&mut pipe, &scripts, &hit, clock, None, PARIS_NOV_15);
    let error = pipe
        .query_async::<Vec<redis::Value>>(&mut connection)
        .await
        .expect_err("EVALSHA of a flushed script fails");
    assert_eq!(
        error.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
        "{error}"
    );
}

/// The Redis key of the counter `test`.
fn name(test: &str, limit: &Limit) -> String {
    counter_key(test, limit).as_str().to_owned()
}

/// Each key's DUMP (None: no key) and absolute expiry in ms (PEXPIRETIME: unlike PTTL, it
/// does not run down between two snapshots).
async fn snapshot(
    connection: &mut MultiplexedConnection,
    keys: &[String],
) -> Vec<(Option<Vec<u8>>, i64)> {
    let mut states = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(key)
            .query_async(connection)
            .await
            .expect("DUMP");
        let expiry: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(connection)
            .await
            .expect("PEXPIRETIME");
        states.push((dump, expiry));
    }
    states
}

/// One hit at [`PARIS_NOV_15`].
async fn hit_now(
    connection: &mut MultiplexedConnection,
    scripts: &Scripts,
    key: &str,
    limit: &Limit,
    hits: Hits,
) -> Decision {
    lua_support::hit(connection, scripts, key, limit, hits, PARIS_NOV_15)
        .await
        .expect("a decision")
}

/// One hit of an all-or-nothing call, binding.
fn planned(key: &str, limit: &Limit, hits: Hits) -> RedisHit {
    RedisHit {
        key: key.to_owned(),
        limit: limit.clone(),
        hits,
        binding: true,
    }
}

#[tokio::test]
async fn a_rejected_all_or_nothing_call_leaves_every_key_byte_identical_with_its_expiry() {
    let (_server, mut connection, scripts) = start().await;
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        let (a, b) = (name("kept-a", &limit), name("kept-b", &limit));
        hit_now(&mut connection, &scripts, &a, &limit, Hits::take(2)).await;
        hit_now(&mut connection, &scripts, &b, &limit, Hits::take(4)).await;
        let fresh = name("kept-new", &limit);
        let keys: Vec<String> = [&a, &b, &fresh]
            .into_iter()
            .flat_map(|counter| state_keys(counter, &limit, PARIS_NOV_15 + 1_000))
            .collect();
        let before = snapshot(&mut connection, &keys).await;

        let request = [
            planned(&a, &limit, Hits::take(1)),
            planned(&fresh, &limit, Hits::take(1)),
            planned(&a, &limit, Hits::take(1)),
            planned(&b, &limit, Hits::take(6)),
        ];
        let (applied, decisions) =
            lua_support::all_or_nothing(&mut connection, &scripts, &request, PARIS_NOV_15 + 1_000)
                .await
                .expect("a reply");
        let name = algorithm.name();
        assert!(!applied, "{name}");
        let allowed: Vec<bool> = decisions.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, false], "{name}");

        let after = snapshot(&mut connection, &keys).await;
        for ((key, (dump, expiry)), (dump_after, expiry_after)) in
            keys.iter().zip(before).zip(after)
        {
            assert_eq!(dump, dump_after, "{name}: {key} changed");
            assert!(
                (expiry - expiry_after).abs() <= 1,
                "{name}: {key} expiry {expiry} became {expiry_after}"
            );
        }
        let unchanged = hit_now(&mut connection, &scripts, &a, &limit, Hits::take(0)).await;
        assert_eq!(
            decisions[0].remaining, unchanged.remaining,
            "{name}: a rejected call reports the counter as it stays"
        );
    }
}

#[tokio::test]
async fn an_all_or_nothing_call_that_passes_decides_as_separate_calls_in_order() {
    let (_server, mut connection, scripts) = start().await;
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        let (together, apart) = (name("together", &limit), name("apart", &limit));
        let costs = [
            Hits::take(2),
            Hits::take(1),
            Hits::give_back(1),
            Hits::take(3),
        ];
        let request: Vec<RedisHit> = costs
            .iter()
            .map(|&hits| planned(&together, &limit, hits))
            .collect();
        let (applied, decisions) =
            lua_support::all_or_nothing(&mut connection, &scripts, &request, PARIS_NOV_15)
                .await
                .expect("a reply");
        assert!(applied, "{}", algorithm.name());
        let mut separate = Vec::new();
        for hits in costs {
            separate.push(hit_now(&mut connection, &scripts, &apart, &limit, hits).await);
        }
        assert_eq!(decisions, separate, "{}", algorithm.name());
    }
}

#[tokio::test]
async fn a_non_binding_rejection_in_an_all_or_nothing_call_undoes_nothing() {
    let (_server, mut connection, scripts) = start().await;
    let limit = limit(Algorithm::FixedWindow);
    let (a, shadow) = (name("binding-a", &limit), name("shadow", &limit));
    let request = [
        planned(&a, &limit, Hits::take(2)),
        RedisHit {
            binding: false,
            ..planned(&shadow, &limit, Hits::take(6))
        },
    ];
    let (applied, _) =
        lua_support::all_or_nothing(&mut connection, &scripts, &request, PARIS_NOV_15)
            .await
            .expect("a reply");
    assert!(applied);
    let left = hit_now(&mut connection, &scripts, &a, &limit, Hits::take(0)).await;
    assert_eq!(left.remaining, 3);
}

#[tokio::test]
async fn a_batch_decides_every_hit_as_separate_calls_in_the_same_order_would() {
    let (_server, mut connection, scripts) = start().await;
    let limits: Vec<Limit> = Algorithm::ALL.into_iter().map(limit).collect();
    // Every algorithm, each counter hit several times, give-backs and checks among them,
    // and an all-or-nothing request in the middle that is rejected and one that passes.
    let costs = [
        Hits::take(2),
        Hits::take(4),
        Hits::give_back(1),
        Hits::take(0),
        Hits::take(3),
    ];
    let keys: Vec<(String, String)> = limits
        .iter()
        .map(|limit| (name("batched", limit), name("one-by-one", limit)))
        .collect();
    let each = |pick: fn(&(String, String)) -> &String, round: usize| -> Vec<RedisHit> {
        limits
            .iter()
            .zip(&keys)
            .map(|(limit, names)| planned(pick(names), limit, costs[round]))
            .collect()
    };
    let rounds: Vec<Vec<RedisHit>> = (0..costs.len()).map(|r| each(|k| &k.0, r)).collect();
    let rejected = [
        planned(&keys[0].0, &limits[0], Hits::take(1)),
        planned(&keys[1].0, &limits[1], Hits::take(50)),
    ];
    let passes = [planned(&keys[2].0, &limits[2], Hits::take(1))];
    let mut groups: Vec<Group<'_>> = Vec::new();
    for (round, hits) in rounds.iter().enumerate() {
        groups.push(Group {
            mode: Mode::Each,
            hits,
        });
        if round == 1 {
            groups.push(Group {
                mode: Mode::AllOrNothing,
                hits: &rejected,
            });
            groups.push(Group {
                mode: Mode::AllOrNothing,
                hits: &passes,
            });
        }
    }
    let batched = lua_support::batch(&mut connection, &scripts, &groups, PARIS_NOV_15)
        .await
        .expect("a reply");
    assert_eq!(batched.applied, [Some(false), Some(true)]);

    // The same hits, one call each, on the other keys: the rejected request changes nothing,
    // so only the passing one is replayed.
    let mut separate = Vec::new();
    for group in &groups {
        for hit in group.hits {
            let other = keys
                .iter()
                .find(|names| names.0 == hit.key)
                .map(|names| names.1.as_str())
                .expect("a batched key");
            let decision = if group.mode == Mode::AllOrNothing && group.hits.len() == 2 {
                Decision {
                    allowed: hit.hits.amount <= 8,
                    ..hit_now(&mut connection, &scripts, other, &hit.limit, Hits::take(0)).await
                }
            } else {
                hit_now(&mut connection, &scripts, other, &hit.limit, hit.hits).await
            };
            separate.push(Ok(decision));
        }
    }
    assert_eq!(batched.decisions, separate);
}

#[tokio::test]
async fn an_error_fails_its_own_hit_and_the_rest_of_the_batch_is_decided() {
    let (_server, mut connection, scripts) = start().await;
    // A bucket's state is a hash: a string where it should be fails the hit.
    let limit = limit(Algorithm::TokenBucket);
    let (wrong, fine) = (name("wrong-type", &limit), name("fine", &limit));
    redis::cmd("SET")
        .arg(&wrong)
        .arg("not a hash")
        .exec_async(&mut connection)
        .await
        .expect("SET");
    let hits = [
        planned(&wrong, &limit, Hits::take(1)),
        planned(&fine, &limit, Hits::take(1)),
    ];
    let all = [
        planned(&fine, &limit, Hits::take(1)),
        planned(&wrong, &limit, Hits::take(1)),
    ];
    let groups = [
        Group {
            mode: Mode::Each,
            hits: &hits,
        },
        Group {
            mode: Mode::AllOrNothing,
            hits: &all,
        },
    ];
    let reply = lua_support::batch(&mut connection, &scripts, &groups, PARIS_NOV_15)
        .await
        .expect("a reply");
    assert!(
        matches!(&reply.decisions[0], Err(message) if message.contains("WRONGTYPE")),
        "{reply:?}"
    );
    assert_eq!(reply.decisions[1].as_ref().map(|d| d.remaining), Ok(7));
    assert_eq!(reply.applied, [None]);
    assert!(reply.decisions[2..].iter().all(Result::is_err), "{reply:?}");
    // The failed group put back what its first hit wrote.
    let left = hit_now(&mut connection, &scripts, &fine, &limit, Hits::take(0)).await;
    assert_eq!(left.remaining, 7);
}

#[tokio::test]
async fn an_error_in_a_run_of_costs_of_their_own_fails_its_hit_and_the_run_goes_on() {
    let (_server, mut connection, scripts) = start().await;
    let limit = limit(Algorithm::TokenBucket);
    let names = ["first", "wrong-type", "third"].map(|test| name(test, &limit));
    redis::cmd("SET")
        .arg(&names[1])
        .arg("not a hash")
        .exec_async(&mut connection)
        .await
        .expect("SET");
    // One limit, a cost each: one run where each hit names its cost (`costs`).
    let hits = [
        planned(&names[0], &limit, Hits::take(2)),
        planned(&names[1], &limit, Hits::take(1)),
        planned(&names[2], &limit, Hits::take(3)),
    ];
    let groups = [Group {
        mode: Mode::Each,
        hits: &hits,
    }];
    let reply = lua_support::batch(&mut connection, &scripts, &groups, PARIS_NOV_15)
        .await
        .expect("a reply");
    let remaining: Vec<Result<u64, &String>> = (reply.decisions.iter())
        .map(|decision| decision.as_ref().map(|d| d.remaining))
        .collect();
    assert_eq!(remaining[0], Ok(6), "{reply:?}");
    assert!(
        matches!(remaining[1], Err(message) if message.contains("WRONGTYPE")),
        "{reply:?}"
    );
    assert_eq!(remaining[2], Ok(5), "{reply:?}");
}

#[tokio::test]
async fn a_call_run_past_its_deadline_decides_nothing_and_writes_nothing() {
    let (_server, mut connection, scripts) = start().await;
    for algorithm in Algorithm::ALL {
        let name_of = algorithm.name();
        let limit = limit(algorithm);
        let key = name("late", &limit);
        hit_now(&mut connection, &scripts, &key, &limit, Hits::take(2)).await;
        let at = PARIS_NOV_15 + 1_000;
        let keys = state_keys(&key, &limit, at);
        let before = snapshot(&mut connection, &keys).await;
        let writes_before = writes(&mut connection).await;

        let hits = [planned(&key, &limit, Hits::take(1))];
        let groups = [Group {
            mode: Mode::Each,
            hits: &hits,
        }];
        let late = lua_support::answer(&mut connection, &scripts, &groups, at, Some(at - 1)).await;
        assert_eq!(late, Ok(Answer::Late { ran_at: at }), "{name_of}");
        assert_eq!(snapshot(&mut connection, &keys).await, before, "{name_of}");
        assert_eq!(writes(&mut connection).await, writes_before, "{name_of}");

        // At its deadline the call is still in time.
        let on_time = lua_support::answer(&mut connection, &scripts, &groups, at, Some(at)).await;
        let Ok(Answer::Decided { ran, hits, .. }) = on_time else {
            panic!("{name_of}: {on_time:?}");
        };
        let ran_at = RanAt {
            started: at,
            finished: at,
        };
        assert_eq!(ran, ran_at, "{name_of}");
        let decision = hits[0].clone().expect("a decision");
        assert!(decision.allowed, "{name_of}");
        let check = lua_support::hit(&mut connection, &scripts, &key, &limit, Hits::take(0), at)
            .await
            .expect("a check");
        assert_eq!(
            check.remaining, decision.remaining,
            "{name_of}: counted once"
        );
    }
}
