//! Clients that try to make the server hold memory, on bare HTTP/2 connections: request
//! bodies announced large and never finished, many streams, many connections. Each load is
//! held open until dropped, and sends only what the server's flow control lets it, so the
//! test process itself stays small.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

/// `ShouldRateLimit`'s path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// RLQS' stream's path.
pub const RLQS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// What a client sends as filler: zeros, never allocated per send.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// A load in progress: its connections and streams stay open until it is dropped.
pub struct Held {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    answers: Answers,
    calls: usize,
}

/// The gRPC status of each call the server answered (`None`: its stream was reset).
type Answers = std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>;

impl Held {
    /// How many calls the load opened.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// The statuses the server answered the load's calls with so far.
    pub fn answers(&self) -> Vec<Option<String>> {
        self.answers.lock().unwrap().clone()
    }

    /// How many of the load's streams and connections are still working (not yet ended).
    pub fn running(&self) -> usize {
        self.tasks.iter().filter(|task| !task.is_finished()).count()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Calls that never finish their request body.
#[derive(Debug, Clone, Copy)]
pub struct Unfinished {
    /// The method called (`/package.Service/Method`).
    pub path: &'static str,
    pub connections: usize,
    /// Calls opened on each connection, as many as the server's stream limit admits.
    pub streams: usize,
    /// The message length each call's gRPC header announces.
    pub announce: u32,
    /// The bytes of it each call sends, as fast as flow control lets it.
    pub send: usize,
    /// A header of about this many bytes on each call (`x-pad`), beside gRPC's own.
    pub header_bytes: usize,
}

/// Starts `load` against `addr`; returns once every connection is open and its calls
/// started.
pub async fn unfinished(addr: SocketAddr, load: Unfinished) -> Held {
    let Unfinished {
        path,
        connections,
        streams,
        announce,
        send,
        header_bytes,
    } = load;
    let pad = "p".repeat(header_bytes);
    let mut tasks = Vec::new();
    let mut connector = Connector::default();
    let answers = Answers::default();
    // Connections opened: a task each, beside their calls'.
    let mut opened = 0;
    for _ in 0..connections {
        let Some(tcp) = connector.connect(addr).await else {
            break;
        };
        let handshake = tokio::time::timeout(Duration::from_secs(1), h2::client::handshake(tcp));
        let Ok(Ok((client, connection))) = handshake.await else {
            continue;
        };
        opened += 1;
        tasks.push(tokio::spawn(async move {
            let _ = connection.await;
        }));
        let mut client = client;
        for _ in 0..streams {
            // Waits while the connection is at the server's stream limit; past it, the
            // load has as many streams as the server admits.
            let ready = tokio::time::timeout(Duration::from_millis(200), client.clone().ready());
            let Ok(Ok(ready)) = ready.await else {
                break;
            };
            client = ready;
            let head = http::Request::post(format!("http://{addr}{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .header("x-pad", pad.as_str())
                .body(())
                .expect("a request");
            let Ok((response, body)) = client.send_request(head, false) else {
                break;
            };
            let answers = answers.clone();
            tasks.push(tokio::spawn(async move {
                let answered = async move {
                    let mut response = response;
                    let status = super::grpc_status(&mut response).await;
                    answers.lock().unwrap().push(status);
                };
                // Never finish the body: hold the stream until the load is dropped or
                // the server answers.
                let sending = async {
                    send_slowly(body, announce, send).await;
                    std::future::pending::<()>().await;
                };
                tokio::join!(answered, sending);
            }));
        }
    }
    let calls = tasks.len() - opened;
    Held {
        tasks,
        answers,
        calls,
    }
}

/// Connections to `addr`, one at a time: `None` once three in a row were not taken within
/// 1.5 s (past the server's connection limit its listen queue fills, and the kernel stops
/// answering; a single one may also wait for a dropped SYN to be sent again, after 1 s).
#[derive(Default)]
struct Connector {
    refused: usize,
}

impl Connector {
    async fn connect(&mut self, addr: SocketAddr) -> Option<tokio::net::TcpStream> {
        while self.refused < 3 {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(1500), connect).await {
                Ok(Ok(tcp)) => {
                    self.refused = 0;
                    return Some(tcp);
                }
                _ => self.refused += 1,
            }
        }
        None
    }
}

/// Sends a gRPC message header announcing `announce` bytes, then `send` bytes of filler, each
/// piece only once the server's flow control has room for it.
async fn send_slowly(mut body: h2::SendStream<Bytes>, announce: u32, send: usize) {
    let mut header = vec![0u8];
    header.extend_from_slice(&announce.to_be_bytes());
    if body.send_data(header.into(), false).is_err() {
        return;
    }
    let mut left = send;
    while left > 0 {
        body.reserve_capacity(left.min(ZEROS.len()));
        let Some(Ok(room)) = poll_fn(|cx| body.poll_capacity(cx)).await else {
            return;
        };
        let piece = room.min(left).min(ZEROS.len());
        if piece == 0 {
            continue;
        }
        if body
            .send_data(Bytes::from_static(&ZEROS[..piece]), false)
            .is_err()
        {
            return;
        }
        left -= piece;
    }
}

/// Opens `connections` HTTP/2 connections to `addr` and leaves them idle once their
/// handshake is sent (each answers the server's pings, as a live client would). Returns
/// once all are opened, whether or not the server has taken them yet.
pub async fn idle_connections(addr: SocketAddr, connections: usize) -> Held {
    let mut tasks = Vec::new();
    let mut connector = Connector::default();
    for _ in 0..connections {
        // Past the server's connection limit and a full listen queue, a connection is not
        // even accepted by the kernel: the load stops there.
        let Some(tcp) = connector.connect(addr).await else {
            break;
        };
        tasks.push(tokio::spawn(async move {
            let Ok((client, connection)) = h2::client::handshake(tcp).await else {
                return;
            };
            let _client = client;
            let _ = connection.await;
        }));
    }
    Held {
        tasks,
        answers: Answers::default(),
        calls: 0,
    }
}

/// Opens `connections` HTTP/1.1 connections to `addr`, each posting a JSON body announced at
/// 2 MB, sending `send` bytes of it (whitespace) and never the rest.
pub async fn unfinished_json(addr: SocketAddr, connections: usize, send: usize) -> Held {
    use tokio::io::AsyncWriteExt;
    let head = "POST /json HTTP/1.1\r\nhost: floodgate\r\ncontent-length: 2000000\r\n\r\n";
    let mut tasks = Vec::new();
    let mut connector = Connector::default();
    for _ in 0..connections {
        let Some(mut tcp) = connector.connect(addr).await else {
            break;
        };
        tasks.push(tokio::spawn(async move {
            let _ = tcp.write_all(head.as_bytes()).await;
            let mut left = send;
            while left > 0 {
                let piece = left.min(SPACES.len());
                if tcp.write_all(&SPACES[..piece]).await.is_err() {
                    return;
                }
                left -= piece;
            }
            // Hold the connection (and read nothing) until the load is dropped.
            std::future::pending::<()>().await;
        }));
    }
    let calls = tasks.len();
    Held {
        tasks,
        answers: Answers::default(),
        calls,
    }
}

/// What a JSON body is filled with: whitespace.
static SPACES: [u8; 64 << 10] = [b' '; 64 << 10];
