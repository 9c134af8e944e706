//! Malformed requests get gRPC INVALID_ARGUMENT with a message saying what is wrong, and the
//! server keeps serving.

mod harness;

use harness::{Floodgate, descriptor, request};

const RULES: &str = "
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 3
";

async fn rejected(
    server: &Floodgate,
    req: floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest,
) -> String {
    let status = server.ask_err(req).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    status.message().to_owned()
}

#[tokio::test]
async fn empty_domain_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(&server, request("", vec![descriptor(&[("user", "a")])])).await;
    assert!(message.contains("domain"), "{message}");
}

#[tokio::test]
async fn request_without_descriptors_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(&server, request("api", vec![])).await;
    assert!(message.contains("no descriptors"), "{message}");
}

#[tokio::test]
async fn descriptor_without_entries_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", "a")]), descriptor(&[])]),
    )
    .await;
    assert!(
        message.contains("descriptor 1") && message.contains("no entries"),
        "{message}"
    );
}

#[tokio::test]
async fn entry_with_empty_key_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", "a"), ("", "b")])]),
    )
    .await;
    assert!(message.contains("entry 1 has an empty key"), "{message}");
}

#[tokio::test]
async fn too_many_descriptors_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let many = (0..65).map(|_| descriptor(&[("user", "a")])).collect();
    let message = rejected(&server, request("api", many)).await;
    assert!(
        message.contains("65 descriptors") && message.contains("64"),
        "{message}"
    );
}

#[tokio::test]
async fn oversized_value_is_invalid_argument() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    let long = "x".repeat(1025);
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", &long)])]),
    )
    .await;
    assert!(message.contains("1025 bytes"), "{message}");
}

#[tokio::test]
async fn request_limits_are_settings() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    drop(server);
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("floodgate.toml");
    std::fs::write(&settings, "[request_limits]\nmax_entries = 1\n").unwrap();
    let server = Floodgate::start(
        &[("r.yaml", RULES)],
        &["--config", settings.to_str().unwrap()],
    );
    let message = rejected(
        &server,
        request("api", vec![descriptor(&[("user", "a"), ("b", "c")])]),
    )
    .await;
    assert!(message.contains("at most 1"), "{message}");
}

#[tokio::test]
async fn invalid_requests_do_not_disturb_valid_ones() {
    let server = Floodgate::start(&[("r.yaml", RULES)], &[]);
    rejected(&server, request("", vec![])).await;
    let response = server
        .ask(request("api", vec![descriptor(&[("user", "a")])]))
        .await;
    assert_eq!(response.statuses[0].limit_remaining, 2);
}
