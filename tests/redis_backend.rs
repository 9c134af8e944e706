//! The redis backend end to end: real `floodgate` binaries sharing one real `redis-server`.

mod harness;
mod redis_harness;

use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use harness::{EVERY_ALGORITHM, Floodgate, POLICIES, admitted, descriptor, request};
use redis_harness::RedisServer;

const OK: i32 = Code::Ok as i32;
const OVER_LIMIT: i32 = Code::OverLimit as i32;

fn redis_flags(redis: &RedisServer) -> Vec<String> {
    vec![
        "--backend".into(),
        "redis".into(),
        "--redis-url".into(),
        redis.url(),
    ]
}

/// A floodgate with `rules` on `redis`, and the settings of `env`.
fn start_with_env(rules: &str, redis: &RedisServer, env: &[(&str, &str)]) -> Floodgate {
    let flags = redis_flags(redis);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Floodgate::start_with_env(&[("rules.yaml", rules)], &flags, env)
}

/// A floodgate on `redis` whose Redis command timeout is `timeout_ms`.
fn start_with_timeout(rules: &str, redis: &RedisServer, timeout_ms: u64) -> Floodgate {
    let timeout = timeout_ms.to_string();
    start_with_env(
        rules,
        redis,
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", &timeout)],
    )
}

/// A floodgate with a command timeout that a debug build on a loaded machine always meets:
/// for tests about counting, where a timeout would be noise.
fn start(rules: &str, redis: &RedisServer) -> Floodgate {
    start_with_timeout(rules, redis, 2000)
}

/// One request on the descriptor (`key`, "shared") of the `global` domain.
fn shared(key: &str) -> RateLimitRequest {
    request("global", vec![descriptor(&[(key, "shared")])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_share_one_exact_count_for_every_algorithm() {
    let redis = RedisServer::start();
    let a = start(EVERY_ALGORITHM, &redis);
    let b = start(EVERY_ALGORITHM, &redis);
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
    ] {
        let allowed = admitted(&[&a, &b], &shared(algorithm), 16, 8).await;
        assert_eq!(
            allowed, 50,
            "{algorithm}: 128 requests over two servers against a limit of 50"
        );
    }
}

#[tokio::test]
async fn restarting_floodgate_mid_window_admits_nothing_extra() {
    let redis = RedisServer::start();
    let first = start(EVERY_ALGORITHM, &redis);
    assert_eq!(
        admitted(&[&first], &shared("fixed_window"), 1, 30).await,
        30
    );
    drop(first);
    let second = start(EVERY_ALGORITHM, &redis);
    assert_eq!(
        admitted(&[&second], &shared("fixed_window"), 1, 30).await,
        20
    );
}

#[tokio::test]
async fn five_descriptors_cost_one_script_call() {
    let redis = RedisServer::start();
    let server = start(EVERY_ALGORITHM, &redis);
    let keys = [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
    ];
    let five = request(
        "global",
        keys.iter().map(|k| descriptor(&[(k, "rt")])).collect(),
    );
    server.ask(five.clone()).await;
    redis.command(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        let response = server.ask(five.clone()).await;
        assert_eq!(response.statuses.len(), 5);
    }
    let stats = redis.command(&["INFO", "commandstats"]);
    let evalsha = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or_else(|| panic!("no evalsha in {stats}"));
    assert!(
        evalsha.starts_with("cmdstat_evalsha:calls=10,"),
        "{evalsha}"
    );
}

#[tokio::test]
async fn script_flush_is_survived_without_a_failed_request() {
    let redis = RedisServer::start();
    let server = start(EVERY_ALGORITHM, &redis);
    let req = request("global", vec![descriptor(&[("fixed_window", "flush")])]);
    let mut client = server.client().await;
    for round in 0..20 {
        if round % 5 == 0 {
            redis.command(&["SCRIPT", "FLUSH"]);
        }
        let response = client
            .should_rate_limit(req.clone())
            .await
            .expect("no failed request");
        assert_eq!(response.get_ref().statuses[0].limit_remaining, 49 - round);
    }
}

#[tokio::test]
async fn a_dead_redis_gets_each_rules_failure_policy_in_bounded_time() {
    let redis = RedisServer::start();
    let server = start(POLICIES, &redis);
    let ask = |key: &'static str| request("policy", vec![descriptor(&[(key, "x")])]);
    assert_eq!(server.ask(ask("error_rule")).await.overall_code, OK);
    drop(redis);

    let started = Instant::now();
    let status = server.ask_err(ask("error_rule")).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(server.ask(ask("open_rule")).await.overall_code, OK);
    assert_eq!(
        server.ask(ask("closed_rule")).await.overall_code,
        OVER_LIMIT
    );
    let local: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(server.ask(ask("local_rule")).await.overall_code);
        }
        codes
    };
    assert_eq!(
        local,
        [OK, OK, OVER_LIMIT],
        "the local limiter counts while redis is down"
    );
    // Seven requests against a dead Redis, each bounded by the command timeout (15 ms):
    // generous slack for a loaded machine, but far from a hang.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn decisions_resume_by_themselves_when_redis_returns() {
    let redis = RedisServer::start();
    let port = redis.port();
    let server = start(POLICIES, &redis);
    let req = request("policy", vec![descriptor(&[("error_rule", "back")])]);
    assert_eq!(server.ask(req.clone()).await.overall_code, OK);
    drop(redis);
    assert_eq!(
        server.ask_err(req.clone()).await.code(),
        tonic::Code::Unavailable
    );

    let _redis = RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut client = server.client().await;
        match client.should_rate_limit(req.clone()).await {
            Ok(response) => {
                assert_eq!(response.get_ref().overall_code, OK);
                break;
            }
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("decisions did not resume: {status:?}"),
        }
    }
}

#[tokio::test]
async fn a_hung_redis_answers_within_the_command_timeout() {
    let redis = RedisServer::start();
    let server = start_with_timeout(POLICIES, &redis, 100);
    let ask = |key: &'static str| request("policy", vec![descriptor(&[(key, "hung")])]);
    // Warm the pool, then freeze Redis: connections stay open but nothing answers.
    assert_eq!(server.ask(ask("open_rule")).await.overall_code, OK);
    let pid = redis.pid().to_string();
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(stop.success());

    for (key, expected) in [("open_rule", OK), ("closed_rule", OVER_LIMIT)] {
        let started = Instant::now();
        let response = server.ask(ask(key)).await;
        let waited = started.elapsed();
        assert_eq!(response.overall_code, expected, "{key}");
        assert!(
            waited >= Duration::from_millis(100),
            "{key} answered before the timeout: {waited:?}"
        );
        assert!(waited < Duration::from_secs(2), "{key} waited {waited:?}");
    }
    let started = Instant::now();
    assert_eq!(
        server.ask_err(ask("error_rule")).await.code(),
        tonic::Code::Unavailable
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status();
}

#[tokio::test]
async fn an_open_circuit_answers_at_once_and_health_follows_the_backend_when_asked() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let redis = RedisServer::start();
    let server = start_with_env(
        POLICIES,
        &redis,
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "200"),
            ("FLOODGATE_REDIS_BREAKER_WINDOW_MS", "500"),
            ("FLOODGATE_REDIS_BREAKER_COOLDOWN_MS", "300"),
            // Opted in: by default readiness stays (tests/readiness.rs).
            ("FLOODGATE_READINESS_FOLLOWS_BACKEND", "true"),
        ],
    );
    let ask = request("policy", vec![descriptor(&[("open_rule", "breaker")])]);
    assert_eq!(server.ask(ask.clone()).await.overall_code, OK);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let status = |response: tonic::Response<tonic_health::pb::HealthCheckResponse>| {
        response.into_inner().status
    };
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    assert_eq!(
        status(health.check(check()).await.unwrap()),
        ServingStatus::Serving as i32
    );

    let pid = redis.pid().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Three requests each wait out the 200 ms timeout: a frozen Redis answers nothing, and
    // after a whole window (500 ms) of that the circuit is open.
    for _ in 0..3 {
        assert_eq!(server.ask(ask.clone()).await.overall_code, OK, "fail_open");
    }
    let started = Instant::now();
    assert_eq!(server.ask(ask.clone()).await.overall_code, OK);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(200),
        "an open circuit waited {waited:?}"
    );
    assert_eq!(server.http("GET", "/readyz", "").0, 503);
    // gRPC health follows within the watcher's interval.
    let deadline = Instant::now() + Duration::from_secs(5);
    while status(health.check(check()).await.unwrap()) != ServingStatus::NotServing as i32 {
        assert!(Instant::now() < deadline, "health did not turn NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status(health.check(check()).await.unwrap()),
        ServingStatus::NotServing as i32
    );

    // Redis answers again: with no traffic at all, probes close the circuit.
    assert!(
        std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(health.check(check()).await.unwrap()) != ServingStatus::Serving as i32 {
        assert!(Instant::now() < deadline, "health did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    let response = server
        .ask(request(
            "policy",
            vec![descriptor(&[("error_rule", "back")])],
        ))
        .await;
    assert_eq!(
        response.statuses[0].limit_remaining, 4,
        "counted in redis again"
    );
}

#[tokio::test]
async fn an_exhausted_counter_is_answered_without_redis_until_its_reset() {
    let redis = RedisServer::start();
    let server = start(POLICIES, &redis);
    let req = request("policy", vec![descriptor(&[("local_rule", "hot")])]);
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(
            client
                .should_rate_limit(req.clone())
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);

    redis.command(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        let response = client
            .should_rate_limit(req.clone())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.overall_code, OVER_LIMIT);
        let reset = response.statuses[0].duration_until_reset.expect("a reset");
        assert!(reset.seconds > 0 && reset.seconds <= 86_400, "{reset:?}");
    }
    let stats = redis.command(&["INFO", "commandstats"]);
    assert!(
        !stats.contains("cmdstat_evalsha"),
        "over-limit answers called redis:\n{stats}"
    );

    // A check (hits_addend 0) still asks Redis.
    let mut check = req.clone();
    check.descriptors[0].hits_addend = Some(pbjson_types::UInt64Value { value: 0 });
    client.should_rate_limit(check).await.unwrap();
    assert!(
        redis
            .command(&["INFO", "commandstats"])
            .contains("cmdstat_evalsha:calls=1,")
    );
}

#[tokio::test]
async fn an_override_window_beyond_a_hundred_years_is_refused_before_redis_sees_it() {
    use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use floodgate::proto::envoy::r#type::v3::RateLimitUnit;

    let redis = RedisServer::start();
    let server = start(POLICIES, &redis);
    let mut req = request("policy", vec![descriptor(&[("open_rule", "override")])]);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: RateLimitUnit::Year as i32,
        unit_multiplier: Some(pbjson_types::UInt32Value { value: 10_000_000 }),
    });
    let status = server.ask_err(req).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(redis.command(&["DBSIZE"]), "0", "a key was written");
}

#[tokio::test]
async fn once_shutdown_begins_new_grpc_connections_are_refused_while_in_flight_requests_finish() {
    let redis = RedisServer::start();
    let server = start_with_env(
        POLICIES,
        &redis,
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "3000"),
            ("FLOODGATE_SHUTDOWN_GRACE", "10"),
        ],
    );
    let ask = request("policy", vec![descriptor(&[("open_rule", "draining")])]);
    assert_eq!(server.ask(ask.clone()).await.overall_code, OK);

    // A request held in flight by a frozen Redis keeps the server in its grace period.
    let pid = redis.pid().to_string();
    let signal = |name: &str, pid: &str| {
        let sent = std::process::Command::new("kill")
            .args([name, pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {name} {pid}");
    };
    signal("-STOP", &pid);
    let mut client = server.client().await;
    let in_flight = tokio::spawn(async move { client.should_rate_limit(ask).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal("-TERM", &server.pid().to_string());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(server.grpc_addr),
    )
    .await
    .expect("a connection attempt is answered, not left waiting");
    assert_eq!(
        refused.expect_err("refused once shutdown began").kind(),
        std::io::ErrorKind::ConnectionRefused
    );

    signal("-CONT", &pid);
    let answered = in_flight
        .await
        .expect("the in-flight task")
        .expect("the in-flight request is answered during the grace period");
    assert_eq!(answered.get_ref().overall_code, OK);
}
