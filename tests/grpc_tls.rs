//! The gRPC port's transports, against the real binary: TLS, mutual TLS (a client without a
//! certificate the CA signed is refused), a certificate rotated on disk and served without a
//! restart, a Unix socket (a live server's never taken over, a stale one replaced), and
//! connections retired at `max_connection_age_ms`.

mod certs;
mod harness;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use certs::{Certificates, Pair, text};
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{Floodgate, OK, OVER_LIMIT, descriptor, request};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const RULES: &str =
    "domain: tls\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2}\n";

fn ask(user: &str) -> RateLimitRequest {
    request("tls", vec![descriptor(&[("user", user)])])
}

/// A floodgate serving gRPC over TLS with the server certificate of `certificates`, and
/// the extra settings of `env`.
fn start_tls(certificates: &Certificates, env: &[(&str, &str)]) -> Floodgate {
    start_tls_wrapped(&[], certificates, env)
}

/// [`start_tls`], the binary run through `prefix` (see [`Floodgate::start_wrapped`]).
fn start_tls_wrapped(
    prefix: &[&str],
    certificates: &Certificates,
    env: &[(&str, &str)],
) -> Floodgate {
    let server = certificates.server();
    let (cert, key) = (text(&server.cert), text(&server.key));
    let mut all = vec![
        ("FLOODGATE_GRPC_TLS__CERT_FILE", cert.as_str()),
        ("FLOODGATE_GRPC_TLS__KEY_FILE", key.as_str()),
    ];
    all.extend_from_slice(env);
    Floodgate::start_wrapped(prefix, &[("tls.yaml", RULES)], &[], &all)
}

/// A client of `server` over TLS, trusting `certificates`' CA, presenting `identity`.
async fn tls_client(
    server: &Floodgate,
    certificates: &Certificates,
    identity: Option<Pair>,
) -> Result<RateLimitServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    Ok(RateLimitServiceClient::new(
        tls_channel(server, certificates, identity).await?,
    ))
}

/// A channel to `server` over TLS, trusting `certificates`' CA, presenting `identity`.
async fn tls_channel(
    server: &Floodgate,
    certificates: &Certificates,
    identity: Option<Pair>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let ca = std::fs::read(certificates.ca()).expect("the CA");
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(pair) = identity {
        let read = |path| std::fs::read(path).expect("a certificate file");
        tls = tls.identity(Identity::from_pem(read(&pair.cert), read(&pair.key)));
    }
    Endpoint::from_shared(format!("https://{}", server.grpc_addr))?
        .tls_config(tls)?
        .connect()
        .await
}

/// The first two answers for one user: OK, then OK, then over limit.
async fn decides(client: &mut RateLimitServiceClient<tonic::transport::Channel>, user: &str) {
    let mut codes = Vec::new();
    for _ in 0..3 {
        let response = client
            .should_rate_limit(ask(user))
            .await
            .expect("a decision");
        codes.push(response.into_inner().overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
}

#[tokio::test]
async fn grpc_over_tls_decides_and_a_plaintext_client_gets_nothing() {
    let certificates = Certificates::generate();
    let server = start_tls(&certificates, &[]);
    let mut client = tls_client(&server, &certificates, None)
        .await
        .expect("a TLS connection");
    decides(&mut client, "alice").await;

    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr)).await;
    let refused = match plain {
        Ok(mut client) => client.should_rate_limit(ask("bob")).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a plaintext client got an answer from a TLS port");
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_the_ca_signed() {
    let certificates = Certificates::generate();
    let ca = text(&certificates.ca());
    let server = start_tls(
        &certificates,
        &[("FLOODGATE_GRPC_TLS__CLIENT_CA_FILE", &ca)],
    );
    let mut client = tls_client(&server, &certificates, Some(certificates.client()))
        .await
        .expect("a client with a certificate connects");
    decides(&mut client, "alice").await;

    for (who, identity) in [
        ("none", None),
        ("another CA's", Some(certificates.stranger())),
    ] {
        let answer = match tls_client(&server, &certificates, identity).await {
            Ok(mut client) => client.should_rate_limit(ask("mallory")).await.err(),
            Err(error) => Some(tonic::Status::unavailable(error.to_string())),
        };
        assert!(
            answer.is_some(),
            "a client with {who} certificate was served"
        );
    }
}

/// The subject of the certificate the server at `addr` presents, through `openssl s_client`.
fn served_subject(addr: std::net::SocketAddr, certificates: &Certificates) -> String {
    let output = std::process::Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-CAfile"])
        .arg(certificates.ca())
        .args(["-servername", "localhost", "-alpn", "h2"])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("subject="))
        .unwrap_or_else(|| panic!("no subject in {stdout}"))
        .to_owned()
}

#[tokio::test]
async fn a_certificate_rotated_on_disk_is_served_without_a_restart() {
    let certificates = Certificates::generate();
    let server = start_tls(
        &certificates,
        &[
            ("FLOODGATE_GRPC_TLS__RELOAD_INTERVAL_MS", "100"),
            ("RUST_LOG", "info"),
        ],
    );
    let first = served_subject(server.grpc_addr, &certificates);
    assert!(first.contains("127.0.0.1"), "{first}");

    // What cert-manager does: the same paths, new contents.
    let renewed = certificates.reissue_server(2);
    let served = certificates.server();
    std::fs::copy(&renewed.key, &served.key).expect("the new key");
    std::fs::copy(&renewed.cert, &served.cert).expect("the new certificate");
    server.wait_for_log("grpc_tls: certificate reloaded");
    let second = served_subject(server.grpc_addr, &certificates);
    assert!(second.contains("127.0.0.1_2"), "still {second}");
    let mut client = tls_client(&server, &certificates, None)
        .await
        .expect("a new connection with the new certificate");
    decides(&mut client, "alice").await;

    // A broken rotation (a key that is not one) keeps the certificate in force. (A tick
    // between the two copies above may have seen a half-rotated pair: count from here.)
    let refused = server.stderr().matches("do not load").count();
    std::fs::write(&served.key, "not a key").expect("write");
    server.wait_for_log_count("do not load", refused + 1);
    assert!(served_subject(server.grpc_addr, &certificates).contains("127.0.0.1_2"));
}

/// A floodgate serving gRPC on a Unix socket, killed when dropped.
struct OnSocket {
    child: std::process::Child,
    _rules: tempfile::TempDir,
}

impl OnSocket {
    /// Starts one on `socket` and waits until it says it listens there.
    fn start(socket: &Path) -> OnSocket {
        let rules = harness::write_rules(&[("tls.yaml", RULES)]);
        let mut child = serve_on(&[], socket, &rules)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("floodgate starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the startup line");
        assert!(
            line.contains(&format!("grpc=unix:{}", socket.display())),
            "{line}"
        );
        OnSocket {
            child,
            _rules: rules,
        }
    }
}

impl Drop for OnSocket {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `floodgate serve` on `rules`, gRPC on the Unix socket `socket`, the binary run through
/// `prefix` (see [`harness::wrapped`]).
fn serve_on(prefix: &[&str], socket: &Path, rules: &tempfile::TempDir) -> std::process::Command {
    let mut command = harness::wrapped(prefix);
    command
        .args(["serve", "--http-addr", "127.0.0.1:0", "--rules"])
        .arg(rules.path())
        .env("FLOODGATE_GRPC_UNIX_SOCKET", socket);
    command
}

/// A client of the server on the Unix socket `socket`.
async fn unix_client(socket: &Path) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::new(unix_channel(socket).await)
}

/// A channel to the server on the Unix socket `socket`.
async fn unix_channel(socket: &Path) -> tonic::transport::Channel {
    let path = socket.to_owned();
    Endpoint::from_static("http://unix.socket")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("a connection over the socket")
}

/// One RLQS report of one bucket over `channel`: the answer holds its one action.
async fn quota_stream_answers(channel: tonic::transport::Channel) {
    use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use floodgate::proto::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    let report = RateLimitQuotaUsageReports {
        domain: "tls".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_owned(), "quota".to_owned())].into(),
            }),
            ..Default::default()
        }],
    };
    let mut answers = RateLimitQuotaServiceClient::new(channel)
        .stream_rate_limit_quotas(futures_util::stream::iter(vec![report]))
        .await
        .expect("the stream opens")
        .into_inner();
    let answer = answers.message().await.expect("an answer");
    assert_eq!(answer.expect("not the end").bucket_action.len(), 1);
}

/// The Rate Limit Quota Service is served wherever ShouldRateLimit is: over mutual TLS and
/// on a Unix socket.
#[tokio::test]
async fn rlqs_streams_are_served_over_mutual_tls_and_on_a_unix_socket() {
    let certificates = Certificates::generate();
    let ca = text(&certificates.ca());
    let server = start_tls(
        &certificates,
        &[("FLOODGATE_GRPC_TLS__CLIENT_CA_FILE", ca.as_str())],
    );
    let identity = Some(certificates.client());
    let channel = tls_channel(&server, &certificates, identity)
        .await
        .expect("mutual TLS");
    quota_stream_answers(channel).await;

    let dir = tempfile::tempdir().expect("a directory for the socket");
    let socket = dir.path().join("floodgate.sock");
    let _on_socket = OnSocket::start(&socket);
    quota_stream_answers(unix_channel(&socket).await).await;
}

#[tokio::test]
async fn grpc_on_a_unix_socket_decides() {
    let dir = tempfile::tempdir().expect("a directory for the socket");
    let socket = dir.path().join("floodgate.sock");
    let _server = OnSocket::start(&socket);
    decides(&mut unix_client(&socket).await, "alice").await;
}

#[tokio::test]
async fn a_second_server_on_a_live_socket_refuses_to_start_and_the_first_still_serves() {
    let dir = tempfile::tempdir().expect("a directory for the socket");
    let socket = dir.path().join("floodgate.sock");
    let _first = OnSocket::start(&socket);
    // A second that starts anyway is stopped by `timeout`, and fails the checks below.
    let rules = harness::write_rules(&[("tls.yaml", RULES)]);
    let output = serve_on(&["timeout", "20"], &socket, &rules)
        .output()
        .expect("floodgate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another process is serving on {}",
            socket.display()
        )),
        "{stderr}"
    );
    decides(&mut unix_client(&socket).await, "alice").await;
}

#[tokio::test]
async fn a_socket_left_by_a_killed_server_is_replaced() {
    let dir = tempfile::tempdir().expect("a directory for the socket");
    let socket = dir.path().join("floodgate.sock");
    // SIGKILL: the process cannot remove its socket file.
    drop(OnSocket::start(&socket));
    let file = std::fs::symlink_metadata(&socket).expect("the socket file stays");
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&file.file_type()));
    let _second = OnSocket::start(&socket);
    decides(&mut unix_client(&socket).await, "alice").await;
}

#[tokio::test]
async fn a_connection_is_retired_at_its_max_age() {
    let server = Floodgate::start_with_env(
        &[("tls.yaml", RULES)],
        &[],
        &[("FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_MS", "300")],
    );
    let tcp = tokio::net::TcpStream::connect(server.grpc_addr)
        .await
        .expect("connect");
    // The client stays: a connection without requests ends only when the server ends it.
    let (_client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    // Without a maximum age an idle connection stays open (for the idle timeout, 5 min):
    // this one is sent GOAWAY and closed.
    let closed = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(closed.is_ok(), "the connection outlived its max age");
}

/// Puts `pair` where the server reads its certificate and key, key first (as a rotation
/// does: a tick between the two sees a mismatched pair, which is refused).
fn rotate_to(certificates: &Certificates, pair: &Pair) {
    let served = certificates.server();
    for (from, to) in [(&pair.key, &served.key), (&pair.cert, &served.cert)] {
        // A copy onto a FIFO would block: the name is freed first.
        let _ = std::fs::remove_file(to);
        std::fs::copy(from, to).expect("a rotated file");
    }
}

/// Replaces the file at `path` by a FIFO, which no one ever writes.
fn fifo_in_place_of(path: &std::path::Path) {
    std::fs::remove_file(path).expect("remove the file");
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
}

#[tokio::test]
async fn a_certificate_replaced_by_a_fifo_is_refused_and_one_written_later_is_served() {
    let certificates = Certificates::generate();
    let server = start_tls(
        &certificates,
        &[
            ("FLOODGATE_GRPC_TLS__RELOAD_INTERVAL_MS", "100"),
            ("RUST_LOG", "info"),
        ],
    );
    let served = certificates.server();
    fifo_in_place_of(&served.cert);
    let log = server.wait_for_log("not a regular file");
    assert!(log.contains(&text(&served.cert)), "{log}");
    // Nothing waits on the FIFO: the server decides, and answers its health check.
    let mut client = tls_client(&server, &certificates, None)
        .await
        .expect("a TLS connection on the certificate in force");
    decides(&mut client, "alice").await;
    assert_eq!(server.http("GET", "/healthz", "").0, 200);

    rotate_to(&certificates, &certificates.reissue_server(2));
    server.wait_for_log("grpc_tls: certificate reloaded");
    let subject = served_subject(server.grpc_addr, &certificates);
    assert!(subject.contains("127.0.0.1_2"), "still {subject}");
}

#[tokio::test]
async fn a_certificate_linked_to_an_endless_file_is_refused_and_the_one_in_force_stays() {
    let certificates = Certificates::generate();
    // A guard, not the check: should the cap ever be lost, the server's reads fail at 4 GiB
    // of address space (it idles at about 1.3) instead of taking the machine's memory.
    let server = start_tls_wrapped(
        &["prlimit", "--as=4294967296", "--"],
        &certificates,
        &[("FLOODGATE_GRPC_TLS__RELOAD_INTERVAL_MS", "100")],
    );
    let served = certificates.server();
    std::fs::remove_file(&served.cert).expect("remove the certificate");
    std::os::unix::fs::symlink("/dev/zero", &served.cert).expect("a link to /dev/zero");
    let log = server.wait_for_log("not a regular file");
    assert!(log.contains(&text(&served.cert)), "{log}");
    let subject = served_subject(server.grpc_addr, &certificates);
    assert!(subject.contains("127.0.0.1"), "{subject}");
    let mut client = tls_client(&server, &certificates, None)
        .await
        .expect("a TLS connection on the certificate in force");
    decides(&mut client, "alice").await;
}

#[tokio::test]
async fn a_rotation_to_a_certificate_outside_its_validity_keeps_the_one_in_force() {
    let certificates = Certificates::generate();
    let server = start_tls(
        &certificates,
        &[("FLOODGATE_GRPC_TLS__RELOAD_INTERVAL_MS", "100")],
    );
    let cases = [
        (2, "20200101000000Z", "20200102000000Z", "expired"),
        (3, "20990101000000Z", "21000101000000Z", "not valid before"),
    ];
    for (serial, not_before, not_after, why) in cases {
        rotate_to(
            &certificates,
            &certificates.reissue_server_dated(serial, not_before, not_after),
        );
        let log = server.wait_for_log(why);
        let line = log
            .lines()
            .find(|line| line.contains(why))
            .unwrap_or_default();
        let (from, to) = (&not_before[..8], &not_after[..8]);
        let dates = |date: &str| format!("{}-{}-{}", &date[..4], &date[4..6], &date[6..]);
        assert!(
            line.contains(&text(&certificates.server().cert))
                && line.contains(&dates(from))
                && line.contains(&dates(to)),
            "{line}"
        );
        let subject = served_subject(server.grpc_addr, &certificates);
        assert!(subject.ends_with("127.0.0.1"), "{subject}");
    }
    let mut client = tls_client(&server, &certificates, None)
        .await
        .expect("a TLS connection on the certificate in force");
    decides(&mut client, "alice").await;
}

#[test]
fn an_expired_certificate_stops_the_start_naming_the_file_and_its_dates() {
    let certificates = Certificates::generate();
    let expired = certificates.reissue_server_dated(2, "20200101000000Z", "20200102000000Z");
    let (cert, key) = (text(&expired.cert), text(&expired.key));
    let rules = harness::write_rules(&[("tls.yaml", RULES)]);
    // A server that starts anyway is stopped by `timeout`, and fails the checks below.
    let output = harness::wrapped(&["timeout", "20"])
        .args(harness::SERVE_ANYWHERE)
        .arg("--rules")
        .arg(rules.path())
        .env("FLOODGATE_GRPC_TLS__CERT_FILE", &cert)
        .env("FLOODGATE_GRPC_TLS__KEY_FILE", &key)
        .output()
        .expect("floodgate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&cert)
            && stderr.contains("expired")
            && stderr.contains("2020-01-01")
            && stderr.contains("2020-01-02"),
        "{stderr}"
    );
}
