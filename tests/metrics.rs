//! `GET /metrics` end to end: known traffic over real gRPC against the real binary, then the
//! page parsed as Prometheus text and every count checked exactly.

mod harness;
mod redis_harness;

use std::collections::{BTreeMap, BTreeSet};

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use harness::statsd::StatsdServer;
use harness::{Floodgate, OK, OVER_LIMIT, POLICIES, costing, descriptor, request};
use redis_harness::RedisServer;

const RULES: &str = r#"
domain: shop
descriptors:
  - key: user_id
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: plan
    value: free
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: tenant
    descriptors:
      - key: path
        detailed_metric: true
        rate_limit: {unit: day, requests_per_unit: 10}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: day, requests_per_unit: 100}
"#;

/// One sample's labels, sorted by name.
type Labels = BTreeMap<String, String>;

/// A parsed page: every sample by name and labels, and every family's declared type.
struct Page {
    samples: BTreeMap<(String, Labels), f64>,
    types: BTreeMap<String, String>,
}

impl Page {
    /// Parses the text format, checking that each family is declared (HELP, then TYPE)
    /// before its samples and that no sample appears twice.
    fn parse(text: &str) -> Page {
        let mut samples = BTreeMap::new();
        let mut types = BTreeMap::new();
        let mut helped = BTreeSet::new();
        for line in text.lines() {
            if let Some(help) = line.strip_prefix("# HELP ") {
                let (name, _) = help.split_once(' ').expect("HELP name text");
                helped.insert(name.to_owned());
                continue;
            }
            if let Some(declared) = line.strip_prefix("# TYPE ") {
                let (name, kind) = declared.split_once(' ').expect("TYPE name kind");
                assert!(helped.contains(name), "TYPE before HELP: {line}");
                assert!(types.insert(name.to_owned(), kind.to_owned()).is_none());
                continue;
            }
            let (name, labels, value) = parse_sample(line);
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = name.strip_suffix(suffix)?;
                    (types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
                })
                .unwrap_or(&name);
            assert!(types.contains_key(family), "sample before its TYPE: {line}");
            let duplicate = samples.insert((name.clone(), labels), value);
            assert!(duplicate.is_none(), "sample twice: {line}");
        }
        Page { samples, types }
    }

    /// The sample `name{labels}`; panics when absent.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let key = (name.to_owned(), labels_of(labels));
        *self
            .samples
            .get(&key)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}; page has {:#?}", self.names()))
    }

    /// Every label set of `name`.
    fn series(&self, name: &str) -> Vec<Labels> {
        (self.samples.keys())
            .filter(|(n, _)| n == name)
            .map(|(_, labels)| labels.clone())
            .collect()
    }

    fn names(&self) -> BTreeSet<&str> {
        self.samples.keys().map(|(name, _)| name.as_str()).collect()
    }
}

fn labels_of(labels: &[(&str, &str)]) -> Labels {
    (labels.iter())
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// `name{a="x",b="y"} value`, unescaping label values (`\\`, `\"`, `\n`).
fn parse_sample(line: &str) -> (String, Labels, f64) {
    let (name, rest) = match line.find('{') {
        Some(brace) => (&line[..brace], &line[brace + 1..]),
        None => {
            let (name, value) = line.split_once(' ').expect("name value");
            return (
                name.to_owned(),
                Labels::new(),
                value.parse().expect("value"),
            );
        }
    };
    let mut labels = Labels::new();
    let mut chars = rest.chars();
    loop {
        let label: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(
            chars.next(),
            Some('"'),
            "label value opens with a quote: {line}"
        );
        let mut value = String::new();
        loop {
            match chars.next().expect("label value closes") {
                '"' => break,
                '\\' => match chars.next() {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => panic!("bad escape {other:?} in {line}"),
                },
                c => value.push(c),
            }
        }
        labels.insert(label, value);
        match chars.next() {
            Some(',') => continue,
            Some('}') => break,
            other => panic!("unexpected {other:?} in {line}"),
        }
    }
    let value = chars.as_str().trim_start_matches(' ');
    (name.to_owned(), labels, value.parse().expect("value"))
}

async fn scrape(server: &Floodgate) -> Page {
    let (status, body) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200, "{body}");
    Page::parse(&body)
}

const RULE_FAMILIES: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "over_limit_with_local_cache",
];

/// The six rule counters of one series, in [`RULE_FAMILIES`] order.
fn rule_counts(page: &Page, labels: &[(&str, &str)]) -> [u64; 6] {
    RULE_FAMILIES
        .map(|family| page.get(&format!("ratelimit_service_rate_limit_{family}"), labels) as u64)
}

/// Sends `req` `times` times; the overall codes.
async fn send(server: &Floodgate, req: &RateLimitRequest, times: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..times {
        let response = client
            .should_rate_limit(req.clone())
            .await
            .expect("decision");
        codes.push(response.get_ref().overall_code);
    }
    codes
}

#[tokio::test]
async fn seven_hits_on_a_limit_of_five_count_within_near_and_over() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    let alice = request("shop", vec![descriptor(&[("user_id", "alice")])]);
    let codes = send(&server, &alice, 7).await;
    assert_eq!(codes, [OK, OK, OK, OK, OK, OVER_LIMIT, OVER_LIMIT]);
    let page = scrape(&server).await;
    let user = [("domain", "shop"), ("key1", "user_id")];
    // Near-limit threshold 0.8 × 5 = 4: the fifth hit (count 4 → 5) is the one near.
    assert_eq!(rule_counts(&page, &user), [7, 2, 1, 5, 0, 0]);
    for family in RULE_FAMILIES {
        let name = format!("ratelimit_service_rate_limit_{family}");
        assert_eq!(page.types[&name], "counter");
    }
}

#[tokio::test]
async fn hits_with_a_cost_split_at_the_near_and_over_thresholds() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    let four = request("shop", vec![costing("user_id", "bob", 4)]);
    let three = request("shop", vec![costing("user_id", "bob", 3)]);
    assert_eq!(send(&server, &four, 1).await, [OK]);
    assert_eq!(send(&server, &three, 1).await, [OVER_LIMIT]);
    let page = scrape(&server).await;
    // 0 → 4 is within and not above the threshold 4; 4 → 7 is rejected: 2 over, 1 near.
    let user = [("domain", "shop"), ("key1", "user_id")];
    assert_eq!(rule_counts(&page, &user), [7, 2, 1, 4, 0, 0]);
}

#[tokio::test]
async fn a_shadow_rule_counts_the_hits_it_let_through() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    let free = request("shop", vec![descriptor(&[("plan", "free")])]);
    assert_eq!(send(&server, &free, 3).await, [OK, OK, OK]);
    let page = scrape(&server).await;
    let plan = [("domain", "shop"), ("key1", "plan_free")];
    // Limit 2, near threshold 1: the second hit is near, the third over and shadowed.
    assert_eq!(rule_counts(&page, &plan), [3, 1, 1, 2, 1, 0]);
    assert_eq!(page.get("ratelimit_service_global_shadow_mode", &[]), 0.0);
}

#[tokio::test]
async fn request_values_label_only_detailed_metric_and_value_to_metric_rules() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    let path = |value: &str| {
        request(
            "shop",
            vec![descriptor(&[("tenant", "acme"), ("path", value)])],
        )
    };
    send(&server, &path("/a"), 2).await;
    send(&server, &path("/q\"x\\y"), 1).await;
    let route = request(
        "shop",
        vec![descriptor(&[("route", "api"), ("method", "GET")])],
    );
    send(&server, &route, 3).await;
    send(
        &server,
        &request("shop", vec![descriptor(&[("user_id", "u1")])]),
        1,
    )
    .await;
    send(
        &server,
        &request("shop", vec![descriptor(&[("user_id", "u2")])]),
        1,
    )
    .await;

    let page = scrape(&server).await;
    let total = "ratelimit_service_rate_limit_total_hits";
    let series: BTreeSet<Labels> = page.series(total).into_iter().collect();
    let expected: BTreeSet<Labels> = [
        labels_of(&[
            ("domain", "shop"),
            ("key1", "tenant_acme"),
            ("key2", "path_/a"),
        ]),
        labels_of(&[
            ("domain", "shop"),
            ("key1", "tenant_acme"),
            ("key2", "path_/q\"x\\y"),
        ]),
        labels_of(&[
            ("domain", "shop"),
            ("key1", "route_api"),
            ("key2", "method"),
        ]),
        labels_of(&[("domain", "shop"), ("key1", "user_id")]),
    ]
    .into_iter()
    .collect();
    assert_eq!(series, expected);
    let value = |labels: &[(&str, &str)]| page.get(total, labels) as u64;
    assert_eq!(
        value(&[
            ("domain", "shop"),
            ("key1", "tenant_acme"),
            ("key2", "path_/a")
        ]),
        2
    );
    assert_eq!(
        value(&[
            ("domain", "shop"),
            ("key1", "tenant_acme"),
            ("key2", "path_/q\"x\\y")
        ]),
        1
    );
    assert_eq!(
        value(&[
            ("domain", "shop"),
            ("key1", "route_api"),
            ("key2", "method")
        ]),
        3
    );
    // Two users, one series: a rule without the options never carries request values.
    assert_eq!(value(&[("domain", "shop"), ("key1", "user_id")]), 2);
}

#[tokio::test]
async fn request_counts_and_latency_cover_every_answer_on_both_transports() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    let alice = request("shop", vec![descriptor(&[("user_id", "alice")])]);
    send(&server, &alice, 7).await;
    // An unknown domain: no limit, and no rule series.
    let unknown = request("nowhere", vec![descriptor(&[("user_id", "alice")])]);
    assert_eq!(send(&server, &unknown, 2).await, [OK, OK]);
    let invalid = server
        .ask_err(request("", vec![descriptor(&[("k", "v")])]))
        .await;
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);
    let body =
        r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user_id","value":"carol"}]}]}"#;
    assert_eq!(server.http("POST", "/json", body).0, 200);
    assert_eq!(server.http("POST", "/json", "not json").0, 400);

    let page = scrape(&server).await;
    let requests = |protocol: &str, method: &str, code: &str| {
        let labels = [("protocol", protocol), ("method", method), ("code", code)];
        page.get("floodgate_requests_total", &labels) as u64
    };
    assert_eq!(requests("grpc", "ShouldRateLimit", "OK"), 7);
    assert_eq!(requests("grpc", "ShouldRateLimit", "OVER_LIMIT"), 2);
    assert_eq!(requests("grpc", "ShouldRateLimit", "INVALID_ARGUMENT"), 1);
    assert_eq!(requests("grpc", "ShouldRateLimit", "UNAVAILABLE"), 0);
    assert_eq!(requests("http", "/json", "OK"), 1);
    assert_eq!(requests("http", "/json", "INVALID_ARGUMENT"), 1);

    let duration = "floodgate_request_duration_seconds";
    assert_eq!(page.types[duration], "histogram");
    let grpc = [("protocol", "grpc"), ("method", "ShouldRateLimit")];
    assert_eq!(page.get(&format!("{duration}_count"), &grpc), 10.0);
    let inf = [grpc[0], grpc[1], ("le", "+Inf")];
    assert_eq!(page.get(&format!("{duration}_bucket"), &inf), 10.0);
    let http = [("protocol", "http"), ("method", "/json")];
    assert_eq!(page.get(&format!("{duration}_count"), &http), 2.0);
    assert!(page.get(&format!("{duration}_sum"), &grpc) > 0.0);

    let domains: BTreeSet<String> = (page.series("ratelimit_service_rate_limit_total_hits"))
        .into_iter()
        .map(|labels| labels["domain"].clone())
        .collect();
    assert_eq!(domains, BTreeSet::from(["shop".to_owned()]));
    assert_eq!(page.get("ratelimit_service_config_load_success", &[]), 1.0);
    assert_eq!(page.get("ratelimit_service_config_load_error", &[]), 0.0);
    // The memory backend makes no remote calls and has no breaker or cache.
    assert_eq!(
        page.get("floodgate_backend_call_duration_seconds_count", &[]),
        0.0
    );
    assert_eq!(page.get("floodgate_backend_circuit_open", &[]), 0.0);
    assert_eq!(page.get("floodgate_over_limit_cache_entries", &[]), 0.0);
}

#[tokio::test]
async fn global_shadow_mode_counts_the_requests_it_let_through() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &["--shadow-mode"]);
    let alice = request("shop", vec![descriptor(&[("user_id", "alice")])]);
    assert_eq!(send(&server, &alice, 7).await, [OK; 7]);
    let page = scrape(&server).await;
    assert_eq!(page.get("ratelimit_service_global_shadow_mode", &[]), 2.0);
    let user = [("domain", "shop"), ("key1", "user_id")];
    // The rule is not in shadow mode itself: its rejections are over_limit, not shadow_mode.
    assert_eq!(rule_counts(&page, &user), [7, 2, 1, 5, 0, 0]);
}

#[tokio::test]
async fn a_dead_redis_shows_in_backend_errors_and_the_breaker_gauge() {
    // A Redis that answered at start, then died (one dead at start opens the breaker at
    // once: `tests/readiness.rs`).
    let redis = RedisServer::start();
    let server = Floodgate::start_with_env(
        &[("policies.yaml", POLICIES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        // No probe during the test: the breaker stays open once it opened.
        &[
            ("FLOODGATE_REDIS_BREAKER_COOLDOWN_MS", "600000"),
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000"),
        ],
    );
    drop(redis);
    let open = request("policy", vec![descriptor(&[("open_rule", "x")])]);
    // Five failed calls open the breaker (redis_breaker_failures = 5); the sixth is refused.
    assert_eq!(send(&server, &open, 6).await, [OK; 6]);
    let error = request("policy", vec![descriptor(&[("error_rule", "x")])]);
    assert_eq!(server.ask_err(error).await.code(), tonic::Code::Unavailable);

    let page = scrape(&server).await;
    let errors = |kind: &str| page.get("floodgate_backend_errors_total", &[("kind", kind)]) as u64;
    assert_eq!(errors("unavailable"), 5);
    assert_eq!(errors("timeout"), 0);
    assert_eq!(errors("protocol"), 0);
    assert_eq!(errors("circuit_open"), 2);
    assert_eq!(
        page.get("floodgate_backend_call_duration_seconds_count", &[]),
        5.0
    );
    assert_eq!(page.get("floodgate_backend_circuit_open", &[]), 1.0);
    // fail_open answers are no counter's decision: hits, and nothing else.
    let rule = [("domain", "policy"), ("key1", "open_rule")];
    assert_eq!(rule_counts(&page, &rule), [6, 0, 0, 0, 0, 0]);
    let requests = |code: &str| {
        let labels = [
            ("protocol", "grpc"),
            ("method", "ShouldRateLimit"),
            ("code", code),
        ];
        page.get("floodgate_requests_total", &labels) as u64
    };
    assert_eq!((requests("OK"), requests("UNAVAILABLE")), (6, 1));
    // Upstream's series for the same failure.
    let upstream = |err_type: &str| {
        page.get(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", err_type)],
        ) as u64
    };
    assert_eq!((upstream("redis_error"), upstream("service_error")), (1, 0));
}

#[tokio::test]
async fn a_malformed_request_counts_as_upstreams_service_error() {
    let server = Floodgate::start(&[("policies.yaml", POLICIES)], &[]);
    let empty_domain = request("", vec![descriptor(&[("open_rule", "x")])]);
    assert_eq!(
        server.ask_err(empty_domain).await.code(),
        tonic::Code::InvalidArgument
    );
    let page = scrape(&server).await;
    let labels = [("err_type", "service_error")];
    assert_eq!(
        page.get("ratelimit_service_should_rate_limit_error", &labels),
        1.0
    );
}

#[tokio::test]
async fn the_build_and_the_process_are_on_the_page() {
    let server = Floodgate::start(&[("policies.yaml", POLICIES)], &[]);
    let page = scrape(&server).await;
    let (version, commit) = harness::built_version();
    let build = [("version", version.as_str()), ("commit", commit.as_str())];
    assert_eq!(page.get("floodgate_build_info", &build), 1.0);
    assert!(page.get("process_resident_memory_bytes", &[]) > 1e6);
    assert!(page.get("process_open_fds", &[]) >= 3.0);
    assert!(page.get("process_max_fds", &[]) >= page.get("process_open_fds", &[]));
    // Counted in clock ticks (10 ms): a process just started may not have used one yet.
    assert!(page.get("process_cpu_seconds_total", &[]) >= 0.0);
    let started = page.get("process_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "{started} vs {now}"
    );
}

#[tokio::test]
async fn the_latency_buckets_start_at_one_microsecond_and_count_every_decision() {
    let server = Floodgate::start(&[("policies.yaml", POLICIES)], &[]);
    let open = request("policy", vec![descriptor(&[("open_rule", "x")])]);
    send(&server, &open, 20).await;
    let page = scrape(&server).await;
    let labels = |le: &'static str| {
        [
            ("protocol", "grpc"),
            ("method", "ShouldRateLimit"),
            ("le", le),
        ]
    };
    let name = "floodgate_request_duration_seconds_bucket";
    assert_eq!(page.get(name, &labels("+Inf")), 20.0);
    // The series' first bucket is 1 µs.
    let (_, text) = server.http("GET", "/metrics", "");
    let series = format!("{name}{{protocol=\"grpc\",method=\"ShouldRateLimit\",le=");
    let first = text.lines().find(|line| line.starts_with(&series));
    assert!(
        first.is_some_and(|line| line.contains("le=\"0.000001\"")),
        "{first:?}"
    );
}

#[tokio::test]
async fn exhausted_counters_answered_by_the_local_cache_count_as_such() {
    let redis = RedisServer::start();
    let rules = "
domain: cache
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 2}
";
    let server = Floodgate::start_with_env(
        &[("cache.yaml", rules)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
    );
    let hammer = request("cache", vec![descriptor(&[("client", "abuser")])]);
    let codes = send(&server, &hammer, 5).await;
    assert_eq!(codes, [OK, OK, OVER_LIMIT, OVER_LIMIT, OVER_LIMIT]);

    let page = scrape(&server).await;
    let rule = [("domain", "cache"), ("key1", "client")];
    // Redis answers three (the third exhausts the counter); the cache the last two.
    assert_eq!(rule_counts(&page, &rule), [5, 3, 1, 2, 0, 2]);
    assert_eq!(page.get("floodgate_over_limit_cache_entries", &[]), 1.0);
    assert_eq!(
        page.get("floodgate_backend_call_duration_seconds_count", &[]),
        3.0
    );
    assert_eq!(page.get("floodgate_backend_circuit_open", &[]), 0.0);
}

#[tokio::test]
async fn counters_past_memory_max_counters_evict_and_say_so() {
    let server = Floodgate::start_with_env(
        &[("shop.yaml", RULES)],
        &[],
        &[("FLOODGATE_MEMORY_MAX_COUNTERS", "64")],
    );
    let page = scrape(&server).await;
    assert_eq!(page.types["floodgate_memory_counters"], "gauge");
    assert_eq!(page.get("floodgate_memory_counters", &[]), 0.0);
    for i in 0..500 {
        let user = request("shop", vec![descriptor(&[("user_id", &format!("u{i}"))])]);
        assert_eq!(send(&server, &user, 1).await, [OK]);
    }
    let page = scrape(&server).await;
    // At most about the bound: 64, rounded up to a multiple of the shard count.
    let held = page.get("floodgate_memory_counters", &[]);
    assert!((1.0..=256.0).contains(&held), "{held} counters");
    let evicted = page.get("floodgate_memory_counters_evicted_total", &[]);
    assert_eq!(
        held + evicted,
        500.0,
        "every counter is held or was evicted"
    );
    // The newest counter is held: its second hit sees the first.
    let last = request("shop", vec![costing("user_id", "u499", 0)]);
    let mut client = server.client().await;
    let response = client.should_rate_limit(last).await.expect("decision");
    assert_eq!(response.get_ref().statuses[0].limit_remaining, 4);
}

/// A wildcard with `share_threshold` is one series under its pattern, as upstream labels it:
/// the pattern wins over `value_to_metric` on its level and over a child's
/// `detailed_metric` there (the child's own level still carries its value).
#[tokio::test]
async fn a_shared_wildcard_is_one_series_under_its_pattern() {
    const SHARED: &str = r#"
domain: shared
descriptors:
  - key: route
    value: "api/*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: "svc/*"
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"#;
    let server = Floodgate::start(&[("shared.yaml", SHARED)], &[]);
    for route in ["api/v1", "api/v2"] {
        let ask = request(
            "shared",
            vec![descriptor(&[("route", route), ("method", "GET")])],
        );
        send(&server, &ask, 1).await;
    }
    for service in ["svc/user", "svc/order"] {
        let ask = request(
            "shared",
            vec![descriptor(&[("service", service), ("endpoint", "get")])],
        );
        send(&server, &ask, 1).await;
    }
    let page = scrape(&server).await;
    let total = "ratelimit_service_rate_limit_total_hits";
    let series: BTreeSet<Labels> = page.series(total).into_iter().collect();
    let route = [
        ("domain", "shared"),
        ("key1", "route_api/*"),
        ("key2", "method"),
    ];
    let service = [
        ("domain", "shared"),
        ("key1", "service_svc/*"),
        ("key2", "endpoint_get"),
    ];
    let expected: BTreeSet<Labels> = [labels_of(&route), labels_of(&service)].into();
    assert_eq!(series, expected);
    assert_eq!(page.get(total, &route) as u64, 2);
    assert_eq!(page.get(total, &service) as u64, 2);
}

/// A request's limit override is labelled by its own entries, values included, as upstream
/// keys it, and never counts in the series of a configured rule on the same keys.
#[tokio::test]
async fn an_override_is_labelled_by_its_entries_and_values() {
    use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use floodgate::proto::envoy::r#type::v3::RateLimitUnit;

    const CONFIGURED: &str = "
domain: ov
descriptors:
  - key: key1
    descriptors:
      - key: subkey1
        rate_limit: {unit: minute, requests_per_unit: 60}
";
    let server = Floodgate::start(&[("ov.yaml", CONFIGURED)], &[]);
    let configured = request(
        "ov",
        vec![descriptor(&[("key1", "value1"), ("subkey1", "x")])],
    );
    send(&server, &configured, 1).await;
    let mut overridden = request(
        "ov",
        vec![descriptor(&[("key1", "value1"), ("subkey1", "something")])],
    );
    overridden.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: RateLimitUnit::Minute as i32,
        unit_multiplier: None,
    });
    send(&server, &overridden, 2).await;

    let page = scrape(&server).await;
    let total = "ratelimit_service_rate_limit_total_hits";
    let rule = [("domain", "ov"), ("key1", "key1"), ("key2", "subkey1")];
    let override_series = [
        ("domain", "ov"),
        ("key1", "key1_value1"),
        ("key2", "subkey1_something"),
    ];
    let series: BTreeSet<Labels> = page.series(total).into_iter().collect();
    assert_eq!(
        series,
        [labels_of(&rule), labels_of(&override_series)].into()
    );
    assert_eq!(page.get(total, &rule) as u64, 1);
    assert_eq!(page.get(total, &override_series) as u64, 2);
}

/// Upstream's stats reach a statsd server as its client sends them: counters of the change
/// since the last flush, under upstream's names, with `EXTRA_TAGS`' suffix, and the
/// ShouldRateLimit response-time timer, each request's µs; over TCP (upstream's default)
/// and over UDP.
#[tokio::test]
async fn upstreams_stats_reach_a_statsd_server_over_tcp_and_udp() {
    let hits = "ratelimit.service.rate_limit.shop.user_id.total_hits.__env=test";
    let loads = "ratelimit.service.config_load_success.__env=test";
    let requests = "ratelimit_server.ShouldRateLimit.total_requests.__env=test";
    let times = "ratelimit_server.ShouldRateLimit.response_time.__env=test";
    for protocol in ["tcp", "udp"] {
        let mut statsd = StatsdServer::start(protocol);
        let server = Floodgate::start_with_env(
            &[("shop.yaml", RULES)],
            &[],
            &[
                ("FLOODGATE_STATSD__ADDR", statsd.addr.as_str()),
                ("FLOODGATE_STATSD__PROTOCOL", protocol),
                ("FLOODGATE_STATSD__FLUSH_INTERVAL_MS", "100"),
                ("FLOODGATE_STATSD__EXTRA_TAGS", "env:test"),
            ],
        );
        // The first flush goes out at start; from it on, response times are taken.
        let bound = std::time::Duration::from_secs(10);
        statsd.receive_until(bound, |received| received.counter(loads) == 1);
        let ask = request("shop", vec![descriptor(&[("user_id", "u1")])]);
        send(&server, &ask, 7).await;
        // No longer than "shop", the longest domain the rules name: counted by name.
        let unknown = request("shoe", vec![descriptor(&[("user_id", "u1")])]);
        send(&server, &unknown, 1).await;
        statsd.receive_until(bound, |received| {
            received.counter(requests) == 8
                && received.counter(hits) == 7
                && received.timed(times) >= 8.0
        });
        let received = &statsd.received;
        assert_eq!(received.counter(loads), 1, "{protocol}: {received:?}");
        let not_found = "ratelimit.service.rate_limit.shoe.domain_not_found.__env=test";
        assert_eq!(received.counter(not_found), 1, "{protocol}: {received:?}");
        let timed = &received.timers[times];
        assert_eq!(
            timed.len(),
            8,
            "one value per request, none sampled out: {timed:?}"
        );
        assert!(
            timed
                .iter()
                .all(|&(micros, rate)| micros > 0 && rate == 1.0),
            "{timed:?}"
        );
        assert!(
            received.gauges.is_empty(),
            "the memory backend has no local cache to report: {received:?}"
        );
        drop(server);
    }
}

/// A request for a domain no rule names is counted by that domain, as upstream's
/// `domain_not_found`.
#[tokio::test]
async fn requests_for_an_unknown_domain_are_counted_by_domain() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    // No longer than "shop", the longest domain the rules name: counted by name.
    let unknown = request("shoe", vec![descriptor(&[("user_id", "u1")])]);
    send(&server, &unknown, 3).await;
    send(
        &server,
        &request("shop", vec![descriptor(&[("user_id", "u1")])]),
        1,
    )
    .await;
    let page = scrape(&server).await;
    let name = "ratelimit_service_rate_limit_domain_not_found";
    assert_eq!(page.get(name, &[("domain", "shoe")]) as u64, 3);
    assert_eq!(page.series(name).len(), 1, "a known domain is not counted");
}

/// A client's domain never becomes a label longer than the rules' own domains: a 100 KB
/// domain is counted as `__other__`, and the page stays small.
#[tokio::test]
async fn an_unknown_domain_longer_than_any_rules_is_counted_as_other() {
    let server = Floodgate::start(&[("shop.yaml", RULES)], &[]);
    // As long as a domain may be (request_limits.max_value_bytes).
    let long = "d".repeat(1024);
    send(
        &server,
        &request(&long, vec![descriptor(&[("user_id", "u1")])]),
        2,
    )
    .await;
    send(
        &server,
        &request("shops", vec![descriptor(&[("user_id", "u1")])]),
        1,
    )
    .await;
    let page = scrape(&server).await;
    let name = "ratelimit_service_rate_limit_domain_not_found";
    // "shops" is one byte longer than "shop", the longest domain the rules name.
    assert_eq!(page.get(name, &[("domain", "__other__")]) as u64, 3);
    assert_eq!(page.series(name).len(), 1);
    let (_, text) = server.http("GET", "/metrics", "");
    assert!(text.len() < 50_000, "a page of {} bytes", text.len());
}

/// A statsd server that refuses (a closed UDP port: each datagram draws an ICMP refusal,
/// which the socket's next send reports) is logged once, not once a flush.
#[tokio::test]
async fn a_refusing_statsd_server_over_udp_is_logged_once() {
    // A port nobody listens on: bound, then released.
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port");
    let addr = closed.local_addr().expect("its address").to_string();
    drop(closed);
    let server = Floodgate::start_with_env(
        &[("shop.yaml", RULES)],
        &[],
        &[
            ("FLOODGATE_STATSD__ADDR", &addr),
            ("FLOODGATE_STATSD__PROTOCOL", "udp"),
            ("FLOODGATE_STATSD__FLUSH_INTERVAL_MS", "20"),
        ],
    );
    // A change to send at every flush, for 2 s: a hundred flushes.
    let ask = request("shop", vec![descriptor(&[("user_id", "u1")])]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < until {
        send(&server, &ask, 1).await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (_, stderr) = server.terminate();
    let logged = stderr.matches("statsd: could not send").count();
    assert_eq!(logged, 1, "{stderr}");
}

/// SIGTERM is not held by a lookup of the statsd host that never ends: the server runs in a
/// mount namespace of its own whose resolver is a DNS server (in this test) that never
/// answers, and exits within its grace and a second.
#[test]
fn shutdown_is_not_held_by_a_statsd_lookup_that_never_ends() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a resolver of the test's own needs root (a mount namespace)");
        return;
    }
    let Ok(silent_dns) = std::net::UdpSocket::bind("127.0.0.77:53") else {
        eprintln!("skipped: no port 53 on 127.0.0.77 for a silent DNS server");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.77\noptions timeout:30 attempts:3\n",
    )
    .expect("writing resolv.conf");
    let script = format!(
        "mount --bind {} /etc/resolv.conf && exec \"$@\"",
        resolv.display()
    );
    let prefix = ["unshare", "-m", "sh", "-c", script.as_str(), "sh"];
    let server = Floodgate::start_wrapped(
        &prefix,
        &[("shop.yaml", RULES)],
        &[],
        &[
            ("FLOODGATE_STATSD__ADDR", "statsd.floodgate.test:8125"),
            ("FLOODGATE_STATSD__FLUSH_INTERVAL_MS", "100"),
            ("FLOODGATE_SHUTDOWN_GRACE", "2"),
        ],
    );
    // The first flush's lookup began at start; the sender gave up on it after 1 s.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let asked = std::time::Instant::now();
    let (status, stderr) = server.terminate();
    let took = asked.elapsed();
    drop(silent_dns);
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(
        took < std::time::Duration::from_secs(3),
        "SIGTERM took {took:?} with a 2 s grace\n{stderr}"
    );
}

/// At every cap a client can fill, with the longest values the default request limits take
/// (1 KiB), `/metrics` stays under the README's 16 MB: 10,000 `detailed_metric` series would
/// hold 10 MB of labels, and the labels' byte cap stops them at 512 KiB; 1,000 unknown
/// domains are named, each no longer than the rules' own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_stays_under_16_mb_at_every_cap() {
    const RULE: &str = "
domain: capped
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1000000}
";
    let server = Floodgate::start(&[("capped.yaml", RULE)], &[]);
    let padding = "v".repeat(1024 - 6);
    let mut clients = Vec::new();
    for client in 0..4 {
        let mut grpc = server.client().await;
        let padding = padding.clone();
        clients.push(tokio::spawn(async move {
            for i in (client..10_100).step_by(4) {
                let value = format!("{i:06}{padding}");
                let ask = request("capped", vec![descriptor(&[("user", &value)])]);
                grpc.should_rate_limit(ask).await.expect("a decision");
                // Unknown domains as long as "capped", each new.
                if i < 1_100 {
                    let domain = format!("d{i:05}");
                    let ask = request(&domain, vec![descriptor(&[("user", "u")])]);
                    grpc.should_rate_limit(ask).await.expect("a decision");
                }
            }
        }));
    }
    for client in clients {
        client.await.expect("a client task");
    }
    let asked = std::time::Instant::now();
    let (status, page) = server.http("GET", "/metrics", "");
    let took = asked.elapsed();
    assert_eq!(status, 200);
    eprintln!("/metrics at the caps: {} bytes in {took:?}", page.len());
    assert!(page.len() < 16_000_000, "{} bytes", page.len());
    let named = page.matches("user_").count();
    assert!(named > 100, "request-labelled series exist: {named}");
}

/// The response-time sample `suffix` (`_count`, `_sum`, or `_bucket` with `le`) of
/// upstream's `ratelimit_service_response_time_seconds`, from `page`.
fn response_time(page: &str, suffix: &str, le: Option<&str>) -> Option<f64> {
    let labels = match le {
        Some(le) => format!("{{grpc_method=\"ShouldRateLimit\",le=\"{le}\"}}"),
        None => "{grpc_method=\"ShouldRateLimit\"}".to_owned(),
    };
    let name = format!("ratelimit_service_response_time_seconds{suffix}{labels} ");
    (page.lines()).find_map(|line| line.strip_prefix(&name)?.parse().ok())
}

/// Upstream's response-time histogram, in seconds, or in milliseconds as upstream's
/// mapping wrote it before its fix (`metrics_response_time_in_milliseconds`, upstream's
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`): the same calls, bounds and sum 1,000
/// times larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_response_time_is_in_seconds_or_milliseconds_as_asked() {
    for milliseconds in [false, true] {
        let setting = milliseconds.to_string();
        let server = Floodgate::start_with_env(
            &[("rules.yaml", RULES)],
            &[],
            &[("FLOODGATE_METRICS_RESPONSE_TIME_IN_MILLISECONDS", &setting)],
        );
        for _ in 0..3 {
            server
                .ask(request("shop", vec![descriptor(&[("user_id", "u")])]))
                .await;
        }
        let (_, page) = server.http("GET", "/metrics", "");
        assert_eq!(response_time(&page, "_count", None), Some(3.0), "{page}");
        // The largest bound and the smallest: 1 s and 1 µs, in the unit asked for.
        let (top, absent) = if milliseconds {
            ("1000", "0.000001")
        } else {
            ("1", "1000")
        };
        assert_eq!(response_time(&page, "_bucket", Some(top)), Some(3.0));
        assert_eq!(response_time(&page, "_bucket", Some(absent)), None);
        let sum = response_time(&page, "_sum", None).expect("a sum");
        // Three answers in memory: well under a second each, and above a microsecond.
        let (low, high) = if milliseconds {
            (3e-3, 3e3)
        } else {
            (3e-6, 3.0)
        };
        assert!(sum > low && sum < high, "sum {sum} in ({low}, {high})");
    }
}
