//! OpenTelemetry traces from the real binary to a real OTLP receiver (`tests/otlp_support`):
//! a decision's span continues the trace the request carried (W3C `traceparent`, B3 in
//! both forms), names the domain, the number of descriptors and the outcome, and has the
//! backend call as its child; over OTLP/gRPC and OTLP/HTTP; an unsampled trace is not
//! exported; a failed backend call is an error span. (Envoy's own trace, end to end, is in
//! `tests/envoy.rs`.)

mod harness;
mod otlp_support;
mod redis_harness;

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use harness::{Floodgate, OK, OVER_LIMIT, descriptor, request};
use otlp_support::{Collector, Received};
use redis_harness::RedisServer;

const RULES: &str = "
domain: traces
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
    on_backend_error: fail_open
";

const DECISION: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const BACKEND: &str = "floodgate.backend.hit_all";

/// A floodgate exporting to `collector` over `protocol`, with `flags`.
fn start(collector: &Collector, protocol: &str, flags: &[&str]) -> Floodgate {
    let endpoint = match protocol {
        "grpc" => format!("http://{}", collector.grpc_addr),
        _ => format!("http://{}", collector.http_addr),
    };
    Floodgate::start_with_env(
        &[("traces.yaml", RULES)],
        flags,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "300"),
        ],
    )
}

/// `user`'s request, carrying the trace `headers`; the gRPC result.
async fn ask_traced(
    server: &Floodgate,
    user: &str,
    headers: &[(&'static str, &str)],
) -> Result<i32, tonic::Status> {
    ask_with(
        server,
        request("traces", vec![descriptor(&[("user", user)])]),
        headers,
    )
    .await
}

async fn ask_with(
    server: &Floodgate,
    asked: RateLimitRequest,
    headers: &[(&'static str, &str)],
) -> Result<i32, tonic::Status> {
    let mut asked = tonic::Request::new(asked);
    for (name, value) in headers {
        let value = value.parse().expect("an ASCII header value");
        asked.metadata_mut().insert(*name, value);
    }
    let answer = server.client().await.should_rate_limit(asked).await?;
    Ok(answer.into_inner().overall_code)
}

/// The decision span of `trace` and its backend child, once both arrived.
async fn decision_of(collector: &Collector, trace: &str) -> (Received, Received) {
    collector
        .wait_for(|spans| {
            let in_trace = || spans.iter().filter(|span| span.trace_id() == trace);
            let decision = in_trace().find(|span| span.span.name == DECISION)?;
            let backend = in_trace().find(|span| {
                span.span.name == BACKEND && span.parent_span_id() == decision.span_id()
            })?;
            Some((decision.clone(), backend.clone()))
        })
        .await
}

const SERVER_KIND: i32 = 2;
const CLIENT_KIND: i32 = 3;
const STATUS_ERROR: i32 = 2;

#[tokio::test]
async fn a_decision_continues_the_w3c_trace_over_otlp_grpc() {
    let collector = Collector::start().await;
    let server = start(&collector, "grpc", &[]);
    let first = "4bf92f3577b34da6a3ce929d0e0e4736";
    let second = "0af7651916cd43dd8448eb211c80319c";
    let traceparent = |trace: &str| format!("00-{trace}-00f067aa0ba902b7-01");
    let sent = ask_traced(&server, "alice", &[("traceparent", &traceparent(first))]).await;
    assert_eq!(sent.expect("a decision"), OK);
    let sent = ask_traced(&server, "alice", &[("traceparent", &traceparent(second))]).await;
    assert_eq!(sent.expect("a decision"), OVER_LIMIT);

    let (decision, backend) = decision_of(&collector, first).await;
    assert_eq!(decision.service, "floodgate");
    assert_eq!(decision.parent_span_id(), "00f067aa0ba902b7");
    assert_eq!(decision.span.kind, SERVER_KIND);
    assert_eq!(
        decision.attribute("ratelimit.domain").as_deref(),
        Some("traces")
    );
    assert_eq!(
        decision.attribute("ratelimit.descriptors").as_deref(),
        Some("1")
    );
    assert_eq!(
        decision.attribute("ratelimit.outcome").as_deref(),
        Some("OK")
    );
    assert_eq!(backend.span.kind, CLIENT_KIND);
    assert_eq!(
        backend.attribute("floodgate.backend").as_deref(),
        Some("memory")
    );
    assert_eq!(backend.attribute("floodgate.hits").as_deref(), Some("1"));
    assert!(decision.span.start_time_unix_nano <= backend.span.start_time_unix_nano);
    assert!(backend.span.end_time_unix_nano <= decision.span.end_time_unix_nano);

    let (over, _) = decision_of(&collector, second).await;
    assert_eq!(
        over.attribute("ratelimit.outcome").as_deref(),
        Some("OVER_LIMIT")
    );
}

#[tokio::test]
async fn b3_in_either_form_is_continued_over_otlp_http() {
    let collector = Collector::start().await;
    let server = start(&collector, "http/protobuf", &[]);
    let single = "463ac35c9f6413ad48485a3953bb6124";
    let b3 = format!("{single}-a2fb4a1d1a96d312-1");
    assert_eq!(
        ask_traced(&server, "bob", &[("b3", &b3)]).await.unwrap(),
        OK
    );
    let multi = [
        ("x-b3-traceid", "48485a3953bb6124"),
        ("x-b3-spanid", "b7ad6b7169203331"),
        ("x-b3-sampled", "1"),
    ];
    assert_eq!(ask_traced(&server, "carol", &multi).await.unwrap(), OK);

    let (decision, _) = decision_of(&collector, single).await;
    assert_eq!(decision.parent_span_id(), "a2fb4a1d1a96d312");
    let (decision, _) = decision_of(&collector, "000000000000000048485a3953bb6124").await;
    assert_eq!(decision.parent_span_id(), "b7ad6b7169203331");
}

#[tokio::test]
async fn an_unsampled_trace_is_not_exported_and_a_request_without_one_starts_its_own() {
    let collector = Collector::start().await;
    let server = start(&collector, "grpc", &[]);
    let unsampled = "11111111111111111111111111111111";
    let header = format!("00-{unsampled}-00f067aa0ba902b7-00");
    assert_eq!(
        ask_traced(&server, "dave", &[("traceparent", &header)])
            .await
            .unwrap(),
        OK
    );
    assert_eq!(ask_traced(&server, "erin", &[]).await.unwrap(), OK);
    // Spans are exported in the order they end: once the later, untraced request's root
    // span is in, the unsampled one would be too.
    let root = collector
        .wait_for(|spans| {
            (spans.iter())
                .find(|span| span.span.name == DECISION && span.parent_span_id().is_empty())
                .cloned()
        })
        .await;
    assert_ne!(root.trace_id(), unsampled);
    let spans = collector.spans();
    assert!(
        spans.iter().all(|span| span.trace_id() != unsampled),
        "{spans:#?}"
    );
}

#[tokio::test]
async fn a_failed_backend_call_is_an_error_span_under_a_decision_its_policy_answered() {
    let collector = Collector::start().await;
    let redis = RedisServer::start();
    let server = start(
        &collector,
        "grpc",
        &["--backend", "redis", "--redis-url", &redis.url()],
    );
    drop(redis);
    let trace = "5b8efff798038103d269b633813fc60c";
    let header = format!("00-{trace}-eee19b7ec3c1b174-01");
    let answer = ask_traced(&server, "frank", &[("traceparent", &header)]).await;
    assert_eq!(answer.expect("fail_open answers"), OK);

    let (decision, backend) = decision_of(&collector, trace).await;
    assert_eq!(
        decision.attribute("ratelimit.outcome").as_deref(),
        Some("OK")
    );
    assert_eq!(
        backend.attribute("floodgate.backend").as_deref(),
        Some("redis")
    );
    assert_eq!(
        backend.attribute("floodgate.failed_hits").as_deref(),
        Some("1")
    );
    let status = backend.span.status.as_ref().expect("a status");
    assert_eq!(status.code, STATUS_ERROR, "{status:?}");
    assert!(!status.message.is_empty());
}

#[tokio::test]
async fn a_malformed_request_is_an_error_span() {
    let collector = Collector::start().await;
    let server = start(&collector, "grpc", &[]);
    let trace = "6e0c63257de34c92bf9efcd03927272e";
    let header = format!("00-{trace}-00f067aa0ba902b7-01");
    let empty_domain = request("", vec![descriptor(&[("user", "x")])]);
    let refused = ask_with(&server, empty_domain, &[("traceparent", &header)]).await;
    assert_eq!(
        refused.expect_err("refused").code(),
        tonic::Code::InvalidArgument
    );
    let decision = collector
        .wait_for(|spans| spans.iter().find(|span| span.trace_id() == trace).cloned())
        .await;
    assert_eq!(
        decision.attribute("ratelimit.outcome").as_deref(),
        Some("INVALID_ARGUMENT")
    );
    assert_eq!(
        decision.span.status.as_ref().map(|s| s.code),
        Some(STATUS_ERROR)
    );
}

/// Each RLQS report is a span of its own, continuing the trace the stream's headers carry,
/// with the domain and the number of buckets reported.
#[tokio::test]
async fn an_rlqs_report_is_a_span_in_the_streams_trace() {
    use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use floodgate::proto::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };

    let collector = Collector::start().await;
    let server = start(&collector, "grpc", &[]);
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let usage = |user: &str| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("user".to_owned(), user.to_owned())].into(),
        }),
        ..Default::default()
    };
    let report = RateLimitQuotaUsageReports {
        domain: "traces".into(),
        bucket_quota_usages: vec![usage("a"), usage("b")],
    };
    let mut stream = tonic::Request::new(futures_util::stream::iter(vec![report]));
    let parent = format!("00-{trace}-b7ad6b7169203331-01");
    (stream.metadata_mut()).insert("traceparent", parent.parse().expect("ASCII"));
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .expect("a connection");
    let mut answers = client
        .stream_rate_limit_quotas(stream)
        .await
        .expect("the stream opens")
        .into_inner();
    let answer = answers.message().await.expect("an answer");
    assert_eq!(answer.expect("not the end").bucket_action.len(), 2);
    let span = collector
        .wait_for(|spans| {
            (spans.iter())
                .find(|span| span.trace_id() == trace && span.span.name == "floodgate.rlqs.report")
                .cloned()
        })
        .await;
    assert_eq!(
        span.attribute("ratelimit.domain").as_deref(),
        Some("traces")
    );
    assert_eq!(
        span.attribute("ratelimit.descriptors").as_deref(),
        Some("2")
    );
    assert_eq!(span.attribute("ratelimit.outcome").as_deref(), Some("OK"));
}
