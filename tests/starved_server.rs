//! A server short of CPU is slow at everything, and that is no reason to shed: floodgate held
//! to a quarter of one core by a cgroup quota (at a priority above the machine's other work,
//! so it gets exactly that share however busy the machine is), Redis at a higher priority
//! still, many requests in flight with a generous deadline and an operator who lets them
//! wait for it (`redis_max_wait_ms`). Every request is decided by Redis: none is shed, none
//! times out.

mod harness;
mod redis_harness;

use std::time::{Duration, Instant};

use harness::cpu::{CpuQuota, URGENT};
use harness::{Floodgate, OK, descriptor, request};
use redis_harness::RedisServer;

const RULES: &str = "
domain: starved
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
    on_backend_error: error
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_short_of_cpu_sheds_nothing_a_live_redis_decides() {
    const IN_FLIGHT: usize = 128;
    let quota = match CpuQuota::new(25, 10_000) {
        Ok(quota) => quota,
        Err(why) => {
            eprintln!("skipped: no CPU quota for the server here: {why}");
            return;
        }
    };
    // The harness runs Redis above the machine's other work, and the server too.
    let redis = RedisServer::start();
    let prefix = quota.prefix(URGENT);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let server = Floodgate::start_wrapped(
        &prefix,
        &[("rules.yaml", RULES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[("FLOODGATE_REDIS_MAX_WAIT_MS", "5000")],
    );

    let until = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for task in 0..IN_FLIGHT {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let (mut decided, mut other) = (0, Vec::new());
            while Instant::now() < until {
                let ask = request(
                    "starved",
                    vec![descriptor(&[("user", &format!("u{task}"))])],
                );
                let mut ask = tonic::Request::new(ask);
                ask.set_timeout(Duration::from_secs(5));
                match client.should_rate_limit(ask).await {
                    Ok(response) if response.get_ref().overall_code == OK => decided += 1,
                    Ok(response) => other.push(format!("{:?}", response.get_ref())),
                    Err(status) => other.push(format!("{status:?}")),
                }
            }
            (decided, other)
        }));
    }
    let mut decided = 0;
    for task in tasks {
        let (count, other) = task.await.expect("a client task");
        assert!(
            other.is_empty(),
            "answers not decided by Redis: {other:?}\n{}",
            server.stderr()
        );
        decided += count;
    }
    assert!(decided > 0);
    assert_eq!(server.metric("floodgate_backend_shed_total"), 0.0);
    let timeouts = r#"floodgate_backend_errors_total{kind="timeout"}"#;
    assert_eq!(server.metric(timeouts), 0.0);
}
