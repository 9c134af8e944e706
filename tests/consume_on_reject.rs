//! `consume_on_reject: false` end to end, through the real `floodgate` binary on the memory
//! backend and on a real `redis-server`: a request answered OVER_LIMIT consumes nothing on
//! any of its counters, for every algorithm, under concurrency too. (The cluster's
//! best-effort give-back is in `tests/redis_cluster.rs`.)

mod harness;
mod redis_harness;

use floodgate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use harness::{ALGORITHMS, EVERY_ALGORITHM, Floodgate, OK, OVER_LIMIT, admitted, costing, request};
use redis_harness::RedisServer;

/// A limited rule and a shadow-mode one, in the domain `shadowed`.
const SHADOWED: &str = "
domain: shadowed
descriptors:
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
";

/// Where the counters live in a test.
enum Store {
    Memory,
    Redis(RedisServer),
}

impl Store {
    /// Both stores under test.
    fn both() -> [Store; 2] {
        [Store::Memory, Store::Redis(RedisServer::start())]
    }

    fn name(&self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Redis(_) => "redis",
        }
    }

    /// A floodgate on this store: [`serve`].
    fn serve(&self, consume: bool) -> Floodgate {
        match self {
            Store::Memory => serve(None, consume),
            Store::Redis(redis) => serve(Some(redis), consume),
        }
    }
}

/// A floodgate with `--consume-on-reject <consume>`, on `redis` or else in memory, serving
/// every algorithm (50 per day each, domain `global`) and the `shadowed` domain.
fn serve(redis: Option<&RedisServer>, consume: bool) -> Floodgate {
    let mut flags = vec!["--consume-on-reject".to_owned(), consume.to_string()];
    if let Some(redis) = redis {
        flags.extend(["--backend".into(), "redis".into(), "--redis-url".into()]);
        flags.push(redis.url());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Floodgate::start_with_env(
        &[
            ("global.yaml", EVERY_ALGORITHM),
            ("shadowed.yaml", SHADOWED),
        ],
        &flags,
        // A timeout a debug build on a loaded machine always meets: these tests count.
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
    )
}

async fn ask(
    server: &Floodgate,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    server.ask(request(domain, descriptors)).await
}

/// The quota left on the counter `key=value`, by a check (a cost of 0).
async fn remaining(server: &Floodgate, domain: &str, key: &str, value: &str) -> u32 {
    ask(server, domain, vec![costing(key, value, 0)])
        .await
        .statuses[0]
        .limit_remaining
}

/// On each store and for each algorithm: exhausts `key=full`, then asks for `key=first` and
/// `key=full` in one request (OVER_LIMIT), and checks what `key=first` has left.
async fn first_left_after_a_rejected_pair(consume: bool, expected: u32) {
    for store in Store::both() {
        let server = store.serve(consume);
        for key in ALGORITHMS {
            ask(&server, "global", vec![costing(key, "full", 50)]).await;
            let pair = vec![costing(key, "first", 1), costing(key, "full", 1)];
            let response = ask(&server, "global", pair).await;
            let at = format!("{} {key}", store.name());
            assert_eq!(response.overall_code, OVER_LIMIT, "{at}");
            assert_eq!(
                response.statuses[0].code, OK,
                "{at}: the first descriptor passes"
            );
            let left = remaining(&server, "global", key, "first").await;
            assert_eq!(left, expected, "{at}");
        }
    }
}

#[tokio::test]
async fn a_rejected_request_consumes_nothing_on_its_other_descriptors() {
    first_left_after_a_rejected_pair(false, 50).await;
}

#[tokio::test]
async fn by_default_a_rejected_request_consumes_its_allowed_descriptors() {
    first_left_after_a_rejected_pair(true, 49).await;
}

#[tokio::test]
async fn a_rejected_request_reports_its_passing_descriptors_quota_unchanged() {
    for store in Store::both() {
        let server = store.serve(false);
        for key in ALGORITHMS {
            ask(&server, "global", vec![costing(key, "first", 10)]).await;
            let pair = vec![costing(key, "first", 1), costing(key, "second", 51)];
            let response = ask(&server, "global", pair).await;
            assert_eq!(response.overall_code, OVER_LIMIT);
            assert_eq!(
                response.statuses[0].limit_remaining,
                40,
                "{} {key}",
                store.name()
            );
        }
    }
}

#[tokio::test]
async fn a_descriptor_repeated_in_a_request_counts_as_two_hits_or_none() {
    for store in Store::both() {
        let server = store.serve(false);
        for key in ALGORITHMS {
            let at = format!("{} {key}", store.name());
            let twice = || vec![costing(key, "twice", 24), costing(key, "twice", 24)];
            assert_eq!(
                ask(&server, "global", twice()).await.overall_code,
                OK,
                "{at}"
            );
            assert_eq!(remaining(&server, "global", key, "twice").await, 2, "{at}");
            let rejected = vec![costing(key, "twice", 1), costing(key, "twice", 2)];
            let response = ask(&server, "global", rejected).await;
            assert_eq!(response.overall_code, OVER_LIMIT, "{at}: 1 + 2 > 2");
            assert_eq!(remaining(&server, "global", key, "twice").await, 2, "{at}");
        }
    }
}

#[tokio::test]
async fn a_shadow_mode_rejection_undoes_nothing() {
    for store in Store::both() {
        let server = store.serve(false);
        let pair = vec![costing("plain", "x", 1), costing("shadow", "x", 2)];
        let response = ask(&server, "shadowed", pair).await;
        assert_eq!(response.overall_code, OK, "{}", store.name());
        assert_eq!(response.statuses[1].code, OK, "shadow mode reports OK");
        assert_eq!(
            remaining(&server, "shadowed", "plain", "x").await,
            4,
            "{}",
            store.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_admit_exactly_and_rejected_ones_consume_nothing() {
    for store in Store::both() {
        let server = store.serve(false);
        for key in ALGORITHMS {
            // Each request costs `cheap` 1 and `dear` 2: `dear` admits 25 requests, and the
            // 39 rejected ones must leave `cheap` at exactly 50 - 25.
            let pair = request(
                "global",
                vec![costing(key, "cheap", 1), costing(key, "dear", 2)],
            );
            let at = format!("{} {key}", store.name());
            assert_eq!(admitted(&[&server], &pair, 8, 8).await, 25, "{at}");
            assert_eq!(remaining(&server, "global", key, "cheap").await, 25, "{at}");
            assert_eq!(remaining(&server, "global", key, "dear").await, 0, "{at}");
        }
    }
}

#[tokio::test]
async fn a_rejection_the_over_limit_cache_knows_sends_nothing_to_redis() {
    let redis = RedisServer::start();
    let server = serve(Some(&redis), false);
    let pair = || {
        vec![
            costing("fixed_window", "a", 1),
            costing("fixed_window", "b", 1),
        ]
    };
    ask(&server, "global", vec![costing("fixed_window", "b", 50)]).await;
    // Redis rejects `b` once; from then on this replica knows it is exhausted.
    assert_eq!(
        ask(&server, "global", pair()).await.overall_code,
        OVER_LIMIT
    );
    redis.command(&["CONFIG", "RESETSTAT"]);
    assert_eq!(
        ask(&server, "global", pair()).await.overall_code,
        OVER_LIMIT
    );
    let stats = redis.command(&["INFO", "commandstats"]);
    assert!(
        !stats.contains("cmdstat_evalsha"),
        "a known rejection called redis:\n{stats}"
    );
    assert_eq!(remaining(&server, "global", "fixed_window", "a").await, 50);
}

#[tokio::test]
async fn the_all_or_nothing_script_survives_a_script_flush() {
    let redis = RedisServer::start();
    let server = serve(Some(&redis), false);
    for round in 0..3 {
        redis.command(&["SCRIPT", "FLUSH"]);
        let pair = vec![
            costing("gcra", "flush", 1),
            costing("sliding_log", "flush", 1),
        ];
        let response = ask(&server, "global", pair).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(response.statuses[1].limit_remaining, 49 - round);
    }
}
