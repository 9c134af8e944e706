//! Which UNAVAILABLE answers a client may send again: those that carry `floodgate-counted:
//! none` (gRPC trailers, or the HTTP header of `POST /json`), which floodgate adds only when
//! no hit of the request was counted. Against a real `redis-server`: one that is gone (no
//! connection, then the open breaker: never sent), one that is frozen (a call sent and not
//! answered: it may have run), and a request whose other hit was counted.

mod harness;
mod redis_harness;

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use harness::{Floodgate, descriptor, request};
use redis_harness::RedisServer;

const RULES: &str = "
domain: retry
descriptors:
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 100}
    on_backend_error: error
  - key: lenient
    rate_limit: {unit: hour, requests_per_unit: 100}
    on_backend_error: fail_open
  - key: local
    rate_limit: {unit: hour, requests_per_unit: 100}
    on_backend_error: local
";

fn start(redis: &RedisServer) -> Floodgate {
    Floodgate::start_with_env(
        &[("retry.yaml", RULES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "300")],
    )
}

fn asking(keys: &[&str]) -> RateLimitRequest {
    let descriptors = keys.iter().map(|key| descriptor(&[(key, "v")])).collect();
    request("retry", descriptors)
}

/// The `floodgate-counted` entry of a failed request's status.
async fn marker(server: &Floodgate, keys: &[&str]) -> Option<String> {
    let status = server.ask_err(asking(keys)).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    (status.metadata().get("floodgate-counted"))
        .map(|value| value.to_str().expect("ASCII").to_owned())
}

#[tokio::test]
async fn a_request_redis_never_received_is_marked_safe_to_send_again() {
    let redis = RedisServer::start();
    let server = start(&redis);
    drop(redis);
    // The first request may meet the connection Redis left (a write that failed: not
    // marked, as a broken connection cannot say what it delivered). After it no connection
    // can be made, then the breaker opens: neither sends anything.
    let _ = marker(&server, &["strict"]).await;
    for _ in 0..8 {
        assert_eq!(marker(&server, &["strict"]).await.as_deref(), Some("none"));
    }
    assert_eq!(
        marker(&server, &["strict", "lenient"]).await.as_deref(),
        Some("none"),
        "a fail_open hit counts nothing either"
    );
    let json =
        r#"{"domain": "retry", "descriptors": [{"entries": [{"key": "strict", "value": "v"}]}]}"#;
    let (status, _) = harness::http_with(server.http_addr, "POST", "/json", &[], json);
    assert_eq!(status, 503);
    let raw = raw_http_headers(server.http_addr, json);
    assert!(raw.contains("floodgate-counted: none"), "{raw}");
}

#[tokio::test]
async fn a_request_whose_other_hit_was_counted_locally_is_not_marked() {
    let redis = RedisServer::start();
    let server = start(&redis);
    drop(redis);
    assert_eq!(marker(&server, &["strict", "local"]).await, None);
}

#[tokio::test]
async fn a_call_redis_may_have_run_is_not_marked() {
    let redis = RedisServer::start();
    let server = start(&redis);
    let pid = redis.pid().to_string();
    let warm = server.ask(asking(&["strict"])).await;
    assert_eq!(warm.overall_code, harness::OK);
    let kill = |signal: &str| {
        let sent = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    };
    kill("-STOP");
    // The call went out on a live connection and times out unanswered: Redis may run it.
    let unmarked = marker(&server, &["strict"]).await;
    kill("-CONT");
    assert_eq!(unmarked, None);
}

/// The response head of `POST /json` with `body`, as raw text.
fn raw_http_headers(addr: std::net::SocketAddr, body: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("the HTTP port");
    write!(
        stream,
        "POST /json HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("the answer");
    answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_owned()
}
