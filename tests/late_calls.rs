//! A request answered another way is never counted in Redis afterwards: the real `floodgate`
//! on a real `redis-server`, or a real Redis Cluster, that stalls (SIGSTOP, `DEBUG SLEEP`)
//! while script calls are on their way. Each request times out and gets its rule's failure policy; when Redis wakes up
//! it finds the calls in its socket buffers, and runs them past their deadline: they must
//! decide nothing (`lua/batch.lua`, `src/backend/redis/deadline.rs`).

mod harness;
mod redis_harness;

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use harness::{Floodgate, OK, OVER_LIMIT, costing, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::cluster::RedisCluster;

/// Every failure policy, on a limit a test never reaches.
const RULES: &str = "
domain: late
descriptors:
  - key: error_rule
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: open_rule
    on_backend_error: fail_open
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: closed_rule
    on_backend_error: fail_closed
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: local_rule
    on_backend_error: local
    rate_limit: {unit: day, requests_per_unit: 1000}
";

/// Each rule's key, and what a request gets from it while Redis does not answer (`None`:
/// gRPC UNAVAILABLE).
const POLICIES: [(&str, Option<i32>); 4] = [
    ("error_rule", None),
    ("open_rule", Some(OK)),
    ("closed_rule", Some(OVER_LIMIT)),
    ("local_rule", Some(OK)),
];

/// The command timeout: what a request waits for Redis before its policy answers.
const TIMEOUT_MS: u64 = 300;

/// A floodgate on a standalone `redis`.
fn start(redis: &RedisServer) -> Floodgate {
    start_on(&["--backend", "redis", "--redis-url", &redis.url()])
}

/// A floodgate on the backend `flags` name, whose requests wait [`TIMEOUT_MS`] and whose
/// breaker stays closed (every request that times out has had a call sent on its behalf,
/// or queued).
fn start_on(flags: &[&str]) -> Floodgate {
    let timeout = TIMEOUT_MS.to_string();
    Floodgate::start_with_env(
        &[("rules.yaml", RULES)],
        flags,
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", &timeout),
            ("FLOODGATE_REDIS_BREAKER_FAILURES", "100000"),
            ("FLOODGATE_REDIS_BREAKER_WINDOW_MS", "600000"),
        ],
    )
}

fn hit(key: &str) -> RateLimitRequest {
    request("late", vec![descriptor(&[(key, "counted")])])
}

/// What the counter of `key` has left, read with a check that counts nothing.
async fn remaining(server: &Floodgate, key: &str) -> u32 {
    let response = server
        .ask(request("late", vec![costing(key, "counted", 0)]))
        .await;
    response.statuses[0].limit_remaining
}

/// Sends `rounds` rounds of `per_rule` concurrent hits on every rule while Redis is stalled,
/// and checks that each was answered by its rule's policy.
async fn hit_while_stalled(server: &Floodgate, rounds: usize, per_rule: usize) {
    for _ in 0..rounds {
        let mut answers = Vec::new();
        for (key, expected) in POLICIES {
            for _ in 0..per_rule {
                let mut client = server.client().await;
                answers.push(tokio::spawn(async move {
                    let answer = client.should_rate_limit(hit(key)).await;
                    let got = answer.map(|response| response.into_inner().overall_code);
                    match (expected, got) {
                        (Some(code), Ok(got)) => assert_eq!(got, code, "{key}"),
                        (None, Err(status)) => {
                            assert_eq!(status.code(), tonic::Code::Unavailable, "{key}")
                        }
                        (expected, got) => panic!("{key}: expected {expected:?}, got {got:?}"),
                    }
                }));
            }
        }
        for answer in answers {
            answer
                .await
                .expect("every request is answered by its policy");
        }
    }
}

/// Waits until the counters on Redis answer again.
async fn until_redis_decides(server: &Floodgate) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe = request("late", vec![costing("error_rule", "probe", 0)]);
    loop {
        match server.client().await.should_rate_limit(probe.clone()).await {
            Ok(_) => return,
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("redis did not come back: {status:?}"),
        }
    }
}

/// Each rule counted one hit on `server` before the stall and none during it.
async fn only_the_first_hit_counted(server: &Floodgate) {
    // Calls Redis found in its buffers have run by now: the probe came after them on the
    // same connections, or on new ones while the old ones drained.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (key, _) in POLICIES {
        assert_eq!(
            remaining(server, key).await,
            999,
            "{key}: a hit answered by its policy was counted in redis too"
        );
    }
}

/// Sends the signal `name` (`-STOP`, `-CONT`) to the processes `pids`.
fn signal(name: &str, pids: &[u32]) {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let sent = std::process::Command::new("kill")
        .arg(name)
        .args(&pids)
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill {name} {pids:?}");
}

/// One hit on each rule, decided by Redis, so every counter exists and the lanes have
/// heard from Redis' clock.
async fn count_one_each(server: &Floodgate) {
    for (key, _) in POLICIES {
        let response = server.ask(hit(key)).await;
        assert_eq!(response.overall_code, OK, "{key}");
        assert_eq!(response.statuses[0].limit_remaining, 999, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hits_answered_while_redis_is_stopped_are_not_counted_when_it_resumes() {
    let redis = RedisServer::start();
    let server = start(&redis);
    count_one_each(&server).await;

    signal("-STOP", &[redis.pid()]);
    hit_while_stalled(&server, 3, 3).await;
    signal("-CONT", &[redis.pid()]);

    until_redis_decides(&server).await;
    only_the_first_hit_counted(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hits_answered_during_a_debug_sleep_are_not_counted_after_it() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let server = start(&redis);
    count_one_each(&server).await;

    // Redis runs nothing else for 1.5 s, while its socket buffers fill with calls.
    let client = redis.client();
    let sleep = tokio::task::spawn_blocking(move || {
        let mut connection = client
            .get_connection()
            .expect("a connection for DEBUG SLEEP");
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1.5")
            .query::<String>(&mut connection)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    hit_while_stalled(&server, 2, 3).await;
    let slept = sleep.await.expect("DEBUG SLEEP's thread");
    assert_eq!(slept.as_deref(), Ok("OK"));

    until_redis_decides(&server).await;
    only_the_first_hit_counted(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hits_answered_while_the_cluster_primaries_are_stopped_are_not_counted_when_they_resume() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let server = start_on(&["--backend", "redis-cluster", "--redis-url", &seeds]);
    count_one_each(&server).await;

    // Every primary at once, and for less than the cluster's node timeout: no replica can
    // win an election while no primary votes, so the same primaries resume.
    let primaries: Vec<u32> = (cluster.primaries().into_iter())
        .map(|node| cluster.server(node).pid())
        .collect();
    signal("-STOP", &primaries);
    hit_while_stalled(&server, 2, 2).await;
    signal("-CONT", &primaries);

    until_redis_decides(&server).await;
    only_the_first_hit_counted(&server).await;
}
