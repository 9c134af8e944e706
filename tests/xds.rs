//! Rules over xDS, end to end: the real `floodgate` subscribed to a management server the
//! test runs (`tests/xds_support`), which pushes, updates and breaks snapshots of
//! `RateLimitConfig`. floodgate ACKs what it accepts and decides under it, NACKs what it
//! refuses and keeps the last good rules, subscribes again after the server restarts, and
//! does all of it over mutual TLS.

mod certs;
mod harness;
mod xds_support;

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::proto::ratelimit::config::ratelimit::v3::RateLimitUnit;
use harness::{Floodgate, OK, OVER_LIMIT, descriptor, request};
use xds_support::{Snapshot, Tls, XdsServer, config};

/// A floodgate subscribed to `server_url`, with the extra `xds.*` settings of `env`.
fn subscribed(server_url: &str, env: &[(&str, &str)]) -> Floodgate {
    let mut all = vec![
        ("FLOODGATE_RULES_SOURCE", "xds"),
        ("FLOODGATE_XDS__SERVER_URL", server_url),
        ("FLOODGATE_XDS__NODE_ID", "test-node"),
        ("FLOODGATE_XDS__RETRY_INITIAL_MS", "50"),
        ("FLOODGATE_XDS__RETRY_MAX_MS", "200"),
    ];
    all.extend_from_slice(env);
    Floodgate::start_with_env(&[], &[], &all)
}

fn ask(key: &str, value: &str) -> RateLimitRequest {
    request("xds", vec![descriptor(&[(key, value)])])
}

/// How many of `count` requests for `key=value` are allowed.
async fn allowed(server: &Floodgate, key: &str, value: &str, count: usize) -> usize {
    let mut allowed = 0;
    for _ in 0..count {
        if server.ask(ask(key, value)).await.overall_code == OK {
            allowed += 1;
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_snapshot_is_acked_and_decides_then_an_update_replaces_it() {
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 2));
    // Start-up waits for the first snapshot: serving means it is in force.
    let server = subscribed(&xds.url("http"), &[]);
    let ack = xds.ack_of("1").await;
    let node = ack.node.expect("the node");
    assert_eq!(
        (node.id.as_str(), node.user_agent_name.as_str()),
        ("test-node", "floodgate")
    );
    assert_eq!(ack.type_url, floodgate::xds::TYPE_URL);
    assert_eq!(allowed(&server, "user", "a", 3).await, 2);

    xds.push(Snapshot::limit("2", "xds", "user", 5));
    xds.ack_of("2").await;
    assert_eq!(allowed(&server, "user", "b", 6).await, 5);
    let (_, rules) = server.http("GET", "/rlconfig", "");
    assert!(
        rules.starts_with(&format!(
            "# rules from xds {}, version \"2\"",
            xds.url("http")
        )),
        "{rules}"
    );
    let (_, metrics) = server.http("GET", "/metrics", "");
    assert!(
        metrics.contains(&format!(
            "floodgate_rules_info{{source=\"xds\",server=\"{}\",version=\"2\"}} 1",
            xds.url("http")
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_snapshot_is_nacked_with_the_error_and_the_last_good_rules_stay() {
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 3));
    let server = subscribed(&xds.url("http"), &[]);
    xds.ack_of("1").await;

    // A descriptor without a unit: no rule file would load.
    xds.push(Snapshot {
        version: "2".into(),
        configs: vec![config("xds", "user", None, 1)],
    });
    let nack = xds.nack().await;
    assert_eq!(
        nack.version_info, "1",
        "a NACK names the version still in force"
    );
    let error = nack.error_detail.expect("why");
    assert_eq!(error.code, tonic::Code::InvalidArgument as i32);
    assert!(
        error.message.contains("xds:xds-limits"),
        "{}",
        error.message
    );
    assert!(error.message.contains("unit"), "{}", error.message);
    assert_eq!(
        allowed(&server, "user", "a", 4).await,
        3,
        "version 1 decides"
    );

    // Two configurations for one domain: refused too.
    let duplicate = config("xds", "user", Some(RateLimitUnit::Second), 1);
    let mut renamed = duplicate.clone();
    renamed.name = "other".into();
    xds.push(Snapshot {
        version: "3".into(),
        configs: vec![duplicate, renamed],
    });
    xds.request_where("a NACK of the duplicate domain", |r| {
        r.error_detail
            .as_ref()
            .is_some_and(|e| e.message.contains("duplicate domain"))
    })
    .await;
    let (_, metrics) = server.http("GET", "/metrics", "");
    assert!(
        metrics.contains("ratelimit_service_config_load_error 2"),
        "{metrics}"
    );

    // A good one after the bad ones is accepted.
    xds.push(Snapshot::limit("4", "xds", "user", 1));
    xds.ack_of("4").await;
    assert_eq!(allowed(&server, "user", "b", 2).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_past_rules_max_bytes_is_nacked_before_it_is_expanded() {
    const RULES_MAX_BYTES: usize = 64 * 1024;
    const GRPC_MESSAGE_MAX_BYTES: usize = 4 * 1024 * 1024;
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 2));
    let server = subscribed(
        &xds.url("http"),
        &[("FLOODGATE_RULES_MAX_BYTES", &RULES_MAX_BYTES.to_string())],
    );
    xds.ack_of("1").await;
    let idle = server.peak_rss();

    // About 195,000 descriptors of 20 bytes each: just under the gRPC message limit, and
    // some 400 times rules_max_bytes as rule text.
    let huge = Snapshot::many("2", "xds", "id", 195_000);
    let size = huge.encoded_len();
    assert!(
        (GRPC_MESSAGE_MAX_BYTES * 9 / 10..GRPC_MESSAGE_MAX_BYTES).contains(&size),
        "{size}"
    );
    xds.push(huge);
    let nack = xds.nack().await;
    assert_eq!(nack.version_info, "1");
    let message = nack.error_detail.expect("why").message;
    assert!(
        message.contains(&format!("rules_max_bytes ({RULES_MAX_BYTES})")),
        "{message}"
    );
    assert_eq!(
        allowed(&server, "user", "a", 3).await,
        2,
        "version 1 decides"
    );
    let peak = server.peak_rss();
    assert!(
        peak < idle + 4 * size as u64,
        "peak RSS {peak} bytes, idle {idle}, for a {size}-byte snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_few_rules_with_long_values_stops_at_rules_max_bytes_as_it_is_written() {
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 2));
    let server = subscribed(&xds.url("http"), &[("FLOODGATE_RULES_MAX_BYTES", "65536")]);
    xds.ack_of("1").await;

    // 100 descriptors, far fewer than 65536 bytes hold, but 1 MB of values.
    let mut long = Snapshot::many("2", "xds", "id", 100);
    for descriptor in &mut long.configs[0].descriptors {
        descriptor.value.push_str(&"x".repeat(10_000));
    }
    xds.push(long);
    let message = xds.nack().await.error_detail.expect("why").message;
    assert!(
        message.contains("pass rules_max_bytes (65536) as rule files")
            && message.contains("resource 0 of 1 (\"xds-limits\")"),
        "{message}"
    );
    assert_eq!(allowed(&server, "user", "a", 3).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_server_restarts_floodgate_subscribes_again_naming_its_version() {
    let xds = XdsServer::start(None).await;
    let addr = xds.addr;
    xds.push(Snapshot::limit("7", "xds", "user", 2));
    let server = subscribed(&xds.url("http"), &[]);
    xds.ack_of("7").await;
    xds.stop().await;
    // The rules stay while the server is away.
    assert_eq!(allowed(&server, "user", "a", 3).await, 2);

    let restarted = XdsServer::start_on(addr, None).await;
    let subscription = restarted
        .request_where("a new subscription", |r| r.response_nonce.is_empty())
        .await;
    assert_eq!(subscription.version_info, "7");
    restarted.push(Snapshot::limit("8", "xds", "user", 4));
    restarted.ack_of("8").await;
    assert_eq!(allowed(&server, "user", "b", 5).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_initial_config_it_serves_at_once_with_no_rules() {
    let xds = XdsServer::start(None).await;
    let server = subscribed(
        &xds.url("http"),
        &[("FLOODGATE_XDS__START_WITHOUT_INITIAL_CONFIG", "true")],
    );
    assert_eq!(
        allowed(&server, "user", "a", 5).await,
        5,
        "no rules: no limits"
    );
    let (_, rules) = server.http("GET", "/rlconfig", "");
    assert!(rules.contains("no snapshot yet"), "{rules}");
    xds.push(Snapshot::limit("1", "xds", "user", 1));
    xds.ack_of("1").await;
    assert_eq!(allowed(&server, "user", "b", 2).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_only_a_client_with_a_certificate_gets_the_rules() {
    let certificates = certs::Certificates::generate();
    let server_pair = certificates.server();
    let tls = Tls::mutual(&server_pair.cert, &server_pair.key, &certificates.ca());
    let xds = XdsServer::start(Some(tls)).await;
    xds.push(Snapshot::limit("1", "xds", "user", 2));
    let url = xds.url("https");
    let ca = certs::text(&certificates.ca());
    let client = certificates.client();
    let (cert, key) = (certs::text(&client.cert), certs::text(&client.key));
    let server = subscribed(
        &url,
        &[
            ("FLOODGATE_XDS__CA_FILE", &ca),
            ("FLOODGATE_XDS__CERT_FILE", &cert),
            ("FLOODGATE_XDS__KEY_FILE", &key),
        ],
    );
    xds.ack_of("1").await;
    assert_eq!(allowed(&server, "user", "a", 3).await, 2);

    // Without a client certificate the handshake is refused: no rules ever arrive.
    let refused = subscribed(
        &url,
        &[
            ("FLOODGATE_XDS__CA_FILE", &ca),
            ("FLOODGATE_XDS__START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    );
    refused.wait_for_log("xDS subscription failed");
    assert_eq!(allowed(&refused, "user", "b", 3).await, 3);
    assert_eq!(
        xds.requests()
            .iter()
            .filter(|r| r.response_nonce.is_empty())
            .count(),
        1,
        "only the client with a certificate subscribed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_answers_carry_the_xds_rule() {
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 1));
    let server = subscribed(&xds.url("http"), &[]);
    assert_eq!(server.ask(ask("user", "c")).await.overall_code, OK);
    let response = server.ask(ask("user", "c")).await;
    assert_eq!(response.overall_code, OVER_LIMIT);
    let limit = response.statuses[0]
        .current_limit
        .clone()
        .expect("the limit");
    assert_eq!(limit.requests_per_unit, 1);
}

/// A floodgate under snapshot 1 (one a minute on `user`), which an overlays file makes a
/// bucket of 4: the server, floodgate, the file's directory and the file.
async fn with_bucket_overlay() -> (XdsServer, Floodgate, tempfile::TempDir, std::path::PathBuf) {
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 1));
    let dir = tempfile::tempdir().expect("a directory");
    let overlays = dir.path().join("overlays.toml");
    std::fs::write(
        &overlays,
        "[[overlay]]\ndomain = 'xds'\npath = ['user']\nalgorithm = 'token_bucket'\nburst = 4\n",
    )
    .expect("the overlays file");
    let path = overlays.display().to_string();
    let server = subscribed(&xds.url("http"), &[("FLOODGATE_XDS__OVERLAYS_FILE", &path)]);
    xds.ack_of("1").await;
    (xds, server, dir, overlays)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlay_gives_a_delivered_rule_floodgates_algorithm_and_burst() {
    let (xds, server, _dir, overlays) = with_bucket_overlay().await;
    assert_eq!(allowed(&server, "user", "a", 6).await, 4);
    let (_, rules) = server.http("GET", "/rlconfig", "");
    assert!(rules.contains("algorithm=token_bucket, burst=4"), "{rules}");

    // An edited overlay applies from the next snapshot; one the loader refuses is a NACK.
    std::fs::write(
        &overlays,
        "[[overlay]]\ndomain = 'xds'\npath = ['user']\nburst = 4\n",
    )
    .expect("a broken overlay");
    xds.push(Snapshot::limit("2", "xds", "user", 1));
    let nack = xds.nack().await;
    let message = nack.error_detail.expect("why").message;
    assert!(message.contains("burst"), "{message}");
}

#[test]
fn an_overlays_file_that_does_not_read_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().expect("a directory");
    let overlays = dir.path().join("overlays.toml");
    std::fs::write(
        &overlays,
        "[[overlay]]\ndomain = 'a'\npath = []\nburts = 1\n",
    )
    .expect("write");
    let path = overlays.display().to_string();
    let stderr = harness::refused_start(
        &harness::SERVE_ANYWHERE,
        &[
            ("FLOODGATE_RULES_SOURCE", "xds"),
            ("FLOODGATE_XDS__OVERLAYS_FILE", &path),
        ],
    );
    assert!(
        stderr.contains("overlays.toml") && stderr.contains("burts"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlays_file_replaced_by_a_fifo_keeps_the_overlays_in_force_and_the_server_answering()
{
    let (xds, server, _dir, overlays) = with_bucket_overlay().await;
    let path = overlays.display().to_string();

    // A FIFO no one writes: opening it to read would wait for a writer.
    std::fs::remove_file(&overlays).expect("remove the overlays file");
    let made = std::process::Command::new("mkfifo")
        .arg(&overlays)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    xds.push(Snapshot::limit("2", "xds", "user", 1));
    xds.ack_of("2").await;
    let log = server.wait_for_log("not a regular file");
    assert!(log.contains(&path), "{log}");
    assert_eq!(
        allowed(&server, "user", "a", 6).await,
        4,
        "the overlays in force stay"
    );
    assert_eq!(server.http("GET", "/healthz", "").0, 200);
}

/// A delivered descriptor's `metadata` (field 8, upstream #1174/#1175) reaches the response's
/// dynamic metadata as a rule file's does, while the descriptor is under its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_descriptors_metadata_reaches_the_dynamic_metadata() {
    use pbjson_types::{Struct, Value, value::Kind};

    let xds = XdsServer::start(None).await;
    let mut configured = config("xds", "user", Some(RateLimitUnit::Minute), 2);
    let backend = Value {
        kind: Some(Kind::StringValue("primary".into())),
    };
    configured.descriptors[0].metadata = Some(Struct {
        fields: [("backend".to_owned(), backend)].into(),
    });
    xds.push(Snapshot {
        version: "1".into(),
        configs: vec![configured],
    });
    let server = subscribed(&xds.url("http"), &[("FLOODGATE_DYNAMIC_METADATA", "true")]);
    xds.ack_of("1").await;
    let response = server.ask(ask("user", "m")).await;
    let metadata = serde_json::to_value(response.dynamic_metadata.expect("metadata")).unwrap();
    assert_eq!(
        metadata["metadata"],
        serde_json::json!({"backend": "primary"})
    );
}

/// `xds.max_message_bytes` (upstream's `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`) bounds what the
/// server may send: a snapshot past it fails the stream, logged, and decides nothing; the
/// same snapshot under a larger bound is in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_past_the_message_size_setting_fails_the_stream() {
    let xds = XdsServer::start(None).await;
    xds.push(Snapshot::limit("1", "xds", "user", 2));
    let url = xds.url("http");
    let small = subscribed(
        &url,
        &[
            ("FLOODGATE_XDS__MAX_MESSAGE_BYTES", "64"),
            ("FLOODGATE_XDS__START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    );
    let log = small.wait_for_log("xDS subscription failed");
    assert!(log.contains("64"), "the failure names the limit:\n{log}");
    assert_eq!(allowed(&small, "user", "a", 3).await, 3, "no rule in force");
    let large = subscribed(&url, &[("FLOODGATE_XDS__MAX_MESSAGE_BYTES", "65536")]);
    assert_eq!(allowed(&large, "user", "a", 3).await, 2);
}
