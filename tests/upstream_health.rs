//! envoyproxy/ratelimit's health tests (`test/server/health_test.go`), as tests of the real
//! binary. Upstream's tests turn its health checker's components (Redis, the rules) up and
//! down by hand; here the components really come and go: floodgate started as upstream's
//! `ratelimit` on a real `redis-server` with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true`
//! (health follows the connection to Redis), which the test kills and starts again on its
//! port, and, with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true`, rules that come over xDS
//! (`CONFIG_TYPE=GRPC_XDS_SOTW`, `FORCE_START_WITHOUT_INITIAL_CONFIG=true`) only when the
//! test pushes them. Health is read as a probe reads it: `GET /healthcheck` on the HTTP
//! port, `grpc.health.v1.Health/Check` for upstream's service name on the gRPC port.
//!
//! Upstream's file as read: `read_file` on `test/server/health_test.go` returned commit
//! `0904ca1cd03d52e2641cf88c0ea776d873d70c9e`. The newest copy the index holds (5,062
//! characters, stored without its commit; index id `55730674405`) has the same four
//! functions, with Redis counted unhealthy until its connection is confirmed; these tests
//! follow it. That first state is the moment before the connection, which a process
//! serving requests is already past, so each test starts from Redis confirmed.
//! `tests/upstream/README.md` says the same.
//!
//! | upstream function | here |
//! |---|---|
//! | `TestHealthCheck` | `health_check` |
//! | `TestHealthyWithAtLeastOneConfigLoaded` | `healthy_with_at_least_one_config_loaded` |
//! | `TestGrpcHealthCheck` | `grpc_health_check` |
//! | `TestGrpcHealthyWithAtLeastOneConfigLoaded` | `grpc_healthy_with_at_least_one_config_loaded` |
//!
//! Each asserts upstream's answers: `/healthcheck` 200 `OK` or 500, and gRPC health under
//! the service name `ratelimit` (floodgate reports under `""` and the rate-limit services'
//! own names as well).

mod harness;
mod redis_harness;
mod upstream_process;
mod xds_support;

use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{descriptor, request};
use redis_harness::RedisServer;
use tonic_health::pb::health_check_response::ServingStatus;
use upstream_process::Upstream;
use xds_support::{Snapshot, XdsServer};

/// How long a change of health may take to show on a busy machine.
const PATIENCE: Duration = Duration::from_secs(20);
/// What upstream's `/healthcheck` answers while healthy: 200 and this body.
const HEALTHY_BODY: &str = "OK";
/// What upstream's `/healthcheck` answers while unhealthy.
const UNHEALTHY: u16 = 500;
/// The name upstream registers its gRPC health status under.
const HEALTH_SERVICE: &str = "ratelimit";

/// The domain and descriptor whose counters live in Redis.
const DOMAIN: &str = "health";
const KEY: &str = "client";
const RULES: &str = "\
domain: health
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 1000}
";

/// floodgate started as `ratelimit`, on a Redis it checks the connection to.
struct Server {
    upstream: Upstream,
    redis_port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Rules from files (`None`) or from `xds`, not yet sent; `extra` added to the
    /// environment.
    fn start(redis: &RedisServer, xds: Option<&XdsServer>, extra: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("a directory");
        let rules = dir.path().join("runtime/ratelimit/config");
        std::fs::create_dir_all(&rules).expect("the runtime directory");
        std::fs::write(rules.join("health.yaml"), RULES).expect("a rule file");
        let root = dir.path().join("runtime").display().to_string();
        let redis_url = format!("127.0.0.1:{}", redis.port());
        let xds_url = xds.map(|xds| xds.addr.to_string()).unwrap_or_default();
        let mut env = vec![
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("USE_STATSD", "false"),
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis_url.as_str()),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
        ];
        if xds.is_some() {
            env.extend([
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", xds_url.as_str()),
                ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
                ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
            ]);
        }
        env.extend_from_slice(extra);
        let upstream = Upstream::start(dir.path(), &env);
        Server {
            upstream,
            redis_port: redis.port(),
            _dir: dir,
        }
    }

    /// `GET /healthcheck`: the status and the body.
    fn healthcheck(&self) -> (u16, String) {
        harness::http(self.upstream.http, "GET", "/healthcheck", "")
    }

    /// The gRPC health status of upstream's service, or the error code asking for it.
    async fn grpc_health(&self) -> Result<i32, tonic::Code> {
        let answer = harness::grpc_health(self.upstream.grpc, HEALTH_SERVICE).await;
        answer.map_err(|status| status.code())
    }

    /// One request on the rule counted in Redis; what it is answered does not matter, only
    /// that the server talks to Redis and finds out how it is.
    async fn use_redis(&self) {
        let ask = request(DOMAIN, vec![descriptor(&[(KEY, "probe")])]);
        if let Ok(mut client) =
            RateLimitServiceClient::connect(format!("http://{}", self.upstream.grpc)).await
        {
            let _ = client.should_rate_limit(ask).await;
        }
    }

    /// Waits until `/healthcheck` answers `status` (and, when healthy, upstream's body),
    /// using Redis meanwhile when `traffic` says so.
    async fn wait_for_healthcheck(&self, status: u16, traffic: bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (now, body) = self.healthcheck();
            if now == status {
                if status == 200 {
                    assert_eq!(body, HEALTHY_BODY);
                }
                return;
            }
            assert!(
                Instant::now() < deadline,
                "/healthcheck answers {now} {body:?}, not {status}:\n{}",
                self.upstream.stderr()
            );
            if traffic {
                self.use_redis().await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the gRPC health status is `wanted`, using Redis meanwhile when `traffic`
    /// says so.
    async fn wait_for_grpc_health(&self, wanted: ServingStatus, traffic: bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let now = self.grpc_health().await;
            if now == Ok(wanted as i32) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "gRPC health is {now:?}, not {wanted:?}:\n{}",
                self.upstream.stderr()
            );
            if traffic {
                self.use_redis().await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Redis back on its port (empty: nothing is persisted).
    fn restart_redis(&self) -> RedisServer {
        RedisServer::start_on(self.redis_port)
    }
}

/// The rules a snapshot brings: the same as the rule file's.
fn snapshot(version: &str) -> Snapshot {
    Snapshot::limit(version, DOMAIN, KEY, 1000)
}

/// Health follows the connection to Redis: healthy, unhealthy once Redis is gone, healthy
/// when it is back.
#[tokio::test]
async fn health_check() {
    let redis = RedisServer::start();
    let server = Server::start(&redis, None, &[]);
    server.wait_for_healthcheck(200, false).await;
    drop(redis);
    server.wait_for_healthcheck(UNHEALTHY, true).await;
    let _redis = server.restart_redis();
    server.wait_for_healthcheck(200, false).await;
}

/// With `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, healthy needs rules as well as Redis:
/// unhealthy until the first rules come, then following Redis.
#[tokio::test]
async fn healthy_with_at_least_one_config_loaded() {
    let redis = RedisServer::start();
    let xds = XdsServer::start(None).await;
    let server = Server::start(
        &redis,
        Some(&xds),
        &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")],
    );
    assert_eq!(server.healthcheck().0, UNHEALTHY, "no rules yet");
    xds.push(snapshot("1"));
    server.wait_for_healthcheck(200, false).await;
    drop(redis);
    server.wait_for_healthcheck(UNHEALTHY, true).await;
    let _redis = server.restart_redis();
    server.wait_for_healthcheck(200, false).await;
}

/// gRPC health follows the connection to Redis.
#[tokio::test]
async fn grpc_health_check() {
    let redis = RedisServer::start();
    let server = Server::start(&redis, None, &[]);
    server
        .wait_for_grpc_health(ServingStatus::Serving, false)
        .await;
    drop(redis);
    server
        .wait_for_grpc_health(ServingStatus::NotServing, true)
        .await;
}

/// With `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, gRPC health is NOT_SERVING until rules
/// come, SERVING with rules and Redis, and NOT_SERVING again when both go.
#[tokio::test]
async fn grpc_healthy_with_at_least_one_config_loaded() {
    let redis = RedisServer::start();
    let xds = XdsServer::start(None).await;
    let server = Server::start(
        &redis,
        Some(&xds),
        &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")],
    );
    assert_eq!(
        server.grpc_health().await,
        Ok(ServingStatus::NotServing as i32),
        "no rules yet"
    );
    xds.push(snapshot("1"));
    server
        .wait_for_grpc_health(ServingStatus::Serving, false)
        .await;
    // Redis goes, then the rules (a snapshot without any).
    drop(redis);
    server
        .wait_for_grpc_health(ServingStatus::NotServing, true)
        .await;
    xds.push(Snapshot {
        version: "2".into(),
        configs: vec![],
    });
    xds.ack_of("2").await;
    server
        .wait_for_grpc_health(ServingStatus::NotServing, false)
        .await;
}
