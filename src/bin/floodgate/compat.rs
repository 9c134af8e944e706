//! envoyproxy/ratelimit's deployment shape: its environment variables, read as floodgate's
//! settings, for `floodgate ratelimit` and for the binary started as `ratelimit` (the
//! image's `/bin/ratelimit`, which Envoy Gateway's and Istio's manifests run).
//!
//! Each upstream variable becomes the `FLOODGATE_*` variable of the setting it means, with
//! upstream's defaults where floodgate's differ (listening on 0.0.0.0, rules under
//! `/srv/runtime_data/current/config`, Redis as the backend, a 24 h connection age). An
//! explicit `FLOODGATE_*` variable still wins, so floodgate's extensions stay reachable. What
//! has no equivalent (statsd, memcache, custom header names) is listed at start-up, never
//! silently dropped; what cannot be honoured safely (memcache as the backend, an unknown
//! `CONFIG_TYPE`) is an error.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// What one entry of the over-limit cache costs, about: its counter key (most are under a
/// hundred bytes) and its expiry, in the map and its expiry order.
const LOCAL_CACHE_ENTRY_BYTES: u64 = 128;

/// The variables of one of upstream's Redis connections, and the settings they become.
struct RedisVariables {
    prefix: &'static str,
    default_url: &'static str,
    backend: &'static str,
    url: &'static str,
    username: &'static str,
    password: &'static str,
    sentinel_master: &'static str,
}

const MAIN_REDIS: RedisVariables = RedisVariables {
    prefix: "REDIS",
    default_url: "/var/run/nutcracker/ratelimit.sock",
    backend: "backend",
    url: "redis_url",
    username: "redis_username",
    password: "redis_password",
    sentinel_master: "redis_sentinel_master",
};

/// `REDIS_PERSECOND=true`: per-second limits' counters in a Redis of their own.
const PER_SECOND_REDIS: RedisVariables = RedisVariables {
    prefix: "REDIS_PERSECOND",
    default_url: "/var/run/nutcracker/ratelimitpersecond.sock",
    backend: "redis_per_second.backend",
    url: "redis_per_second.url",
    username: "redis_per_second.username",
    password: "redis_per_second.password",
    sentinel_master: "redis_per_second.sentinel_master",
};

/// Upstream's memcache variables: floodgate offers no memcache backend.
const MEMCACHE_VARIABLES: [&str; 9] = [
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
];

/// Why upstream's environment cannot be served.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("envoyproxy/ratelimit environment: {0}")]
pub struct CompatError(String);

/// Upstream's environment as floodgate's.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translated {
    /// `FLOODGATE_*` variables, to be read below the real ones.
    pub env: Vec<(String, String)>,
    /// The log filter `LOG_LEVEL` asks for (upstream's default: warn).
    pub log_level: String,
    /// Variables set that floodgate reads and follows.
    pub honoured: BTreeSet<String>,
    /// Variables set that floodgate does not honour, each with why.
    pub ignored: Vec<String>,
    /// The standard `OTEL_*` variables upstream's `TRACING_*` ones mean, for those the
    /// environment does not set itself (the tracer reads only the process environment).
    pub otel: Vec<(String, String)>,
}

/// Reads upstream's variables from `env`.
pub fn translate(env: &HashMap<String, String>) -> Result<Translated, CompatError> {
    let mut out = Translator {
        env,
        translated: Translated::default(),
        read: RefCell::default(),
    };
    out.listeners()?;
    out.rules()?;
    out.backend()?;
    out.behaviour()?;
    out.observability()?;
    out.tracing()?;
    let ignored: BTreeSet<&str> = (out.translated.ignored.iter())
        .filter_map(|line| line.split_once(':').map(|(name, _)| name))
        .collect();
    let read = out.read.take();
    out.translated.honoured = (read.into_iter())
        .filter(|name| !ignored.contains(name.as_str()))
        .collect();
    Ok(out.translated)
}

struct Translator<'a> {
    env: &'a HashMap<String, String>,
    translated: Translated,
    /// The variables read that the environment sets.
    read: RefCell<BTreeSet<String>>,
}

impl<'a> Translator<'a> {
    /// Upstream's variable `name`, unless unset or empty (as envconfig reads it).
    fn get(&self, name: &str) -> Option<&'a str> {
        let env: &'a HashMap<String, String> = self.env;
        let value = env.get(name).map(String::as_str).filter(|v| !v.is_empty());
        if value.is_some() {
            self.read.borrow_mut().insert(name.to_owned());
        }
        value
    }

    fn or(&self, name: &str, default: &'a str) -> &'a str {
        self.get(name).unwrap_or(default)
    }

    fn flag(&self, name: &str) -> Result<bool, CompatError> {
        match self.get(name) {
            None => Ok(false),
            Some(value) => parse_bool(value)
                .ok_or_else(|| CompatError(format!("{name}={value:?} is not a boolean"))),
        }
    }

    fn set(&mut self, setting: &str, value: impl Into<String>) {
        let name = format!("FLOODGATE_{}", setting.to_uppercase().replace('.', "__"));
        self.translated.env.push((name, value.into()));
    }

    /// `setting` = upstream's `name`, when it is set.
    fn copy(&mut self, name: &str, setting: &str) {
        if let Some(value) = self.get(name) {
            self.set(setting, value);
        }
    }

    fn ignore(&mut self, name: &str, why: &str) {
        if self.get(name).is_some() {
            self.translated.ignored.push(format!("{name}: {why}"));
        }
    }

    fn millis(&self, name: &str, default: &str) -> Result<String, CompatError> {
        let text = self.or(name, default);
        let duration = go_duration(text)
            .ok_or_else(|| CompatError(format!("{name}={text:?} is not a duration")))?;
        Ok(duration.as_millis().to_string())
    }

    fn listeners(&mut self) -> Result<(), CompatError> {
        let http = socket_addr(self.or("HOST", "0.0.0.0"), self.or("PORT", "8080"));
        self.set("http_addr", http);
        let grpc = socket_addr(
            self.or("GRPC_HOST", "0.0.0.0"),
            self.or("GRPC_PORT", "8081"),
        );
        self.set("grpc_addr", grpc);
        self.copy("GRPC_UDS", "grpc_unix_socket");
        if self.flag("GRPC_SERVER_USE_TLS")? {
            self.copy("GRPC_SERVER_TLS_CERT", "grpc_tls.cert_file");
            self.copy("GRPC_SERVER_TLS_KEY", "grpc_tls.key_file");
            self.copy("GRPC_CLIENT_TLS_CACERT", "grpc_tls.client_ca_file");
            self.ignore(
                "GRPC_CLIENT_TLS_SAN",
                "not checked: any client certificate the CA signed is accepted",
            );
        }
        let age = self.millis("GRPC_MAX_CONNECTION_AGE", "24h")?;
        self.set("connection_limits.max_connection_age_ms", age);
        let grace = self.millis("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")?;
        self.set("connection_limits.max_connection_age_grace_ms", grace);
        for name in ["DEBUG_HOST", "DEBUG_PORT"] {
            self.ignore(name, "/rlconfig is served on the HTTP port");
        }
        Ok(())
    }

    fn rules(&mut self) -> Result<(), CompatError> {
        match self.or("CONFIG_TYPE", "FILE") {
            "FILE" => {
                let root = self.or("RUNTIME_ROOT", "/srv/runtime_data/current");
                let dir = [
                    root,
                    self.or("RUNTIME_SUBDIRECTORY", ""),
                    self.or("RUNTIME_APPDIRECTORY", "config"),
                ]
                .iter()
                .filter(|part| !part.is_empty())
                .map(|part| part.trim_end_matches('/'))
                .collect::<Vec<_>>()
                .join("/");
                self.set("rules", dir);
                self.set("rules_source", "files");
            }
            "GRPC_XDS_SOTW" => self.xds()?,
            other => {
                return Err(CompatError(format!(
                    "CONFIG_TYPE={other:?}: FILE and GRPC_XDS_SOTW are offered"
                )));
            }
        }
        if self.flag("MERGE_DOMAIN_CONFIG")? {
            self.set("merge_domain_config", "true");
        }
        if self.get("RUNTIME_WATCH_ROOT").is_some() && !self.flag("RUNTIME_WATCH_ROOT")? {
            self.ignore(
                "RUNTIME_WATCH_ROOT",
                "the rules directory itself is watched (a ConfigMap's ..data swap included)",
            );
        }
        if self.get("RUNTIME_IGNOREDOTFILES").is_some() && !self.flag("RUNTIME_IGNOREDOTFILES")? {
            self.ignore("RUNTIME_IGNOREDOTFILES", "dot files are never rules");
        }
        Ok(())
    }

    fn xds(&mut self) -> Result<(), CompatError> {
        self.set("rules_source", "xds");
        let tls = self.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
        let scheme = if tls { "https" } else { "http" };
        let server = self.or("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000");
        let url = if server.contains("://") {
            server.to_owned()
        } else {
            format!("{scheme}://{server}")
        };
        self.set("xds.server_url", url);
        self.set("xds.node_id", self.or("CONFIG_GRPC_XDS_NODE_ID", "default"));
        if tls {
            self.copy("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds.ca_file");
            self.copy("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds.cert_file");
            self.copy("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds.key_file");
            self.copy("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.server_name");
        }
        let initial = match self.get("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL") {
            Some(_) => {
                self.ignore(
                    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL is set, and is the first pause",
                );
                self.millis("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s")?
            }
            None => self.millis("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s")?,
        };
        self.set("xds.retry_initial_ms", initial);
        let longest = self.millis("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s")?;
        self.set("xds.retry_max_ms", longest);
        if self.flag("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
            self.set("xds.start_without_initial_config", "true");
        }
        self.copy("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "xds.max_message_bytes");
        self.ignore(
            "CONFIG_GRPC_XDS_NODE_METADATA",
            "the node is sent with its id and cluster only",
        );
        self.ignore(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "no headers are added to the xDS stream",
        );
        for name in [
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
            "XDS_CLIENT_BACKOFF_JITTER",
        ] {
            self.ignore(
                name,
                "the pause before subscribing again is always jittered",
            );
        }
        Ok(())
    }

    fn backend(&mut self) -> Result<(), CompatError> {
        match self.or("BACKEND_TYPE", "redis").to_lowercase().as_str() {
            "redis" => {}
            other => {
                return Err(CompatError(format!(
                    "BACKEND_TYPE={other:?}: redis is offered (floodgate's own `memory` \
                     through FLOODGATE_BACKEND)"
                )));
            }
        }
        self.redis(&MAIN_REDIS)?;
        if self.flag("REDIS_PERSECOND")? {
            self.redis(&PER_SECOND_REDIS)?;
        }
        let tls = self.flag("REDIS_TLS")? || self.flag("REDIS_PERSECOND_TLS")?;
        if tls {
            self.copy("REDIS_TLS_CACERT", "redis_tls_ca_file");
            self.copy("REDIS_TLS_CLIENT_CERT", "redis_tls_cert_file");
            self.copy("REDIS_TLS_CLIENT_KEY", "redis_tls_key_file");
        }
        self.copy("CACHE_KEY_PREFIX", "redis_key_prefix");
        self.ignore(
            "EXPIRATION_JITTER_MAX_SECONDS",
            "a key expires just after its last useful moment, on Redis' clock",
        );
        self.redis_startup()?;
        for name in MEMCACHE_VARIABLES {
            self.ignore(name, "memcache is not offered");
        }
        Ok(())
    }

    /// Upstream retries Redis at start-up (from `REDIS_STARTUP_INITIAL_INTERVAL`, doubling
    /// up to `_MAX_INTERVAL`) and exits when `_MAX_ELAPSED_TIME` passes without an answer.
    fn redis_startup(&mut self) -> Result<(), CompatError> {
        for (name, setting) in [
            (
                "REDIS_STARTUP_INITIAL_INTERVAL",
                "redis_startup.initial_interval_ms",
            ),
            (
                "REDIS_STARTUP_MAX_INTERVAL",
                "redis_startup.max_interval_ms",
            ),
            (
                "REDIS_STARTUP_MAX_ELAPSED_TIME",
                "redis_startup.max_elapsed_ms",
            ),
        ] {
            if self.get(name).is_some() {
                let millis = self.millis(name, "0")?;
                self.set(setting, millis);
            }
        }
        Ok(())
    }

    /// One Redis connection's variables (`REDIS_*`, or `REDIS_PERSECOND_*`) as the settings
    /// `redis` names.
    fn redis(&mut self, redis: &RedisVariables) -> Result<(), CompatError> {
        let var = |name: &str| format!("{}_{name}", redis.prefix);
        let kind = match self.or(&var("TYPE"), "SINGLE").to_uppercase().as_str() {
            "SINGLE" => "redis",
            "CLUSTER" => "redis-cluster",
            "SENTINEL" => "redis-sentinel",
            other => {
                return Err(CompatError(format!(
                    "{}={other:?}: SINGLE, CLUSTER or SENTINEL",
                    var("TYPE")
                )));
            }
        };
        self.set(redis.backend, kind);
        let tls = self.flag(&var("TLS"))?;
        let url = self.or(&var("URL"), redis.default_url);
        let mut addresses: Vec<&str> = url.split(',').map(str::trim).collect();
        if kind == "redis-sentinel" {
            // Upstream: the primary's name first, then the sentinels.
            self.set(redis.sentinel_master, addresses.remove(0));
        }
        let suffix = if self.flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? {
            "/#insecure"
        } else {
            ""
        };
        // The sentinels' own password goes in their URLs; the primary's is `*_AUTH`.
        let sentinel_auth = (kind == "redis-sentinel")
            .then(|| self.get(&var("SENTINEL_AUTH")))
            .flatten()
            .map(|auth| format!(":{}@", percent_encoded(auth)))
            .unwrap_or_default();
        let urls = match self.or(&var("SOCKET_TYPE"), "unix") {
            "unix" if kind == "redis" => format!("redis+unix://{}", addresses.join("")),
            "tcp" => {
                let scheme = if tls { "rediss" } else { "redis" };
                (addresses.iter())
                    .map(|address| format!("{scheme}://{sentinel_auth}{address}{suffix}"))
                    .collect::<Vec<_>>()
                    .join(",")
            }
            other => {
                return Err(CompatError(format!(
                    "{}={other:?}: tcp, or unix for a single Redis",
                    var("SOCKET_TYPE")
                )));
            }
        };
        self.set(redis.url, urls);
        if let Some(auth) = self.get(&var("AUTH")) {
            match auth.split_once(':') {
                Some((user, password)) => {
                    self.set(redis.username, user);
                    self.set(redis.password, password);
                }
                None => self.set(redis.password, auth),
            }
        }
        self.redis_tuning_ignored(redis);
        Ok(())
    }

    /// Upstream's pool and pipelining knobs for one Redis connection: floodgate has none of
    /// them, and says what it does instead.
    fn redis_tuning_ignored(&mut self, redis: &RedisVariables) {
        let var = |name: &str| format!("{}_{name}", redis.prefix);
        self.ignore(
            &var("POOL_SIZE"),
            "floodgate multiplexes one connection (redis_pool_size)",
        );
        self.ignore(
            &var("TIMEOUT"),
            "a request waits at most redis_max_wait_ms (40 ms), then the rule's on_backend_error",
        );
        for pipelining in ["PIPELINE_WINDOW", "PIPELINE_LIMIT", "USE_EXPLICIT_PIPELINE"] {
            self.ignore(
                &var(pipelining),
                "the requests waiting on a connection always go as one call",
            );
        }
        self.ignore(
            &var("POOL_ON_EMPTY_BEHAVIOR"),
            "a call never waits for a free connection (they are multiplexed); past \
             redis_max_wait_ms the rule's on_backend_error answers",
        );
        self.ignore(
            &var("CLUSTER_PIPELINE_PARALLELISM"),
            "a request's calls to different cluster nodes always go at once",
        );
    }

    fn behaviour(&mut self) -> Result<(), CompatError> {
        self.copy("NEAR_LIMIT_RATIO", "near_limit_ratio");
        if self.flag("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")? {
            self.set("readiness_follows_backend", "true");
        }
        if self.flag("SHADOW_MODE")? {
            self.set("shadow_mode", "true");
        }
        if self.flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")? {
            self.set("readiness_needs_rules", "true");
        }
        if self.flag("QUOTA_MODE")? {
            self.set("quota_mode", "true");
        }
        if self.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
            self.set("consume_on_reject", "false");
        }
        if self.flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            self.set("response_headers", "draft03");
            for name in [
                "LIMIT_LIMIT_HEADER",
                "LIMIT_REMAINING_HEADER",
                "LIMIT_RESET_HEADER",
            ] {
                self.ignore(
                    name,
                    "the header names are X-RateLimit-Limit/-Remaining/-Reset",
                );
            }
        }
        if self.flag("RESPONSE_DYNAMIC_METADATA")? {
            self.set("dynamic_metadata", "true");
        }
        self.local_cache()
    }

    /// Upstream's over-limit cache is off unless `LOCAL_CACHE_SIZE_IN_BYTES` sizes it;
    /// floodgate's (on by default) is sized in entries: one per [`LOCAL_CACHE_ENTRY_BYTES`].
    /// Left on, it would answer (and count in the stats) what upstream sends to Redis.
    fn local_cache(&mut self) -> Result<(), CompatError> {
        let bytes = self.or("LOCAL_CACHE_SIZE_IN_BYTES", "0");
        let bytes: u64 = bytes.parse().map_err(|_| {
            CompatError(format!(
                "LOCAL_CACHE_SIZE_IN_BYTES={bytes:?}: a number of bytes"
            ))
        })?;
        let entries = bytes.div_ceil(LOCAL_CACHE_ENTRY_BYTES);
        self.set("redis_local_cache_size", entries.to_string());
        Ok(())
    }

    fn observability(&mut self) -> Result<(), CompatError> {
        self.translated.log_level = self.or("LOG_LEVEL", "warn").to_lowercase();
        if let Some(format) = self.get("LOG_FORMAT").map(str::to_lowercase) {
            self.set("log_format", format);
        }
        if self.flag("USE_PROMETHEUS")? {
            let addr = self.or("PROMETHEUS_ADDR", ":9090");
            let addr = match addr.strip_prefix(':') {
                Some(port) => format!("0.0.0.0:{port}"),
                None => addr.to_owned(),
            };
            self.set("metrics_addr", addr);
            if self.or("PROMETHEUS_PATH", "/metrics") != "/metrics" {
                self.ignore("PROMETHEUS_PATH", "metrics are served on /metrics");
            }
        }
        if self.flag("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")? {
            self.set("metrics_response_time_in_milliseconds", "true");
        }
        self.ignore(
            "PROMETHEUS_MAPPER_YAML",
            "the metric names are those of upstream's default mapping",
        );
        self.statsd()
    }

    /// Upstream's statsd stats: on unless `USE_STATSD=false` (upstream's default is on),
    /// to `STATSD_HOST:STATSD_PORT` over `STATSD_PROTOCOL` (tcp), every
    /// `STATS_FLUSH_INTERVAL`, with `EXTRA_TAGS`.
    fn statsd(&mut self) -> Result<(), CompatError> {
        let plain = match self.get("USE_STATSD") {
            None => true,
            Some(_) => self.flag("USE_STATSD")?,
        };
        let dog = self.flag("USE_DOG_STATSD")?;
        let on = plain || dog;
        if self.flag("DISABLE_STATS")? {
            self.ignore(
                "DISABLE_STATS",
                "no stats go to statsd, but /metrics is still served (it costs a few atomic \
                 increments)",
            );
            return Ok(());
        }
        if !on {
            return Ok(());
        }
        let host = self.or("STATSD_HOST", "localhost");
        let port = self.or("STATSD_PORT", "8125");
        self.set("statsd.addr", format!("{host}:{port}"));
        // Upstream's DogStatsD client sends datagrams, whatever STATSD_PROTOCOL says.
        match self.or("STATSD_PROTOCOL", "tcp").to_lowercase().as_str() {
            _ if dog => self.set("statsd.protocol", "udp"),
            protocol @ ("tcp" | "udp") => self.set("statsd.protocol", protocol),
            other => {
                return Err(CompatError(format!(
                    "STATSD_PROTOCOL={other:?}: tcp or udp"
                )));
            }
        }
        let interval = self.millis("STATS_FLUSH_INTERVAL", "10s")?;
        self.set("statsd.flush_interval_ms", interval);
        if let Some(tags) = self.get("EXTRA_TAGS") {
            self.set("statsd.extra_tags", sorted_tags(tags));
        }
        if dog {
            self.dogstatsd()?;
        }
        Ok(())
    }

    /// `USE_DOG_STATSD`: tags the DogStatsD way (`|#key:value`), over UDP as upstream's
    /// DogStatsD client sends them, each name first rewritten by the first of
    /// `USE_DOG_STATSD_MOGRIFIERS` whose `DOG_STATSD_MOGRIFIER_<NAME>_PATTERN` matches it.
    fn dogstatsd(&mut self) -> Result<(), CompatError> {
        self.set("statsd.format", "dogstatsd");
        let Some(names) = self.get("USE_DOG_STATSD_MOGRIFIERS") else {
            return Ok(());
        };
        let mut mogrifiers = Vec::new();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let var = |part: &str| format!("DOG_STATSD_MOGRIFIER_{name}_{part}");
            let required = |part: &str| {
                self.get(&var(part)).ok_or_else(|| {
                    CompatError(format!("mogrifier {name}: {} is not set", var(part)))
                })
            };
            let pattern = required("PATTERN")?;
            let rename = required("NAME")?;
            let tags = self.get(&var("TAGS")).unwrap_or_default();
            mogrifiers.push(serde_json::json!({
                "pattern": pattern, "name": rename, "tags": tags,
            }));
        }
        self.set(
            "statsd.mogrifiers",
            serde_json::Value::from(mogrifiers).to_string(),
        );
        Ok(())
    }

    /// Upstream's OTLP tracing: on with `TRACING_ENABLED`, over `TRACING_EXPORTER_PROTOCOL`
    /// (`http`, the default, or `grpc`) to the standard `OTEL_EXPORTER_OTLP_*` endpoint,
    /// named `TRACING_SERVICE_NAME` (default `RateLimit`), sampling
    /// `TRACING_SAMPLING_RATE` of the traces that start here (the caller's sampled flag is
    /// followed).
    fn tracing(&mut self) -> Result<(), CompatError> {
        if !self.flag("TRACING_ENABLED")? {
            return Ok(());
        }
        self.otel("OTEL_TRACES_EXPORTER", "otlp");
        let protocol = match self.or("TRACING_EXPORTER_PROTOCOL", "http") {
            "http" => "http/protobuf",
            "grpc" => "grpc",
            other => {
                return Err(CompatError(format!(
                    "TRACING_EXPORTER_PROTOCOL={other:?}: http or grpc"
                )));
            }
        };
        self.otel("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol);
        self.otel(
            "OTEL_SERVICE_NAME",
            self.or("TRACING_SERVICE_NAME", "RateLimit"),
        );
        let resource: Vec<String> = [
            ("service.namespace", "TRACING_SERVICE_NAMESPACE"),
            ("service.instance.id", "TRACING_SERVICE_INSTANCE_ID"),
        ]
        .into_iter()
        .filter_map(|(key, name)| Some(format!("{key}={}", self.get(name)?)))
        .collect();
        if !resource.is_empty() {
            self.otel("OTEL_RESOURCE_ATTRIBUTES", &resource.join(","));
        }
        let rate = self.or("TRACING_SAMPLING_RATE", "1");
        match rate.parse::<f64>() {
            Ok(rate) if (0.0..1.0).contains(&rate) => {
                self.otel("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
                self.otel("OTEL_TRACES_SAMPLER_ARG", &rate.to_string());
            }
            Ok(rate) if rate >= 1.0 => {}
            _ => {
                return Err(CompatError(format!(
                    "TRACING_SAMPLING_RATE={rate:?} is not a rate from 0 to 1"
                )));
            }
        }
        Ok(())
    }

    /// The `OTEL_*` variable `name` = `value`, unless the environment sets it.
    fn otel(&mut self, name: &str, value: &str) {
        if self.get(name).is_none() {
            (self.translated.otel).push((name.to_owned(), value.to_owned()));
        }
    }
}

/// `text` with every byte but URL-safe ones percent-encoded, for a URL's user info.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// `EXTRA_TAGS` (`key:value,…`) ordered by key: upstream reads them into a map and its
/// statsd client writes a stat's tags sorted by key, so `foo:bar,a:b` is sent as
/// `.__a=b.__foo=bar` whatever order the variable gives.
fn sorted_tags(tags: &str) -> String {
    let mut pairs: Vec<&str> = tags.split(',').map(str::trim).collect();
    pairs.sort_by_key(|pair| pair.split_once(':').map_or(*pair, |(key, _)| key));
    pairs.join(",")
}

/// `host:port`, an IPv6 host in brackets.
fn socket_addr(host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// A Go duration (`time.ParseDuration`): numbers with units, `1h30m`, `500ms`, `1.5s`, `0`.
pub fn go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&end| end > 0)?;
        let value: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn value<'a>(translated: &'a Translated, name: &str) -> Option<&'a str> {
        (translated.env.iter())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    #[test]
    fn upstreams_tracing_becomes_the_standard_variables_under_the_real_ones() {
        let off = translate(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]));
        assert_eq!(off.expect("translates").otel, []);
        let translated = translate(&env(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAMESPACE", "gateway"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("OTEL_SERVICE_NAME", "mine"),
        ]))
        .expect("translates");
        let otel: Vec<(&str, &str)> = (translated.otel.iter())
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        assert_eq!(
            otel,
            [
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.namespace=gateway"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]
        );
        for (name, value) in [
            ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
            ("TRACING_SAMPLING_RATE", "2x"),
            ("TRACING_SAMPLING_RATE", "-1"),
        ] {
            let refused = translate(&env(&[("TRACING_ENABLED", "1"), (name, value)]));
            assert!(refused.unwrap_err().0.contains(name), "{name}={value}");
        }
    }

    #[test]
    fn upstreams_timeouts_and_pipelining_are_named_as_ignored() {
        let names = [
            "REDIS_TIMEOUT",
            "REDIS_PIPELINE_WINDOW",
            "REDIS_PIPELINE_LIMIT",
            "REDIS_PERSECOND_TIMEOUT",
            "REDIS_PERSECOND_PIPELINE_WINDOW",
            "REDIS_PERSECOND_PIPELINE_LIMIT",
        ];
        let mut vars: Vec<(&str, &str)> = names.iter().map(|name| (*name, "10s")).collect();
        vars.push(("REDIS_PERSECOND", "true"));
        let translated = translate(&env(&vars)).expect("translates");
        for name in names {
            let said = (translated.ignored.iter()).any(|why| why.starts_with(&format!("{name}:")));
            assert!(said, "{name}: {:?}", translated.ignored);
        }
        assert_eq!(
            value(&translated, "FLOODGATE_REDIS_COMMAND_TIMEOUT_MS"),
            None
        );
    }

    #[test]
    fn upstreams_xds_client_settings_are_honoured_or_named() {
        let translated = translate(&env(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.2"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a:b"),
        ]))
        .expect("translates");
        assert_eq!(
            value(&translated, "FLOODGATE_XDS__MAX_MESSAGE_BYTES"),
            Some("8388608")
        );
        for name in [
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
            "XDS_CLIENT_BACKOFF_JITTER",
            "CONFIG_GRPC_XDS_NODE_METADATA",
        ] {
            let said = (translated.ignored.iter()).any(|why| why.starts_with(&format!("{name}:")));
            assert!(said, "{name}: {:?}", translated.ignored);
        }
    }

    #[test]
    fn merge_domain_config_merges_the_files_of_a_domain() {
        let off = translate(&env(&[])).expect("translates");
        assert_eq!(value(&off, "FLOODGATE_MERGE_DOMAIN_CONFIG"), None);
        let on = translate(&env(&[("MERGE_DOMAIN_CONFIG", "true")])).expect("translates");
        assert_eq!(value(&on, "FLOODGATE_MERGE_DOMAIN_CONFIG"), Some("true"));
        assert!(
            on.ignored
                .iter()
                .all(|why| !why.contains("MERGE_DOMAIN_CONFIG"))
        );
    }

    #[test]
    fn the_over_limit_cache_is_off_unless_upstreams_variable_sizes_it() {
        let off = translate(&env(&[])).expect("translates");
        assert_eq!(value(&off, "FLOODGATE_REDIS_LOCAL_CACHE_SIZE"), Some("0"));
        let sized = translate(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]));
        let sized = sized.expect("translates");
        assert_eq!(
            value(&sized, "FLOODGATE_REDIS_LOCAL_CACHE_SIZE"),
            Some("8192")
        );
        let refused = translate(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1MB")]));
        assert!(refused.unwrap_err().0.contains("LOCAL_CACHE_SIZE_IN_BYTES"));
    }

    #[test]
    fn upstreams_defaults_listen_everywhere_and_read_the_runtime_directory() {
        let translated = translate(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
        ]))
        .expect("translates");
        assert_eq!(
            value(&translated, "FLOODGATE_HTTP_ADDR"),
            Some("0.0.0.0:8080")
        );
        assert_eq!(
            value(&translated, "FLOODGATE_GRPC_ADDR"),
            Some("0.0.0.0:8081")
        );
        assert_eq!(
            value(&translated, "FLOODGATE_RULES"),
            Some("/srv/runtime_data/current/config")
        );
        assert_eq!(value(&translated, "FLOODGATE_BACKEND"), Some("redis"));
        assert_eq!(
            value(&translated, "FLOODGATE_REDIS_URL"),
            Some("redis://redis:6379")
        );
        assert_eq!(
            value(
                &translated,
                "FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_MS"
            ),
            Some("86400000")
        );
        assert_eq!(translated.log_level, "warn");
        let ipv6 = translate(&env(&[("HOST", "::"), ("GRPC_HOST", "::1")])).expect("translates");
        assert_eq!(value(&ipv6, "FLOODGATE_HTTP_ADDR"), Some("[::]:8080"));
        assert_eq!(value(&ipv6, "FLOODGATE_GRPC_ADDR"), Some("[::1]:8081"));
    }

    #[test]
    fn envoy_gateways_environment_subscribes_over_tls_and_serves_tls() {
        let translated = translate(&env(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("USE_STATSD", "false"),
        ]))
        .expect("translates");
        let expected = [
            ("FLOODGATE_RULES_SOURCE", "xds"),
            ("FLOODGATE_XDS__SERVER_URL", "https://envoy-gateway:18001"),
            ("FLOODGATE_XDS__NODE_ID", "envoy-ratelimit"),
            ("FLOODGATE_XDS__CA_FILE", "/certs/ca.crt"),
            ("FLOODGATE_XDS__CERT_FILE", "/certs/tls.crt"),
            ("FLOODGATE_XDS__START_WITHOUT_INITIAL_CONFIG", "true"),
            ("FLOODGATE_GRPC_TLS__CERT_FILE", "/certs/tls.crt"),
            ("FLOODGATE_GRPC_TLS__CLIENT_CA_FILE", "/certs/ca.crt"),
            ("FLOODGATE_METRICS_ADDR", "0.0.0.0:19001"),
            ("FLOODGATE_XDS__RETRY_INITIAL_MS", "10000"),
        ];
        for (name, want) in expected {
            assert_eq!(value(&translated, name), Some(want), "{name}");
        }
        assert_eq!(value(&translated, "FLOODGATE_STATSD__ADDR"), None);
    }

    #[test]
    fn redis_persecond_is_a_second_redis_read_as_the_first() {
        let off = translate(&env(&[("REDIS_PERSECOND_URL", "fast:6379")])).expect("ok");
        assert_eq!(value(&off, "FLOODGATE_REDIS_PER_SECOND__BACKEND"), None);
        let on = translate(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "sentinel"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "fastprimary,s1:26379,s2:26379"),
            ("REDIS_PERSECOND_AUTH", "user:secret"),
            ("REDIS_PERSECOND_SENTINEL_AUTH", "s3cr@t"),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_TLS_CACERT", "/ca.pem"),
        ]))
        .expect("translates");
        let expected = [
            ("FLOODGATE_REDIS_URL", "redis://main:6379"),
            ("FLOODGATE_REDIS_PER_SECOND__BACKEND", "redis-sentinel"),
            (
                "FLOODGATE_REDIS_PER_SECOND__URL",
                "rediss://:s3cr%40t@s1:26379,rediss://:s3cr%40t@s2:26379",
            ),
            ("FLOODGATE_REDIS_PER_SECOND__SENTINEL_MASTER", "fastprimary"),
            ("FLOODGATE_REDIS_PER_SECOND__USERNAME", "user"),
            ("FLOODGATE_REDIS_PER_SECOND__PASSWORD", "secret"),
            // The TLS files serve both Redis connections, as upstream's.
            ("FLOODGATE_REDIS_TLS_CA_FILE", "/ca.pem"),
        ];
        for (name, expected) in expected {
            assert_eq!(value(&on, name), Some(expected), "{name}");
        }
        let unix = translate(&env(&[("REDIS_PERSECOND", "true")])).expect("translates");
        assert_eq!(
            value(&unix, "FLOODGATE_REDIS_PER_SECOND__URL"),
            Some("redis+unix:///var/run/nutcracker/ratelimitpersecond.sock")
        );
        let refused = translate(&env(&[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "MEMCACHE"),
        ]));
        assert!(refused.unwrap_err().0.contains("REDIS_PERSECOND_TYPE"));
    }

    #[test]
    fn statsd_is_on_by_default_as_upstreams_and_follows_its_variables() {
        let default = translate(&env(&[])).expect("translates");
        assert_eq!(
            value(&default, "FLOODGATE_STATSD__ADDR"),
            Some("localhost:8125")
        );
        assert_eq!(value(&default, "FLOODGATE_STATSD__PROTOCOL"), Some("tcp"));
        assert_eq!(
            value(&default, "FLOODGATE_STATSD__FLUSH_INTERVAL_MS"),
            Some("10000")
        );
        let set = translate(&env(&[
            ("STATSD_HOST", "exporter"),
            ("STATSD_PORT", "9125"),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "2s"),
            ("EXTRA_TAGS", "env:prod"),
        ]))
        .expect("translates");
        assert_eq!(value(&set, "FLOODGATE_STATSD__ADDR"), Some("exporter:9125"));
        assert_eq!(value(&set, "FLOODGATE_STATSD__PROTOCOL"), Some("udp"));
        assert_eq!(
            value(&set, "FLOODGATE_STATSD__FLUSH_INTERVAL_MS"),
            Some("2000")
        );
        assert_eq!(
            value(&set, "FLOODGATE_STATSD__EXTRA_TAGS"),
            Some("env:prod")
        );
        let unsorted = translate(&env(&[("EXTRA_TAGS", "foo:bar,a:b")])).expect("translates");
        assert_eq!(
            value(&unsorted, "FLOODGATE_STATSD__EXTRA_TAGS"),
            Some("a:b,foo:bar"),
            "upstream's client writes tags sorted by key"
        );
        let refused = translate(&env(&[("STATSD_PROTOCOL", "sctp")]));
        assert!(refused.unwrap_err().0.contains("STATSD_PROTOCOL"));
    }

    #[test]
    fn redis_kinds_auth_and_tls_become_urls() {
        let sentinel = translate(&env(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_AUTH", "user:p@ss"),
        ]))
        .expect("translates");
        assert_eq!(
            value(&sentinel, "FLOODGATE_BACKEND"),
            Some("redis-sentinel")
        );
        assert_eq!(
            value(&sentinel, "FLOODGATE_REDIS_URL"),
            Some("redis://s1:26379,redis://s2:26379")
        );
        assert_eq!(
            value(&sentinel, "FLOODGATE_REDIS_SENTINEL_MASTER"),
            Some("mymaster")
        );
        assert_eq!(value(&sentinel, "FLOODGATE_REDIS_USERNAME"), Some("user"));
        assert_eq!(value(&sentinel, "FLOODGATE_REDIS_PASSWORD"), Some("p@ss"));

        let cluster = translate(&env(&[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "a:6379,b:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ]))
        .expect("translates");
        assert_eq!(
            value(&cluster, "FLOODGATE_REDIS_URL"),
            Some("rediss://a:6379/#insecure,rediss://b:6379/#insecure")
        );
        let unix = translate(&env(&[])).expect("upstream's default socket");
        assert_eq!(
            value(&unix, "FLOODGATE_REDIS_URL"),
            Some("redis+unix:///var/run/nutcracker/ratelimit.sock")
        );
    }

    #[test]
    fn what_cannot_be_served_is_an_error_naming_the_variable() {
        for (pairs, names) in [
            (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE"),
            (vec![("CONFIG_TYPE", "GRPC_XDS_DELTA")], "CONFIG_TYPE"),
            (vec![("SHADOW_MODE", "maybe")], "SHADOW_MODE"),
            (vec![("QUOTA_MODE", "maybe")], "QUOTA_MODE"),
            (
                vec![("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "maybe")],
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
            ),
            (
                vec![("GRPC_MAX_CONNECTION_AGE", "a day")],
                "GRPC_MAX_CONNECTION_AGE",
            ),
        ] {
            let error = translate(&env(&pairs)).expect_err("refused").to_string();
            assert!(error.contains(names), "{error}");
        }
    }

    #[test]
    fn go_durations_read_as_go_reads_them() {
        let cases = [
            ("24h", 86_400_000),
            ("1h30m", 5_400_000),
            ("1.5s", 1_500),
            ("500ms", 500),
            ("0", 0),
            ("3s", 3_000),
        ];
        for (text, millis) in cases {
            assert_eq!(
                go_duration(text).map(|d| d.as_millis()),
                Some(millis),
                "{text}"
            );
        }
        for bad in ["", "1", "h", "1d", "-1s", "1h-"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn dogstatsd_takes_each_named_mogrifier_and_refuses_one_without_a_pattern() {
        let translated = translate(&env(&[
            ("USE_DOG_STATSD", "true"),
            ("USE_DOG_STATSD_MOGRIFIERS", "A, B"),
            ("DOG_STATSD_MOGRIFIER_A_PATTERN", "^x\\.(.*)$"),
            ("DOG_STATSD_MOGRIFIER_A_NAME", "y.$1"),
            ("DOG_STATSD_MOGRIFIER_B_PATTERN", "^z$"),
            ("DOG_STATSD_MOGRIFIER_B_NAME", "w"),
            ("DOG_STATSD_MOGRIFIER_B_TAGS", "k:v"),
        ]))
        .expect("translated");
        assert_eq!(
            value(&translated, "FLOODGATE_STATSD__FORMAT"),
            Some("dogstatsd")
        );
        assert_eq!(
            value(&translated, "FLOODGATE_STATSD__PROTOCOL"),
            Some("udp")
        );
        let mogrifiers: serde_json::Value =
            serde_json::from_str(value(&translated, "FLOODGATE_STATSD__MOGRIFIERS").unwrap())
                .unwrap();
        assert_eq!(
            mogrifiers,
            serde_json::json!([
                {"pattern": "^x\\.(.*)$", "name": "y.$1", "tags": ""},
                {"pattern": "^z$", "name": "w", "tags": "k:v"},
            ])
        );
        let missing = translate(&env(&[
            ("USE_DOG_STATSD", "true"),
            ("USE_DOG_STATSD_MOGRIFIERS", "C"),
            ("DOG_STATSD_MOGRIFIER_C_NAME", "w"),
        ]));
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("DOG_STATSD_MOGRIFIER_C_PATTERN is not set")
        );
    }
}
