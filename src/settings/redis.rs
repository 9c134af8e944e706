//! The `redis_*` settings: where Redis is, how to reach it, how long to wait for it, and a
//! second Redis for per-second limits.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{BackendKind, Password};

/// A second Redis for the counters of per-second limits (upstream's `REDIS_PERSECOND`):
/// their rate is the highest, and a Redis of their own keeps them from slowing the others.
/// Off until `backend` is set; the TLS files, key prefix, timeouts, breaker and over-limit
/// cache sizes are the main Redis' settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PerSecondRedis {
    /// `redis`, `redis-cluster` or `redis-sentinel`; unset: one store holds every counter.
    pub backend: Option<BackendKind>,
    /// As `redis_url`, for this Redis.
    pub url: String,
    /// As `redis_username` and `redis_password`, for this Redis.
    pub username: Option<String>,
    pub password: Option<Password>,
    /// redis-sentinel: the name the sentinels monitor this primary under.
    pub sentinel_master: String,
    /// Connections to this Redis; `redis_pool_size` when unset.
    pub pool_size: Option<usize>,
}

/// Waiting for Redis at start-up (upstream's `REDIS_STARTUP_*`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisStartup {
    /// The longest the start waits for Redis to answer; past it the process exits with an
    /// error. 0: no wait: floodgate serves at once, each rule's `on_backend_error`
    /// answering until Redis does.
    pub max_elapsed_ms: u64,
    /// The pause after the first try that fails, doubled after each failure up to
    /// `max_interval_ms`.
    pub initial_interval_ms: u64,
    pub max_interval_ms: u64,
}

impl Default for RedisStartup {
    fn default() -> Self {
        RedisStartup {
            max_elapsed_ms: 0,
            initial_interval_ms: 500,
            max_interval_ms: 5_000,
        }
    }
}

/// How to reach Redis and how to guard against it: the `redis_*` settings. They are written
/// flat, as envoyproxy/ratelimit's (`redis_url` in the file, `FLOODGATE_REDIS_URL`), and
/// read from the same layers as the rest into this section (`Settings::load_from`), so every
/// field names its setting.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]` for the redis backend (`rediss://` for TLS);
    /// for redis-cluster a comma-separated list of seed nodes; for redis-sentinel of sentinels.
    #[serde(rename = "redis_url")]
    pub url: String,
    /// Redis ACL user name; replaces the URL's when set.
    #[serde(rename = "redis_username")]
    pub username: Option<String>,
    /// Redis password; replaces the URL's when set (so it can come from a secret instead of
    /// the URL). Never printed.
    #[serde(rename = "redis_password")]
    pub password: Option<Password>,
    /// redis-sentinel: the name the sentinels monitor the primary under.
    #[serde(rename = "redis_sentinel_master")]
    pub sentinel_master: String,
    /// `rediss://`: a PEM CA Redis' certificate must chain to (else the system's trust, or
    /// `SSL_CERT_FILE`).
    #[serde(rename = "redis_tls_ca_file")]
    pub tls_ca_file: Option<PathBuf>,
    /// `rediss://`: a PEM client certificate and key, for a Redis that requires one.
    #[serde(rename = "redis_tls_cert_file")]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(rename = "redis_tls_key_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Connections to Redis; each is multiplexed, shared by every request in flight on it.
    #[serde(rename = "redis_pool_size")]
    pub pool_size: usize,
    #[serde(rename = "redis_per_second")]
    pub per_second: PerSecondRedis,
    /// Milliseconds to open a connection to Redis.
    #[serde(rename = "redis_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Milliseconds Redis has to start a call once it is sent (the script decides nothing
    /// after it); a Redis whose quickest round trip is above it is too far to call at all.
    #[serde(rename = "redis_command_timeout_ms")]
    pub command_timeout_ms: u64,
    /// The most milliseconds a request waits for Redis, whatever the caller's deadline (80%
    /// of its `grpc-timeout`, when that is shorter): then its rules' `on_backend_error`
    /// answers it. At least `redis_command_timeout_ms`; unset,
    /// [`DEFAULT_REDIS_MAX_WAIT_MS`] or `redis_command_timeout_ms` if that is longer.
    #[serde(rename = "redis_max_wait_ms")]
    pub max_wait_ms: Option<u64>,
    /// Put before every Redis key, so several deployments can share one Redis.
    #[serde(rename = "redis_key_prefix")]
    pub key_prefix: String,
    /// Failed calls within `redis_breaker_window_ms` (failures outnumbering answers) that
    /// open the circuit breaker: Redis is not called (each rule's failure policy answers at
    /// once) until a probe succeeds. Timeouts are not failures.
    #[serde(rename = "redis_breaker_failures")]
    pub breaker_failures: u32,
    /// The breaker's window in milliseconds: failures are counted over it, and a Redis that
    /// answers nothing at all for a whole window while calls wait opens the breaker too.
    #[serde(rename = "redis_breaker_window_ms")]
    pub breaker_window_ms: u64,
    /// Milliseconds between probes of an open circuit.
    #[serde(rename = "redis_breaker_cooldown_ms")]
    pub breaker_cooldown_ms: u64,
    /// Counters Redis reported exhausted that are remembered locally, and answered without
    /// Redis, until their quota returns (0 disables the cache).
    #[serde(rename = "redis_local_cache_size")]
    pub local_cache_size: usize,
    #[serde(rename = "redis_startup")]
    pub startup: RedisStartup,
}

impl RedisSettings {
    /// The most a request waits for Redis: `redis_max_wait_ms`, or unset the default (or the
    /// command timeout, if an operator raised it above the default).
    pub fn max_wait(&self) -> Duration {
        let millis =
            (self.max_wait_ms).unwrap_or(DEFAULT_REDIS_MAX_WAIT_MS.max(self.command_timeout_ms));
        Duration::from_millis(millis)
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        RedisSettings {
            url: "redis://127.0.0.1:6379".into(),
            username: None,
            password: None,
            sentinel_master: "mymaster".into(),
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            pool_size: 1,
            per_second: PerSecondRedis::default(),
            connect_timeout_ms: 250,
            command_timeout_ms: 15,
            max_wait_ms: None,
            key_prefix: "floodgate:".into(),
            breaker_failures: 5,
            breaker_window_ms: 1000,
            breaker_cooldown_ms: 500,
            local_cache_size: 100_000,
            startup: RedisStartup::default(),
        }
    }
}

/// The default bound on a request's wait for Redis (`redis_max_wait_ms`). A live Redis near
/// by answers a request within two command timeouts: the call ahead of it on the connection,
/// then its own (2 × 15 ms); 10 ms more is for this server getting to the request and its
/// reply when its CPU is busy. Anything longer is Redis stalled, cut off or overloaded,
/// where waiting helps nobody: a rate limiter must not be the reason a request is slow.
/// Envoy's own default filter timeout (20 ms, so a wait of 16 ms) is shorter, and governs.
/// With 10 ms for the answer's way back it fits the latency histogram's 50 ms bucket.
pub const DEFAULT_REDIS_MAX_WAIT_MS: u64 = 40;
