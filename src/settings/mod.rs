//! Settings: built-in defaults, then a settings file (`--config`, TOML), then `FLOODGATE_*`
//! environment variables, then command-line flags — each layer overriding the one before.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;

use crate::rules::OnBackendError;

mod limits;
mod redis;
#[cfg(test)]
mod scripted;
mod statsd;
mod tls;
mod xds;

pub use limits::{ConnectionLimits, DEFAULT_MAX_REQUEST_BYTES_HELD, RequestLimits};
pub use redis::{DEFAULT_REDIS_MAX_WAIT_MS, PerSecondRedis, RedisSettings, RedisStartup};
#[cfg(test)]
pub use scripted::ScriptedSettings;
use statsd::check_mogrifier;
pub use statsd::{Mogrifier, StatsdFormat, StatsdProtocol, StatsdSettings};
pub use tls::ListenerTls;
pub use xds::{DEFAULT_XDS_MAX_MESSAGE_BYTES, XdsSettings};

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
    /// The unit tests' store (`backend/scripted.rs`): the smallest whole example of a store
    /// named in the settings, with a section of its own (`scripted`).
    #[cfg(test)]
    Scripted,
}

impl BackendKind {
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Redis => "redis",
            BackendKind::RedisCluster => "redis-cluster",
            BackendKind::RedisSentinel => "redis-sentinel",
            #[cfg(test)]
            BackendKind::Scripted => "scripted",
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

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
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
    /// The most the RLQS streams' memory of their buckets may take together, in bytes
    /// (estimated per bucket); past it a new bucket is answered but not remembered.
    pub rlqs_max_remembered_bytes: usize,
    /// The unit tests' store's section (`backend: scripted`).
    #[cfg(test)]
    pub scripted: ScriptedSettings,
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

/// The default of `rlqs_max_remembered_bytes`: the most every RLQS stream's memory of its
/// buckets (matched, with their state; and unmatched) may take together, as the streams
/// estimate it. Past it a new bucket is answered as always but not remembered: its next
/// report is answered as its first (no assignment pushed at its window's reset, its demand
/// measured again), and a bucket no rule matches is matched again. 48 MiB holds about
/// 120,000 (bucket, Envoy) pairs of one short entry (docs/operating.md, RLQS fleets).
pub const DEFAULT_RLQS_MAX_REMEMBERED_BYTES: usize = 48 << 20;

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
            rlqs_max_remembered_bytes: DEFAULT_RLQS_MAX_REMEMBERED_BYTES,
            #[cfg(test)]
            scripted: ScriptedSettings::default(),
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
