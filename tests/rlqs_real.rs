//! The RLQS phase sweep of `tests/rlqs_phases.rs` against the real binary, in real time: the
//! same model of Envoy 1.40's client, over gRPC, reporting at every 0.5 s of the report
//! interval from the reset, to floodgate on the memory backend, and to two floodgates on
//! one real Redis (instances spread over both). Windows of a second and of ten (longer
//! ones take their length in real time: the in-process sweep covers them).

mod harness;
mod redis_harness;
mod rlqs_model;
mod rlqs_sweep;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use floodgate::quota::Connection;
use harness::Floodgate;
use redis_harness::RedisServer;
use rlqs_sweep::{Scenario, Timeline, Transport, run_sweep};

/// Floodgate processes: a stream to one is a gRPC stream, its answers forwarded.
struct Replicas(Vec<Floodgate>);

impl Transport for Replicas {
    async fn connect(&self, replica: usize) -> Connection {
        let server = &self.0[replica % self.0.len()];
        harness::quota_connection(server).await
    }
}

/// Seconds since the last multiple of `rlqs_sweep::ALIGNED_SECONDS` before the test began
/// (a window of every length the sweep uses starts there), on the wall clock the
/// servers and Redis count windows by.
struct WallClock {
    base: f64,
}

impl WallClock {
    fn new() -> Self {
        let now = unix_seconds();
        let aligned = rlqs_sweep::ALIGNED_SECONDS as f64;
        WallClock {
            base: (now / aligned).floor() * aligned,
        }
    }
}

impl Timeline for WallClock {
    fn now(&self) -> f64 {
        unix_seconds() - self.base
    }

    fn instant(&self, at: f64) -> tokio::time::Instant {
        let wait = (at - self.now()).max(0.0);
        tokio::time::Instant::now() + Duration::from_secs_f64(wait)
    }
}

fn unix_seconds() -> f64 {
    (SystemTime::now().duration_since(UNIX_EPOCH))
        .expect("after 1970")
        .as_secs_f64()
}

/// Windows of 1 s and 10 s, limits of 5 and 100, every 0.5 s of the report interval from
/// the reset, one instance or two on `replicas`, demand at and above the limit.
fn scenarios(replicas: usize) -> Vec<Scenario> {
    let mut scenarios = Vec::new();
    for (window, offsets) in [(1, 2), (10, 10)] {
        for limit in [5, 100] {
            for step in 0..offsets {
                let offset = f64::from(step) * 0.5;
                for envoys in [1, 2] {
                    for demand in [1.0, 3.0] {
                        let replicas = envoys.min(replicas);
                        scenarios.push(Scenario::new(
                            window, limit, offset, envoys, replicas, demand,
                        ));
                    }
                }
            }
        }
    }
    scenarios
}

/// Starts `replicas` floodgates with the sweep's rules and `flags`, and runs the sweep.
async fn sweep(replicas: usize, flags: &[&str]) {
    let mut scenarios = scenarios(replicas);
    let rules = rlqs_sweep::rules(&mut scenarios);
    let servers = (0..replicas)
        .map(|_| {
            Floodgate::start_with_env(
                &[("phases.yaml", rules.as_str())],
                flags,
                &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
            )
        })
        .collect();
    let clock = WallClock::new();
    let begin = clock.now() + 1.0;
    run_sweep(&Replicas(servers), &clock, &scenarios, begin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_holds_at_every_phase_on_the_real_server() {
    sweep(1, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_holds_at_every_phase_on_two_replicas_sharing_redis() {
    let redis = RedisServer::start();
    sweep(2, &["--backend", "redis", "--redis-url", &redis.url()]).await;
}
