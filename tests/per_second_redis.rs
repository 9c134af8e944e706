//! `redis_per_second`: the counters of per-second limits in a Redis of their own (upstream's
//! `REDIS_PERSECOND`), against two real `redis-server`s (and a real Redis Cluster).
//!
//! The per-second rules here have `unit_multiplier: 3600`: still a `second` unit, so they
//! go to the per-second Redis, with a window no test run crosses.

mod harness;
mod redis_harness;

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use harness::{Floodgate, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::cluster::RedisCluster;

const OK: i32 = Code::Ok as i32;
const OVER_LIMIT: i32 = Code::OverLimit as i32;

const RULES: &str = "
domain: split
descriptors:
  - key: fast
    rate_limit: {unit: second, unit_multiplier: 3600, requests_per_unit: 3}
    on_backend_error: fail_open
  - key: slow
    rate_limit: {unit: day, requests_per_unit: 2}
";

/// A floodgate on `main`, with per-second counters on `per_second` (`kind`: a backend
/// name), and the settings of `env`.
fn start(main: &RedisServer, kind: &str, per_second: &str, env: &[(&str, &str)]) -> Floodgate {
    let mut env = env.to_vec();
    env.extend([
        ("FLOODGATE_REDIS_PER_SECOND__BACKEND", kind),
        ("FLOODGATE_REDIS_PER_SECOND__URL", per_second),
        ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000"),
    ]);
    let flags = ["--backend", "redis", "--redis-url", &main.url()];
    Floodgate::start_with_env(&[("rules.yaml", RULES)], &flags, &env)
}

/// One request with a `fast` (per-second) and a `slow` (per-day) descriptor.
async fn both(server: &Floodgate) -> RateLimitResponse {
    let descriptors = vec![descriptor(&[("fast", "a")]), descriptor(&[("slow", "a")])];
    server.ask(request("split", descriptors)).await
}

/// The (code, remaining) of each status of `n` requests as [`both`] sends, one after
/// another.
async fn answers(server: &Floodgate, n: usize) -> Vec<Vec<(i32, u32)>> {
    let mut answers = Vec::new();
    for _ in 0..n {
        answers.push(statuses(&both(server).await));
    }
    answers
}

/// (code, remaining) of each status.
fn statuses(response: &RateLimitResponse) -> Vec<(i32, u32)> {
    (response.statuses.iter())
        .map(|status| (status.code, status.limit_remaining))
        .collect()
}

/// The keys of `redis` that name descriptor `key`.
fn keys_of(redis: &RedisServer, key: &str) -> usize {
    let keys = redis.command(&["KEYS", "*"]);
    keys.lines().filter(|line| line.contains(key)).count()
}

#[tokio::test]
async fn per_second_counters_live_in_their_own_redis() {
    let (main, per_second) = (RedisServer::start(), RedisServer::start());
    let server = start(&main, "redis", &per_second.url(), &[]);
    assert_eq!(
        answers(&server, 3).await,
        [
            vec![(OK, 2), (OK, 1)],
            vec![(OK, 1), (OK, 0)],
            vec![(OK, 0), (OVER_LIMIT, 0)],
        ],
        "each limit counted exactly, each in its own store"
    );
    assert_eq!(
        (keys_of(&per_second, "fast"), keys_of(&per_second, "slow")),
        (1, 0),
        "the per-second Redis holds the per-second counter only: {}",
        per_second.command(&["KEYS", "*"])
    );
    assert_eq!(
        (keys_of(&main, "fast"), keys_of(&main, "slow")),
        (0, 1),
        "the main Redis holds the others: {}",
        main.command(&["KEYS", "*"])
    );
}

#[tokio::test]
async fn a_dead_per_second_redis_fails_only_the_per_second_limits() {
    let main = RedisServer::start();
    let per_second = RedisServer::start();
    let url = per_second.url();
    drop(per_second);
    let server = start(&main, "redis", &url, &[]);
    for remaining in [1, 0] {
        let response = both(&server).await;
        assert_eq!(
            statuses(&response),
            [(OK, 0), (OK, remaining)],
            "fast: its fail_open policy (nothing known of its quota); slow: counted in the \
             main Redis"
        );
    }
    assert_eq!(keys_of(&main, "slow"), 1);
}

#[tokio::test]
async fn a_rejected_request_gives_back_what_the_other_store_counted() {
    let (main, per_second) = (RedisServer::start(), RedisServer::start());
    let env = [("FLOODGATE_CONSUME_ON_REJECT", "false")];
    let server = start(&main, "redis", &per_second.url(), &env);
    assert_eq!(
        answers(&server, 4).await,
        [
            vec![(OK, 2), (OK, 1)],
            vec![(OK, 1), (OK, 0)],
            // slow is exhausted in the main Redis: fast's hit in the per-second one is
            // given back, so the rejected requests consume nothing.
            vec![(OK, 1), (OVER_LIMIT, 0)],
            vec![(OK, 1), (OVER_LIMIT, 0)],
        ]
    );
    let fast = [descriptor(&[("fast", "a")])].to_vec();
    let alone = server.ask(request("split", fast)).await;
    assert_eq!(statuses(&alone), [(OK, 0)], "one request's worth was left");
}

#[tokio::test]
async fn per_second_counters_can_live_in_a_redis_cluster() {
    let main = RedisServer::start();
    let cluster = RedisCluster::start();
    let server = start(&main, "redis-cluster", &cluster.seeds(), &[]);
    assert_eq!(answers(&server, 1).await, [vec![(OK, 2), (OK, 1)]]);
    let on_cluster: usize = (cluster.primaries().into_iter())
        .flat_map(|node| cluster.keys(node))
        .filter(|key| key.contains("fast"))
        .count();
    assert_eq!(on_cluster, 1, "the per-second counter is on the cluster");
    assert_eq!((keys_of(&main, "fast"), keys_of(&main, "slow")), (0, 1));
}

#[test]
fn a_per_second_redis_beside_the_memory_backend_stops_the_start() {
    let rules = harness::write_rules(&[("rules.yaml", RULES)]);
    let rules = rules.path().to_str().expect("a UTF-8 path");
    let args = [&harness::SERVE_ANYWHERE[..], &["--rules", rules]].concat();
    let message = harness::refused_start(
        &args,
        &[
            ("FLOODGATE_REDIS_PER_SECOND__BACKEND", "redis"),
            ("FLOODGATE_REDIS_PER_SECOND__URL", "redis://127.0.0.1:1"),
        ],
    );
    assert!(
        message.contains("redis_per_second needs a Redis backend"),
        "{message}"
    );
}
