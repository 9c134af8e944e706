//! Settings: built-in defaults, then a settings file (`--config`, TOML), then `FLOODGATE_*`
//! environment variables, then command-line flags — each layer overriding the one before.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;

use crate::rules::OnBackendError;

/// A secret setting: usable as a string, printed as `<redacted>`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Password(String);

impl Password {
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Which rate-limit headers the service adds to `response_headers_to_add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HeaderStyle {
    /// No headers (Envoy can still build its own from the statuses).
    #[default]
    None,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (draft-polli-ratelimit-headers-03).
    Draft03,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    Ietf,
}

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// In process memory: exact for one replica, forgotten on restart.
    #[default]
    Memory,
    /// One Redis server, shared by every replica.
    Redis,
    /// A Redis Cluster (`redis_url` lists seed nodes, comma-separated).
    RedisCluster,
    /// The primary Redis Sentinel names (`redis_url` lists the sentinels, comma-separated);
    /// followed through failovers.
    RedisSentinel,
}

impl BackendKind {
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Redis => "redis",
            BackendKind::RedisCluster => "redis-cluster",
            BackendKind::RedisSentinel => "redis-sentinel",
        }
    }
}

/// Where the rules come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RulesSource {
    /// The rule files of the `rules` directory, reloaded when they change.
    #[default]
    Files,
    /// The `RateLimitConfig` snapshots an xDS management server sends (`xds.*`).
    Xds,
}

/// The xDS management server that delivers the rules when `rules_source` is `xds`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct XdsSettings {
    /// `http://host:port`, or `https://host:port` for TLS.
    pub server_url: String,
    /// The node this replica subscribes as (the server may send each node its own rules).
    pub node_id: String,
    pub node_cluster: String,
    /// PEM CA certificates the server's certificate must chain to (https); the system's
    /// roots when unset.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for a server that requires them (mutual TLS).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, when not the URL's host.
    pub server_name: Option<String>,
    /// Serve at once with no rules until the first snapshot arrives, instead of waiting
    /// for it before opening the listeners.
    pub start_without_initial_config: bool,
    /// Pauses between reconnections: from this, doubling (jittered) up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// A TOML file of overlays: floodgate's extensions (algorithm, burst, ...) for rules
    /// the server delivers, by domain and descriptor path (`src/xds/overlay.rs`).
    pub overlays_file: Option<PathBuf>,
    /// The largest message the xDS server may send (upstream's
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`); a larger one fails the stream.
    pub max_message_bytes: usize,
}

impl Default for XdsSettings {
    fn default() -> Self {
        XdsSettings {
            server_url: "http://127.0.0.1:18000".into(),
            node_id: "floodgate".into(),
            node_cluster: "floodgate".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
            start_without_initial_config: false,
            retry_initial_ms: 500,
            retry_max_ms: 30_000,
            overlays_file: None,
            max_message_bytes: DEFAULT_XDS_MAX_MESSAGE_BYTES,
        }
    }
}

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

/// envoyproxy/ratelimit's stats sent to a statsd server, beside `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StatsdSettings {
    /// `host:port` of the statsd server; none: nothing is sent.
    pub addr: Option<String>,
    pub protocol: StatsdProtocol,
    /// How often the changes since the last flush are sent.
    pub flush_interval_ms: u64,
    /// Tags added to every stat, `key:value,key:value` (upstream's `EXTRA_TAGS`), written
    /// as upstream's client writes them: a `.__key=value` suffix each (`|#key:value` as
    /// DogStatsD).
    pub extra_tags: String,
    /// Plain statsd, or DogStatsD: tags after the value (`|#key:value`), names rewritten by
    /// `mogrifiers` (upstream's `USE_DOG_STATSD`).
    pub format: StatsdFormat,
    /// DogStatsD only: the first whose `pattern` matches a stat's name renames it and adds
    /// its tags (upstream's `USE_DOG_STATSD_MOGRIFIERS`). In TOML an array of tables; as an
    /// environment variable, the same array in JSON.
    #[serde(deserialize_with = "mogrifiers")]
    pub mogrifiers: Vec<Mogrifier>,
}

/// How stats are written to the statsd server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsdFormat {
    /// `name.__tag=value:1|c`, as upstream's statsd client.
    #[default]
    Statsd,
    /// `name:1|c|#tag:value`, as upstream's DogStatsD client.
    Dogstatsd,
}

/// A DogStatsD rename (upstream's mogrifier): a stat whose name `pattern` (a regular
/// expression) matches is sent as `name` with `tags` (`key:value,key:value`); `$N` in
/// either stands for the match's Nth group (`$0` the whole match).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mogrifier {
    pub pattern: String,
    pub name: String,
    #[serde(default)]
    pub tags: String,
}

/// `statsd.mogrifiers`: an array of tables (TOML), or that array as a JSON string (an
/// environment variable has no arrays).
fn mogrifiers<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Mogrifier>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Tables(Vec<Mogrifier>),
        Json(String),
    }
    match Given::deserialize(deserializer)? {
        Given::Tables(tables) => Ok(tables),
        Given::Json(text) if text.trim().is_empty() => Ok(Vec::new()),
        Given::Json(text) => serde_json::from_str(&text)
            .map_err(|error| serde::de::Error::custom(format!("statsd.mogrifiers: {error}"))),
    }
}

/// Why `mogrifier` cannot rename anything: a pattern that does not compile, an empty name,
/// a tag without key or value (upstream refuses the same at start), or a `$N` past the
/// pattern's groups.
fn check_mogrifier(mogrifier: &Mogrifier) -> Result<(), String> {
    let pattern = regex::Regex::new(&mogrifier.pattern).map_err(|error| error.to_string())?;
    if mogrifier.name.is_empty() {
        return Err("no name".into());
    }
    let mut templates = vec![mogrifier.name.as_str()];
    for tag in mogrifier
        .tags
        .split(',')
        .filter(|tag| !tag.trim().is_empty())
    {
        match tag.split_once(':') {
            Some((key, value)) if !key.trim().is_empty() && !value.trim().is_empty() => {
                templates.push(value);
            }
            _ => return Err(format!("tag {tag:?} is not key:value")),
        }
    }
    for template in templates {
        let groups = template.split('$').skip(1).filter_map(|after| {
            let digits = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            after[..digits].parse::<usize>().ok()
        });
        if let Some(group) = groups.max().filter(|&g| g >= pattern.captures_len()) {
            return Err(format!(
                "{template:?} names group {group}, which the pattern lacks"
            ));
        }
    }
    Ok(())
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

impl Default for StatsdSettings {
    fn default() -> Self {
        StatsdSettings {
            addr: None,
            protocol: StatsdProtocol::Tcp,
            flush_interval_ms: 10_000,
            extra_tags: String::new(),
            format: StatsdFormat::Statsd,
            mogrifiers: Vec::new(),
        }
    }
}

/// How stats reach the statsd server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsdProtocol {
    /// One connection, opened again after a failure (upstream's default).
    #[default]
    Tcp,
    Udp,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Bounds on a request, so no client can make one decision arbitrarily expensive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
}

impl RequestLimits {
    /// The encoded size of the largest request these limits let through: every descriptor
    /// and entry there may be, each key and value as long as it may be, the domain as long
    /// as a value, and every number at its widest. A gRPC message larger than this cannot be
    /// valid.
    pub fn largest_request_bytes(&self) -> usize {
        use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
        use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
            Entry, RateLimitOverride,
        };
        use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
        use prost::Message;
        let entry = Entry {
            key: "k".repeat(self.max_key_bytes),
            value: "v".repeat(self.max_value_bytes),
        };
        let descriptor = RateLimitDescriptor {
            entries: vec![entry; self.max_entries],
            limit: Some(RateLimitOverride {
                requests_per_unit: u32::MAX,
                // A negative enum value is ten bytes on the wire, the most an enum takes.
                unit: -1,
                unit_multiplier: Some(pbjson_types::UInt32Value { value: u32::MAX }),
            }),
            hits_addend: Some(pbjson_types::UInt64Value { value: u64::MAX }),
            is_negative_hits: true,
        };
        let request = RateLimitRequest {
            domain: "d".repeat(self.max_value_bytes),
            descriptors: vec![descriptor; self.max_descriptors],
            hits_addend: u32::MAX,
        };
        request.encoded_len()
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 16,
            max_key_bytes: 256,
            max_value_bytes: 1024,
        }
    }
}

/// The default of `xds.max_message_bytes`: gRPC's customary 4 MiB, what Envoy's and
/// envoyproxy/ratelimit's xDS clients accept too.
pub const DEFAULT_XDS_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The default of `connection_limits.max_request_bytes_held`.
pub const DEFAULT_MAX_REQUEST_BYTES_HELD: usize = 32 << 20;

/// Bounds on a client connection, on both ports, so no client can hold one (a file
/// descriptor, and the memory of its streams) without using it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionLimits {
    /// A new connection must send its first 24 bytes (an HTTP/2 preface) within this, and an
    /// HTTP/1 request its headers.
    pub handshake_timeout_ms: u64,
    /// A connection that sends nothing for this long is closed. Idle HTTP/2 peers are
    /// pinged every `keepalive_interval_ms`, so only a dead or silent one reaches it.
    pub idle_timeout_ms: u64,
    /// HTTP/2 pings on a connection with nothing to read; a ping unanswered for as long
    /// closes it.
    pub keepalive_interval_ms: u64,
    /// The most one request may take, its body included (HTTP: 408; gRPC: CANCELLED, or
    /// DEADLINE_EXCEEDED when the caller's `grpc-timeout` is the sooner).
    pub request_timeout_ms: u64,
    /// Streams (requests in flight) one HTTP/2 connection may have open; clients open more
    /// connections beyond it (Envoy's connection pool does).
    pub max_concurrent_streams: u32,
    /// gRPC: a connection this old (±10%) is asked to go (HTTP/2 GOAWAY), so that clients
    /// spread over replicas added since they connected; 0: never.
    pub max_connection_age_ms: u64,
    /// gRPC: after `max_connection_age_ms`, how long its requests in flight get before the
    /// connection is closed; 0: until they finish (each is bounded by `request_timeout_ms`).
    pub max_connection_age_grace_ms: u64,
    /// gRPC: the most bytes calls waiting for the rest of their request may hold together,
    /// across connections (their headers, stream state and body so far); a call that would
    /// pass it is refused with RESOURCE_EXHAUSTED (`grpc_body.rs`).
    pub max_request_bytes_held: usize,
    /// Connections each port holds at most; at that many, new ones wait in the listen queue
    /// until some close (silent ones are closed to make room).
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            keepalive_interval_ms: 30_000,
            request_timeout_ms: 10_000,
            max_concurrent_streams: 1024,
            max_connection_age_ms: 0,
            max_connection_age_grace_ms: 0,
            max_request_bytes_held: DEFAULT_MAX_REQUEST_BYTES_HELD,
            max_connections: 1024,
        }
    }
}

/// TLS on a listener (the gRPC port's `grpc_tls`, the admin API's `admin_tls`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerTls {
    /// PEM certificate chain and private key: with both set, the listener serves TLS only.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates: set, clients must present a certificate that chains to one
    /// (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are read again for a rotated certificate; 0: never.
    pub reload_interval_ms: u64,
}

impl Default for ListenerTls {
    fn default() -> Self {
        ListenerTls {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            reload_interval_ms: 10_000,
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

/// Everything `floodgate serve` can be told. A name that is no setting is refused
/// (`Settings::load_from` checks the names: the `redis_*` ones are read by [`RedisSettings`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub grpc_addr: SocketAddr,
    /// A Unix socket to serve gRPC on instead of `grpc_addr` (a sidecar's Envoy, say).
    pub grpc_unix_socket: Option<PathBuf>,
    pub grpc_tls: ListenerTls,
    pub http_addr: SocketAddr,
    /// Also serve `/metrics` alone on this address (envoyproxy/ratelimit's
    /// `PROMETHEUS_ADDR`); the HTTP port serves it anyway.
    pub metrics_addr: Option<SocketAddr>,
    pub statsd: StatsdSettings,
    /// The admin API (read and reset counters) on this address; off when unset.
    pub admin_addr: Option<SocketAddr>,
    /// The bearer token every admin request must carry. Taken as written from
    /// `FLOODGATE_ADMIN_TOKEN`; never printed.
    pub admin_token: Option<Password>,
    /// TLS on the admin API; with `client_ca_file`, mutual TLS, which may stand in for the
    /// token. `admin_addr` needs the token, mutual TLS, or both (then both are required).
    pub admin_tls: ListenerTls,
    /// Where the rules come from: the `rules` directory, or an xDS server (`xds`).
    pub rules_source: RulesSource,
    /// Directory of rule files.
    pub rules: PathBuf,
    /// Milliseconds between looks at the rules directory for changes (0: only on SIGHUP).
    pub rules_reload_interval_ms: u64,
    /// The most bytes the rule files may hold together; a reload past it is rejected and the
    /// rules in force are kept (a load briefly holds about 60 times what it parses). An xDS
    /// snapshot is held to it as rule text while it is converted, and to a sixteenth of it
    /// in descriptors and `replaces` entries before that (`xds/bound.rs`).
    pub rules_max_bytes: u64,
    /// Rule files of one domain add up instead of being an error (upstream's
    /// `MERGE_DOMAIN_CONFIG`); a top-level descriptor two files define is still one.
    pub merge_domain_config: bool,
    pub xds: XdsSettings,
    pub backend: BackendKind,
    /// The most counters held in memory (the memory backend, and the `local` failure
    /// policy's counters); past it a new counter takes the place of one expiring soon.
    pub memory_max_counters: usize,
    /// The `redis_*` settings, read from the same layers into a section of their own.
    #[serde(skip)]
    pub redis: RedisSettings,
    /// Global shadow mode: the overall code is never OVER_LIMIT.
    pub shadow_mode: bool,
    /// Hits above this share of a limit count as near it (`ratelimit_service_rate_limit_
    /// near_limit`), as envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`. Between 0 and 1.
    pub near_limit_ratio: f64,
    /// Global quota mode: every rule behaves as `quota_mode: true`.
    pub quota_mode: bool,
    /// Whether a rejected request still counts its allowed descriptors (envoyproxy/ratelimit,
    /// the default). `false`: a request answered OVER_LIMIT consumes nothing on any counter.
    pub consume_on_reject: bool,
    pub response_headers: HeaderStyle,
    /// Up to this many seconds, chosen at random, are added to `Retry-After`.
    pub retry_after_jitter: u32,
    /// Fill `dynamic_metadata` (descriptors, codes, quota-mode violations, rule metadata).
    pub dynamic_metadata: bool,
    /// What a rule without `on_backend_error` does when its backend fails.
    pub on_backend_error: OnBackendErrorSetting,
    pub request_limits: RequestLimits,
    pub connection_limits: ConnectionLimits,
    pub log_format: LogFormat,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    pub shutdown_grace: u64,
    /// Also turn unready (`/readyz` 503, gRPC health NOT_SERVING) while the backend's
    /// circuit is open. Off: readiness says whether floodgate can answer, which it can, by
    /// each rule's `on_backend_error` (upstream's `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`).
    pub readiness_follows_backend: bool,
    /// Also unready (`/readyz` 503, gRPC health NOT_SERVING) while no rule is loaded: an
    /// xDS server's first snapshot not come yet, an empty rules directory (upstream's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub readiness_needs_rules: bool,
    /// `/metrics`' `ratelimit_service_response_time_seconds` in milliseconds, as
    /// envoyproxy/ratelimit's mapping wrote it before it was fixed to seconds (upstream's
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`), for dashboards built on those values.
    pub metrics_response_time_in_milliseconds: bool,
}

/// `on_backend_error` as a settings value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OnBackendErrorSetting {
    #[default]
    Error,
    FailOpen,
    FailClosed,
    Local,
}

impl From<OnBackendErrorSetting> for OnBackendError {
    fn from(value: OnBackendErrorSetting) -> Self {
        match value {
            OnBackendErrorSetting::Error => OnBackendError::Error,
            OnBackendErrorSetting::FailOpen => OnBackendError::FailOpen,
            OnBackendErrorSetting::FailClosed => OnBackendError::FailClosed,
            OnBackendErrorSetting::Local => OnBackendError::Local,
        }
    }
}

/// The default bound on counters held in memory (`memory_max_counters`): at most about
/// 76 MiB of counters (docs/operating.md, Memory).
pub const DEFAULT_MEMORY_MAX_COUNTERS: usize = 400_000;

/// The default bound on a request's wait for Redis (`redis_max_wait_ms`). A live Redis near
/// by answers a request within two command timeouts: the call ahead of it on the connection,
/// then its own (2 × 15 ms); 10 ms more is for this server getting to the request and its
/// reply when its CPU is busy. Anything longer is Redis stalled, cut off or overloaded,
/// where waiting helps nobody: a rate limiter must not be the reason a request is slow.
/// Envoy's own default filter timeout (20 ms, so a wait of 16 ms) is shorter, and governs.
/// With 10 ms for the answer's way back it fits the latency histogram's 50 ms bucket.
pub const DEFAULT_REDIS_MAX_WAIT_MS: u64 = 40;

impl Settings {}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], 8081)),
            grpc_unix_socket: None,
            grpc_tls: ListenerTls::default(),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            metrics_addr: None,
            statsd: StatsdSettings::default(),
            admin_addr: None,
            admin_token: None,
            admin_tls: ListenerTls::default(),
            rules_source: RulesSource::Files,
            rules: PathBuf::from("examples/rules"),
            rules_reload_interval_ms: 1000,
            rules_max_bytes: crate::rules::DEFAULT_RULES_MAX_BYTES,
            merge_domain_config: false,
            xds: XdsSettings::default(),
            backend: BackendKind::Memory,
            memory_max_counters: DEFAULT_MEMORY_MAX_COUNTERS,
            redis: RedisSettings::default(),
            shadow_mode: false,
            near_limit_ratio: 0.8,
            quota_mode: false,
            consume_on_reject: true,
            response_headers: HeaderStyle::None,
            retry_after_jitter: 0,
            dynamic_metadata: false,
            on_backend_error: OnBackendErrorSetting::Error,
            request_limits: RequestLimits::default(),
            connection_limits: ConnectionLimits::default(),
            log_format: LogFormat::Text,
            shutdown_grace: 10,
            readiness_follows_backend: false,
            readiness_needs_rules: false,
            metrics_response_time_in_milliseconds: false,
        }
    }
}

/// A setting given on the command line; `None` leaves the lower layers' value.
#[derive(Debug, Default)]
pub struct Overrides {
    pub values: Vec<(&'static str, config::Value)>,
}

impl Overrides {
    pub fn set(&mut self, key: &'static str, value: Option<impl Into<config::Value>>) {
        if let Some(value) = value {
            self.values.push((key, value.into()));
        }
    }
}

/// Settings whose environment value is taken as written: the environment layer otherwise
/// reads numbers and booleans, which would turn a password `0123` into `123`.
const VERBATIM: [&str; 6] = [
    "statsd.mogrifiers",
    "redis_username",
    "redis_password",
    "redis_per_second.username",
    "redis_per_second.password",
    "admin_token",
];

impl Settings {
    /// Layers the settings file (if any), the `FLOODGATE_*` environment and `overrides` over
    /// the defaults. Nested keys use a double underscore:
    /// `FLOODGATE_REQUEST_LIMITS__MAX_DESCRIPTORS=8`.
    pub fn load(
        file: Option<&Path>,
        overrides: Overrides,
    ) -> Result<Settings, config::ConfigError> {
        Self::load_from(file, std::env::vars(), overrides)
    }

    /// [`Settings::load`] with the environment given explicitly (for tests).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: Overrides,
    ) -> Result<Settings, config::ConfigError> {
        let settings = setting_names();
        let mut env: config::Map<String, String> = env
            .into_iter()
            .filter(|(name, _)| names_a_setting(name, settings))
            .collect();
        let verbatim: Vec<(&str, String)> = VERBATIM
            .into_iter()
            .filter_map(|key| {
                let name = key.to_uppercase().replace('.', "__");
                let value = env.remove(&format!("FLOODGATE_{name}"))?;
                Some((key, value))
            })
            .collect();
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).format(config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("FLOODGATE")
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(env)),
        );
        // Above the file, as the rest of the environment; below the flags.
        for (key, value) in verbatim {
            builder = builder.set_override(key, value)?;
        }
        for (key, value) in overrides.values {
            builder = builder.set_override(key, value)?;
        }
        let layers = builder.build()?;
        let names: config::Map<String, config::Value> = layers.clone().try_deserialize()?;
        if let Some(unknown) = names
            .keys()
            .find(|name| !setting_names().contains(&name.as_str()))
        {
            return Err(config::ConfigError::Message(format!(
                "unknown setting `{unknown}` (docs/settings.md lists them)"
            )));
        }
        let mut settings: Settings = layers.clone().try_deserialize()?;
        settings.redis = layers.try_deserialize()?;
        settings.check()?;
        Ok(settings)
    }
}

impl Settings {
    /// What no one setting's type says: the ranges and combinations that make no sense.
    fn check(&self) -> Result<(), config::ConfigError> {
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            return Err(config::ConfigError::Message(format!(
                "near_limit_ratio must be between 0 and 1, got {}",
                self.near_limit_ratio
            )));
        }
        for mogrifier in &self.statsd.mogrifiers {
            check_mogrifier(mogrifier).map_err(|why| {
                config::ConfigError::Message(format!(
                    "statsd.mogrifiers: pattern {:?}: {why}",
                    mogrifier.pattern
                ))
            })?;
        }
        let startup = &self.redis.startup;
        if startup.max_elapsed_ms > 0
            && (startup.initial_interval_ms == 0 || startup.max_interval_ms == 0)
        {
            return Err(config::ConfigError::Message(
                "redis_startup: initial_interval_ms and max_interval_ms must be above 0".into(),
            ));
        }
        if let Some(max_wait) = self.redis.max_wait_ms
            && max_wait < self.redis.command_timeout_ms
        {
            return Err(config::ConfigError::Message(format!(
                "redis_max_wait_ms ({max_wait}) must be at least redis_command_timeout_ms ({}): \
                 a request would stop waiting before its call could be answered",
                self.redis.command_timeout_ms
            )));
        }
        if self.redis.per_second.backend == Some(BackendKind::Memory) {
            return Err(config::ConfigError::Message(
                "redis_per_second.backend: redis, redis-cluster or redis-sentinel (memory \
                 holds every counter already)"
                    .into(),
            ));
        }
        let limits = &self.connection_limits;
        let zero = [
            ("handshake_timeout_ms", limits.handshake_timeout_ms),
            ("idle_timeout_ms", limits.idle_timeout_ms),
            ("keepalive_interval_ms", limits.keepalive_interval_ms),
            ("request_timeout_ms", limits.request_timeout_ms),
            (
                "max_concurrent_streams",
                limits.max_concurrent_streams.into(),
            ),
            ("max_connections", limits.max_connections as u64),
        ]
        .into_iter()
        .find(|(_, value)| *value == 0);
        if let Some((name, _)) = zero {
            return Err(config::ConfigError::Message(format!(
                "connection_limits.{name} must be above 0"
            )));
        }
        Ok(())
    }
}

/// Whether the environment variable `name` is a setting: `FLOODGATE_` and a setting's name
/// (before any `__` into a nested one). Other `FLOODGATE_*` variables are not ours to refuse:
/// Kubernetes gives every pod `FLOODGATE_SERVICE_HOST`, `FLOODGATE_PORT`, … when a Service is
/// named floodgate, and tools set their own (`FLOODGATE_BIN` in the client test suites).
fn names_a_setting(name: &str, settings: &[&str]) -> bool {
    let Some(setting) = name.strip_prefix("FLOODGATE_") else {
        return false;
    };
    let top = setting.split("__").next().unwrap_or_default();
    settings.iter().any(|known| known.eq_ignore_ascii_case(top))
}

/// Every setting's name: the fields of [`Settings`] and of [`RedisSettings`], as serde knows
/// them.
fn setting_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names = field_names::<Settings>().to_vec();
        names.retain(|&name| name != "redis");
        names.extend(field_names::<RedisSettings>());
        names
    })
}

/// The names of a struct's fields, as serde knows them: read off the `deserialize_struct`
/// call its derived `Deserialize` makes, so a new setting needs no list kept by hand.
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    struct FieldNames(&'static [&'static str]);

    #[derive(Debug)]
    struct Done;
    impl std::fmt::Display for Done {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names read")
        }
    }
    impl std::error::Error for Done {}
    impl de::Error for Done {
        fn custom<T: std::fmt::Display>(_: T) -> Self {
            Done
        }
    }

    impl<'de> de::Deserializer<'de> for &mut FieldNames {
        type Error = Done;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Done> {
            Err(Done)
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Done> {
            self.0 = fields;
            Err(Done)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut names = FieldNames(&[]);
    let _ = T::deserialize(&mut names);
    names.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_largest_request_the_defaults_allow_is_a_little_over_a_mebibyte() {
        // 64 descriptors of 16 entries (256-byte keys, 1 KiB values), each with an override
        // and its own hits; the domain 1 KiB. What the Bounds table says (docs/operating.md).
        assert_eq!(RequestLimits::default().largest_request_bytes(), 1_323_913);
    }

    #[test]
    fn defaults_serve_the_example_rules_on_loopback() {
        let settings = Settings::load_from(None, env(&[]), Overrides::default()).unwrap();
        assert_eq!(settings, Settings::default());
        assert_eq!(settings.grpc_addr.to_string(), "127.0.0.1:8081");
    }

    #[test]
    fn environment_overrides_file_and_flags_override_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("floodgate.toml");
        std::fs::write(
            &file,
            "shadow_mode = true\nresponse_headers = \"ietf\"\nhttp_addr = \"127.0.0.1:9000\"\n\
             [request_limits]\nmax_descriptors = 3\n",
        )
        .unwrap();
        let mut overrides = Overrides::default();
        overrides.set("http_addr", Some("127.0.0.1:9100"));
        let settings = Settings::load_from(
            Some(&file),
            env(&[
                ("FLOODGATE_RESPONSE_HEADERS", "draft03"),
                ("FLOODGATE_HTTP_ADDR", "127.0.0.1:9001"),
                ("FLOODGATE_REQUEST_LIMITS__MAX_ENTRIES", "4"),
            ]),
            overrides,
        )
        .unwrap();
        assert!(settings.shadow_mode);
        assert!(settings.consume_on_reject);
        assert_eq!(settings.response_headers, HeaderStyle::Draft03);
        assert_eq!(settings.http_addr.to_string(), "127.0.0.1:9100");
        assert_eq!(settings.request_limits.max_descriptors, 3);
        assert_eq!(settings.request_limits.max_entries, 4);
    }

    #[test]
    fn redis_credentials_come_from_the_environment_as_written() {
        let settings = Settings::load_from(
            None,
            env(&[
                ("FLOODGATE_BACKEND", "redis-sentinel"),
                ("FLOODGATE_REDIS_USERNAME", "1234"),
                ("FLOODGATE_REDIS_PASSWORD", "0123"),
                ("FLOODGATE_REDIS_SENTINEL_MASTER", "cache"),
            ]),
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(settings.backend, BackendKind::RedisSentinel);
        assert_eq!(settings.redis.username.as_deref(), Some("1234"));
        assert_eq!(settings.redis.password, Some(Password::new("0123")));
        assert_eq!(settings.redis.sentinel_master, "cache");
        assert!(!format!("{settings:?}").contains("0123"));
    }

    #[test]
    fn the_environments_password_overrides_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("floodgate.toml");
        std::fs::write(&file, "redis_password = \"from-file\"\n").unwrap();
        let from_file = Settings::load_from(Some(&file), env(&[]), Overrides::default());
        assert_eq!(
            from_file.unwrap().redis.password,
            Some(Password::new("from-file"))
        );
        let from_env = Settings::load_from(
            Some(&file),
            env(&[("FLOODGATE_REDIS_PASSWORD", "from-env")]),
            Overrides::default(),
        );
        assert_eq!(
            from_env.unwrap().redis.password,
            Some(Password::new("from-env"))
        );
    }

    #[test]
    fn consume_on_reject_is_layered_like_every_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("floodgate.toml");
        std::fs::write(&file, "consume_on_reject = false\n").unwrap();
        let load = |env_pairs: &[(&str, &str)], flag: Option<bool>| {
            let mut overrides = Overrides::default();
            overrides.set("consume_on_reject", flag);
            Settings::load_from(Some(&file), env(env_pairs), overrides)
                .unwrap()
                .consume_on_reject
        };
        assert!(!load(&[], None));
        assert!(load(&[("FLOODGATE_CONSUME_ON_REJECT", "true")], None));
        assert!(!load(
            &[("FLOODGATE_CONSUME_ON_REJECT", "true")],
            Some(false)
        ));
    }

    #[test]
    fn rules_reload_interval_is_layered_like_every_setting() {
        let load = |env_pairs: &[(&str, &str)], flag: Option<u64>| {
            let mut overrides = Overrides::default();
            overrides.set("rules_reload_interval_ms", flag);
            Settings::load_from(None, env(env_pairs), overrides)
                .unwrap()
                .rules_reload_interval_ms
        };
        assert_eq!(load(&[], None), 1000);
        assert_eq!(
            load(&[("FLOODGATE_RULES_RELOAD_INTERVAL_MS", "0")], None),
            0
        );
        assert_eq!(
            load(&[("FLOODGATE_RULES_RELOAD_INTERVAL_MS", "0")], Some(250)),
            250
        );
    }

    #[test]
    fn floodgate_variables_that_name_no_setting_are_left_alone() {
        let settings = Settings::load_from(
            None,
            env(&[
                ("FLOODGATE_SERVICE_HOST", "10.0.0.7"),
                ("FLOODGATE_PORT", "tcp://10.0.0.7:8081"),
                ("FLOODGATE_BIN", "/usr/local/bin/floodgate"),
                ("FLOODGATE_SHADOW_MODE", "true"),
                ("FLOODGATE_REQUEST_LIMITS__MAX_ENTRIES", "3"),
            ]),
            Overrides::default(),
        )
        .unwrap();
        assert!(settings.shadow_mode);
        assert_eq!(settings.request_limits.max_entries, 3);
        assert!(setting_names().contains(&"redis_url"));
        assert!(setting_names().contains(&"consume_on_reject"));
    }

    #[test]
    fn unknown_setting_in_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("floodgate.toml");
        std::fs::write(&file, "shadow_mod = true\n").unwrap();
        let error = Settings::load_from(Some(&file), env(&[]), Overrides::default()).unwrap_err();
        assert!(error.to_string().contains("shadow_mod"), "{error}");
    }

    #[test]
    fn the_redis_settings_are_read_as_written_into_their_section() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("floodgate.toml");
        std::fs::write(
            &file,
            "redis_url = \"redis://cache:6379\"\nredis_pool_size = 2\n",
        )
        .unwrap();
        let settings = Settings::load_from(
            Some(&file),
            env(&[
                ("FLOODGATE_REDIS_POOL_SIZE", "3"),
                // Read as a number by the environment layer, a string for this setting.
                ("FLOODGATE_REDIS_KEY_PREFIX", "2024"),
                ("FLOODGATE_REDIS_PER_SECOND__URL", "redis://second:6379"),
                ("FLOODGATE_REDIS_STARTUP__MAX_ELAPSED_MS", "100"),
            ]),
            Overrides::default(),
        )
        .unwrap();
        let redis = &settings.redis;
        assert_eq!(redis.url, "redis://cache:6379");
        assert_eq!(redis.pool_size, 3);
        assert_eq!(redis.key_prefix, "2024");
        assert_eq!(redis.per_second.url, "redis://second:6379");
        assert_eq!(redis.startup.max_elapsed_ms, 100);
        assert_eq!(redis.command_timeout_ms, 15, "the rest keep their defaults");

        let bad = env(&[("FLOODGATE_REDIS_POOL_SIZE", "many")]);
        let error = Settings::load_from(None, bad, Overrides::default()).unwrap_err();
        assert!(error.to_string().contains("redis_pool_size"), "{error}");
        let bad = env(&[("FLOODGATE_REDIS_PER_SECOND__URLS", "redis://second:6379")]);
        let error = Settings::load_from(None, bad, Overrides::default()).unwrap_err();
        assert!(error.to_string().contains("urls"), "{error}");
        std::fs::write(&file, "redis_urls = \"redis://cache:6379\"\n").unwrap();
        let error = Settings::load_from(Some(&file), env(&[]), Overrides::default()).unwrap_err();
        assert!(
            error.to_string().contains("unknown setting `redis_urls`"),
            "{error}"
        );
    }

    #[test]
    fn mogrifiers_come_from_json_in_the_environment_and_bad_ones_stop_the_start() {
        let load = |json: &str| {
            let env = [("FLOODGATE_STATSD__MOGRIFIERS".to_owned(), json.to_owned())];
            Settings::load_from(None, env, Overrides::default())
        };
        let loaded =
            load(r#"[{"pattern": "^a\\.(.*)$", "name": "b.$1", "tags": "k:$1"}]"#).expect("loads");
        assert_eq!(
            loaded.statsd.mogrifiers,
            [Mogrifier {
                pattern: "^a\\.(.*)$".into(),
                name: "b.$1".into(),
                tags: "k:$1".into(),
            }]
        );
        for (json, why) in [
            (r#"[{"pattern": "(", "name": "b"}]"#, "regex"),
            (r#"[{"pattern": "^a$", "name": ""}]"#, "no name"),
            (r#"[{"pattern": "^(a)$", "name": "b.$2"}]"#, "group 2"),
            (
                r#"[{"pattern": "^a$", "name": "b", "tags": "k:"}]"#,
                "not key:value",
            ),
            (r#"[{"pattern": "^a$"}]"#, "name"),
        ] {
            let error = load(json).expect_err(json).to_string();
            assert!(error.contains(why), "{json}: {error}");
        }
    }
}
