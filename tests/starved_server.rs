//! A server short of CPU is slow at everything, and that is no reason to shed: floodgate
//! pinned to one core beside a busy loop, Redis on its own, many requests in flight with
//! a generous deadline. Every request is decided by Redis: none is shed, none times out.

mod harness;
mod redis_harness;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::{Floodgate, OK, descriptor, request};
use redis_harness::RedisServer;

const RULES: &str = "
domain: starved
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
    on_backend_error: error
";

/// A busy loop on core 0, stopped when dropped.
struct Hog(Child);

impl Hog {
    fn on_core_zero() -> Hog {
        let child = Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .spawn()
            .expect("taskset (util-linux) runs a busy loop");
        Hog(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_short_of_cpu_sheds_nothing_a_live_redis_decides() {
    const IN_FLIGHT: usize = 128;
    let redis = RedisServer::start();
    let server = Floodgate::start_wrapped(
        &["taskset", "-c", "0"],
        &[("rules.yaml", RULES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[],
    );
    let _hog = Hog::on_core_zero();

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
