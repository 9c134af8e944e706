//! Replicas whose clocks disagree still share one count: the scripts read Redis' `TIME`, not
//! the caller's clock. Three `floodgate` binaries on one `redis-server`, one on the real
//! clock, one an hour ahead and one a day behind (libfaketime), take turns answering
//! requests for one counter; together they admit exactly the limit.
//!
//! How the clocks are skewed: floodgate is linked dynamically against glibc, and Rust's
//! `SystemTime::now` calls glibc's `clock_gettime` (which reaches the vDSO from inside
//! glibc), so libfaketime's `clock_gettime`, preloaded, answers instead. The `faketime`
//! wrapper forks and waits for its child, so killing it would orphan floodgate: the test
//! sets what the wrapper sets, `LD_PRELOAD` and `FAKETIME`, on floodgate itself.
//! `FAKETIME_DONT_FAKE_MONOTONIC=1` leaves `Instant` (tokio's timers, the Redis timeouts)
//! alone: a day subtracted from the monotonic clock of a machine up for less than a day
//! would be negative. Each server's own log timestamp proves its clock is skewed, so a
//! libfaketime that had no effect fails the test instead of letting it pass vacuously.

mod harness;
mod redis_harness;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{descriptor, request};
use redis_harness::RedisServer;
use tonic::transport::Channel;

/// Where `faketime` points `LD_PRELOAD` (`$LIB` is expanded by the dynamic loader).
const LIBFAKETIME: &str = "/usr/$LIB/faketime/libfaketime.so.1";

const RULES: &str = "
domain: skew
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}
";
const LIMIT: u32 = 5;
/// Requests per test: three times the limit, taking turns over the three servers.
const REQUESTS: usize = 15;

/// The clocks of the three servers, relative to the real one: (FAKETIME, seconds).
const SKEWS: [(Option<&str>, i64); 3] = [
    (None, 0),
    (Some("+3600s"), 3_600),
    (Some("-86400s"), -86_400),
];

/// A floodgate binary on the redis backend, maybe on a skewed clock; killed when dropped.
struct Replica {
    child: Child,
    grpc_addr: SocketAddr,
    stderr: PathBuf,
    _rules: tempfile::TempDir,
}

impl Replica {
    /// Starts floodgate with the flags `tests/harness` uses, `FAKETIME=skew` if given, and
    /// checks that its clock is off by `skew_seconds`.
    fn start(redis: &RedisServer, skew: Option<&str>, skew_seconds: i64) -> Replica {
        let rules = harness::write_rules(&[("rules.yaml", RULES)]);
        let stderr = rules.path().join(".stderr");
        let mut command = harness::command();
        command
            .args(["serve", "--grpc-addr", "127.0.0.1:0"])
            .args(["--http-addr", "127.0.0.1:0", "--rules"])
            .arg(rules.path())
            .args(["--backend", "redis", "--redis-url", &redis.url()])
            .env("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")
            // The "floodgate serving" line, whose timestamp shows the server's clock.
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).expect("log file"));
        if let Some(offset) = skew {
            command
                .env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = command.spawn().expect("floodgate binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("reading the startup line");
        let real_now = unix_seconds(SystemTime::now());
        let mut replica = Replica {
            child,
            grpc_addr: "0.0.0.0:0".parse().expect("an address"),
            stderr,
            _rules: rules,
        };
        let Some(addresses) = line.trim().strip_prefix("floodgate listening: ") else {
            panic!(
                "floodgate ({skew:?}) did not start: {line:?}\n{}",
                replica.log()
            );
        };
        replica.grpc_addr = addresses
            .split_whitespace()
            .find_map(|part| part.strip_prefix("grpc="))
            .and_then(|address| address.parse().ok())
            .unwrap_or_else(|| panic!("no grpc= in {addresses:?}"));

        let logged = replica.startup_time();
        let offset = logged - real_now;
        assert!(
            (offset - skew_seconds).abs() < 60,
            "floodgate under FAKETIME={skew:?} logged its start {offset} s from the real \
             clock, not {skew_seconds} s: the clock is not skewed as the test needs"
        );
        replica
    }

    /// The timestamp, in seconds since the epoch, of the "floodgate serving" log line:
    /// the server's own idea of the time it started.
    fn startup_time(&self) -> i64 {
        let log = strip_ansi(&self.log());
        let line = log
            .lines()
            .find(|line| line.contains("floodgate serving"))
            .unwrap_or_else(|| panic!("no \"floodgate serving\" line in:\n{log}"));
        let stamp = line.split_whitespace().next().unwrap_or_default();
        let timestamp: jiff::Timestamp = stamp
            .parse()
            .unwrap_or_else(|e| panic!("{stamp:?} in {line:?} is not a timestamp: {e}"));
        timestamp.as_second()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc_addr))
            .await
            .expect("connecting to floodgate")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unix_seconds(time: SystemTime) -> i64 {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    i64::try_from(seconds).expect("before 2^63")
}

/// The text without terminal colour codes (`ESC [ … m`), which the log carries.
fn strip_ansi(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            plain.push(c);
        }
    }
    plain
}

/// Redis, the three replicas, and a client to each.
struct Cluster {
    redis: RedisServer,
    _replicas: Vec<Replica>,
    clients: Vec<RateLimitServiceClient<Channel>>,
}

impl Cluster {
    async fn start() -> Cluster {
        let redis = RedisServer::start();
        let replicas: Vec<Replica> = SKEWS
            .iter()
            .map(|&(skew, seconds)| Replica::start(&redis, skew, seconds))
            .collect();
        let mut clients = Vec::new();
        for replica in &replicas {
            clients.push(replica.client().await);
        }
        Cluster {
            redis,
            _replicas: replicas,
            clients,
        }
    }

    /// Redis' clock, in µs since the epoch.
    async fn redis_now(&self) -> u64 {
        let mut connection = self.redis.connection().await;
        let (seconds, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut connection)
            .await
            .expect("TIME");
        seconds * 1_000_000 + micros
    }

    /// `REQUESTS` requests for `key = value`, request `i` to replica `i mod 3`.
    async fn take_turns(&self, key: &str, value: &str) -> Vec<RateLimitResponse> {
        let mut responses = Vec::new();
        for i in 0..REQUESTS {
            let mut client = self.clients[i % self.clients.len()].clone();
            let response = client
                .should_rate_limit(request("skew", vec![descriptor(&[(key, value)])]))
                .await
                .expect("ShouldRateLimit succeeds")
                .into_inner();
            responses.push(response);
        }
        responses
    }

    /// [`Cluster::take_turns`] within one fixed window of `window` on Redis' clock: starts
    /// right after a boundary when less than half the window (at most 5 s) is left, and
    /// tries again with a new counter if the requests still straddled two windows.
    async fn take_turns_in_one_window(
        &self,
        key: &str,
        window: Duration,
    ) -> Vec<RateLimitResponse> {
        let w = u64::try_from(window.as_micros()).expect("a short window");
        for attempt in 0..5 {
            let now = self.redis_now().await;
            let left = w - now % w;
            if left < (w / 2).min(5_000_000) {
                tokio::time::sleep(Duration::from_micros(left) + Duration::from_millis(20)).await;
            }
            let before = self.redis_now().await;
            let responses = self.take_turns(key, &format!("attempt-{attempt}")).await;
            let after = self.redis_now().await;
            if before / w == after / w {
                return responses;
            }
        }
        panic!("five attempts to send {REQUESTS} requests within one {window:?} window failed");
    }
}

/// Checks that the replicas counted as one: the first `LIMIT` requests pass, with the
/// remaining quota counting down across replicas, and every later one is refused.
fn assert_one_count(what: &str, responses: &[RateLimitResponse], window: Duration) {
    let codes: Vec<i32> = responses.iter().map(|r| r.overall_code).collect();
    let remaining: Vec<u32> = responses
        .iter()
        .map(|r| r.statuses[0].limit_remaining)
        .collect();
    let expected_codes: Vec<i32> = (0..REQUESTS)
        .map(|i| {
            if i < LIMIT as usize {
                Code::Ok as i32
            } else {
                Code::OverLimit as i32
            }
        })
        .collect();
    let expected_remaining: Vec<u32> = (0..REQUESTS as u32)
        .map(|i| LIMIT.saturating_sub(i + 1))
        .collect();
    assert_eq!(
        (codes, remaining),
        (expected_codes, expected_remaining),
        "{what}: requests taking turns over replicas with clocks {SKEWS:?} must count as one \
         (codes 1 = OK, 2 = OVER_LIMIT; remaining quota)"
    );
    for (i, response) in responses.iter().enumerate() {
        let reset = response.statuses[0]
            .duration_until_reset
            .expect("a reset duration");
        let reset = Duration::new(reset.seconds as u64, reset.nanos as u32);
        assert!(
            reset <= window,
            "{what}: request {i} (replica {}) reports a reset in {reset:?}, beyond {window:?}",
            i % SKEWS.len()
        );
    }
}

#[tokio::test]
async fn a_per_second_window_is_one_window_across_skewed_clocks() {
    let cluster = Cluster::start().await;
    let window = Duration::from_secs(1);
    let responses = cluster.take_turns_in_one_window("per_second", window).await;
    assert_one_count("5 per second, fixed_window", &responses, window);
}

#[tokio::test]
async fn a_per_minute_window_is_one_window_across_skewed_clocks() {
    let cluster = Cluster::start().await;
    let window = Duration::from_secs(60);
    let responses = cluster.take_turns_in_one_window("per_minute", window).await;
    assert_one_count("5 per minute, fixed_window", &responses, window);
}

#[tokio::test]
async fn a_token_bucket_is_one_bucket_across_skewed_clocks() {
    let cluster = Cluster::start().await;
    // 5 per hour: a token comes back every 12 minutes, never during the test.
    let responses = cluster.take_turns("bucket", "shared").await;
    assert_one_count(
        "5 per hour, token_bucket",
        &responses,
        Duration::from_secs(720),
    );
}
