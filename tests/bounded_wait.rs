//! A request waits for Redis at most `redis_max_wait_ms`, whatever Redis does and however
//! long its caller would wait: the real `floodgate` with its default settings (a 15 ms command
//! timeout, a 40 ms wait), clients that give every request a 2 s `grpc-timeout`, and a real
//! `redis-server` that is stopped, sleeps, moves 50 ms away, is partitioned or loses packets.
//! Every request is answered by its rule's policy long before its caller's deadline (the code
//! before this bound held each one for 80% of it: 1.6 s), and no request answered by its
//! policy is counted in Redis once it answers again.
//!
//! The bound asserted is half the caller's deadline, far above the 40 ms wait, so that a busy
//! machine's scheduling cannot fail the test; the server's own latency histogram, printed,
//! shows the wait itself.

mod harness;
mod redis_harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{Floodgate, OK, costing, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::delay::DelayedLink;
use redis_harness::netns::IsolatedRedis;
use tonic::Code;

const RULES: &str = "
domain: bounded
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000}
    on_backend_error: error
";

/// What every request tells its server it waits.
const CALLER_WAITS: Duration = Duration::from_secs(2);
/// The most any answer may take here: half the caller's deadline, where the code before the
/// bound answered at 80% of it.
const BOUND: Duration = Duration::from_secs(1);
/// Clients asking at once, each again as soon as it has its answer.
const CLIENTS: usize = 8;

/// A floodgate with its default timeouts on the Redis at `url`.
fn floodgate_on(url: &str) -> Floodgate {
    Floodgate::start(
        &[("rules.yaml", RULES)],
        &["--backend", "redis", "--redis-url", url],
    )
}

/// How one request was answered, and how long it took.
#[derive(Debug)]
struct Answer {
    took: Duration,
    /// Redis decided it (OK), or its policy answered (UNAVAILABLE, with whether the answer
    /// says nothing was counted).
    outcome: Outcome,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Decided,
    Policy { counted_none: bool },
    Other(String),
}

/// What the clients got while `fault` lasted: each client asks without pause, every request
/// with a 2 s deadline, from when the fault begins until `lasting` after.
async fn ask_throughout(server: &Floodgate, lasting: Duration) -> Vec<Answer> {
    let until = Instant::now() + lasting;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let mut grpc = server.client().await;
        clients.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            while Instant::now() < until {
                let user = format!("u{client}");
                let mut ask =
                    tonic::Request::new(request("bounded", vec![descriptor(&[("user", &user)])]));
                ask.set_timeout(CALLER_WAITS);
                let sent = Instant::now();
                let outcome = match grpc.should_rate_limit(ask).await {
                    Ok(response) if response.get_ref().overall_code == OK => Outcome::Decided,
                    Ok(response) => Outcome::Other(format!("{:?}", response.get_ref())),
                    Err(status) if status.code() == Code::Unavailable => Outcome::Policy {
                        counted_none: status
                            .metadata()
                            .get("floodgate-counted")
                            .is_some_and(|value| value == "none"),
                    },
                    Err(status) => Outcome::Other(format!("{status:?}")),
                };
                answers.push(Answer {
                    took: sent.elapsed(),
                    outcome,
                });
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for client in clients {
        answers.extend(client.await.expect("a client task"));
    }
    answers
}

/// Every answer came within [`BOUND`] and was Redis' or the policy's; some were the policy's.
/// Prints what the server's own latency histogram saw.
fn every_answer_bounded(server: &Floodgate, answers: &[Answer], fault: &str) {
    let slowest = answers.iter().map(|answer| answer.took).max();
    let policy = (answers.iter())
        .filter(|answer| matches!(answer.outcome, Outcome::Policy { .. }))
        .count();
    let marked = (answers.iter())
        .filter(|answer| answer.outcome == Outcome::Policy { counted_none: true })
        .count();
    let buckets = ["0.025", "0.05", "0.1", "0.25", "1"].map(|le| {
        let name = format!(
            "floodgate_request_duration_seconds_bucket{{protocol=\"grpc\",\
             method=\"ShouldRateLimit\",le=\"{le}\"}}"
        );
        (le, server.metric(&name))
    });
    eprintln!(
        "{fault}: {} answers, {policy} by policy ({marked} marked counted-none), slowest \
         {slowest:?}; server histogram (cumulative): {buckets:?}",
        answers.len()
    );
    let others: Vec<&Answer> = (answers.iter())
        .filter(|answer| matches!(answer.outcome, Outcome::Other(_)))
        .collect();
    assert!(others.is_empty(), "{fault}: {others:?}");
    assert!(policy > 0, "{fault}: the fault never reached a request");
    let late: Vec<&Answer> = answers.iter().filter(|a| a.took > BOUND).collect();
    assert!(
        late.is_empty(),
        "{fault}: held past {BOUND:?}: {late:?}\n{}",
        server.stderr()
    );
}

/// Waits until Redis decides again, then checks that every client's counter holds exactly
/// the requests Redis decided: none answered by its policy was counted as well.
async fn counted_exactly(server: &Floodgate, decided_before: &[u64], answers: &[Answer]) {
    until_decided(server).await;
    // Calls Redis found in its buffers when it woke have run by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let decided_during = (answers.iter())
        .filter(|answer| answer.outcome == Outcome::Decided)
        .count() as u64;
    let mut counted = 0;
    for client in 0..CLIENTS {
        counted += hits_of(server, &format!("u{client}")).await;
    }
    let decided: u64 = decided_before.iter().sum::<u64>() + decided_during;
    assert_eq!(
        counted, decided,
        "every request Redis decided is counted, and no other"
    );
}

/// The hits counted on `user`'s counter, read with a request that counts nothing.
async fn hits_of(server: &Floodgate, user: &str) -> u64 {
    let look = request("bounded", vec![costing("user", user, 0)]);
    let response = server.ask(look).await;
    1_000_000 - u64::from(response.statuses[0].limit_remaining)
}

/// Waits until a request is decided by Redis again.
async fn until_decided(server: &Floodgate) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let look = request("bounded", vec![costing("user", "probe", 0)]);
    loop {
        match server.client().await.should_rate_limit(look.clone()).await {
            Ok(_) => return,
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("redis never decided again: {status:?}"),
        }
    }
}

/// One decided hit per client before the fault, so counters and connections exist.
async fn one_hit_each(server: &Floodgate) -> Vec<u64> {
    let look = request("bounded", vec![costing("user", "probe", 0)]);
    server.look_until_decided(look).await;
    for client in 0..CLIENTS {
        let hit = request(
            "bounded",
            vec![descriptor(&[("user", &format!("u{client}"))])],
        );
        assert_eq!(server.ask(hit).await.overall_code, OK);
    }
    vec![1; CLIENTS]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_redis_costs_each_request_at_most_the_wait() {
    let redis = RedisServer::start();
    let server = floodgate_on(&redis.url());
    let before = one_hit_each(&server).await;

    redis.freeze();
    let answers = ask_throughout(&server, Duration::from_millis(1500)).await;
    redis.thaw();

    every_answer_bounded(&server, &answers, "SIGSTOP 1.5 s");
    counted_exactly(&server, &before, &answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sleeping_redis_costs_each_request_at_most_the_wait() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let server = floodgate_on(&redis.url());
    let before = one_hit_each(&server).await;

    let client = redis.client();
    let sleep = tokio::task::spawn_blocking(move || {
        let mut connection = client
            .get_connection()
            .expect("a connection for DEBUG SLEEP");
        deadpool_redis::redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1")
            .query::<String>(&mut connection)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let answers = ask_throughout(&server, Duration::from_millis(900)).await;
    let slept = sleep.await.expect("DEBUG SLEEP's thread");
    assert_eq!(slept.as_deref(), Ok("OK"));

    every_answer_bounded(&server, &answers, "DEBUG SLEEP 1");
    counted_exactly(&server, &before, &answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_too_far_for_the_timeout_is_answered_at_once_and_called_again_once_near() {
    let redis = RedisServer::start();
    // 50 ms there and back, more than the 15 ms command timeout: no call can be answered.
    let link = Arc::new(DelayedLink::to(redis.port(), Duration::from_millis(25)).await);
    let server = floodgate_on(&link.url());

    let answers = ask_throughout(&server, Duration::from_millis(1500)).await;
    every_answer_bounded(&server, &answers, "a Redis 50 ms away");
    let marked = (answers.iter())
        .filter(|answer| answer.outcome == Outcome::Policy { counted_none: true })
        .count();
    // Only requests before the lane had measured enough round trips to call Redis far (its
    // first few) waited for it; the rest were answered at once, with nothing sent.
    assert!(
        answers.len() - marked <= 4 * CLIENTS,
        "{marked} of {} answered without a call",
        answers.len()
    );
    let log = server.wait_for_log("redis is too far for redis_command_timeout_ms");
    assert!(log.contains("round_trip_ms"), "{log}");
    assert!(server.metric(r#"floodgate_backend_errors_total{kind="too_far"}"#) > 0.0);
    let round_trip = server.metric("floodgate_redis_round_trip_seconds");
    assert!(round_trip > 0.015, "measured {round_trip} s");
    // Readiness says whether floodgate answers, which it does, by each rule's policy.
    assert_eq!(server.http("GET", "/readyz", "").0, 200);

    // The way shortens: a probe of the round trip finds it, and requests are called again.
    link.set_delay(Duration::ZERO);
    until_decided(&server).await;
    assert_eq!(
        hits_of(&server, "u0").await,
        0,
        "nothing was counted while Redis was too far"
    );
    let hit = request("bounded", vec![descriptor(&[("user", "u0")])]);
    assert_eq!(server.ask(hit).await.overall_code, OK);
    assert_eq!(hits_of(&server, "u0").await, 1);
}

/// A Redis 100 ms there and back, default settings: its set-up (three round trips) is
/// bounded by the distance its first round trip measured, so the first one succeeds; and
/// until the lane has measured Redis too far, its calls run out of time and their replies
/// come a round trip later, but the connection is alive and is kept: a connection counts as
/// silent only past its quickest round trip. (With either bound flat, the first set-up ran
/// out, or the calls of the first few hundred milliseconds dropped the connection: 2
/// connections here, every run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_farther_than_the_silence_keeps_its_connection_while_it_is_measured() {
    let redis = RedisServer::start();
    let link = DelayedLink::to(redis.port(), Duration::from_millis(50)).await;
    // Set-up (connect, TIME, the script's load) is three round trips, 300 ms: more than the
    // connect timeout (250 ms) and two command timeouts, unless the load's bound follows the
    // distance the clock's read measured (a set-up that ran out dropped its connection).
    let server = floodgate_on(&link.url());

    let answers = ask_throughout(&server, Duration::from_millis(1500)).await;
    every_answer_bounded(&server, &answers, "a Redis 100 ms away");
    let round_trip = server.metric("floodgate_redis_round_trip_seconds");
    assert!(round_trip > 0.09, "measured {round_trip} s");
    let log = server.stderr();
    assert!(!log.contains("could not connect to redis"), "{log}");
    assert_eq!(
        link.connections(),
        1,
        "connections opened through the relay:\n{}",
        server.stderr()
    );
}

/// A Redis in a network namespace of its own, or `None` (and why, printed) where this machine
/// has none.
fn isolated() -> Option<IsolatedRedis> {
    match IsolatedRedis::start() {
        Ok(redis) => Some(redis),
        Err(why) => {
            eprintln!("skipped: no network namespace with iptables here: {why}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_redis_costs_each_request_at_most_the_wait() {
    let Some(redis) = isolated() else { return };
    let server = floodgate_on(&redis.url());
    let before = one_hit_each(&server).await;

    redis.cut();
    let answers = ask_throughout(&server, Duration::from_millis(1500)).await;
    redis.heal();

    every_answer_bounded(&server, &answers, "a partition of 1.5 s");
    counted_exactly(&server, &before, &answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_losing_a_fifth_of_its_packets_costs_each_request_at_most_the_wait() {
    let Some(redis) = isolated() else { return };
    let server = floodgate_on(&redis.url());
    let before = one_hit_each(&server).await;

    redis.lose(0.2);
    let answers = ask_throughout(&server, Duration::from_secs(3)).await;
    redis.heal();

    every_answer_bounded(&server, &answers, "20% packet loss");
    // A reply lost on its way back leaves a request its policy's answer although Redis
    // counted it (the one case no client of any store can tell): the counters hold at least
    // what Redis decided, and at most one hit more per policy answer.
    until_decided(&server).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let decided = before.iter().sum::<u64>()
        + (answers.iter())
            .filter(|answer| answer.outcome == Outcome::Decided)
            .count() as u64;
    let mut counted = 0;
    for client in 0..CLIENTS {
        counted += hits_of(&server, &format!("u{client}")).await;
    }
    let policy = answers.len() as u64 + before.len() as u64 - decided;
    eprintln!("20% packet loss: {decided} decided, {counted} counted");
    assert!(
        (decided..=decided + policy).contains(&counted),
        "{counted} counted for {decided} decided and {policy} policy answers"
    );
}

#[test]
fn a_wait_shorter_than_the_command_timeout_is_refused_at_start() {
    let stderr = harness::refused_start(
        &harness::SERVE_ANYWHERE,
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "50"),
            ("FLOODGATE_REDIS_MAX_WAIT_MS", "20"),
        ],
    );
    assert!(
        stderr.contains("redis_max_wait_ms (20) must be at least redis_command_timeout_ms (50)"),
        "{stderr}"
    );
}
