//! Readiness says whether floodgate can answer, not whether Redis can: against a real
//! `redis-server` that dies, the replica stays ready (`/readyz`, `/healthcheck`, gRPC
//! health) while every rule's `on_backend_error` answers, `/readyz` and the metrics report
//! the backend's state, and the error that opened the circuit is logged, a password changed
//! under a running server included. `readiness_follows_backend` (upstream's
//! `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`) ties readiness to the backend instead; its test
//! is `tests/redis_backend.rs`'
//! `an_open_circuit_answers_at_once_and_health_follows_the_backend_when_asked`.

mod harness;
mod redis_harness;

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use harness::{Floodgate, OK, OVER_LIMIT, POLICIES, descriptor, request};
use redis_harness::RedisServer;
use tonic_health::pb::health_check_response::ServingStatus;

fn start(redis: &RedisServer) -> Floodgate {
    Floodgate::start_with_env(
        &[("rules.yaml", POLICIES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "300"),
            ("FLOODGATE_REDIS_BREAKER_FAILURES", "3"),
            ("FLOODGATE_REDIS_BREAKER_COOLDOWN_MS", "200"),
        ],
    )
}

fn ask(key: &str) -> floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest {
    request("policy", vec![descriptor(&[(key, "x")])])
}

/// Sends requests on `error_rule` until `/readyz` reports the circuit open; its body.
async fn until_the_circuit_opens(server: &Floodgate) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = server.ask_err(ask("error_rule")).await;
        let (status, body) = server.http("GET", "/readyz", "");
        if body.contains("circuit open") {
            return (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "the circuit never opened: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first line of the server's log that contains `text`, once there is one.
fn logged_line(server: &Floodgate, text: &str) -> String {
    let log = server.wait_for_log(text);
    let line = log.lines().find(|line| line.contains(text));
    line.unwrap_or_default().to_owned()
}

async fn grpc_health(server: &Floodgate, service: &str) -> i32 {
    let answer = harness::grpc_health(server.grpc_addr, service).await;
    answer.expect("a health answer")
}

#[tokio::test]
async fn with_redis_dead_the_replica_stays_ready_and_every_policy_answers() {
    let redis = RedisServer::start();
    let server = start(&redis);
    assert_eq!(server.ask(ask("error_rule")).await.overall_code, OK);
    assert_eq!(
        server.http("GET", "/readyz", ""),
        (200, "ready\nbackend: up\n".into())
    );
    drop(redis);

    let (status, body) = until_the_circuit_opens(&server).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready\n"), "{body}");
    assert_eq!(server.http("GET", "/healthcheck", "").0, 200);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        assert_eq!(
            grpc_health(&server, service).await,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    // The policies answer, which they could not from a replica the Service had dropped.
    let refused = server.ask_err(ask("error_rule")).await;
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert_eq!(server.ask(ask("open_rule")).await.overall_code, OK);
    let closed = server.ask(ask("closed_rule")).await.overall_code;
    assert_eq!(closed, OVER_LIMIT);
    assert_eq!(server.ask(ask("local_rule")).await.overall_code, OK);

    let (_, metrics) = server.http("GET", "/metrics", "");
    assert!(
        metrics.contains("floodgate_backend_circuit_open 1"),
        "{metrics}"
    );
    let opened = logged_line(&server, "circuit open");
    assert!(
        opened.contains("Connection refused") || opened.contains("broken pipe"),
        "the opening names its cause: {opened}"
    );
}

#[tokio::test]
async fn a_password_set_under_a_running_server_is_logged_as_the_circuits_cause() {
    let redis = RedisServer::start();
    let server = start(&redis);
    assert_eq!(server.ask(ask("error_rule")).await.overall_code, OK);
    // The operator rotates the password and the connections drop; floodgate's reconnect
    // is refused for want of it.
    let mut admin = redis.connection().await;
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "rotated-0123"])
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET");
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut admin)
        .await
        .expect("CLIENT KILL");

    until_the_circuit_opens(&server).await;
    // The broken connections may open it; the refusal follows within the changed-error
    // interval, from the probes. (Redis refuses the script's large argument from a client
    // that has not authenticated before it can say NOAUTH.)
    let cause = logged_line(&server, "unauthenticated");
    assert!(
        cause.contains("circuit open") || cause.contains("still failing"),
        "the circuit's log line says why Redis refuses: {cause}"
    );
}

/// `readiness_needs_rules` (upstream's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`): a server
/// started with no rule is unready until one is loaded, then ready; without it, ready at
/// once.
#[tokio::test]
async fn with_readiness_needs_rules_a_server_without_rules_is_unready_until_they_come() {
    let server = Floodgate::start_with_env(
        &[],
        &[],
        &[
            ("FLOODGATE_READINESS_NEEDS_RULES", "true"),
            ("FLOODGATE_RULES_RELOAD_INTERVAL_MS", "50"),
        ],
    );
    let (status, body) = server.http("GET", "/readyz", "");
    assert_eq!(
        (status, body.lines().next()),
        (503, Some("no rules loaded"))
    );
    // envoyproxy/ratelimit's shape: 500 while unhealthy.
    assert_eq!(server.http("GET", "/healthcheck", "").0, 500);
    let not_serving = ServingStatus::NotServing as i32;
    assert_eq!(grpc_health(&server, "").await, not_serving);
    let service = "envoy.service.ratelimit.v3.RateLimitService";
    assert_eq!(grpc_health(&server, service).await, not_serving);

    let rule =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n";
    std::fs::write(server.rules_dir.path().join("d.yaml"), rule).expect("a rule file");
    let until = Instant::now() + Duration::from_secs(10);
    while grpc_health(&server, service).await != ServingStatus::Serving as i32 {
        assert!(
            Instant::now() < until,
            "not serving 10 s after the rules came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    assert_eq!(
        grpc_health(&server, "").await,
        ServingStatus::Serving as i32
    );

    // Without the setting, the same server is ready with no rules.
    let plain = Floodgate::start(&[], &[]);
    assert_eq!(plain.http("GET", "/readyz", "").0, 200);
    assert_eq!(grpc_health(&plain, "").await, ServingStatus::Serving as i32);
}

/// A Redis that does not answer at start-up is an open circuit from the start: with
/// `readiness_follows_backend` (upstream's `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`) the
/// server is unready (`/readyz` 503, `/healthcheck` 500) until Redis answers a probe, as
/// upstream's health starts Redis unhealthy until its connection is confirmed; requests
/// meanwhile get their rule's policy at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_down_at_start_is_unready_until_it_answers_when_readiness_follows_it() {
    let port = redis_harness::free_port();
    let server = Floodgate::start_with_env(
        &[("rules.yaml", POLICIES)],
        &[
            "--backend",
            "redis",
            "--redis-url",
            &format!("redis://127.0.0.1:{port}"),
        ],
        &[
            ("FLOODGATE_READINESS_FOLLOWS_BACKEND", "true"),
            ("FLOODGATE_REDIS_BREAKER_COOLDOWN_MS", "200"),
        ],
    );
    let (status, body) = server.http("GET", "/readyz", "");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("circuit open"), "{body}");
    assert_eq!(server.http("GET", "/healthcheck", "").0, 500);
    let answer = server.ask(ask("open_rule")).await;
    assert_eq!(answer.overall_code, OK, "fail_open answers at once");
    let _redis = RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.http("GET", "/healthcheck", "").0 != 200 {
        assert!(Instant::now() < deadline, "never ready once Redis answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    let answer = server.ask(ask("error_rule")).await;
    assert_eq!(answer.overall_code, OK, "decided by Redis");
}
