//! A busy Redis is not a dead one. Two floodgates share a real `redis-server` that another
//! client keeps busy with long Lua scripts (it answers between them, late), while both send
//! it far more work than it can take: every request still gets a decision, the excess is shed
//! at once to its rule's policy, the circuit breaker never opens, and the shared count stays
//! exact. A Redis cut off by a partition, which answers nothing at all, still fails fast,
//! opens the breaker, and is used again once the partition heals. And connections killed
//! under load (`CLIENT KILL`) cost the calls in flight on them, never the breaker.

mod harness;
mod redis_harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use harness::{Floodgate, OK, OVER_LIMIT, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::netns::IsolatedRedis;
use redis_harness::partition::Partition;

/// One shared counter of 150 a day (a window a test does not cross: a minute's rolled over
/// under a run once, admitting 151), per-user counters that never run out, and one of a
/// day that outlasts any partition; a hit that Redis cannot decide in time is rejected
/// (fail_closed), so only Redis admits.
const RULES: &str = "
domain: busy
descriptors:
  - key: shared
    rate_limit: {unit: day, requests_per_unit: 150}
    on_backend_error: fail_closed
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
    on_backend_error: fail_closed
  - key: partitioned
    rate_limit: {unit: day, requests_per_unit: 1000000}
    on_backend_error: fail_closed
";

const LIMIT: usize = 150;

/// Keeps Redis busy from another connection: a script that spins for `busy`, a pause of
/// `pause` (when Redis serves everyone else), again, until `stop`.
fn keep_busy(redis: &RedisServer, busy: Duration, pause: Duration, stop: Arc<AtomicBool>) {
    let spin = format!(
        "local function now() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
         local until_ = now() + {}
         while now() < until_ do end
         return 1",
        busy.as_micros()
    );
    let client = redis.client();
    std::thread::spawn(move || {
        let mut connection = client.get_connection().expect("busy client connects");
        while !stop.load(Ordering::Relaxed) {
            let _: i64 = deadpool_redis::redis::cmd("EVAL")
                .arg(&spin)
                .arg(0)
                .query(&mut connection)
                .expect("the busy script runs");
            std::thread::sleep(pause);
        }
    });
}

#[tokio::test]
async fn a_redis_busy_beyond_its_capacity_sheds_the_excess_and_never_opens_the_breaker() {
    let redis = RedisServer::start();
    let start = || {
        Floodgate::start_with_env(
            &[("rules.yaml", RULES)],
            &["--backend", "redis", "--redis-url", &redis.url()],
            &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "100")],
        )
    };
    let servers = [start(), start()];
    let stop = Arc::new(AtomicBool::new(false));
    // Redis answers others 5 ms in every 125: calls wait up to 120 ms in its queue, more
    // than the 100 ms command timeout within which Redis must run them.
    keep_busy(
        &redis,
        Duration::from_millis(120),
        Duration::from_millis(5),
        stop.clone(),
    );

    // 64 requests in flight on each server for two seconds, five hits each.
    let until = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for (task, server) in (0..128).map(|task| (task, &servers[task % 2])) {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let (mut admitted, mut rejected, mut failed) = (0, 0, Vec::new());
            let mut round = 0;
            while Instant::now() < until {
                let mut descriptors = vec![descriptor(&[("shared", "all")])];
                descriptors.extend(
                    (0..4).map(|i| descriptor(&[("user", &format!("u{task}-{round}-{i}"))])),
                );
                round += 1;
                match client.should_rate_limit(request("busy", descriptors)).await {
                    Ok(response) if response.get_ref().overall_code == OK => admitted += 1,
                    Ok(response) if response.get_ref().overall_code == OVER_LIMIT => rejected += 1,
                    Ok(response) => failed.push(format!("{:?}", response.get_ref())),
                    Err(status) => failed.push(format!("{status:?}")),
                }
            }
            (admitted, rejected, failed)
        }));
    }
    let (mut admitted, mut rejected) = (0, 0);
    for task in tasks {
        let (a, r, failed) = task.await.expect("a client task");
        assert!(failed.is_empty(), "requests without a decision: {failed:?}");
        admitted += a;
        rejected += r;
    }
    stop.store(true, Ordering::Relaxed);

    assert!(
        (1..=LIMIT).contains(&admitted),
        "admitted {admitted} against a shared limit of {LIMIT}"
    );
    let shed: f64 = servers
        .iter()
        .map(|server| server.metric("floodgate_backend_shed_total"))
        .sum();
    assert!(
        shed > 0.0,
        "nothing was shed in {} requests",
        admitted + rejected
    );
    for server in &servers {
        assert_eq!(
            server.metric("floodgate_backend_circuit_open"),
            0.0,
            "{}",
            server.stderr()
        );
        let (_, page) = server.http("GET", "/metrics", "");
        assert!(
            page.contains("floodgate_backend_errors_total{kind=\"circuit_open\"} 0"),
            "the breaker refused calls: {page}"
        );
    }
}

/// A floodgate on the Redis at `url`, with a short timeout and breaker window.
fn behind(url: &str) -> Floodgate {
    Floodgate::start_with_env(
        &[("rules.yaml", RULES)],
        &["--backend", "redis", "--redis-url", url],
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "50"),
            ("FLOODGATE_REDIS_BREAKER_WINDOW_MS", "300"),
            ("FLOODGATE_REDIS_BREAKER_COOLDOWN_MS", "200"),
        ],
    )
}

#[tokio::test]
async fn a_partitioned_redis_fails_fast_opens_the_breaker_and_recovers_after_healing() {
    let redis = RedisServer::start();
    let partition = Partition::relay_to(redis.port()).await;
    let server = behind(&partition.url());
    let cut = || partition.cut();
    let heal = || partition.heal();
    fails_fast_then_recovers(&server, cut, heal, Duration::ZERO).await;
}

/// How long the iptables partition lasts: `FLOODGATE_PARTITION_MS`, or 2 s (TCP's own
/// retransmissions on the old connection have backed off to over a second by then).
fn partition_length() -> Duration {
    let millis = std::env::var("FLOODGATE_PARTITION_MS").ok();
    Duration::from_millis(millis.and_then(|ms| ms.parse().ok()).unwrap_or(2_000))
}

#[tokio::test]
async fn a_redis_partitioned_by_iptables_decides_again_about_a_cooldown_after_healing() {
    let redis = match IsolatedRedis::start() {
        Ok(redis) => redis,
        Err(why) => {
            eprintln!("skipped: no network namespace with iptables here: {why}");
            return;
        }
    };
    let server = behind(&redis.url());
    let recovered =
        fails_fast_then_recovers(&server, || redis.cut(), || redis.heal(), partition_length())
            .await;
    eprintln!(
        "partitioned {:?}: decisions back {recovered:?} after healing",
        partition_length()
    );
}

/// Cuts Redis off with `cut`: every request gets fail_closed within the timeout, the breaker
/// opens; after `hold`, heals it with `heal`: Redis decides again, on the count it kept.
/// How long after healing the first decision came back.
async fn fails_fast_then_recovers(
    server: &Floodgate,
    cut: impl FnOnce(),
    heal: impl FnOnce(),
    hold: Duration,
) -> Duration {
    let ask = || request("busy", vec![descriptor(&[("partitioned", "p")])]);
    let remaining = |response: &RateLimitResponse| response.statuses[0].limit_remaining;
    // The first call also connects and loads the script: on a loaded machine it can take
    // longer than the 50 ms timeout and be answered by fail_closed. Ask until Redis decides.
    let ready_at = Instant::now();
    let first = loop {
        let response = server.ask(ask()).await;
        if response.overall_code == OK {
            break response;
        }
        assert!(
            ready_at.elapsed() < Duration::from_secs(10),
            "Redis never decided before the cut"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let counted = remaining(&first);

    cut();
    // Nothing answers: each request waits at most the timeout and gets fail_closed, and once
    // a whole window went by without an answer the breaker opens and answers at once.
    let cut_at = Instant::now();
    loop {
        let started = Instant::now();
        let response = server.ask(ask()).await;
        assert_eq!(response.overall_code, OVER_LIMIT, "fail_closed");
        assert!(started.elapsed() < Duration::from_secs(1), "a request hung");
        if server.http("GET", "/readyz", "").1.contains("circuit open") {
            break;
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(10),
            "the breaker did not open"
        );
    }
    // The open breaker answers without calling Redis. A request can still be the probe the
    // cooldown lets through (it waits for its timeout), so one of a few must be refused.
    let refused = r#"floodgate_backend_errors_total{kind="circuit_open"}"#;
    let refused_before = server.metric(refused);
    for _ in 0..5 {
        assert_eq!(server.ask(ask()).await.overall_code, OVER_LIMIT);
    }
    assert!(
        server.metric(refused) > refused_before,
        "the open breaker refused none of five calls"
    );

    // Traffic goes on while the partition lasts, answered by the open breaker.
    while cut_at.elapsed() < hold {
        assert_eq!(server.ask(ask()).await.overall_code, OVER_LIMIT);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    heal();
    // The connection that lost bytes is given up; a new one gets through, the probe closes
    // the breaker, and Redis decides again, on the count it kept.
    let healed_at = Instant::now();
    let back = loop {
        let response = server.ask(ask()).await;
        if response.overall_code == OK {
            break response;
        }
        assert!(
            healed_at.elapsed() < Duration::from_secs(10),
            "decisions did not come back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        remaining(&back) < counted,
        "counted in redis again: {} after {counted}",
        remaining(&back)
    );
    let recovered = healed_at.elapsed();
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
    recovered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connections_fail_only_the_calls_in_flight_and_never_open_the_breaker() {
    const IN_FLIGHT: usize = 32;
    const KILLS: usize = 6;
    let redis = RedisServer::start();
    let server = Floodgate::start_with_env(
        &[("rules.yaml", RULES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..IN_FLIGHT {
        let mut client = server.client().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let user = format!("killed-{task}");
            let (mut decided, mut refused) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                let ask = request("busy", vec![descriptor(&[("user", &user)])]);
                let response = client.should_rate_limit(ask).await.expect("a decision");
                match response.into_inner().overall_code {
                    OK => decided += 1,
                    _ => refused += 1,
                }
            }
            (decided, refused)
        }));
    }
    // More failures than `redis_breaker_failures` (5) within one breaker window, each a
    // connection dropped under a full load: each costs the call in flight on it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for kill in 0..KILLS {
        let clients = redis.command(&["CLIENT", "LIST"]);
        let killed: usize = redis
            .command(&["CLIENT", "KILL", "TYPE", "normal"])
            .parse()
            .expect("a count");
        assert!(
            killed >= 1,
            "kill {kill}: floodgate had no connection to kill: {clients}\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut decided, mut refused) = (0, 0);
    for task in tasks {
        let (d, r) = task.await.expect("a client task");
        decided += d;
        refused += r;
    }
    assert!(
        refused <= KILLS * IN_FLIGHT,
        "{refused} requests failed over to fail_closed for {KILLS} dropped connections"
    );
    assert!(
        decided > 10 * refused,
        "decided {decided}, refused {refused}"
    );
    assert_eq!(
        server.metric("floodgate_backend_errors_total{kind=\"circuit_open\"}"),
        0.0,
        "the breaker opened"
    );
    assert_eq!(server.http("GET", "/readyz", "").0, 200);
}
