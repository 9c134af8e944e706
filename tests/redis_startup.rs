//! Waiting for Redis at start-up (`redis_startup`, upstream's `REDIS_STARTUP_*`): a Redis
//! that comes up after floodgate is waited for, with the start's pauses doubling; one that
//! never does makes the start fail with an error naming it, within the bound.

mod harness;
mod redis_harness;

use std::process::{Command, Stdio};
use std::time::Duration;

use harness::{Floodgate, OK, OVER_LIMIT, costing, descriptor, request};
use redis_harness::RedisServer;

const RULES: &str = "\
domain: startup
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_waits_for_a_redis_that_comes_up_later() {
    let port = redis_harness::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let starting = std::thread::spawn(move || {
        Floodgate::start_with_env(
            &[("rules.yaml", RULES)],
            &["--backend", "redis", "--redis-url", &url],
            &[
                ("FLOODGATE_REDIS_STARTUP__MAX_ELAPSED_MS", "60000"),
                ("FLOODGATE_REDIS_STARTUP__INITIAL_INTERVAL_MS", "100"),
                ("FLOODGATE_REDIS_STARTUP__MAX_INTERVAL_MS", "400"),
            ],
        )
    });
    // Without Redis the listeners never open, however long that is.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !starting.is_finished(),
        "floodgate served before Redis answered"
    );
    let redis = RedisServer::start_on(port);
    let server = starting
        .join()
        .expect("floodgate starts once Redis answers");
    let log = server.stderr();
    assert!(
        log.contains("redis does not answer at start-up; trying again"),
        "{log}"
    );
    assert!(log.contains("redis answered at start-up"), "{log}");
    // Counted in Redis, exactly (once the first calls have opened the connections).
    let look = request("startup", vec![costing("user", "late", 0)]);
    server.look_until_decided(look).await;
    let ask = || request("startup", vec![descriptor(&[("user", "late")])]);
    assert_eq!(server.ask(ask()).await.overall_code, OK);
    assert_eq!(server.ask(ask()).await.overall_code, OK);
    assert_eq!(server.ask(ask()).await.overall_code, OVER_LIMIT);
    assert_eq!(redis.command(&["DBSIZE"]), "1", "the counter is in Redis");
}

#[test]
fn a_redis_that_never_answers_fails_the_start_within_the_bound() {
    let rules = harness::write_rules(&[("rules.yaml", RULES)]);
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--backend", "redis", "--redis-url"])
        .arg(format!("redis://127.0.0.1:{}", redis_harness::free_port()))
        .arg("--rules")
        .arg(rules.path())
        .env("FLOODGATE_REDIS_STARTUP__MAX_ELAPSED_MS", "1500")
        .env("FLOODGATE_REDIS_STARTUP__INITIAL_INTERVAL_MS", "200")
        .stdin(Stdio::null())
        .output()
        .expect("floodgate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        output.stdout.is_empty(),
        "it never listened: {:?}",
        output.stdout
    );
    assert!(
        stderr.contains("Redis did not answer within redis_startup.max_elapsed_ms (1500 ms"),
        "{stderr}"
    );
}

#[test]
fn upstreams_startup_variables_become_the_wait() {
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["ratelimit", "--explain"])
        .env_clear()
        .env("REDIS_STARTUP_INITIAL_INTERVAL", "250ms")
        .env("REDIS_STARTUP_MAX_INTERVAL", "2s")
        .env("REDIS_STARTUP_MAX_ELAPSED_TIME", "1m")
        .output()
        .expect("floodgate runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in [
        "FLOODGATE_REDIS_STARTUP__INITIAL_INTERVAL_MS=250",
        "FLOODGATE_REDIS_STARTUP__MAX_INTERVAL_MS=2000",
        "FLOODGATE_REDIS_STARTUP__MAX_ELAPSED_MS=60000",
    ] {
        assert!(stdout.contains(line), "{line} in {stdout}");
    }
}
