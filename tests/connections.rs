//! Clients that hold a connection without using it, against the real binary: a connection
//! that never speaks, headers or a body that never end (HTTP and gRPC), an idle keep-alive
//! connection; the
//! HTTP/2 stream limit both ports advertise; and a process at its descriptor limit: silent
//! connections make room for a new client at once, and connections past their handshake
//! are left alone (the process serves again once they leave).

mod harness;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use harness::Floodgate;

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5}\n";

/// Tight bounds, so that each is reached within a test.
const LIMITS: [(&str, &str); 4] = [
    ("FLOODGATE_CONNECTION_LIMITS__HANDSHAKE_TIMEOUT_MS", "300"),
    ("FLOODGATE_CONNECTION_LIMITS__IDLE_TIMEOUT_MS", "600"),
    ("FLOODGATE_CONNECTION_LIMITS__REQUEST_TIMEOUT_MS", "400"),
    ("FLOODGATE_CONNECTION_LIMITS__MAX_CONCURRENT_STREAMS", "77"),
];

fn start() -> Floodgate {
    Floodgate::start_with_env(&[("d.yaml", RULES)], &[], &LIMITS)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    // The test's own bound on every wait: far past the server's.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
}

/// Reads until the server closes the connection; what it sent.
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return received,
            Err(e) => panic!("the server kept the connection open: {e}"),
        }
    }
}

#[test]
fn a_connection_that_never_speaks_is_closed_on_both_ports() {
    let server = start();
    // gRPC's server sends its SETTINGS at once; HTTP waits to see which protocol comes.
    // Either way the server closes the connection.
    read_until_closed(&mut connect(server.grpc_addr));
    assert_eq!(read_until_closed(&mut connect(server.http_addr)), b"");
    // And the ports still serve.
    assert_eq!(server.http("GET", "/healthz", "").0, 200);
}

#[test]
fn http_headers_that_never_end_are_cut() {
    let server = start();
    let mut slow = connect(server.http_addr);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: floodgate\r\nx-slow: ")
        .expect("write");
    let answer = String::from_utf8_lossy(&read_until_closed(&mut slow)).into_owned();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
}

#[test]
fn a_json_body_that_never_ends_gets_408() {
    let server = start();
    let mut slow = connect(server.http_addr);
    slow.write_all(
        b"POST /json HTTP/1.1\r\nhost: floodgate\r\ncontent-type: application/json\r\n\
          transfer-encoding: chunked\r\n\r\n5\r\n{\"dom\r\n",
    )
    .expect("write");
    let answer = String::from_utf8_lossy(&read_until_closed(&mut slow)).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout_ms"), "{answer}");
}

#[tokio::test]
async fn a_grpc_request_whose_body_never_ends_is_cancelled() {
    let server = start();
    let mut call = harness::raw_call(server.grpc_addr, &[]).await;
    // A gRPC message that announces 100 bytes and brings 3; the stream stays open.
    (call.body)
        .send_data(
            bytes::Bytes::from_static(&[0, 0, 0, 0, 100, 1, 2, 3]),
            false,
        )
        .expect("data");
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        harness::grpc_status(&mut call.response),
    )
    .await
    .expect("answered within the request timeout, not the test's bound");
    let cancelled = (tonic::Code::Cancelled as i32).to_string();
    assert_eq!(answer, Some(cancelled));
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = start();
    let mut client = connect(server.http_addr);
    client
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: floodgate\r\n\r\n")
        .expect("write");
    let mut buf = [0; 1024];
    let read = client.read(&mut buf).expect("the answer");
    assert!(buf[..read].starts_with(b"HTTP/1.1 200"));
    // Kept alive, then silent: closed by the server.
    assert_eq!(read_until_closed(&mut client), b"");
}

/// An HTTP/2 client's preface: a connection's whole handshake, as the server counts it.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The settings a server sends first on an HTTP/2 connection (prior knowledge, no TLS).
fn http2_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut client = connect(addr);
    client.write_all(PREFACE).expect("preface");
    // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
    client
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .expect("settings");
    let mut header = [0; 9];
    client.read_exact(&mut header).expect("a frame");
    assert_eq!(header[3], 4, "the server's first frame is SETTINGS");
    let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    let mut payload = vec![0; length];
    client.read_exact(&mut payload).expect("its payload");
    payload
        .chunks(6)
        .map(|entry| {
            let id = u16::from_be_bytes([entry[0], entry[1]]);
            let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
            (id, value)
        })
        .collect()
}

#[test]
fn both_ports_advertise_the_stream_limit() {
    const MAX_CONCURRENT_STREAMS: u16 = 3;
    let server = start();
    for addr in [server.grpc_addr, server.http_addr] {
        let settings = http2_settings(addr);
        assert!(
            settings.contains(&(MAX_CONCURRENT_STREAMS, 77)),
            "{addr}: {settings:?}"
        );
    }
}

/// An HTTP/2 connection whose handshake the server has read, open until closed or dropped.
struct Handshaken {
    pings: h2::PingPong,
    /// Drives the connection; aborted, it closes it.
    connection: tokio::task::JoinHandle<()>,
}

impl Handshaken {
    /// A connection to `addr` once the server answers its ping, within a second; `None`
    /// when it does not: the server is at its descriptor limit, and the connection waits
    /// in the listen backlog.
    async fn open(addr: SocketAddr) -> Option<Handshaken> {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let answered = tokio::time::timeout(Duration::from_secs(1), async {
            let (client, mut connection) = h2::client::handshake(tcp).await.ok()?;
            let pings = connection.ping_pong()?;
            let connection = tokio::spawn(async move {
                // The client's handle keeps the connection open while it runs.
                let _client = client;
                let _ = connection.await;
            });
            let mut open = Handshaken { pings, connection };
            open.pings.ping(h2::Ping::opaque()).await.ok()?;
            Some(open)
        });
        answered.await.ok().flatten()
    }

    /// Closes the connection, and returns once it is closed.
    async fn close(mut self) {
        self.connection.abort();
        let _ = (&mut self.connection).await;
    }
}

impl Drop for Handshaken {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

#[tokio::test]
async fn a_server_at_its_descriptor_limit_serves_again_once_clients_leave() {
    // The hard limit is the soft one floodgate raises to: 64 descriptors in all.
    let server = Floodgate::start_wrapped(
        &["prlimit", "--nofile=64:64", "--"],
        &[("d.yaml", RULES)],
        &[],
        &[("FLOODGATE_CONNECTION_LIMITS__HANDSHAKE_TIMEOUT_MS", "60000")],
    );
    // Connections past their handshake, then idle, until the server accepts no more. None
    // of them may be closed to make room: the server waits for clients to leave.
    let mut hogs = Vec::new();
    while let Some(hog) = Handshaken::open(server.grpc_addr).await {
        hogs.push(hog);
        assert!(
            hogs.len() < 64,
            "the server accepts past its descriptor limit"
        );
    }
    let log = server.wait_for_log("accepting a connection failed");
    assert!(log.contains("Too many open files"), "{log}");
    for hog in &mut hogs {
        let pong = tokio::time::timeout(Duration::from_secs(5), hog.pings.ping(h2::Ping::opaque()));
        pong.await
            .expect("a pong in time")
            .expect("the connection is still open");
    }
    for hog in hogs {
        hog.close().await;
    }
    // The descriptors are back: a new client is answered.
    assert_eq!(server.http("GET", "/healthz", "").0, 200);
    let log = server.stderr();
    let grpc_failures = log
        .lines()
        .filter(|line| line.contains("accepting a connection failed") && line.contains("grpc"))
        .count();
    assert_eq!(
        grpc_failures, 1,
        "one line per series of failures, not one per retry:\n{log}"
    );
}

#[tokio::test]
async fn silent_connections_make_room_for_a_new_client_and_handshaken_ones_stay() {
    // The handshake timeout frees nothing within the test: only making room can.
    let server = Floodgate::start_wrapped(
        &["prlimit", "--nofile=256:256", "--"],
        &[("d.yaml", RULES)],
        &[],
        &[("FLOODGATE_CONNECTION_LIMITS__HANDSHAKE_TIMEOUT_MS", "30000")],
    );
    // The oldest connection: past its handshake, then idle.
    let mut handshaken = Handshaken::open(server.grpc_addr)
        .await
        .expect("a connection past its handshake");
    // More silent connections than the server has descriptors.
    let _silent: Vec<TcpStream> = (0..300).map(|_| connect(server.grpc_addr)).collect();
    server.wait_for_log("accepting a connection failed");

    let request = harness::request("d", vec![harness::descriptor(&[("k", "v")])]);
    let answer = tokio::time::timeout(Duration::from_secs(5), server.ask(request))
        .await
        .expect("a decision within 5 s, long before a handshake timeout frees anything");
    assert_eq!(answer.overall_code, harness::OK);
    assert!(server.stderr().contains("to make room"));
    handshaken
        .pings
        .ping(h2::Ping::opaque())
        .await
        .expect("the connection past its handshake is still open");
}

#[tokio::test]
async fn at_max_connections_a_new_client_waits_until_one_leaves_and_silent_ones_make_room() {
    let server = Floodgate::start_with_env(
        &[("d.yaml", RULES)],
        &[],
        &[
            ("FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTIONS", "8"),
            ("FLOODGATE_CONNECTION_LIMITS__HANDSHAKE_TIMEOUT_MS", "60000"),
        ],
    );
    // Seven connections past their handshake, and one that never speaks.
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(Handshaken::open(server.grpc_addr).await.expect("room"));
    }
    let silent = connect(server.grpc_addr);
    // The silent one is closed to make room for the next client (once 100 ms old).
    held.push(
        Handshaken::open(server.grpc_addr)
            .await
            .expect("room made from the silent connection"),
    );
    // (It got the server's SETTINGS, then was closed.)
    read_until_closed(&mut { silent });
    // Eight past their handshake: the next waits until one leaves. The HTTP port counts
    // its own, so health checks are still answered.
    assert!(Handshaken::open(server.grpc_addr).await.is_none());
    let log = server.wait_for_log("holding connection_limits.max_connections (8)");
    assert!(log.contains("to make room"), "{log}");
    assert_eq!(server.http("GET", "/healthz", "").0, 200);
    held.pop().expect("one").close().await;
    let answered = Handshaken::open(server.grpc_addr).await;
    assert!(answered.is_some(), "a client is served once one left");
    for connection in &mut held {
        connection
            .pings
            .ping(h2::Ping::opaque())
            .await
            .expect("the connections past their handshake stay open");
    }
}

#[test]
fn http_bodies_that_never_end_share_the_budget_and_past_it_some_are_cut() {
    // Default limits: the request timeout (10 s) does not end them first.
    let server = Floodgate::start(&[("d.yaml", RULES)], &[]);
    // Each announces 2 MB of JSON and sends 1 MB of it (whitespace); 40 of them are past
    // the 32 MiB the server holds for unfinished requests.
    let head = "POST /json HTTP/1.1\r\nhost: floodgate\r\ncontent-length: 2000000\r\n\r\n";
    let filler = vec![b' '; 1 << 20];
    let clients: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut client = connect(server.http_addr);
            client.write_all(head.as_bytes()).expect("head");
            client.write_all(&filler).expect("body");
            client
        })
        .collect();
    // Which are cut depends on how much each held when room was needed (the largest go
    // first); the first answer to come is a cut, told why, long before the request timeout
    // would answer the others.
    let (answers, answered) = std::sync::mpsc::channel();
    for mut client in clients {
        let answers = answers.clone();
        std::thread::spawn(move || {
            let answer = String::from_utf8_lossy(&read_until_closed(&mut client)).into_owned();
            let _ = answers.send(answer);
        });
    }
    let answer = answered
        .recv_timeout(Duration::from_secs(5))
        .expect("a request cut within 5 s");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("max_request_bytes_held"), "{answer}");
    // A well-behaved request is answered meanwhile.
    assert_eq!(server.http("GET", "/healthz", "").0, 200);
}

#[test]
fn a_budget_too_small_for_the_largest_call_is_refused_at_start() {
    let rules = harness::write_rules(&[("d.yaml", RULES)]);
    let mut args = harness::SERVE_ANYWHERE.to_vec();
    args.extend(["--rules", rules.path().to_str().expect("a path")]);
    let stderr = harness::refused_start(
        &args,
        &[(
            "FLOODGATE_CONNECTION_LIMITS__MAX_REQUEST_BYTES_HELD",
            "1000000",
        )],
    );
    assert!(
        stderr.contains("connection_limits.max_request_bytes_held (1000000) must be at least"),
        "{stderr}"
    );
}
