//! The redis backend on a secured Redis, end to end: TLS-only servers (`rediss://`, a test CA
//! made with `openssl`), one that requires client certificates, and ACL users, with real
//! `floodgate` binaries.

mod harness;
mod redis_harness;

use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use harness::{Floodgate, POLICIES, descriptor, request};
use redis_harness::tls::{Certificates, ServerFiles};
use redis_harness::{Access, RedisServer};

const OK: i32 = Code::Ok as i32;
const OVER_LIMIT: i32 = Code::OverLimit as i32;

/// The ACL user the secured servers know; the default user is off.
const USER: &str = "floodgate";
const PASSWORD: &str = "s3cret-0123";
const ACL: [&str; 9] = [
    "--user",
    USER,
    "on",
    ">s3cret-0123",
    "~floodgate:*",
    "+@all",
    "--user",
    "default",
    "off",
];

/// A floodgate on the redis backend at `url`, with extra environment.
fn start(url: &str, env: &[(&str, &str)]) -> Floodgate {
    let env = [&[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "1000")], env].concat();
    Floodgate::start_with_env(
        &[("rules.yaml", POLICIES)],
        &["--backend", "redis", "--redis-url", url],
        &env,
    )
}

fn ask(key: &str) -> floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest {
    request("policy", vec![descriptor(&[(key, "x")])])
}

/// The overall codes of `count` requests on `key`.
async fn codes(server: &Floodgate, key: &str, count: usize) -> Vec<i32> {
    let mut codes = Vec::new();
    for _ in 0..count {
        codes.push(server.ask(ask(key)).await.overall_code);
    }
    codes
}

/// Counting really happens in Redis: five admitted, then over the limit (the rule is
/// fail_closed: without Redis it would refuse the first).
async fn assert_counted(server: &Floodgate) {
    assert_eq!(
        codes(server, "closed_rule", 6).await,
        [OK, OK, OK, OK, OK, OVER_LIMIT],
        "{}",
        server.stderr()
    );
}

/// Redis cannot be used: each rule's failure policy answers, in bounded time.
async fn assert_failure_policies(server: &Floodgate) {
    let started = Instant::now();
    assert_eq!(codes(server, "closed_rule", 2).await, [OVER_LIMIT; 2]);
    assert_eq!(codes(server, "open_rule", 2).await, [OK; 2]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A server that knows only [`USER`] (the default user is off).
fn acl_server() -> RedisServer {
    let access = Access {
        tls: None,
        user: Some((USER.into(), PASSWORD.into())),
    };
    RedisServer::start_secured(&access, &ACL)
}

fn tls_server(certificates: &Certificates, options: &[&str]) -> RedisServer {
    let access = Access {
        tls: Some(ServerFiles::of(certificates)),
        user: None,
    };
    RedisServer::start_secured(&access, options)
}

#[tokio::test]
async fn decisions_work_over_tls_with_the_ca_trusted() {
    let certificates = Certificates::generate();
    let redis = tls_server(&certificates, &[]);
    let ca = certificates.ca().display().to_string();
    let server = start(&redis.url(), &[("SSL_CERT_FILE", &ca)]);
    assert_counted(&server).await;
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_unless_the_url_says_insecure() {
    let certificates = Certificates::generate();
    let redis = tls_server(&certificates, &[]);
    let untrusting = start(&redis.url(), &[]);
    assert_failure_policies(&untrusting).await;
    let insecure = start(&format!("{}#insecure", redis.url()), &[]);
    assert_counted(&insecure).await;
}

#[tokio::test]
async fn a_plain_url_on_a_tls_port_gets_the_failure_policies_not_a_hang() {
    let certificates = Certificates::generate();
    let redis = tls_server(&certificates, &[]);
    let plain = redis.url().replacen("rediss://", "redis://", 1);
    let server = start(&plain, &[]);
    assert_failure_policies(&server).await;
}

#[tokio::test]
async fn acl_credentials_work_from_the_url_and_from_the_environment() {
    let redis = acl_server();
    let port = redis.port();
    let in_url = start(&format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}/"), &[]);
    assert_counted(&in_url).await;
    redis.command(&["FLUSHALL"]);
    let from_env = start(
        &format!("redis://127.0.0.1:{port}/"),
        &[
            ("FLOODGATE_REDIS_USERNAME", USER),
            ("FLOODGATE_REDIS_PASSWORD", PASSWORD),
        ],
    );
    assert_counted(&from_env).await;
}

#[tokio::test]
async fn a_wrong_password_gets_the_failure_policies_and_a_log_line_without_it() {
    let redis = acl_server();
    let wrong = "not-the-secret-42";
    let url = format!("redis://{USER}:{wrong}@127.0.0.1:{}/", redis.port());
    let server = start(&url, &[]);
    assert_failure_policies(&server).await;
    let log = server.stderr();
    assert!(
        log.contains("Password authentication failed") && !log.contains(wrong),
        "the log names the problem and hides the password:\n{log}"
    );
}

#[tokio::test]
async fn a_redis_that_requires_client_certificates_gets_the_one_in_the_settings() {
    let certificates = Certificates::generate();
    let redis = tls_server(&certificates, &[]);
    // From here on, every new connection must present a certificate the CA signed.
    redis.command(&["CONFIG", "SET", "tls-auth-clients", "yes"]);
    let path = |path: std::path::PathBuf| path.display().to_string();
    let client = certificates.client();
    let (ca, cert, key) = (path(certificates.ca()), path(client.cert), path(client.key));
    let with = start(
        &redis.url(),
        &[
            ("FLOODGATE_REDIS_TLS_CA_FILE", &ca),
            ("FLOODGATE_REDIS_TLS_CERT_FILE", &cert),
            ("FLOODGATE_REDIS_TLS_KEY_FILE", &key),
        ],
    );
    assert_counted(&with).await;
    let without = start(&redis.url(), &[("FLOODGATE_REDIS_TLS_CA_FILE", &ca)]);
    assert_failure_policies(&without).await;
}
