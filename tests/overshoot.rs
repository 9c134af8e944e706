//! Usage charged after the fact (`overshoot: true`), end to end: a charge bigger than what
//! remains is counted in full, the counter goes past its limit, and even a check is refused
//! until the count is back within it. For every algorithm, on the memory backend, on a real
//! Redis shared by two floodgates (one of which has the counter in its over-limit cache when
//! it charges again), and on a real Redis Cluster and a primary named by real sentinels,
//! shared the same way.

mod harness;
mod redis_harness;

use floodgate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use harness::{Floodgate, OK, OVER_LIMIT, costing, request};
use redis_harness::RedisServer;
use redis_harness::cluster::RedisCluster;
use redis_harness::sentinel::{MASTER, Sentinels};

/// A budget of 10 an hour per tenant, counted past its limit, for each algorithm.
const RULES: &str = "
domain: budget
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 10, overshoot: true}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window, overshoot: true}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log, overshoot: true}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket, overshoot: true}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: gcra, overshoot: true}
";

const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

/// `key=tenant` given back `amount` (`is_negative_hits`).
fn giving_back(key: &str, amount: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: true,
        ..costing(key, "tenant", amount)
    }
}

/// One request on `descriptor`: its overall code and remaining quota.
async fn ask(server: &Floodgate, descriptor: RateLimitDescriptor) -> (i32, u32) {
    let response: RateLimitResponse = server.ask(request("budget", vec![descriptor])).await;
    (response.overall_code, response.statuses[0].limit_remaining)
}

/// The budget's story, the charges alternating between `a` and `b` (the same server, or
/// two sharing one Redis).
async fn charges_past_the_budget_count(a: &Floodgate, b: &Floodgate) {
    for key in ALGORITHMS {
        let charge = |amount| costing(key, "tenant", amount);
        assert_eq!(ask(a, charge(8)).await, (OK, 2), "{key}: 8 of 10");
        // 13 of 10: over, and counted.
        assert_eq!(ask(b, charge(5)).await, (OVER_LIMIT, 0), "{key}: 5 more");
        assert_eq!(
            ask(a, charge(0)).await,
            (OVER_LIMIT, 0),
            "{key}: a check at 13"
        );
        // 16: `b` remembers the counter as exhausted, and still charges it.
        assert_eq!(ask(b, charge(3)).await, (OVER_LIMIT, 0), "{key}: 3 more");
        assert_eq!(
            ask(a, giving_back(key, 7)).await.0,
            OK,
            "{key}: 7 given back"
        );
        // 9 of 10: had a charge been lost, more would remain.
        assert_eq!(ask(a, charge(0)).await, (OK, 1), "{key}: a check at 9");
    }
}

#[tokio::test]
async fn on_the_memory_backend_a_charge_past_the_budget_counts() {
    let server = Floodgate::start(&[("budget.yaml", RULES)], &[]);
    charges_past_the_budget_count(&server, &server).await;
}

/// Two floodgates on the backend `flags` name, with time for a busy machine's Redis.
fn two_sharing(flags: &[&str]) -> [Floodgate; 2] {
    let env = [("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")];
    [(); 2].map(|()| Floodgate::start_with_env(&[("budget.yaml", RULES)], flags, &env))
}

#[tokio::test]
async fn on_redis_two_servers_share_every_charge_past_the_budget() {
    let redis = RedisServer::start();
    let [a, b] = two_sharing(&["--backend", "redis", "--redis-url", &redis.url()]);
    charges_past_the_budget_count(&a, &b).await;
}

#[tokio::test]
async fn on_a_redis_cluster_two_servers_share_every_charge_past_the_budget() {
    let cluster = RedisCluster::start();
    let [a, b] = two_sharing(&[
        "--backend",
        "redis-cluster",
        "--redis-url",
        &cluster.seeds(),
    ]);
    charges_past_the_budget_count(&a, &b).await;
}

#[tokio::test]
async fn on_a_primary_named_by_sentinels_two_servers_share_every_charge_past_the_budget() {
    let sentinels = Sentinels::start();
    let [a, b] = two_sharing(&[
        "--backend",
        "redis-sentinel",
        "--redis-url",
        &sentinels.urls(),
        "--redis-sentinel-master",
        MASTER,
    ]);
    charges_past_the_budget_count(&a, &b).await;
}
