//! The load generator's HTTP/2 connections and the gRPC clients over them.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use anyhow::Context;
use arc_swap::ArcSwap;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::codegen::http::{Request, Response, Uri};

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// A gRPC client on one of the generator's connections; cloning it shares the connection.
pub type Client = RateLimitServiceClient<Http2>;

/// The generator's connections to the server, opened before any load starts so that
/// connecting is never part of a measured latency.
pub struct Connections(Vec<Http2>);

impl Connections {
    pub async fn open(addr: &str, count: usize) -> anyhow::Result<Connections> {
        // A Unix socket (`unix:/path`) is asked as grpc-go asks one: authority `localhost`.
        let (origin, socket) = match addr.strip_prefix("unix:") {
            Some(path) => (
                Uri::from_static("http://localhost"),
                Some(PathBuf::from(path)),
            ),
            None => {
                let origin = (addr.parse()).with_context(|| format!("server address {addr:?}"))?;
                (origin, None)
            }
        };
        let mut connections = Vec::with_capacity(count);
        for _ in 0..count {
            connections.push(Http2::connect(origin.clone(), socket.clone()).await?);
        }
        Ok(Connections(connections))
    }

    /// One client per connection.
    pub fn clients(&self) -> Vec<Client> {
        (self.0.iter())
            .map(|connection| {
                RateLimitServiceClient::with_origin(connection.clone(), connection.0.origin.clone())
            })
            .collect()
    }

    /// How many times so far a connection was found closed and dialed again.
    pub fn redials(&self) -> u64 {
        (self.0.iter())
            .map(|connection| connection.0.redials.load(Ordering::Relaxed))
            .sum()
    }
}

/// One bare HTTP/2 connection, shared by the requests that clone it. tonic's `Channel` would
/// put a buffer task between every request and the connection; the load generator shares
/// the machine with the server it measures, so it spends as little CPU as it can.
///
/// An overloaded server may close a connection: h2's flood guards answer a backlog of
/// unread request bodies, or many requests cancelled at their deadline, with GOAWAY
/// ENHANCE_YOUR_CALM. The requests on it fail, and the next request dials again, as a real
/// client would, rather than every later request failing at once.
#[derive(Clone)]
pub struct Http2(Arc<Link>);

struct Link {
    origin: Uri,
    /// The Unix socket dialed instead of the origin's host and port.
    socket: Option<PathBuf>,
    sender: ArcSwap<Sender>,
    /// Held while dialing again, so that a closed connection is replaced once, not by every
    /// request that finds it closed.
    redialing: tokio::sync::Mutex<()>,
    redials: AtomicU64,
}

type Sender = http2::SendRequest<tonic::body::Body>;

impl Http2 {
    async fn connect(origin: Uri, socket: Option<PathBuf>) -> anyhow::Result<Self> {
        let sender = dial(&origin, socket.as_deref()).await?;
        Ok(Http2(Arc::new(Link {
            origin,
            socket,
            sender: ArcSwap::from_pointee(sender),
            redialing: tokio::sync::Mutex::new(()),
            redials: AtomicU64::new(0),
        })))
    }
}

impl Link {
    /// The connection's sender, dialed again first if the server has closed it.
    async fn sender(&self) -> Result<Sender, tonic::ConnectError> {
        let current = self.sender.load();
        if !current.is_closed() {
            return Ok(Sender::clone(&current));
        }
        let _redialing = self.redialing.lock().await;
        let current = self.sender.load();
        if !current.is_closed() {
            // Another request dialed while this one waited.
            return Ok(Sender::clone(&current));
        }
        let fresh = dial(&self.origin, self.socket.as_deref())
            .await
            .map_err(|error| tonic::ConnectError(error.into()))?;
        self.sender.store(Arc::new(fresh.clone()));
        self.redials.fetch_add(1, Ordering::Relaxed);
        Ok(fresh)
    }
}

/// Abandoned streams a connection remembers (h2's default is 10).
const ABANDONED_STREAMS_REMEMBERED: usize = 100_000;

async fn dial(origin: &Uri, socket: Option<&Path>) -> anyhow::Result<Sender> {
    if let Some(path) = socket {
        let unix = tokio::net::UnixStream::connect(path)
            .await
            .with_context(|| format!("connecting to unix:{}", path.display()))?;
        return handshake(unix, origin).await;
    }
    let authority = origin
        .authority()
        .with_context(|| format!("server address {origin} has no host:port"))?;
    let tcp = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .with_context(|| format!("connecting to {origin}"))?;
    tcp.set_nodelay(true)?;
    handshake(tcp, origin).await
}

/// HTTP/2 over `io`, its connection driven by a task of its own.
async fn handshake<IO>(io: IO, origin: &Uri) -> anyhow::Result<Sender>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        // A request past its deadline is abandoned (RST_STREAM), and the server's late answer
        // to it is no attack: remember many such streams so their frames are dropped quietly,
        // and never close the connection over them (h2's default would after 1,024).
        .max_concurrent_reset_streams(ABANDONED_STREAMS_REMEMBERED)
        .max_local_error_reset_streams(None)
        .handshake(TokioIo::new(io))
        .await
        .with_context(|| format!("HTTP/2 handshake with {origin}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// A failed dial is a [`tonic::ConnectError`], which tonic answers as UNAVAILABLE.
type Error = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Request<tonic::body::Body>> for Http2 {
    type Response = Response<hyper::body::Incoming>;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Error>> + Send>>;

    /// Always ready: whether the connection still is, each request finds out when sent.
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        let link = self.0.clone();
        Box::pin(async move {
            let mut sender = link.sender().await?;
            Ok(sender.send_request(request).await?)
        })
    }
}
