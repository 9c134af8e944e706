//! Prometheus metrics, served as text on `GET /metrics`.
//!
//! Rule statistics carry envoyproxy/ratelimit's names and labels, as its statsd exporter
//! mapping turns them into Prometheus series
//! (`ratelimit_service_rate_limit_total_hits{domain="api",key1="user_id"}`, …), so dashboards
//! built for it keep working; the rest are floodgate's own (`floodgate_*`).
//!
//! This module reads; the layers count. A rule's [`RuleStats`] are the rules' own (found
//! here once, by series, on the rule's first hit, then kept in the rule), the backend's
//! call figures are its [`BackendStats`](crate::backend::BackendStats), and the request
//! counts below are the service's; every count is a relaxed atomic add of
//! [`crate::instruments`], histograms have fixed buckets, and whatever can be read elsewhere
//! at scrape time (the breaker's state, the over-limit cache's size) is read then.

mod exposition;
mod process;
mod quota;
mod rule_stats;
mod samples;
pub mod statsd;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use exposition::CONTENT_TYPE;
pub use quota::{QuotaStats, ReportRefusal, Strategy};
pub use rule_stats::MAX_REQUEST_LABELLED_SERIES;

use exposition::{Exposition, Kind};
use rule_stats::{RuleRegistry, SeriesLabels};

use crate::backend::{Backend, CacheCounts, MemoryBackend};
use crate::instruments::{Histogram, Tally};
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::rules::{Judged, MetricLevel, Origin, Rule, RuleStats};

/// One of a rule's counts: the name upstream gives it, what `/metrics` says of it, and how
/// it is read.
type RuleCount = (&'static str, &'static str, fn(&RuleStats) -> u64);

/// A rule's counts.
const RULE_COUNTS: [RuleCount; 6] = [
    ("total_hits", "Hits (request cost) on the rule.", |s| {
        s.total_hits.get()
    }),
    ("over_limit", "Hits over the rule's limit.", |s| {
        s.over_limit.get()
    }),
    (
        "near_limit",
        "Hits above near_limit_ratio of the rule's limit.",
        |s| s.near_limit.get(),
    ),
    ("within_limit", "Hits within the rule's limit.", |s| {
        s.within_limit.get()
    }),
    (
        "shadow_mode",
        "Hits of over-limit requests let through by the rule's shadow_mode (each request's whole cost).",
        |s| s.shadow_mode.get(),
    ),
    (
        "over_limit_with_local_cache",
        "Over-limit hits answered by the over-limit cache, without the backend.",
        |s| s.over_limit_with_local_cache.get(),
    ),
];

/// Everything the service counts, one per [`RateLimiter`](crate::service::RateLimiter).
#[derive(Debug)]
pub struct Metrics {
    near_limit_ratio: f64,
    /// `ratelimit_service_response_time_seconds` in milliseconds (upstream's mapping before
    /// its fix), for dashboards built on those values.
    response_time_in_milliseconds: bool,
    rules: RuleRegistry,
    requests: [RequestStats; Endpoint::ALL.len()],
    config_loads: ConfigLoads,
    global_shadow_mode: Tally,
    quota: QuotaStats,
    /// Requests for a domain no rule file names, by that domain (at most
    /// [`MAX_UNKNOWN_DOMAINS`] of them, then [`OTHER_DOMAINS`]).
    domains_not_found: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

/// Unknown domains counted by name beyond this many are counted as [`OTHER_DOMAINS`]: a
/// client that sends a new domain per request must not grow the page (and this process)
/// without bound.
pub const MAX_UNKNOWN_DOMAINS: usize = 1_000;

/// The one `domain` label of the unknown domains not counted by name: those past
/// [`MAX_UNKNOWN_DOMAINS`], and those longer than any domain a rule names (a client's
/// string of any length never becomes a label, so the series are bounded in bytes too: at
/// most 1,000 times the longest domain of the rules).
pub const OTHER_DOMAINS: &str = "__other__";

impl Metrics {
    /// `near_limit_ratio`: the share of a limit above which hits count as near it.
    pub fn new(near_limit_ratio: f64, response_time_in_milliseconds: bool) -> Self {
        Metrics {
            near_limit_ratio,
            response_time_in_milliseconds,
            rules: RuleRegistry::default(),
            requests: Default::default(),
            config_loads: ConfigLoads::default(),
            global_shadow_mode: Tally::default(),
            quota: QuotaStats::default(),
            domains_not_found: Default::default(),
        }
    }

    /// Rule-set loads; the reload path records each attempt here.
    pub fn config_loads(&self) -> &ConfigLoads {
        &self.config_loads
    }

    /// The Rate Limit Quota Service's streams, reports and assignments.
    pub fn quota(&self) -> &QuotaStats {
        &self.quota
    }

    /// The requests served on `endpoint`.
    pub fn requests(&self, endpoint: Endpoint) -> &RequestStats {
        &self.requests[endpoint as usize]
    }

    /// A request for `domain`, which no rule names (upstream's `domain_not_found`), the
    /// longest domain the rules name being `longest_known` bytes: counted by name, or as
    /// [`OTHER_DOMAINS`] when longer than that or past [`MAX_UNKNOWN_DOMAINS`].
    pub fn record_domain_not_found(&self, domain: &str, longest_known: usize) {
        let domain = if domain.len() > longest_known {
            OTHER_DOMAINS
        } else {
            domain
        };
        let mut counts =
            (self.domains_not_found.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = counts.get_mut(domain) {
            *count += 1;
        } else {
            let named = counts.len() - usize::from(counts.contains_key(OTHER_DOMAINS));
            let label = if named < MAX_UNKNOWN_DOMAINS {
                domain
            } else {
                OTHER_DOMAINS
            };
            *counts.entry(label.to_owned()).or_default() += 1;
        }
    }

    /// The unknown domains asked for, and how often.
    fn domains_not_found(&self) -> Vec<(String, u64)> {
        let counts =
            (self.domains_not_found.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        counts
            .iter()
            .map(|(domain, n)| (domain.clone(), *n))
            .collect()
    }

    /// A request that global shadow mode answered OK although it was over limit.
    pub fn record_global_shadow_mode(&self) {
        self.global_shadow_mode.add(1);
    }

    /// Counts one descriptor's `hits` in its rule's statistics (`rule` is `None` for a
    /// request-supplied override). `entries` are the request's, for rules whose metrics carry
    /// request values.
    pub fn record_rule(
        &self,
        domain: &str,
        rule: Option<&Rule>,
        entries: &[Entry],
        hits: u64,
        judged: Judged,
    ) {
        let ratio = self.near_limit_ratio;
        let Some(rule) = rule else {
            // An override is labelled by its own entries, values included, as upstream keys
            // it (`key1_value1.subkey1_something`): never the series of a configured rule.
            let path = (entries.iter())
                .map(|entry| match entry.value.as_str() {
                    "" => entry.key.clone(),
                    value => format!("{}_{value}", entry.key),
                })
                .collect();
            if let Some(stats) = self.rules.request_labelled((domain.to_owned(), path)) {
                stats.record(hits, judged, ratio);
            }
            return;
        };
        let labelled = (rule.metric_levels.iter()).any(|level| labels_value(rule, level));
        if labelled && let Some(stats) = self.request_labelled(domain, rule, entries) {
            stats.record(hits, judged, ratio);
            return;
        }
        let stats = rule
            .stats
            .get_or_init(|| self.rules.rule(configured_labels(domain, rule)));
        stats.record(hits, judged, ratio);
    }

    /// The series of a `detailed_metric` / `value_to_metric` rule for these request values.
    fn request_labelled(
        &self,
        domain: &str,
        rule: &Rule,
        entries: &[Entry],
    ) -> Option<std::sync::Arc<RuleStats>> {
        let path = (rule.metric_levels.iter())
            .zip(entries)
            .map(|(level, entry)| {
                if labels_value(rule, level) && !entry.value.is_empty() {
                    format!("{}_{}", entry.key, entry.value)
                } else {
                    level.segment.clone()
                }
            })
            .collect();
        self.rules.request_labelled((domain.to_owned(), path))
    }

    /// The whole page: these counts, the backend's and those of the counters in memory.
    pub fn render(&self, origin: &Origin, backend: &Backend, memory: &MemoryBackend) -> String {
        let mut page = Exposition::default();
        render_build(&mut page);
        render_origin(&mut page, origin);
        self.render_rules(&mut page);
        self.render_service(&mut page);
        self.quota.render(&mut page);
        render_backend(&mut page, backend);
        render_memory(&mut page, memory);
        process::render(&mut page);
        page.finish()
    }

    fn render_rules(&self, page: &mut Exposition) {
        let series = self.rules.all();
        let label_names: Vec<String> =
            (1..=series.iter().map(|((_, p), _)| p.len()).max().unwrap_or(0))
                .map(|level| format!("key{level}"))
                .collect();
        for (suffix, help, read) in RULE_COUNTS {
            let name = format!("ratelimit_service_rate_limit_{suffix}");
            page.family(&name, Kind::Counter, help);
            for ((domain, path), stats) in &series {
                let mut labels = vec![("domain", domain.as_str())];
                labels.extend(
                    (label_names.iter().map(String::as_str)).zip(path.iter().map(String::as_str)),
                );
                page.sample(&name, &labels, read(stats));
            }
        }
    }

    /// Requests answered with an error, as upstream counts them: `redis_error` when the
    /// backend failed them (UNAVAILABLE), `service_error` when they were malformed.
    fn errors(&self) -> [(&'static str, u64); 2] {
        [
            ("redis_error", Code::Unavailable),
            ("service_error", Code::InvalidArgument),
        ]
        .map(|(err_type, code)| {
            let mut count: u64 = (Endpoint::ALL.iter())
                .map(|&endpoint| self.requests(endpoint).codes[code as usize].get())
                .sum();
            if code == Code::InvalidArgument {
                count += UNDECODABLE.load(Ordering::Relaxed);
            }
            (err_type, count)
        })
    }

    /// Every count upstream sends to statsd, under its statsd name, as a total since start
    /// (`statsd.rs` sends what changed): each rule's six counts
    /// (`ratelimit.service.rate_limit.<domain>.<key path>.<count>`), the rule loads, the
    /// requests answered with an error, and the gRPC requests served.
    fn statsd_totals(&self) -> Vec<(String, u64)> {
        let mut totals = Vec::new();
        for ((domain, path), stats) in self.rules.all() {
            let base = format!("ratelimit.service.rate_limit.{domain}.{}", path.join("."));
            for (count, _, read) in RULE_COUNTS {
                totals.push((format!("{base}.{count}"), read(&stats)));
            }
        }
        let service = [
            ("config_load_success", self.config_loads.success.get()),
            ("config_load_error", self.config_loads.error.get()),
            ("global_shadow_mode", self.global_shadow_mode.get()),
        ];
        for (name, value) in service {
            totals.push((format!("ratelimit.service.{name}"), value));
        }
        for (err_type, count) in self.errors() {
            totals.push((
                format!("ratelimit.service.call.should_rate_limit.{err_type}"),
                count,
            ));
        }
        for (domain, count) in self.domains_not_found() {
            let name = format!("ratelimit.service.rate_limit.{domain}.domain_not_found");
            totals.push((name, count));
        }
        let grpc = self.requests(Endpoint::GrpcShouldRateLimit);
        let served =
            (grpc.codes.iter()).map(Tally::get).sum::<u64>() + UNDECODABLE.load(Ordering::Relaxed);
        totals.push((
            "ratelimit_server.ShouldRateLimit.total_requests".into(),
            served,
        ));
        totals
    }

    /// What goes to statsd at one flush: the counts (`statsd_totals`); the
    /// over-limit cache's counts as upstream's `ratelimit.localcache.*` gauges, when there
    /// is an enabled cache; and the ShouldRateLimit response times since the last flush, in
    /// µs, as upstream's client sends its `response_time` timer (µs under `|ms`).
    pub fn statsd_report(&self, local_cache: Option<CacheCounts>) -> statsd::Report {
        let gauges = local_cache.map_or_else(Vec::new, |counts| {
            [
                ("evacuateCount", counts.evacuated),
                ("expiredCount", counts.expired),
                ("entryCount", counts.entries),
                ("averageAccessTime", counts.average_access_time),
                ("hitCount", counts.hits),
                ("missCount", counts.misses),
                ("lookupCount", counts.lookups),
                ("overwriteCount", counts.overwrites),
            ]
            .into_iter()
            .map(|(name, value)| (format!("ratelimit.localcache.{name}"), value))
            .collect()
        });
        let times = self.requests(Endpoint::GrpcShouldRateLimit).times.take();
        statsd::Report {
            counters: self.statsd_totals(),
            gauges,
            timers: vec![statsd::Timer {
                name: "ratelimit_server.ShouldRateLimit.response_time".into(),
                values: times.kept,
                recorded: times.recorded,
            }],
        }
    }

    /// The service's families: rule loads, global shadow mode, unknown domains, then the
    /// requests and their durations.
    fn render_service(&self, page: &mut Exposition) {
        let counters = [
            (
                "ratelimit_service_config_load_success",
                "Rule sets loaded (the one at start-up and every reload that took effect).",
                self.config_loads.success.get(),
            ),
            (
                "ratelimit_service_config_load_error",
                "Rule loads that failed (the rules in force stayed).",
                self.config_loads.error.get(),
            ),
            (
                "ratelimit_service_global_shadow_mode",
                "Over-limit requests that global shadow mode answered OK.",
                self.global_shadow_mode.get(),
            ),
        ];
        for (name, help, value) in counters {
            page.family(name, Kind::Counter, help);
            page.sample(name, &[], value);
        }
        let name = "ratelimit_service_rate_limit_domain_not_found";
        let help = "Requests for a domain no rule names, by domain: the first 1,000 domains no \
                    longer than the longest a rule names; the others as __other__.";
        page.family(name, Kind::Counter, help);
        for (domain, count) in self.domains_not_found() {
            page.sample(name, &[("domain", domain.as_str())], count);
        }
        self.render_requests(page);
        self.render_durations(page);
    }

    /// The requests served, by answer, and those answered with an error, by kind.
    fn render_requests(&self, page: &mut Exposition) {
        let name = "floodgate_requests_total";
        page.family(
            name,
            Kind::Counter,
            "Rate-limit requests served, by answer.",
        );
        for endpoint in Endpoint::ALL {
            let stats = self.requests(endpoint);
            for code in Code::ALL {
                let labels = [
                    ("protocol", endpoint.protocol()),
                    ("method", endpoint.method()),
                    ("code", code.name()),
                ];
                let mut count = stats.codes[code as usize].get();
                if (endpoint, code) == (Endpoint::GrpcShouldRateLimit, Code::InvalidArgument) {
                    count += UNDECODABLE.load(Ordering::Relaxed);
                }
                page.sample(name, &labels, count);
            }
        }
        // envoyproxy/ratelimit's series for requests that got no decision: `redis_error` when
        // the backend failed them (UNAVAILABLE), `service_error` when they were malformed.
        let name = "ratelimit_service_should_rate_limit_error";
        let help = "Rate-limit requests answered with an error, by err_type: redis_error (the \
                    backend failed and the rule left the answer to the caller) or service_error \
                    (a malformed request).";
        page.family(name, Kind::Counter, help);
        for (err_type, count) in self.errors() {
            page.sample(name, &[("err_type", err_type)], count);
        }
    }

    /// How long requests took: floodgate's histogram, and upstream's for ShouldRateLimit.
    fn render_durations(&self, page: &mut Exposition) {
        let name = "floodgate_request_duration_seconds";
        let help = "Time to answer a rate-limit request, from its decoding to its encoding.";
        page.family(name, Kind::Histogram, help);
        for endpoint in Endpoint::ALL {
            let labels = [
                ("protocol", endpoint.protocol()),
                ("method", endpoint.method()),
            ];
            page.histogram(name, &labels, &self.requests(endpoint).duration.snapshot());
        }

        // Upstream's statsd mapping turns its `ratelimit_server.<method>.response_time`
        // timer into this family: the same observations as ShouldRateLimit's above.
        let name = "ratelimit_service_response_time_seconds";
        let (help, scale) = if self.response_time_in_milliseconds {
            (
                "Time to answer a ShouldRateLimit call, in milliseconds despite the name \
                 (metrics_response_time_in_milliseconds, as upstream's mapping once wrote it).",
                1_000,
            )
        } else {
            ("Time to answer a ShouldRateLimit call.", 1)
        };
        page.family(name, Kind::Histogram, help);
        let duration = &self.requests(Endpoint::GrpcShouldRateLimit).duration;
        page.histogram_scaled(
            name,
            &[("grpc_method", "ShouldRateLimit")],
            &duration.snapshot(),
            scale,
        );
    }
}

/// What is running: a series that is always 1, labelled with the version and the commit.
fn render_build(page: &mut Exposition) {
    let name = "floodgate_build_info";
    page.family(
        name,
        Kind::Gauge,
        "The running build: its version and commit.",
    );
    let labels = [("version", crate::VERSION), ("commit", crate::COMMIT)];
    page.sample(name, &labels, 1u8);
}

/// Where the rules in force came from: a series that is always 1, labelled.
fn render_origin(page: &mut Exposition, origin: &Origin) {
    let name = "floodgate_rules_info";
    let help = "The rules in force: their source (files or xds) and, from xds, the server and \
                the snapshot's version (empty before the first snapshot).";
    page.family(name, Kind::Gauge, help);
    let (server, version) = match origin {
        Origin::Files => ("", ""),
        Origin::Xds { server, version } => (server.as_str(), version.as_str()),
        Origin::AwaitingXds { server } => (server.as_str(), ""),
    };
    let labels = [
        ("source", origin.source()),
        ("server", server),
        ("version", version),
    ];
    page.sample(name, &labels, 1u64);
}

fn render_backend(page: &mut Exposition, backend: &Backend) {
    let stats = backend.stats();
    let name = "floodgate_backend_call_duration_seconds";
    let help = "Time of one request's exchange with the remote backend (Redis); none on memory.";
    page.family(name, Kind::Histogram, help);
    page.histogram(name, &[], &stats.calls().snapshot());

    let name = "floodgate_backend_errors_total";
    let help = "Remote backend calls that failed, by kind (circuit_open: refused by the open \
                circuit breaker without a call; too_far: refused without a call, Redis' \
                quickest round trip being above redis_command_timeout_ms).";
    page.family(name, Kind::Counter, help);
    for (kind, count) in stats.errors() {
        page.sample(name, &[("kind", kind)], count);
    }

    let name = "floodgate_backend_shed_total";
    let help = "Requests shed without a backend call, answered at once by their rules' \
                on_backend_error, because the backend already had as much work in flight as \
                it answers in time.";
    page.family(name, Kind::Counter, help);
    page.sample(name, &[], stats.shed());

    let name = "floodgate_backend_circuit_open";
    let help = "1 while the remote backend's circuit breaker is open, else 0.";
    page.family(name, Kind::Gauge, help);
    page.sample(name, &[], u8::from(backend.circuit_open()));

    if let Some(round_trip) = backend.round_trip() {
        let name = "floodgate_redis_round_trip_seconds";
        let help = "The quickest round trip to Redis lately (of the connection where it is \
                    longest). Above redis_command_timeout_ms Redis is too far to call: every \
                    request is answered by its rules' on_backend_error at once \
                    (floodgate_backend_errors_total{kind=\"too_far\"}).";
        page.family(name, Kind::Gauge, help);
        page.sample(name, &[], round_trip.as_secs_f64());
    }

    let name = "floodgate_over_limit_cache_entries";
    let help = "Exhausted counters remembered by the over-limit cache.";
    page.family(name, Kind::Gauge, help);
    page.sample(name, &[], backend.over_limit_cache_len());

    let leases = backend.lease_counts();
    let name = "floodgate_leased_counters";
    let help = "Counters of `lease: true` limits this replica decides from blocks of their \
                quota taken from the shared store.";
    page.family(name, Kind::Gauge, help);
    page.sample(name, &[], leases.counters);
    let name = "floodgate_lease_held";
    let help = "Quota this replica's blocks hold unspent: taken out of the shared counts, \
                lost to the other replicas until spent, given back (idle a second) or their \
                window ends.";
    page.family(name, Kind::Gauge, help);
    page.sample(name, &[], leases.held);
    let name = "floodgate_lease_decisions_total";
    let help = "Hits of leased counters decided here without the store: allowed from a block, \
                or refused while the shared count had nothing left.";
    page.family(name, Kind::Counter, help);
    page.sample(name, &[], leases.decided);
    let name = "floodgate_lease_blocks_total";
    let help = "Blocks of quota taken from the shared store.";
    page.family(name, Kind::Counter, help);
    page.sample(name, &[], leases.takes);
}

fn render_memory(page: &mut Exposition, memory: &MemoryBackend) {
    let name = "floodgate_memory_counters";
    let help = "Counters held in process memory (the memory backend's, or the local failure \
                policy's), at most about memory_max_counters.";
    page.family(name, Kind::Gauge, help);
    page.sample(name, &[], memory.len());

    let name = "floodgate_memory_counters_evicted_total";
    let help = "Live counters dropped to make room for new ones once memory_max_counters was \
                reached; each starts over if hit again. Above zero, raise the setting.";
    page.family(name, Kind::Counter, help);
    page.sample(name, &[], memory.evicted());
}

/// The labels of a configured rule's series: its domain and its path's segments.
/// Whether `level` of `rule` is labelled with the request's value rather than the rule's
/// segment: under `detailed_metric` or `value_to_metric`, unless the level shares its
/// counter (`share_threshold`), whose series is the pattern's.
fn labels_value(rule: &Rule, level: &MetricLevel) -> bool {
    (rule.detailed_metric || level.value_to_metric) && !level.shared
}

fn configured_labels(domain: &str, rule: &Rule) -> SeriesLabels {
    let path = (rule.metric_levels.iter())
        .map(|level| level.segment.clone())
        .collect();
    (domain.to_owned(), path)
}

/// Rule-set loads that succeeded and failed (`ratelimit_service_config_load_*`).
#[derive(Debug, Default)]
pub struct ConfigLoads {
    success: Tally,
    error: Tally,
}

impl ConfigLoads {
    /// Counts one load of the rules: `success` when the loaded rules took effect.
    pub fn record(&self, success: bool) {
        if success {
            self.success.add(1);
        } else {
            self.error.add(1);
        }
    }
}

/// gRPC rate-limit requests of this process whose message did not decode: they never reach
/// a handler, so the codec (`edge::codec`) counts them here, and they show as
/// `INVALID_ARGUMENT`. The generated code builds codecs with `Default::default()`, which leaves
/// no way to hand one a per-service counter: this one is process-wide.
static UNDECODABLE: AtomicU64 = AtomicU64::new(0);

/// Counts a gRPC `ShouldRateLimit` request whose message did not decode.
pub fn record_undecodable() {
    UNDECODABLE.fetch_add(1, Ordering::Relaxed);
}

/// Where rate-limit requests come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// gRPC `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
    GrpcShouldRateLimit,
    /// HTTP `POST /json`.
    HttpJson,
}

impl Endpoint {
    const ALL: [Endpoint; 2] = [Endpoint::GrpcShouldRateLimit, Endpoint::HttpJson];

    fn protocol(self) -> &'static str {
        match self {
            Endpoint::GrpcShouldRateLimit => "grpc",
            Endpoint::HttpJson => "http",
        }
    }

    fn method(self) -> &'static str {
        match self {
            Endpoint::GrpcShouldRateLimit => "ShouldRateLimit",
            Endpoint::HttpJson => "/json",
        }
    }
}

/// How a rate-limit request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
    /// Rejected as malformed (gRPC INVALID_ARGUMENT, HTTP 400).
    InvalidArgument,
    /// The backend failed and the rule left the answer to the caller (gRPC UNAVAILABLE,
    /// HTTP 503).
    Unavailable,
    /// The caller's deadline had passed when floodgate got to the request: refused without
    /// any work (gRPC DEADLINE_EXCEEDED).
    DeadlineExceeded,
}

impl Code {
    const ALL: [Code; 5] = [
        Code::Ok,
        Code::OverLimit,
        Code::InvalidArgument,
        Code::Unavailable,
        Code::DeadlineExceeded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::Unavailable => "UNAVAILABLE",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        }
    }
}

/// One endpoint's requests: how many got each answer, and how long they took (and, for a
/// statsd timer, a sample of those times in µs).
#[derive(Debug, Default)]
pub struct RequestStats {
    codes: [Tally; Code::ALL.len()],
    duration: Histogram,
    times: samples::Samples,
}

impl RequestStats {
    pub fn record(&self, code: Code, elapsed: Duration) {
        self.codes[code as usize].add(1);
        self.duration.observe(elapsed);
        self.times
            .record(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_domains_past_the_cap_or_longer_than_the_rules_are_counted_as_one() {
        let metrics = Metrics::new(0.8, false);
        metrics.record_domain_not_found(&"x".repeat(100_000), 8);
        metrics.record_domain_not_found("shop", 8);
        for domain in 0..MAX_UNKNOWN_DOMAINS + 5 {
            metrics.record_domain_not_found(&format!("d{domain}"), 8);
        }
        let counts = metrics.domains_not_found();
        assert_eq!(counts.len(), MAX_UNKNOWN_DOMAINS + 1);
        let other = counts.iter().find(|(domain, _)| domain == OTHER_DOMAINS);
        // The long one, and the six domains past the cap ("shop" took a place).
        assert_eq!(other.map(|(_, count)| *count), Some(7));
        let longest = counts.iter().map(|(domain, _)| domain.len()).max();
        assert_eq!(longest, Some(OTHER_DOMAINS.len()));
    }
}
