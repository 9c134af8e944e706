//! Runs the real `floodgate` binary for integration tests: rules written to a temporary
//! directory, gRPC and HTTP on free loopback ports, killed when dropped.

#![allow(dead_code)]

pub mod cgroup;
pub mod cpu;
pub mod hostile;
pub mod memory;
pub mod statsd;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use floodgate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

pub const BINARY: &str = env!("CARGO_BIN_EXE_floodgate");

/// Rules with one descriptor per algorithm in the domain `global`, each 50 per day: no
/// refill or window roll-over during a test, so every admission can be counted exactly.
pub const EVERY_ALGORITHM: &str = "
domain: global
descriptors:
  - key: fixed_window
    rate_limit: {unit: day, requests_per_unit: 50}
  - key: sliding_window
    rate_limit: {unit: day, requests_per_unit: 50, algorithm: sliding_window}
  - key: sliding_log
    rate_limit: {unit: day, requests_per_unit: 50, algorithm: sliding_log}
  - key: token_bucket
    rate_limit: {unit: day, requests_per_unit: 50, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: day, requests_per_unit: 50, algorithm: gcra}
";

/// The descriptor keys of [`EVERY_ALGORITHM`], one per algorithm.
pub const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

/// One rule per backend failure policy in the domain `policy` (the key names the policy),
/// each 5 a day (`local_rule` 2), for tests where Redis fails.
pub const POLICIES: &str = "
domain: policy
descriptors:
  - key: error_rule
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: open_rule
    on_backend_error: fail_open
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: closed_rule
    on_backend_error: fail_closed
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: local_rule
    on_backend_error: local
    rate_limit: {unit: day, requests_per_unit: 2}
";
/// The overall and per-descriptor codes, as the wire carries them.
pub const OK: i32 =
    floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code::Ok as i32;
pub const OVER_LIMIT: i32 =
    floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit as i32;

/// The version and commit the binary under test reports: Cargo's version, and git's HEAD
/// (what the build names when `FLOODGATE_COMMIT` does not say otherwise).
pub fn built_version() -> (String, String) {
    let commit = std::env::var("FLOODGATE_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty())
        .unwrap_or_else(|| {
            let output = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .expect("git runs");
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        });
    (env!("CARGO_PKG_VERSION").to_owned(), commit)
}

/// A running floodgate server.
pub struct Floodgate {
    child: Child,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// The admin API's address, when `admin_addr` is set.
    pub admin_addr: Option<SocketAddr>,
    pub rules_dir: tempfile::TempDir,
}

impl Floodgate {
    /// Starts a server on `rules` (file name, YAML) with extra `serve` flags.
    pub fn start(rules: &[(&str, &str)], flags: &[&str]) -> Floodgate {
        Self::start_with_env(rules, flags, &[])
    }

    /// [`Floodgate::start`] with extra environment variables.
    pub fn start_with_env(
        rules: &[(&str, &str)],
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> Floodgate {
        Self::start_wrapped(&[], rules, flags, env)
    }

    /// [`Floodgate::start_with_env`] with the binary run through `prefix` (a program and its
    /// arguments, e.g. `prlimit --nofile=64:64 --`).
    pub fn start_wrapped(
        prefix: &[&str],
        rules: &[(&str, &str)],
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> Floodgate {
        let rules_dir = write_rules(rules);
        let log = std::fs::File::create(rules_dir.path().join(".stderr")).expect("log file");
        let mut child = wrapped(prefix)
            .args([
                "serve",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--rules",
            ])
            .arg(rules_dir.path())
            .args(flags)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("floodgate binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("reading the startup line");
        let Some(addresses) = line.trim().strip_prefix("floodgate listening: ") else {
            let _ = child.kill();
            let _ = child.wait();
            let stderr =
                std::fs::read_to_string(rules_dir.path().join(".stderr")).unwrap_or_default();
            panic!("floodgate did not start: {line:?}\n{stderr}");
        };
        let address = |name: &str| -> SocketAddr {
            addresses
                .split_whitespace()
                .find_map(|part| part.strip_prefix(name))
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {addresses:?}"))
        };
        let admin_addr = (addresses.split_whitespace())
            .find_map(|part| part.strip_prefix("admin="))
            .and_then(|a| a.parse().ok());
        Floodgate {
            grpc_addr: address("grpc="),
            http_addr: address("http="),
            admin_addr,
            child,
            rules_dir,
        }
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.rules_dir.path().join(".stderr")).unwrap_or_default()
    }

    /// Waits (up to 10 s) until `text` is in the server's log `count` times; the log.
    pub fn wait_for_log_count(&self, text: &str, count: usize) -> String {
        let start = std::time::Instant::now();
        loop {
            let log = self.stderr();
            if log.matches(text).count() >= count {
                return log;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no {text:?} ({count}×) in the log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `text` is in the server's log; the log.
    pub fn wait_for_log(&self, text: &str) -> String {
        self.wait_for_log_count(text, 1)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The most memory the process has held so far (`VmHWM`, its peak resident set), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the process' status");
        let kib: u64 = (status.lines())
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmHWM in {status}"));
        kib * 1024
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc_addr))
            .await
            .expect("connecting to floodgate")
    }

    /// One request; panics on a gRPC error.
    pub async fn ask(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit succeeds")
            .into_inner()
    }

    /// Asks `look` (a request that counts nothing: every descriptor's `hits_addend` 0) until
    /// the backend decides it, for up to 20 s: the server's first calls open its connections
    /// and load the script, which on a busy machine may take longer than one request's wait.
    /// For a test whose subject is what comes after, not that first wait.
    pub async fn look_until_decided(&self, look: RateLimitRequest) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match self.client().await.should_rate_limit(look.clone()).await {
                Ok(_) => return,
                Err(status) if std::time::Instant::now() < deadline => {
                    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(status) => panic!("the backend never decided: {status:?}"),
            }
        }
    }

    /// One request; the gRPC error.
    pub async fn ask_err(&self, request: RateLimitRequest) -> tonic::Status {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .expect_err("ShouldRateLimit fails")
    }

    /// The value of the sample `name` (with its labels, as the page writes them) on
    /// `/metrics`; panics when there is none.
    pub fn metric(&self, name: &str) -> f64 {
        let (status, page) = self.http("GET", "/metrics", "");
        assert_eq!(status, 200, "{page}");
        page.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} on the page"))
            .parse()
            .expect("a number")
    }

    /// Waits up to 10 s for the sample `name` on `/metrics` to reach `value`, letting the
    /// runtime's other tasks (a client's connection) run meanwhile.
    pub async fn wait_for_metric(&self, name: &str, value: f64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (_, page) = self.http("GET", "/metrics", "");
            let family = name.split('{').next().unwrap_or(name);
            let found = (page.lines())
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok());
            if found.is_some_and(|found: f64| found >= value) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} is {found:?}, not {value}, after 10 s:\n{}",
                (page.lines())
                    .filter(|line| line.contains(family))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A plain HTTP/1.1 exchange with the server's HTTP port: (status, body).
    pub fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http(self.http_addr, method, path, body)
    }

    /// Sends SIGTERM and waits: the exit status and everything written to stderr.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let status = self.child.wait().expect("waiting for floodgate");
        (status, self.stderr())
    }
}

impl Drop for Floodgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the binary with `args` and `env`, expects it to refuse to start, and returns what it
/// wrote to stderr.
pub fn refused_start(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = command()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("floodgate runs");
    assert!(
        !output.status.success(),
        "floodgate started with {args:?} {env:?}"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `serve` on free loopback ports: the arguments a start that must fail is given.
pub const SERVE_ANYWHERE: [&str; 5] = [
    "serve",
    "--grpc-addr",
    "127.0.0.1:0",
    "--http-addr",
    "127.0.0.1:0",
];

/// The binary with a clean environment: no FLOODGATE_* from the caller leaks in.
pub fn command() -> Command {
    wrapped(&[])
}

/// [`command`], run through `prefix` (a program and its arguments) when there is one.
pub fn wrapped(prefix: &[&str]) -> Command {
    let mut command = match prefix.split_first() {
        Some((program, arguments)) => {
            let mut command = Command::new(program);
            command.args(arguments).arg(BINARY);
            command
        }
        None => Command::new(BINARY),
    };
    for (name, _) in std::env::vars() {
        if name.starts_with("FLOODGATE_") {
            command.env_remove(name);
        }
    }
    command.env("RUST_LOG", "warn");
    command
}

pub fn write_rules(rules: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary rules directory");
    for (name, text) in rules {
        std::fs::write(dir.path().join(name), text).expect("writing a rule file");
    }
    dir
}

pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    http_with(addr, method, path, &[], body)
}

/// [`http`] with extra request headers; `content-type: application/json` unless they name
/// another.
pub fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connecting over HTTP");
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let content_type =
        if (headers.iter()).any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
            ""
        } else {
            "content-type: application/json\r\n"
        };
    let extra: String = (headers.iter())
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{content_type}{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("writing the HTTP request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("reading the HTTP response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("an HTTP status line");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A descriptor from (key, value) pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The descriptor `key=value` with its own `hits_addend` (0 only checks).
pub fn costing(key: &str, value: &str, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(pbjson_types::UInt64Value { value: hits }),
        ..descriptor(&[(key, value)])
    }
}

/// A request for `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// Sends `per_task` copies of `req` from each of `tasks` concurrent tasks, the tasks spread
/// over `servers`; returns how many were allowed (overall code OK).
pub async fn admitted(
    servers: &[&Floodgate],
    req: &RateLimitRequest,
    tasks: usize,
    per_task: usize,
) -> usize {
    let mut clients = Vec::new();
    for server in servers {
        clients.push(server.client().await);
    }
    let mut handles = Vec::new();
    for task in 0..tasks {
        let mut client = clients[task % clients.len()].clone();
        let req = req.clone();
        handles.push(tokio::spawn(async move {
            let mut allowed = 0;
            for _ in 0..per_task {
                let response = client.should_rate_limit(req.clone()).await.expect("decision");
                if response.get_ref().overall_code
                    == floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code::Ok
                        as i32
                {
                    allowed += 1;
                }
            }
            allowed
        }));
    }
    let mut total = 0;
    for handle in handles {
        total += handle.await.expect("task");
    }
    total
}

/// A `ShouldRateLimit` call opened on a bare HTTP/2 connection, its body still to send: for
/// what no gRPC client does (hold the body back, send it late, never end it).
pub struct RawCall {
    /// The connection's task: it ends when the server closes the connection.
    pub connection: tokio::task::JoinHandle<Result<(), h2::Error>>,
    pub response: h2::client::ResponseFuture,
    pub body: h2::SendStream<bytes::Bytes>,
}

/// An RLQS stream to the floodgate at `server`: the sender its reports go on, and what the
/// server sends back.
pub async fn quota_stream(
    server: &Floodgate,
) -> (
    tokio::sync::mpsc::Sender<
        floodgate::proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports,
    >,
    tonic::Streaming<
        floodgate::proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse,
    >,
) {
    use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc_addr))
        .await
        .expect("a connection");
    let (reports, outgoing) = tokio::sync::mpsc::channel(16);
    let outgoing = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|report| (report, outgoing))
    });
    let answers = (client.stream_rate_limit_quotas(outgoing).await)
        .expect("the stream opens")
        .into_inner();
    (reports, answers)
}

/// [`quota_stream`] as an in-process stream is: what the server sends comes through a
/// channel (read on a task of its own, so a reader may stop waiting at any point), ending
/// with the status that ends the stream.
pub async fn quota_connection(server: &Floodgate) -> floodgate::quota::Connection {
    let (reports, mut incoming) = quota_stream(server).await;
    let (forward, answers) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let answer = match incoming.message().await {
                Ok(Some(answer)) => Ok(answer),
                Ok(None) => break,
                Err(status) => Err(status),
            };
            if forward.send(answer).await.is_err() {
                break;
            }
        }
    });
    (reports, answers)
}

/// Opens a [`RawCall`] to the gRPC port `addr`, with `headers` beside gRPC's own.
pub async fn raw_call(addr: SocketAddr, headers: &[(&str, &str)]) -> RawCall {
    let method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    raw_call_to(addr, method, headers).await
}

/// A [`RawCall`] of the gRPC method at `path` (`/package.Service/Method`).
pub async fn raw_call_to(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> RawCall {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.expect("a stream");
    let mut head = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        head = head.header(*name, *value);
    }
    let head = head.body(()).expect("a request");
    let (response, body) = client.send_request(head, false).expect("sent");
    RawCall {
        connection,
        response,
        body,
    }
}

/// `message` as one gRPC frame: uncompressed, its length, its bytes.
pub fn grpc_frame(message: &RateLimitRequest) -> bytes::Bytes {
    use prost::Message;
    let message = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    framed.into()
}

/// The gRPC status of a raw call's answer and its message (from its headers, or its
/// trailers after the body); `None` when the answer or the stream failed.
pub async fn grpc_status_and_message(
    response: &mut h2::client::ResponseFuture,
) -> Option<(String, String)> {
    let response = response.await.ok()?;
    let (head, mut received) = response.into_parts();
    while let Some(chunk) = received.data().await {
        let chunk = chunk.ok()?;
        let _ = received.flow_control().release_capacity(chunk.len());
    }
    let trailers = received.trailers().await.ok().flatten();
    let field = |name: &str| {
        (head.headers.get(name))
            .or_else(|| trailers.as_ref().and_then(|t| t.get(name)))
            .map(|value| value.to_str().expect("ascii").to_owned())
    };
    let message = field("grpc-message").unwrap_or_default();
    Some((field("grpc-status")?, percent_decoded(&message)))
}

/// `text` with gRPC's percent-encoding of a message undone.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%' && index + 2 < bytes.len())
            .then(|| std::str::from_utf8(&bytes[index + 1..index + 3]).ok())
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The gRPC status of a raw call's answer (its headers, or its trailers after the body);
/// `None` when the answer or the stream failed.
pub async fn grpc_status(response: &mut h2::client::ResponseFuture) -> Option<String> {
    grpc_status_and_message(response)
        .await
        .map(|(status, _)| status)
}

/// A floodgate serving gRPC on a Unix socket of its own (HTTP on a free port), killed when
/// dropped.
pub struct OnUnixSocket {
    child: Child,
    pub socket: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl OnUnixSocket {
    /// Starts one on `rules` with extra `serve` flags; returns once it listens.
    pub fn start(rules: &[(&str, &str)], flags: &[&str]) -> OnUnixSocket {
        let dir = write_rules(rules);
        let socket = dir.path().join(".grpc.sock");
        let log = std::fs::File::create(dir.path().join(".stderr")).expect("log file");
        let mut child = wrapped(&[])
            .args(["serve", "--http-addr", "127.0.0.1:0", "--rules"])
            .arg(dir.path())
            .args(flags)
            .env("FLOODGATE_GRPC_UNIX_SOCKET", &socket)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("floodgate binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("reading the startup line");
        assert!(
            line.contains(&format!("grpc=unix:{}", socket.display())),
            "floodgate did not start on its socket: {line:?}"
        );
        OnUnixSocket { child, socket, dir }
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(".stderr")).unwrap_or_default()
    }
}

impl Drop for OnUnixSocket {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `grpc.health.v1.Health/Check` for `service` on the gRPC port at `addr`: its status, or
/// the error asking for it.
pub async fn grpc_health(addr: SocketAddr, service: &str) -> Result<i32, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("the gRPC port");
    let check = tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    let answer = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(check)
        .await;
    answer.map(|answer| answer.into_inner().status)
}
