//! envoyproxy/ratelimit's deployment shape, against the real binary: started as
//! `ratelimit` (the image's `/bin/ratelimit`) with upstream's documented environment, it
//! serves file rules on Redis, answers `/healthcheck`, serves Prometheus on its own port, and
//! with Envoy Gateway's environment subscribes to an xDS server over mutual TLS and serves
//! gRPC over TLS.

mod harness;
mod otlp_support;
mod redis_harness;
mod upstream_process;
mod xds_support;

use std::path::Path;

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{OK, OVER_LIMIT, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::tls::{Certificates, text};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use upstream_process::Upstream;
use xds_support::{Snapshot, Tls, XdsServer};

const RULES: &str = "domain: compat\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n";

/// The overall codes of three requests for `user` on `client`.
async fn three_codes(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    user: &str,
) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..3 {
        let ask = request("compat", vec![descriptor(&[("user", user)])]);
        let response = client.should_rate_limit(ask).await.expect("a decision");
        codes.push(response.into_inner().overall_code);
    }
    codes
}

#[tokio::test]
async fn started_as_ratelimit_it_serves_upstreams_file_environment() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("a directory");
    let rules = dir.path().join("runtime/ratelimit/config");
    std::fs::create_dir_all(&rules).expect("the runtime directory");
    std::fs::write(rules.join("compat.yaml"), RULES).expect("a rule file");
    let root = dir.path().join("runtime").display().to_string();
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let collector = otlp_support::Collector::start().await;
    let traces_to = format!("http://{}", collector.grpc_addr);
    // Upstream's stats over statsd, UDP: what a statsd exporter beside it would receive.
    let statsd = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("a UDP port");
    let statsd_port = statsd.local_addr().expect("its address").port().to_string();
    let upstream = Upstream::start(
        dir.path(),
        &[
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &statsd_port),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("LOG_LEVEL", "info"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SERVICE_NAME", "ratelimit-compat"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &traces_to),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{}", upstream.grpc))
        .await
        .expect("gRPC");
    assert_eq!(
        three_codes(&mut client, "alice").await,
        [OK, OK, OVER_LIMIT]
    );
    let keys = redis.command(&["DBSIZE"]);
    assert_ne!(keys, "0", "counted in Redis");

    let (status, body) = harness::http(upstream.http, "GET", "/healthcheck", "");
    assert_eq!((status, body.lines().next()), (200, Some("OK")));
    let metrics = upstream.metrics.expect("a Prometheus port");
    let (status, page) = harness::http(metrics, "GET", "/metrics", "");
    assert_eq!(status, 200);
    assert!(
        page.contains("ratelimit_service_config_load_success 1"),
        "{page}"
    );
    assert_eq!(harness::http(metrics, "GET", "/rlconfig", "").0, 404);
    let mut datagram = [0u8; 2048];
    let received = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        statsd.recv(&mut datagram),
    )
    .await
    .expect("stats within 10 s")
    .expect("a datagram");
    let stats = String::from_utf8_lossy(&datagram[..received]);
    assert!(
        stats.contains("ratelimit.service.config_load_success:1|c"),
        "{stats}"
    );
    // TRACING_* become the standard OTLP settings: spans under upstream's service name.
    let traced = collector
        .wait_for(|spans| {
            (spans.iter())
                .find(|span| span.attribute("floodgate.backend").as_deref() == Some("redis"))
                .cloned()
        })
        .await;
    assert_eq!(traced.service, "ratelimit-compat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_gets_rules_over_mutual_tls_and_serves_tls() {
    let certificates = Certificates::generate();
    let read = |path: &Path| std::fs::read(path).expect("a certificate file");
    let server_pair = certificates.server();
    let tls = Tls::mutual(&server_pair.cert, &server_pair.key, &certificates.ca());
    let xds = XdsServer::start(Some(tls)).await;
    let client_pair = certificates.client();
    let (ca, cert, key) = (
        text(&certificates.ca()),
        text(&client_pair.cert),
        text(&client_pair.key),
    );
    let (server_cert, server_key) = (text(&server_pair.cert), text(&server_pair.key));
    let xds_url = xds.addr.to_string();
    let dir = tempfile::tempdir().expect("a directory");
    // What Envoy Gateway sets, but the listen addresses, and floodgate's memory backend
    // through its own variable (it wins over upstream's Redis default).
    let upstream = Upstream::start(
        dir.path(),
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &cert),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &key),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "100ms"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &server_cert),
            ("GRPC_SERVER_TLS_KEY", &server_key),
            ("GRPC_CLIENT_TLS_CACERT", &ca),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("FLOODGATE_BACKEND", "memory"),
        ],
    );
    xds.push(Snapshot::limit("1", "compat", "user", 2));
    let ack = xds.ack_of("1").await;
    assert_eq!(ack.node.expect("the node").id, "envoy-ratelimit");

    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&certificates.ca())))
        .domain_name("localhost")
        .identity(Identity::from_pem(
            read(&client_pair.cert),
            read(&client_pair.key),
        ));
    let channel = Endpoint::from_shared(format!("https://{}", upstream.grpc))
        .expect("an endpoint")
        .tls_config(tls)
        .expect("TLS")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("a TLS connection: {e}\n{}", upstream.stderr()));
    let mut client = RateLimitServiceClient::new(channel);
    assert_eq!(
        three_codes(&mut client, "alice").await,
        [OK, OK, OVER_LIMIT]
    );
    let (status, _) = harness::http(upstream.http, "GET", "/healthcheck", "");
    assert_eq!(status, 200);
}

#[test]
fn an_upstream_setting_floodgate_cannot_serve_stops_the_start_naming_it() {
    let stderr = harness::refused_start(&["ratelimit"], &[("BACKEND_TYPE", "memcache")]);
    assert!(stderr.contains("BACKEND_TYPE=\"memcache\""), "{stderr}");
}

#[tokio::test]
async fn upstreams_global_quota_mode_is_honoured() {
    let rules = "domain: compat\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: team\n    rate_limit: {unit: day, requests_per_unit: 5}\n";
    let codes = |quota_mode: &'static str| async move {
        let dir = tempfile::tempdir().expect("a directory");
        let config = dir.path().join("runtime/ratelimit/config");
        std::fs::create_dir_all(&config).expect("the runtime directory");
        std::fs::write(config.join("compat.yaml"), rules).expect("a rule file");
        let root = dir.path().join("runtime").display().to_string();
        let upstream = Upstream::start(
            dir.path(),
            &quietly(&[
                ("RUNTIME_ROOT", &root),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("QUOTA_MODE", quota_mode),
            ]),
        );
        let mut client = RateLimitServiceClient::connect(format!("http://{}", upstream.grpc))
            .await
            .expect("a connection");
        let mut codes = Vec::new();
        for _ in 0..2 {
            // The user's limit runs out on the second; the team's does not.
            let ask = request(
                "compat",
                vec![
                    descriptor(&[("user", "alice")]),
                    descriptor(&[("team", "t")]),
                ],
            );
            let answer = client.should_rate_limit(ask).await.expect("a decision");
            codes.push(answer.into_inner().overall_code);
        }
        codes
    };
    assert_eq!(codes("false").await, [OK, OVER_LIMIT]);
    // Every rule in quota mode: over limit only when every descriptor is.
    assert_eq!(codes("true").await, [OK, OK]);
}

/// Over xDS with `FORCE_START_WITHOUT_INITIAL_CONFIG`, upstream's
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` keeps the replica unhealthy until the first
/// snapshot is in force.
#[tokio::test]
async fn healthy_with_at_least_one_config_loaded_waits_for_the_first_snapshot() {
    let xds = XdsServer::start(None).await;
    let xds_url = xds.addr.to_string();
    let dir = tempfile::tempdir().expect("a directory");
    let upstream = Upstream::start(
        dir.path(),
        &quietly(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ]),
    );
    // Upstream's answer while unhealthy: 500.
    let (status, body) = harness::http(upstream.http, "GET", "/healthcheck", "");
    assert_eq!(status, 500, "{body}");
    xds.push(Snapshot::limit("1", "compat", "user", 2));
    xds.ack_of("1").await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while harness::http(upstream.http, "GET", "/healthcheck", "").0 != 200 {
        assert!(
            std::time::Instant::now() < until,
            "unhealthy after the snapshot"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `env` and what a test of one setting adds to upstream's environment: free loopback
/// ports, no statsd, and floodgate's memory backend (its own variable wins over upstream's
/// Redis default).
fn quietly<'a>(env: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all = env.to_vec();
    all.extend([
        ("USE_STATSD", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("FLOODGATE_BACKEND", "memory"),
    ]);
    all
}
