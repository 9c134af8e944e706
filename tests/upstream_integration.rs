//! envoyproxy/ratelimit's integration tests, as a conformance test of floodgate: the real
//! binary started as upstream's `ratelimit`, configured only by the environment variables
//! upstream's tests give upstream, on upstream's rule files (`tests/upstream/integration`,
//! unchanged), against real Redis deployments, an xDS server and TLS peers on free ports.
//! A change of upstream's files or expectations shows up here as a failing test.
//!
//! Upstream's tests and variants (`test/integration/*_test.go`), and what stands for each:
//!
//! | upstream | here |
//! |---|---|
//! | `TestBasicConfig` (`WithoutPerSecondRedis`, `…WithLocalCache`, `…WithCachePrefix`, `…WithstopCacheKeyIncrementWhenOverlimitConfig`, `…WithLocalCacheAndstop…`) | one `basic_*` test per row of the `variants!` table |
//! | `TestBasicTLSConfig`, `TestBasicAuthConfig`, `TestBasicAuthConfigWithRedisCluster`, `TestBasicAuthConfigWithRedisSentinel` | `basic_*` rows: TLS, TLS with a client certificate, a password, a cluster, Sentinel |
//! | `TestXdsProviderBasicConfig` | `xds_*` |
//! | `TestBasicReloadConfig` (`BasicWithoutWatchRoot`, `ReloadWithoutWatchRoot`), `TestXdsProviderBasicConfigReload` | `basic_without_watch_root`, `reload_*` |
//! | `TestBasicConfig_ExtraTags` | `extra_tags_are_sent_with_upstreams_stats` |
//! | `Test_mTLS`, `TestReloadGRPCServerCerts` | `mutual_tls_*`, `a_rotated_server_certificate_*` |
//! | `TestShareThreshold` | `share_threshold_*` |
//!
//! | `TestBasicConfig/WithPerSecondRedis…` and the `WithPerSecondRedis…` variants of the TLS, auth, cluster and sentinel tests | `basic_*_per_second_*` rows, a second deployment of the same kind for `REDIS_PERSECOND_*` |
//! | the local cache's gauges, which upstream reads in `TestBasicConfig` | `the_local_cache_reports_upstreams_gauges` |
//!
//! Not ported: the memcache tests (`BACKEND_TYPE=memcache` is not offered, docs/migration.md
//! `MEMCACHE_*`).

mod harness;
mod redis_harness;
mod upstream_process;
mod xds_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use floodgate::proto::ratelimit::config::ratelimit::v3::{RateLimitConfig, RateLimitUnit};
use harness::statsd::StatsdServer;
use harness::{OK, OVER_LIMIT, descriptor, request};
use redis_harness::cluster::RedisCluster;
use redis_harness::sentinel::{MASTER, Sentinels};
use redis_harness::tls::{Certificates, ServerFiles, text};
use redis_harness::{Access, RedisServer};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use upstream_process::Upstream;
use xds_support::{Snapshot, XdsServer};

/// Upstream's rule files, as its tests lay them out.
const UPSTREAM_FILES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upstream/integration");
/// The password upstream's tests give every Redis that asks for one.
const PASSWORD: &str = "password123";
/// How long a sequence counting in one window may take, at most, on a loaded machine: a
/// sequence starts only with at least this much of its window left.
const SEQUENCE: Duration = Duration::from_secs(10);
/// How long a TLS connection may take to open.
const CONNECT: Duration = Duration::from_secs(5);
/// Bound on a reload taking effect.
const RELOAD: Duration = Duration::from_secs(30);

/// Which of upstream's variables point floodgate at a Redis deployment.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// `REDIS_*`: every limit, or every limit but per-second ones.
    Main,
    /// `REDIS_PERSECOND_*`: per-second limits, with `REDIS_PERSECOND=true`.
    PerSecond,
}

impl Role {
    fn prefix(self) -> &'static str {
        match self {
            Role::Main => "REDIS",
            Role::PerSecond => "REDIS_PERSECOND",
        }
    }
}

/// A Redis deployment of upstream's test set-up.
#[derive(Debug, Clone, Copy)]
enum Redis {
    /// One open server.
    Plain,
    /// One server with a password.
    Password,
    /// One server over TLS only, with a password.
    Tls,
    /// [`Redis::Tls`] that asks clients for a certificate its CA signed.
    TlsClientCertificate,
    /// Three primaries and three replicas, with a password.
    Cluster,
    /// A primary, a replica and three sentinels.
    Sentinel,
}

/// One variant of upstream's basic scenario: its name, the Redis deployments it starts, and
/// the variables it adds to the base environment.
struct Variant {
    /// Upstream's test and subtest.
    upstream: &'static str,
    redis: &'static [(Role, Redis)],
    env: &'static [(&'static str, &'static str)],
}

impl Variant {
    fn setting(&self, name: &str) -> Option<&'static str> {
        (self.env.iter()).find_map(|(key, value)| (*key == name).then_some(*value))
    }

    /// Upstream's tests use the `_local` rules when its local cache is on.
    fn local_cache(&self) -> bool {
        self.setting("LOCAL_CACHE_SIZE_IN_BYTES")
            .is_some_and(|bytes| bytes != "0")
    }

    fn stops_counting_over_the_limit(&self) -> bool {
        self.setting("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT") == Some("true")
    }
}

const LOCAL_CACHE: (&str, &str) = ("LOCAL_CACHE_SIZE_IN_BYTES", "1000");
const STOP_INCREMENT: (&str, &str) = ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true");
const MAIN_PLAIN: &[(Role, Redis)] = &[(Role::Main, Redis::Plain)];

/// The rows of upstream's basic scenario; each is one test below.
macro_rules! variants {
    ($($test:ident: $upstream:literal, $redis:expr, [$($env:expr),*];)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let variant = Variant { upstream: $upstream, redis: $redis, env: &[$($env),*] };
                let deployment = Deployment::start(&variant);
                let server = deployment.floodgate(&[]);
                basic_scenario(&server, &variant).await;
            }
        )*
    };
}

variants! {
    basic_without_per_second_redis:
        "TestBasicConfig/WithoutPerSecondRedis", MAIN_PLAIN, [];
    basic_with_local_cache:
        "TestBasicConfig/WithoutPerSecondRedisWithLocalCache", MAIN_PLAIN, [LOCAL_CACHE];
    basic_with_cache_prefix:
        "TestBasicConfig/WithoutPerSecondRedisWithCachePrefix", MAIN_PLAIN,
        [("CACHE_KEY_PREFIX", "prefix:")];
    basic_stopping_the_increment_over_the_limit:
        "TestBasicConfig/WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig",
        MAIN_PLAIN, [STOP_INCREMENT];
    basic_with_local_cache_stopping_the_increment_over_the_limit:
        "TestBasicConfig/WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig",
        MAIN_PLAIN, [LOCAL_CACHE, STOP_INCREMENT];
    basic_without_watch_root:
        "TestBasicReloadConfig/BasicWithoutWatchRoot", MAIN_PLAIN,
        [("RUNTIME_WATCH_ROOT", "false")];
    basic_over_tls:
        "TestBasicTLSConfig/WithoutPerSecondRedisTLS", &[(Role::Main, Redis::Tls)], [];
    basic_over_tls_with_local_cache:
        "TestBasicTLSConfig/WithoutPerSecondRedisTLSWithLocalCache",
        &[(Role::Main, Redis::Tls)], [LOCAL_CACHE];
    basic_over_tls_with_a_client_certificate:
        "TestBasicTLSConfig/WithoutPerSecondRedisTLSWithClientCert",
        &[(Role::Main, Redis::TlsClientCertificate)], [];
    basic_with_a_password:
        "TestBasicAuthConfig/WithoutPerSecondRedisAuth", &[(Role::Main, Redis::Password)], [];
    basic_with_a_password_and_local_cache:
        "TestBasicAuthConfig/WithoutPerSecondRedisAuthWithLocalCache",
        &[(Role::Main, Redis::Password)], [LOCAL_CACHE];
    basic_on_a_cluster:
        "TestBasicAuthConfigWithRedisCluster/WithoutPerSecondRedisAuth",
        &[(Role::Main, Redis::Cluster)], [];
    basic_on_a_cluster_with_local_cache:
        "TestBasicAuthConfigWithRedisCluster/WithoutPerSecondRedisAuthWithLocalCache",
        &[(Role::Main, Redis::Cluster)], [LOCAL_CACHE];
    basic_through_sentinel:
        "TestBasicAuthConfigWithRedisSentinel/WithoutPerSecondRedisAuth",
        &[(Role::Main, Redis::Sentinel)], [];
    basic_through_sentinel_with_local_cache:
        "TestBasicAuthConfigWithRedisSentinel/WithoutPerSecondRedisAuthWithLocalCache",
        &[(Role::Main, Redis::Sentinel)], [LOCAL_CACHE];
    basic_with_per_second_redis:
        "TestBasicConfig/WithPerSecondRedis",
        &[(Role::Main, Redis::Plain), (Role::PerSecond, Redis::Plain)], [];
    basic_with_per_second_redis_and_local_cache:
        "TestBasicConfig/WithPerSecondRedisWithLocalCache",
        &[(Role::Main, Redis::Plain), (Role::PerSecond, Redis::Plain)], [LOCAL_CACHE];
    basic_with_per_second_redis_stopping_the_increment_over_the_limit:
        "TestBasicConfig/WithPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig",
        &[(Role::Main, Redis::Plain), (Role::PerSecond, Redis::Plain)], [STOP_INCREMENT];
    basic_over_tls_with_per_second_redis:
        "TestBasicTLSConfig/WithPerSecondRedisTLS",
        &[(Role::Main, Redis::Tls), (Role::PerSecond, Redis::Tls)], [];
    basic_over_tls_with_per_second_redis_and_local_cache:
        "TestBasicTLSConfig/WithPerSecondRedisTLSWithLocalCache",
        &[(Role::Main, Redis::Tls), (Role::PerSecond, Redis::Tls)], [LOCAL_CACHE];
    basic_with_a_password_and_per_second_redis:
        "TestBasicAuthConfig/WithPerSecondRedisAuth",
        &[(Role::Main, Redis::Password), (Role::PerSecond, Redis::Password)], [];
    basic_with_a_password_per_second_redis_and_local_cache:
        "TestBasicAuthConfig/WithPerSecondRedisAuthWithLocalCache",
        &[(Role::Main, Redis::Password), (Role::PerSecond, Redis::Password)], [LOCAL_CACHE];
    basic_on_a_cluster_with_per_second_redis:
        "TestBasicAuthConfigWithRedisCluster/WithPerSecondRedisAuth",
        &[(Role::Main, Redis::Cluster), (Role::PerSecond, Redis::Cluster)], [];
    basic_on_a_cluster_with_per_second_redis_and_local_cache:
        "TestBasicAuthConfigWithRedisCluster/WithPerSecondRedisAuthWithLocalCache",
        &[(Role::Main, Redis::Cluster), (Role::PerSecond, Redis::Cluster)], [LOCAL_CACHE];
    basic_through_sentinel_with_per_second_redis:
        "TestBasicAuthConfigWithRedisSentinel/WithPerSecondRedisAuth",
        &[(Role::Main, Redis::Sentinel), (Role::PerSecond, Redis::Sentinel)], [];
    basic_through_sentinel_with_per_second_redis_and_local_cache:
        "TestBasicAuthConfigWithRedisSentinel/WithPerSecondRedisAuthWithLocalCache",
        &[(Role::Main, Redis::Sentinel), (Role::PerSecond, Redis::Sentinel)], [LOCAL_CACHE];
}

/// A running Redis deployment (a server, a cluster, sentinels), kept until the test ends.
type Running = Box<dyn std::any::Any>;

/// What a variant runs against: its Redis deployments, the certificates they use, upstream's
/// runtime directory with its rule files, and the environment that names them all.
struct Deployment {
    _redis: Vec<Running>,
    certificates: Certificates,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Deployment {
    fn start(variant: &Variant) -> Deployment {
        let certificates = Certificates::generate();
        let dir = tempfile::tempdir().expect("a directory");
        let runtime = dir.path().join("runtime/current");
        let config = runtime.join("ratelimit/config");
        std::fs::create_dir_all(&config).expect("the runtime directory");
        for file in std::fs::read_dir(Path::new(UPSTREAM_FILES).join("config")).expect("rules") {
            let file = file.expect("a rule file").path();
            std::fs::copy(&file, config.join(file.file_name().expect("a name"))).expect("copied");
        }
        // Upstream's defaults for its integration tests, on free loopback ports.
        let mut env: Vec<(String, String)> = [
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("RUNTIME_ROOT", &text(&runtime)),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "config"),
            ("BACKEND_TYPE", "redis"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("USE_STATSD", "false"),
            // Upstream waits as long as Redis takes; floodgate gives Redis 15 ms to start a
            // call (docs/migration.md, "Behaviour you may notice": "A command timeout (15 ms,
            // under Envoy's 20 ms filter timeout)"), which a loaded test machine misses.
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000"),
        ]
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
        let mut redis = Vec::new();
        for &(role, kind) in variant.redis {
            redis.push(start_redis(role, kind, &certificates, &mut env));
        }
        for (name, value) in variant.env {
            env.retain(|(set, _)| set != name);
            env.push(((*name).to_owned(), (*value).to_owned()));
        }
        Deployment {
            _redis: redis,
            certificates,
            dir,
            env,
        }
    }

    /// floodgate started as `ratelimit` with the deployment's environment and `extra`.
    fn floodgate(&self, extra: &[(&str, &str)]) -> Upstream {
        let mut env: Vec<(&str, &str)> = (self.env.iter())
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        env.extend_from_slice(extra);
        Upstream::start(self.dir.path(), &env)
    }

    /// The directory upstream's `RUNTIME_*` variables name: the rules it loads.
    fn config_dir(&self) -> PathBuf {
        self.dir.path().join("runtime/current/ratelimit/config")
    }
}

/// Starts `kind` and adds the variables that name it in `role` to `env`.
fn start_redis(
    role: Role,
    kind: Redis,
    certificates: &Certificates,
    env: &mut Vec<(String, String)>,
) -> Running {
    let prefix = role.prefix();
    if let Role::PerSecond = role {
        env.push(("REDIS_PERSECOND".into(), "true".into()));
    }
    let mut set = |name: &str, value: String| env.push((format!("{prefix}{name}"), value));
    let address = |server: &RedisServer| format!("127.0.0.1:{}", server.port());
    let with_password = Access {
        tls: None,
        user: Some(("default".into(), PASSWORD.into())),
    };
    let password = ["--requirepass", PASSWORD];
    match kind {
        Redis::Plain => {
            let server = RedisServer::start();
            set("_URL", address(&server));
            Box::new(server)
        }
        Redis::Password => {
            let server = RedisServer::start_secured(&with_password, &password);
            set("_URL", address(&server));
            set("_AUTH", PASSWORD.into());
            Box::new(server)
        }
        Redis::Tls | Redis::TlsClientCertificate => {
            let access = Access {
                tls: Some(ServerFiles::of(certificates)),
                ..with_password
            };
            let server = RedisServer::start_secured(&access, &password);
            set("_URL", address(&server));
            set("_AUTH", PASSWORD.into());
            set("_TLS", "true".into());
            let mut shared = vec![("REDIS_TLS_CACERT", text(&certificates.ca()))];
            if let Redis::TlsClientCertificate = kind {
                // From here on, a client must show a certificate the CA signed.
                server.command(&["CONFIG", "SET", "tls-auth-clients", "yes"]);
                let client = certificates.client();
                shared.push(("REDIS_TLS_CLIENT_CERT", text(&client.cert)));
                shared.push(("REDIS_TLS_CLIENT_KEY", text(&client.key)));
            }
            env.extend(shared.into_iter().map(|(n, v)| (n.to_owned(), v)));
            Box::new(server)
        }
        Redis::Cluster => {
            let cluster = RedisCluster::start();
            let mut seeds = Vec::new();
            for node in cluster.nodes() {
                // Replicas log in to their primary with the password every node now asks for.
                cluster.command(node, &["CONFIG", "SET", "masterauth", PASSWORD]);
                seeds.push(address(cluster.server(node)));
            }
            for node in cluster.nodes() {
                cluster.command(node, &["CONFIG", "SET", "requirepass", PASSWORD]);
            }
            set("_TYPE", "cluster".into());
            set("_URL", seeds.join(","));
            set("_AUTH", PASSWORD.into());
            Box::new(cluster)
        }
        Redis::Sentinel => {
            // Without a password: the sentinel harness does not pass one to its sentinels.
            let sentinels = Sentinels::start();
            let urls = sentinels.urls();
            let addresses = (urls.split(','))
                .map(|url| url.trim_start_matches("redis://").trim_end_matches('/'));
            let url = std::iter::once(MASTER).chain(addresses);
            set("_TYPE", "sentinel".into());
            set("_URL", url.collect::<Vec<_>>().join(","));
            Box::new(sentinels)
        }
    }
}

/// A client of `server`'s plain gRPC port.
async fn client(server: &Upstream) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap_or_else(|e| panic!("gRPC: {e}\n{}", server.stderr()))
}

/// One request of `descriptors` (each one entry) in `domain`: the answer, and the time
/// before and after it.
async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: &[(&str, &str)],
) -> Answer {
    let ask: RateLimitRequest = request(
        domain,
        (descriptors.iter())
            .map(|entry| descriptor(&[*entry]))
            .collect(),
    );
    let before = since_epoch();
    let response = (client.should_rate_limit(ask).await)
        .unwrap_or_else(|e| panic!("{domain} {descriptors:?}: {e}"))
        .into_inner();
    Answer {
        response,
        before,
        after: since_epoch(),
    }
}

fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
}

/// An answer and when it was asked for.
struct Answer {
    response: RateLimitResponse,
    before: Duration,
    after: Duration,
}

/// What upstream expects of one descriptor's status: its code, and its limit with the
/// remaining count (`None`: no rule, every field at its default).
struct Expected {
    code: i32,
    limit: Option<(u32, Unit, u32)>,
    /// False for a descriptor the over-limit cache left unconsulted: no reset time.
    consulted: bool,
}

impl Answer {
    /// Checks the overall code and each status; `context` names the step on failure.
    fn expect(&self, context: &str, overall: i32, statuses: &[Expected]) {
        let response = &self.response;
        assert_eq!(response.overall_code, overall, "{context}: {response:?}");
        assert_eq!(response.statuses.len(), statuses.len(), "{context}");
        for (status, expected) in response.statuses.iter().zip(statuses) {
            self.expect_status(context, status, expected);
        }
    }

    fn expect_status(&self, context: &str, status: &DescriptorStatus, expected: &Expected) {
        assert_eq!(status.code, expected.code, "{context}: {status:?}");
        assert_eq!(status.quota, None, "{context}: {status:?}");
        let Some((requests_per_unit, unit, remaining)) = expected.limit else {
            assert_eq!(status.current_limit, None, "{context}: {status:?}");
            assert_eq!(status.limit_remaining, 0, "{context}: {status:?}");
            assert_eq!(status.duration_until_reset, None, "{context}: {status:?}");
            return;
        };
        let limit = RateLimit {
            requests_per_unit,
            unit: unit as i32,
            ..Default::default()
        };
        assert_eq!(status.current_limit, Some(limit), "{context}: {status:?}");
        assert_eq!(status.limit_remaining, remaining, "{context}: {status:?}");
        match expected.consulted {
            true => self.expect_reset(context, status, unit),
            false => assert_eq!(
                status.duration_until_reset,
                Some(Default::default()),
                "{context}: {status:?}"
            ),
        }
    }

    /// floodgate's reset time is finer than upstream's whole seconds (docs/migration.md,
    /// "Reset times … carry them to the microsecond; upstream sends whole seconds to the end
    /// of the unit"): within (0, unit], and not above what upstream would have answered
    /// when the request was sent, unless a window turned while it was answered.
    fn expect_reset(&self, context: &str, status: &DescriptorStatus, unit: Unit) {
        let unit = unit_seconds(unit);
        let reset = status.duration_until_reset.expect("a reset time");
        let reset = Duration::new(reset.seconds as u64, reset.nanos as u32);
        assert!(
            reset > Duration::ZERO && reset <= Duration::from_secs(unit),
            "{context}: {reset:?} of a {unit} s window"
        );
        let window = |at: Duration| at.as_secs() / unit;
        if window(self.before) == window(self.after) {
            let upstream = Duration::from_secs(unit - self.before.as_secs() % unit);
            // Over-limit cache answers included: an entry's time left counts from when
            // Redis was asked, so it ends with the window, not a round trip after it.
            assert!(
                reset <= upstream,
                "{context}: {reset:?}, upstream's {upstream:?}"
            );
        }
    }
}

fn unit_seconds(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        other => panic!("no fixed length: {other:?}"),
    }
}

/// Waits for the next `unit` window if less than [`SEQUENCE`] of this one is left, so a
/// sequence that counts in one window never straddles two, wherever the boundary falls.
async fn room_in_window(unit: Unit) {
    let unit = Duration::from_secs(unit_seconds(unit));
    let now = since_epoch();
    let into = Duration::from_nanos((now.as_nanos() % unit.as_nanos()) as u64);
    let left = unit - into;
    if left < SEQUENCE {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

fn ok_without_limit() -> Expected {
    Expected {
        code: OK,
        limit: None,
        consulted: true,
    }
}

fn limited(code: i32, requests_per_unit: u32, unit: Unit, remaining: u32) -> Expected {
    Expected {
        code,
        limit: Some((requests_per_unit, unit, remaining)),
        consulted: true,
    }
}

/// A descriptor the request's cached rejection left unconsulted: docs/decisions.md, "The
/// over-limit cache short-circuits": it answers OK with remaining 0 (upstream counts it).
fn not_consulted(requests_per_unit: u32, unit: Unit) -> Expected {
    Expected {
        consulted: false,
        ..limited(OK, requests_per_unit, unit, 0)
    }
}

/// The value of a per-rule counter of upstream's on `/metrics` (0 before its first count,
/// as upstream's stats store answers for a counter it has not seen).
fn stat(server: &Upstream, name: &str, domain: &str, key: &str) -> u64 {
    let (status, page) = harness::http(server.http, "GET", "/metrics", "");
    assert_eq!(status, 200, "{page}");
    let labels = format!("{{domain=\"{domain}\",key1=\"{key}\"}}");
    (page.lines())
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(&labels)?
                .strip_prefix(' ')
        })
        .map_or(0, |value| value.parse::<f64>().expect("a number") as u64)
}

/// `ratelimit_service_config_load_success` on `/metrics`.
fn loads(server: &Upstream) -> u64 {
    let (_, page) = harness::http(server.http, "GET", "/metrics", "");
    (page.lines())
        .find_map(|line| line.strip_prefix("ratelimit_service_config_load_success "))
        .map_or(0, |value| value.parse::<f64>().expect("a number") as u64)
}

/// Waits (up to [`RELOAD`]) until more rule loads succeeded than `before`; their count.
async fn reloaded(server: &Upstream, before: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + RELOAD;
    loop {
        let now = loads(server);
        if now > before {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload within {RELOAD:?}: {}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The per-rule counters upstream's scenario checks for one rule.
struct Counts {
    total_hits: u64,
    over_limit: u64,
    over_limit_with_local_cache: u64,
}

fn expect_counts(server: &Upstream, context: &str, key: &str, expected: Counts) {
    let read = |name: &str| {
        stat(
            server,
            &format!("ratelimit_service_rate_limit_{name}"),
            "another",
            key,
        )
    };
    let counts = (
        read("total_hits"),
        read("over_limit"),
        read("over_limit_with_local_cache"),
    );
    let wanted = (
        expected.total_hits,
        expected.over_limit,
        expected.over_limit_with_local_cache,
    );
    assert_eq!(
        counts, wanted,
        "{context}: {key} (total_hits, over_limit, over_limit_with_local_cache)"
    );
}

/// A value no earlier run used: upstream draws a random number for the same purpose.
fn fresh_value() -> String {
    since_epoch().as_nanos().to_string()
}

/// Upstream's basic scenario: an unknown domain, one hit on a per-second rule, a
/// per-minute rule driven past its limit, then two rules in one request, one of them
/// past its limit, and the reset time counting down.
async fn basic_scenario(server: &Upstream, variant: &Variant) {
    let name = variant.upstream;
    let local = variant.local_cache();
    let key = |key: &str| match local {
        true => format!("{key}_local"),
        false => key.to_owned(),
    };
    let mut client = client(server).await;

    ask(&mut client, "foo", &[(&key("hello"), "world")])
        .await
        .expect(
            &format!("{name}: unknown domain"),
            OK,
            &[ok_without_limit()],
        );
    // Upstream reads its local cache's hit and miss gauges here and below; floodgate's are
    // checked on their own (`the_local_cache_reports_upstreams_gauges`).

    let key1 = key("key1");
    ask(&mut client, "basic", &[(&key1, "foo")]).await.expect(
        &format!("{name}: basic"),
        OK,
        &[limited(OK, 50, Unit::Second, 49)],
    );
    let hits = stat(
        server,
        "ratelimit_service_rate_limit_total_hits",
        "basic",
        &key1,
    );
    assert_eq!(hits, 1, "{name}: basic total_hits");

    let key2 = key("key2");
    let value = fresh_value();
    room_in_window(Unit::Minute).await;
    for i in 0..25u32 {
        let over = i >= 20;
        let (code, remaining) = if over { (OVER_LIMIT, 0) } else { (OK, 19 - i) };
        let context = format!("{name}: {key2} request {}", i + 1);
        ask(&mut client, "another", &[(&key2, &value)])
            .await
            .expect(
                &context,
                code,
                &[limited(code, 20, Unit::Minute, remaining)],
            );
        let over_limit = u64::from(i.saturating_sub(19));
        let cached = match local && over {
            true => u64::from(i - 20),
            false => 0,
        };
        expect_counts(
            server,
            &context,
            &key2,
            Counts {
                total_hits: u64::from(i + 1),
                over_limit,
                over_limit_with_local_cache: cached,
            },
        );
    }

    two_rules_in_one_request(server, &mut client, variant).await;

    let key4 = key("key4");
    let first = ask(&mut client, "another", &[(&key4, "durTest")]).await;
    first.expect(
        &format!("{name}: {key4}"),
        OK,
        &[limited(OK, 20, Unit::Day, 19)],
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = ask(&mut client, "another", &[(&key4, "durTest")]).await;
    second.expect(
        &format!("{name}: {key4} again"),
        OK,
        &[limited(OK, 20, Unit::Day, 18)],
    );
    let reset = |answer: &Answer| answer.response.statuses[0].duration_until_reset;
    let (first, second) = (
        reset(&first).expect("reset"),
        reset(&second).expect("reset"),
    );
    assert!(
        (second.seconds, second.nanos) < (first.seconds, first.nanos),
        "{name}: the reset time counts down: {first:?} then {second:?}"
    );
}

/// `key2` (20 a minute) and `key3` (10 an hour) in one request, 15 times: from the 11th,
/// `key3` is over its limit and so is the request.
async fn two_rules_in_one_request(
    server: &Upstream,
    client: &mut RateLimitServiceClient<Channel>,
    variant: &Variant,
) {
    let name = variant.upstream;
    let local = variant.local_cache();
    let stop = variant.stops_counting_over_the_limit();
    let (key2, key3) = match local {
        true => ("key2_local", "key3_local"),
        false => ("key2", "key3"),
    };
    let value = fresh_value();
    room_in_window(Unit::Minute).await;
    room_in_window(Unit::Hour).await;
    for i in 0..15u32 {
        let over = i >= 10;
        let context = format!("{name}: {key2} and {key3} request {}", i + 1);
        // With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, a request over one limit counts on
        // none: key2's count stays where the 10th request left it.
        // With the local cache as well, key3's rejection is known from the 12th request on
        // and settles the request without asking Redis about key2.
        let key2_status = match (stop && over, local && i > 10) {
            (true, true) => not_consulted(20, Unit::Minute),
            (true, false) => limited(OK, 20, Unit::Minute, 10),
            (false, _) => limited(OK, 20, Unit::Minute, 19 - i),
        };
        let (code3, key3_remaining) = if over { (OVER_LIMIT, 0) } else { (OK, 9 - i) };
        ask(client, "another", &[(key2, &value), (key3, &value)])
            .await
            .expect(
                &context,
                code3,
                &[key2_status, limited(code3, 10, Unit::Hour, key3_remaining)],
            );
        let cached = |count: u64| if local { count } else { 0 };
        expect_counts(
            server,
            &context,
            key2,
            Counts {
                total_hits: u64::from(i + 26),
                over_limit: 5,
                over_limit_with_local_cache: cached(4),
            },
        );
        expect_counts(
            server,
            &context,
            key3,
            Counts {
                total_hits: u64::from(i + 1),
                over_limit: u64::from(i.saturating_sub(9)),
                over_limit_with_local_cache: cached(u64::from(i.saturating_sub(10))),
            },
        );
    }
}

/// Upstream's reload scenario: a domain that is not loaded yet answers no limit; `add`
/// brings it (a rule load counted), its per-second rule then counts; `restore` takes it
/// away (another load counted).
async fn reload_scenario(
    server: &Upstream,
    name: &str,
    add: impl FnOnce(),
    restore: impl FnOnce(),
) {
    let mut client = client(server).await;
    ask(&mut client, "reload", &[("block", "foo")])
        .await
        .expect(&format!("{name}: before"), OK, &[ok_without_limit()]);
    let before = loads(server);
    add();
    let after = reloaded(server, before).await;
    ask(&mut client, "reload", &[("key1", "foo")]).await.expect(
        &format!("{name}: after"),
        OK,
        &[limited(OK, 50, Unit::Second, 49)],
    );
    restore();
    reloaded(server, after).await;
}

/// Copies upstream's rule file `name` into the rules directory `config`, as upstream's
/// reload tests do.
fn copy_upstream_file(name: &str, config: &Path) -> PathBuf {
    let copy = config.join(name);
    std::fs::copy(Path::new(UPSTREAM_FILES).join(name), &copy).expect("a rule file copied");
    copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_picks_up_an_added_rule_file_and_its_removal() {
    let variant = Variant {
        upstream: "TestBasicReloadConfig/ReloadWithoutWatchRoot",
        redis: MAIN_PLAIN,
        env: &[("RUNTIME_WATCH_ROOT", "false")],
    };
    let deployment = Deployment::start(&variant);
    let server = deployment.floodgate(&[]);
    let config = deployment.config_dir();
    let added = config.join("reload.yaml");
    reload_scenario(
        &server,
        variant.upstream,
        || drop(copy_upstream_file("reload.yaml", &config)),
        || std::fs::remove_file(&added).expect("the file removed"),
    )
    .await;
}

/// `existingDomainreload.yaml` names the domain `basic` a second time. Upstream's file
/// loader refuses a domain defined twice unless `MERGE_DOMAIN_CONFIG` merges the files:
/// without it the load fails and the rules in force stay; with it the new rules join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_file_for_a_loaded_domain_joins_it_only_when_merged() {
    for merge in ["false", "true"] {
        let variant = Variant {
            upstream: "existingDomainreload.yaml",
            redis: MAIN_PLAIN,
            env: &[],
        };
        let deployment = Deployment::start(&variant);
        let server = deployment.floodgate(&[("MERGE_DOMAIN_CONFIG", merge)]);
        let mut client = client(&server).await;
        let context = format!("MERGE_DOMAIN_CONFIG={merge}");
        let before = loads(&server);
        let errors = |server: &Upstream| {
            let (_, page) = harness::http(server.http, "GET", "/metrics", "");
            (page.lines()).any(|line| line == "ratelimit_service_config_load_error 1")
        };
        copy_upstream_file("existingDomainreload.yaml", &deployment.config_dir());
        let key11 = if merge == "true" {
            reloaded(&server, before).await;
            limited(OK, 50, Unit::Second, 49)
        } else {
            let deadline = tokio::time::Instant::now() + RELOAD;
            while !errors(&server) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{context}: no load error"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(loads(&server), before, "{context}");
            ok_without_limit()
        };
        ask(&mut client, "basic", &[("key11", "foo")])
            .await
            .expect(&context, OK, &[key11]);
        ask(&mut client, "basic", &[("key1", "foo")]).await.expect(
            &context,
            OK,
            &[limited(OK, 50, Unit::Second, 49)],
        );
    }
}

/// Upstream's rules as its xDS tests serve them: the domains `basic` and `another` of its
/// rule files, and with `reload` the domain of `reload.yaml` as well.
fn upstream_snapshot(version: &str, reload: bool) -> Snapshot {
    let mut configs = vec![
        domain_config(
            "basic",
            &[
                ("key1", RateLimitUnit::Second, 50),
                ("key1_local", RateLimitUnit::Second, 50),
                ("one_per_minute", RateLimitUnit::Minute, 1),
            ],
        ),
        domain_config(
            "another",
            &[
                ("key2", RateLimitUnit::Minute, 20),
                ("key3", RateLimitUnit::Hour, 10),
                ("key2_local", RateLimitUnit::Minute, 20),
                ("key3_local", RateLimitUnit::Hour, 10),
                ("key4", RateLimitUnit::Day, 20),
                ("key4_local", RateLimitUnit::Day, 20),
            ],
        ),
    ];
    if reload {
        configs.push(domain_config(
            "reload",
            &[
                ("key1", RateLimitUnit::Second, 50),
                ("block", RateLimitUnit::Second, 0),
                ("one_per_minute", RateLimitUnit::Minute, 1),
            ],
        ));
    }
    Snapshot {
        version: version.into(),
        configs,
    }
}

/// A configuration for `domain` with one descriptor per (key, unit, requests per unit).
fn domain_config(domain: &str, rules: &[(&str, RateLimitUnit, u32)]) -> RateLimitConfig {
    let mut descriptors = Vec::new();
    for &(key, unit, requests_per_unit) in rules {
        let rule = xds_support::config(domain, key, Some(unit), requests_per_unit);
        descriptors.extend(rule.descriptors);
    }
    RateLimitConfig {
        descriptors,
        ..xds_support::config(domain, "", None, 0)
    }
}

/// A deployment whose rules come from an xDS server (upstream's `configXdsProvider`), with
/// the server serving `snapshot` from the start.
async fn over_xds(variant: &Variant, snapshot: Snapshot) -> (Deployment, XdsServer, Upstream) {
    let xds = XdsServer::start(None).await;
    xds.push(snapshot);
    let deployment = Deployment::start(variant);
    let url = xds.addr.to_string();
    let server = deployment.floodgate(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_NODE_ID", "init-test-node"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &url),
    ]);
    (deployment, xds, server)
}

async fn xds_basic(variant: &Variant) {
    let (_deployment, _xds, server) = over_xds(variant, upstream_snapshot("1", false)).await;
    basic_scenario(&server, variant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_without_per_second_redis() {
    xds_basic(&Variant {
        upstream: "TestXdsProviderBasicConfig/WithoutPerSecondRedis",
        redis: MAIN_PLAIN,
        env: &[],
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_with_local_cache() {
    xds_basic(&Variant {
        upstream: "TestXdsProviderBasicConfig/WithoutPerSecondRedisWithLocalCache",
        redis: MAIN_PLAIN,
        env: &[LOCAL_CACHE],
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_over_xds_takes_a_new_snapshot_and_the_old_one_back() {
    let variant = Variant {
        upstream: "TestXdsProviderBasicConfigReload/ReloadConfigWithXdsServer",
        redis: MAIN_PLAIN,
        env: &[],
    };
    let (_deployment, xds, server) = over_xds(&variant, upstream_snapshot("1", false)).await;
    reload_scenario(
        &server,
        variant.upstream,
        || xds.push(upstream_snapshot("2", true)),
        || xds.push(upstream_snapshot("3", false)),
    )
    .await;
}

/// floodgate as `ratelimit` of `variant`, its stats going to `statsd` every 100 ms, with
/// the `extra` variables.
fn with_statsd(deployment: &Deployment, statsd: &StatsdServer, extra: &[(&str, &str)]) -> Upstream {
    let port = statsd.addr.rsplit(':').next().expect("host:port");
    let mut env = vec![
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port),
        ("STATSD_PROTOCOL", "udp"),
        ("STATS_FLUSH_INTERVAL", "100ms"),
    ];
    env.extend_from_slice(extra);
    deployment.floodgate(&env)
}

/// `EXTRA_TAGS` reach every stat upstream sends, as its statsd client writes tags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_tags_are_sent_with_upstreams_stats() {
    let mut statsd = StatsdServer::start("udp");
    let variant = Variant {
        upstream: "TestBasicConfig_ExtraTags",
        redis: MAIN_PLAIN,
        env: &[],
    };
    let deployment = Deployment::start(&variant);
    let server = with_statsd(&deployment, &statsd, &[("EXTRA_TAGS", "foo:bar,a:b")]);
    let mut client = client(&server).await;
    ask(&mut client, "basic", &[("key1", "foo")]).await;
    let hits = "ratelimit.service.rate_limit.basic.key1.total_hits.__a=b.__foo=bar";
    let loads = "ratelimit.service.config_load_success.__a=b.__foo=bar";
    statsd.receive_until(Duration::from_secs(10), |received| {
        received.counter(hits) == 1 && received.counter(loads) == 1
    });
}

/// `USE_DOG_STATSD`: the same stats as DogStatsD lines, tags after the value (`EXTRA_TAGS`
/// first, then what the mogrifier of upstream's README example draws from the name), the
/// names it does not match left as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dogstatsd_sends_tags_after_the_value_and_mogrifies_names() {
    let mut statsd = StatsdServer::start("udp");
    let variant = Variant {
        upstream: "USE_DOG_STATSD with USE_DOG_STATSD_MOGRIFIERS",
        redis: MAIN_PLAIN,
        env: &[],
    };
    let deployment = Deployment::start(&variant);
    let server = with_statsd(
        &deployment,
        &statsd,
        &[
            ("USE_DOG_STATSD", "true"),
            ("EXTRA_TAGS", "foo:bar"),
            ("USE_DOG_STATSD_MOGRIFIERS", "DESCRIPTOR"),
            (
                "DOG_STATSD_MOGRIFIER_DESCRIPTOR_PATTERN",
                r"^ratelimit\.service\.rate_limit\.([^.]+)\.([^.]+)\.([^.]+)$",
            ),
            (
                "DOG_STATSD_MOGRIFIER_DESCRIPTOR_NAME",
                "ratelimit.service.rate_limit.$3",
            ),
            (
                "DOG_STATSD_MOGRIFIER_DESCRIPTOR_TAGS",
                "domain:$1,descriptor:$2",
            ),
        ],
    );
    let mut client = client(&server).await;
    ask(&mut client, "basic", &[("key1", "foo")]).await;
    ask(&mut client, "basic", &[("key1", "foo")]).await;
    let hits = "ratelimit.service.rate_limit.total_hits|#foo:bar,domain:basic,descriptor:key1";
    let loads = "ratelimit.service.config_load_success|#foo:bar";
    let timer = "ratelimit_server.ShouldRateLimit.response_time|#foo:bar";
    statsd.receive_until(Duration::from_secs(10), |received| {
        received.counter(hits) == 2 && received.counter(loads) == 1 && received.timed(timer) >= 2.0
    });
    assert!(
        !(statsd.received.counters.keys()).any(|name| name.contains(".__")),
        "no tag is left in a name: {:?}",
        statsd.received.counters
    );
}

/// Upstream's local-cache gauges (`ratelimit.localcache.*`, freecache's counts): a limit
/// of 20 a minute asked 25 times finds its counter in the cache from the 22nd request on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_cache_reports_upstreams_gauges() {
    let mut statsd = StatsdServer::start("udp");
    let variant = Variant {
        upstream: "TestBasicConfig/WithoutPerSecondRedisWithLocalCache (its gauges)",
        redis: MAIN_PLAIN,
        env: &[LOCAL_CACHE],
    };
    let deployment = Deployment::start(&variant);
    let server = with_statsd(&deployment, &statsd, &[]);
    let mut client = client(&server).await;
    let value = fresh_value();
    room_in_window(Unit::Minute).await;
    for _ in 0..25 {
        ask(&mut client, "another", &[("key2_local", &value)]).await;
    }
    let gauge = |received: &harness::statsd::Received, name: &str| {
        (received.gauges.get(&format!("ratelimit.localcache.{name}"))).copied()
    };
    // The 21st request is the first rejection, from Redis; the next four are the cache's.
    // A flush's gauges arrive one line at a time: wait until every one has its value.
    let expected = [
        ("lookupCount", 25),
        ("hitCount", 4),
        ("missCount", 21),
        ("entryCount", 1),
        ("overwriteCount", 0),
        ("evacuateCount", 0),
        ("expiredCount", 0),
    ];
    statsd.receive_until(Duration::from_secs(10), |received| {
        (expected.iter()).all(|(name, value)| gauge(received, name) == Some(*value))
    });
    let received = &statsd.received;
    let read = |name| gauge(received, name).unwrap_or_else(|| panic!("{name}: {received:?}"));
    let stored = read("averageAccessTime");
    let now = since_epoch().as_secs();
    assert!((now - 60..=now).contains(&stored), "{stored} against {now}");
}

/// A gRPC client of `server` over TLS, trusting `ca`, with `identity` when given.
async fn tls_client(
    server: &Upstream,
    ca: &Path,
    identity: Option<&redis_harness::tls::Pair>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let read = |path: &Path| std::fs::read(path).expect("a certificate file");
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)))
        .domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(read(&pair.cert), read(&pair.key)));
    }
    let endpoint = Endpoint::from_shared(format!("https://{}", server.grpc))
        .expect("an endpoint")
        .connect_timeout(CONNECT)
        .tls_config(tls)
        .expect("TLS");
    Ok(RateLimitServiceClient::new(endpoint.connect().await?))
}

/// Upstream's `Test_mTLS`: the gRPC port serves TLS and asks for a client certificate its
/// CA signed (`GRPC_CLIENT_TLS_SAN` is set aside: docs/migration.md, "any client certificate
/// the CA signed is accepted"); Redis over TLS with a password, as there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_on_the_grpc_port_admits_a_client_the_ca_signed() {
    let variant = Variant {
        upstream: "Test_mTLS",
        redis: &[(Role::Main, Redis::Tls)],
        env: &[],
    };
    let deployment = Deployment::start(&variant);
    let certificates = &deployment.certificates;
    let (server_pair, ca) = (certificates.server(), certificates.ca());
    let (cert, key, ca_text) = (text(&server_pair.cert), text(&server_pair.key), text(&ca));
    let server = deployment.floodgate(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
        ("GRPC_CLIENT_TLS_CACERT", &ca_text),
        ("GRPC_CLIENT_TLS_SAN", "localhost"),
    ]);
    let mut client = tls_client(&server, &ca, Some(&certificates.client()))
        .await
        .unwrap_or_else(|e| panic!("mutual TLS: {e}\n{}", server.stderr()));
    ask(&mut client, "basic", &[("key1", "foo")]).await.expect(
        "over mutual TLS",
        OK,
        &[limited(OK, 50, Unit::Second, 49)],
    );
    let anonymous = match tls_client(&server, &ca, None).await {
        Ok(mut client) => client
            .should_rate_limit(request("basic", vec![descriptor(&[("key1", "foo")])]))
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(!anonymous, "a client without a certificate was served");
}

/// Upstream's `TestReloadGRPCServerCerts`: the certificate files replaced under the running
/// server are served to new connections, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_server_certificate_is_served_without_a_restart() {
    let variant = Variant {
        upstream: "TestReloadGRPCServerCerts",
        redis: MAIN_PLAIN,
        env: &[],
    };
    let deployment = Deployment::start(&variant);
    let (first, second) = (&deployment.certificates, Certificates::generate());
    let (cert, key) = (
        deployment.dir.path().join("tls.crt"),
        deployment.dir.path().join("tls.key"),
    );
    let install = |pair: redis_harness::tls::Pair| {
        // Written beside, then renamed over: the server never reads half a file.
        for (from, to) in [(pair.cert, &cert), (pair.key, &key)] {
            let staged = to.with_extension("new");
            std::fs::copy(from, &staged).expect("a certificate file copied");
            std::fs::rename(&staged, to).expect("renamed into place");
        }
    };
    install(first.server());
    let (cert_text, key_text) = (text(&cert), text(&key));
    // Upstream watches the files; floodgate reads them again every
    // `grpc_tls.reload_interval_ms` (README, "Rotation without a restart"), 10 s by
    // default: shortened here so the test does not wait for it.
    let server = deployment.floodgate(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert_text),
        ("GRPC_SERVER_TLS_KEY", &key_text),
        ("FLOODGATE_GRPC_TLS__RELOAD_INTERVAL_MS", "100"),
    ]);
    let trusts = |ca: PathBuf| {
        let server = &server;
        async move { tls_client(server, &ca, None).await.is_ok() }
    };
    assert!(trusts(first.ca()).await, "{}", server.stderr());
    assert!(
        !trusts(second.ca()).await,
        "served a certificate of the second CA"
    );
    install(second.server());
    let deadline = tokio::time::Instant::now() + RELOAD;
    while !trusts(second.ca()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate not served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !trusts(first.ca()).await,
        "still serving the first certificate"
    );
}

/// Upstream's `TestShareThreshold`: every value a `share_threshold` wildcard matches counts
/// in one counter; without it, each value has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_counts_every_value_of_a_wildcard_together() {
    let variant = Variant {
        upstream: "TestShareThreshold/WithoutPerSecondRedis",
        redis: MAIN_PLAIN,
        env: &[],
    };
    let deployment = Deployment::start(&variant);
    let server = deployment.floodgate(&[]);
    let mut client = client(&server).await;
    let domain = "share-threshold-test";
    room_in_window(Unit::Hour).await;
    for i in 0..10 {
        let answer = ask(&mut client, domain, &[("files", "files/a.pdf")]).await;
        let code = answer.response.overall_code;
        assert!(code == OK || code == OVER_LIMIT, "files/a.pdf {i}: {code}");
    }
    ask(&mut client, domain, &[("files", "files/b.csv")])
        .await
        .expect(
            "files/b.csv",
            OVER_LIMIT,
            &[limited(OVER_LIMIT, 10, Unit::Hour, 0)],
        );
    for i in 0..10 {
        let value = format!("files_no_share/{}-{i}", fresh_value());
        ask(&mut client, domain, &[("files_no_share", &value)])
            .await
            .expect(&value, OK, &[limited(OK, 10, Unit::Hour, 9)]);
    }
}
