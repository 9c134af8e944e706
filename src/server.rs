//! The server's lifecycle: bind the listeners, serve gRPC (rate limit, health, reflection),
//! HTTP and, when asked, the metrics and admin ports; probe a failing backend (and, with
//! `readiness_follows_backend`, keep health in line with it); on shutdown turn health
//! NOT_SERVING, let in-flight requests finish within the grace period, then stop.
//!
//! Both ports hold their clients to [`ConnectionLimits`]: the handshake and idle timeouts of
//! every accepted connection (`listener.rs`), HTTP/2 keep-alive pings and a stream limit,
//! HTTP/1's header timeout, and a bound on each request's time, body included. The gRPC
//! port may listen on a Unix socket, serve TLS (`tls.rs`), and retire old connections
//! (`max_connection_age_ms`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::edge::grpc::{CallDeadline, GrpcService, StampArrival};
use crate::edge::grpc_body::{
    HeldBytes, LimitBodies, MAX_REPORT_BYTES, MessageLimits, check_budget, plain_body,
};
use crate::edge::grpc_conn::{self, Http2Limits};
pub use crate::edge::http::Readiness;
use crate::edge::http::{self, HttpState};
use crate::edge::listener::{Acceptor, Connections, Handshaking, Timeouts, next_until};
use crate::edge::rlqs::{QuotaGrpc, RateLimitQuotaServiceServer};
use crate::edge::socket::Listener;
use crate::edge::tls::ServerTls;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::quota::QuotaService;
use crate::service::RateLimiter;
use crate::settings::ConnectionLimits;
use crate::settings::Password;

/// Where and how the gRPC port listens.
pub struct GrpcEndpoint {
    pub addr: SocketAddr,
    /// Serve on this Unix socket instead of `addr`.
    pub unix_socket: Option<PathBuf>,
    /// Serve over TLS only.
    pub tls: Option<Arc<ServerTls>>,
}

/// Where and how the admin API listens, and what it requires of a client.
pub struct AdminEndpoint {
    pub addr: SocketAddr,
    /// The bearer token every request must carry; `None` where mutual TLS stands in for it.
    pub token: Option<Password>,
    /// Serve over TLS only (mutual TLS when it names a client CA).
    pub tls: Option<Arc<ServerTls>>,
}

/// Where a listener is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for BoundAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoundAddr::Tcp(addr) => write!(f, "{addr}"),
            BoundAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl BoundAddr {
    /// The address a gRPC client is given for this listener: `unix:/path` for a socket,
    /// `https://` under TLS, else `http://`.
    pub fn client_address(&self, tls: bool) -> String {
        match self {
            BoundAddr::Unix(path) => format!("unix:{}", path.display()),
            BoundAddr::Tcp(addr) if tls => format!("https://{addr}"),
            BoundAddr::Tcp(addr) => format!("http://{addr}"),
        }
    }
}

/// Where the server listens.
pub struct Endpoints {
    pub grpc: GrpcEndpoint,
    pub http: SocketAddr,
    /// `/metrics` alone, besides the HTTP port (envoyproxy/ratelimit's Prometheus port).
    pub metrics: Option<SocketAddr>,
    /// The admin API.
    pub admin: Option<AdminEndpoint>,
}

/// A server that is accepting requests.
pub struct RunningServer {
    pub grpc_addr: BoundAddr,
    pub http_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub admin_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    tasks: JoinHandle<()>,
    watcher: JoinHandle<()>,
}

/// How often the backend's health is looked at (and an open circuit probed).
const HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// Why the server did not start, or stopped other than asked.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The settings cannot hold what they promise (`connection_limits`).
    #[error("{0}")]
    Settings(String),
    /// An address or socket could not be bound.
    #[error("binding {what}")]
    Bind {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The reflection service could not be built from the descriptors.
    #[error("building the {0} reflection service: {1}")]
    Reflection(&'static str, String),
    /// The task serving the ports ended by a panic or was cancelled.
    #[error("the server task")]
    Task(#[from] tokio::task::JoinError),
}

/// Binds the `endpoints` (port 0 picks a free port) and starts serving, each connection
/// held to `limits`, ready as `readiness` says.
pub async fn start(
    limiter: Arc<RateLimiter>,
    endpoints: Endpoints,
    limits: ConnectionLimits,
    readiness: Readiness,
) -> Result<RunningServer, ServerError> {
    check_budget(&limits, limiter.request_limits()).map_err(ServerError::Settings)?;
    let listeners = Listeners::bind(endpoints).await?;
    let (stop, stopped) = watch::channel(false);
    let (health, routes) = grpc_services(&limiter, stopped.clone()).await?;
    if !starts_ready(&limiter, readiness) {
        set_health(&health, tonic_health::ServingStatus::NotServing).await;
    }
    let ready = Arc::new(AtomicBool::new(true));
    let watcher = tokio::spawn(watch_backend(limiter.clone(), health.clone(), readiness));
    let state = HttpState {
        limiter,
        ready: ready.clone(),
        readiness,
    };
    let ports = Ports::new(limits, stopped);
    Ok(RunningServer {
        grpc_addr: listeners.grpc_addr.clone(),
        http_addr: listeners.http.addr,
        metrics_addr: (listeners.metrics.as_ref()).map(|metrics| metrics.addr),
        admin_addr: (listeners.admin.as_ref()).map(|(admin, _)| admin.addr),
        tasks: tokio::spawn(ports.serve(listeners, routes, state)),
        stop,
        ready,
        health,
        watcher,
    })
}

/// The listeners of [`Endpoints`], bound.
struct Listeners {
    grpc: Listener,
    grpc_addr: BoundAddr,
    grpc_tls: Option<Arc<ServerTls>>,
    http: Bound,
    metrics: Option<Bound>,
    admin: Option<(Bound, AdminEndpoint)>,
}

/// A TCP listener and the address it is bound to (port 0 resolved).
struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Listeners {
    /// Binds gRPC, HTTP, metrics and admin, in that order; an error names the address.
    async fn bind(endpoints: Endpoints) -> Result<Self, ServerError> {
        let Endpoints {
            grpc,
            http,
            metrics,
            admin,
        } = endpoints;
        let (grpc_listener, grpc_addr) = match &grpc.unix_socket {
            Some(path) => {
                let listener =
                    (Listener::bind_unix(path).await).map_err(|source| ServerError::Bind {
                        what: format!("the gRPC socket {}", path.display()),
                        source,
                    })?;
                (listener, BoundAddr::Unix(path.clone()))
            }
            None => {
                let Bound { listener, addr } = bind_tcp("gRPC", grpc.addr).await?;
                (Listener::Tcp(listener), BoundAddr::Tcp(addr))
            }
        };
        let http = bind_tcp("HTTP", http).await?;
        let metrics = match metrics {
            Some(addr) => Some(bind_tcp("metrics", addr).await?),
            None => None,
        };
        let admin = match admin {
            Some(endpoint) => Some((bind_tcp("admin", endpoint.addr).await?, endpoint)),
            None => None,
        };
        Ok(Listeners {
            grpc: grpc_listener,
            grpc_addr,
            grpc_tls: grpc.tls,
            http,
            metrics,
            admin,
        })
    }
}

/// Binds `addr`, the `port`'s address, and resolves it.
async fn bind_tcp(port: &str, addr: SocketAddr) -> Result<Bound, ServerError> {
    let bind = |source| ServerError::Bind {
        what: format!("the {port} address {addr}"),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind)?;
    let addr = listener.local_addr().map_err(bind)?;
    Ok(Bound { listener, addr })
}

/// The gRPC port's services: health (SERVING from the start), reflection, and rate limits
/// from `limiter`, per request and as quota streams (which end when `stopped` says so);
/// with the reporter that turns health on and off.
async fn grpc_services(
    limiter: &Arc<RateLimiter>,
    stopped: watch::Receiver<bool>,
) -> Result<(tonic_health::server::HealthReporter, tonic::service::Routes), ServerError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<GrpcService>>()
        .await;
    health
        .set_serving::<RateLimitQuotaServiceServer<QuotaGrpc>>()
        .await;
    (health.set_service_status(UPSTREAM_HEALTH_NAME, tonic_health::ServingStatus::Serving)).await;
    // Both versions, as grpc-go registers them: grpcio-reflection's client and several GUI
    // clients speak only v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = (reflection().build_v1())
        .map_err(|error| ServerError::Reflection("v1", error.to_string()))?;
    let reflection_v1alpha = (reflection().build_v1alpha())
        .map_err(|error| ServerError::Reflection("v1alpha", error.to_string()))?;
    let routes = tonic::service::Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            RateLimitServiceServer::new(GrpcService(limiter.clone()))
                .max_decoding_message_size(limiter.request_limits().largest_request_bytes()),
        )
        .add_service(
            RateLimitQuotaServiceServer::new(QuotaGrpc::new(QuotaService::new(
                limiter.clone(),
                stopped,
            )))
            .max_decoding_message_size(MAX_REPORT_BYTES),
        )
        .prepare();
    Ok((health, routes))
}

/// What every port's connections share: their limits, the signal to stop, the
/// connections still in their handshake (at the descriptor limit, any port makes room from
/// all of them), and the budget of the requests waiting for the rest of their body.
struct Ports {
    limits: ConnectionLimits,
    timeouts: Timeouts,
    handshaking: Handshaking,
    held: Arc<HeldBytes>,
    stopped: watch::Receiver<bool>,
}

impl Ports {
    /// Ports held to `limits` that stop when `stopped` says so.
    fn new(limits: ConnectionLimits, stopped: watch::Receiver<bool>) -> Self {
        let timeouts = Timeouts {
            handshake: millis(limits.handshake_timeout_ms),
            idle: millis(limits.idle_timeout_ms),
        };
        Ports {
            limits,
            timeouts,
            handshaking: Handshaking::default(),
            held: Arc::new(HeldBytes::new(limits.max_request_bytes_held)),
            stopped,
        }
    }

    /// Serves gRPC `routes` and the HTTP, metrics and admin routers over `state` on their
    /// `listeners`; the future ends once every port has stopped.
    fn serve(
        self,
        listeners: Listeners,
        routes: tonic::service::Routes,
        state: HttpState,
    ) -> impl Future<Output = ()> + Send + 'static {
        let limits = self.limits;
        let service = StampArrival(CallDeadline {
            inner: LimitBodies {
                inner: routes,
                limits: Arc::new(MessageLimits::new(state.limiter.request_limits())),
                held: self.held.clone(),
            },
            request_timeout: millis(limits.request_timeout_ms),
        });
        let grpc = grpc_conn::serve(
            self.incoming("grpc", listeners.grpc, listeners.grpc_tls),
            service,
            http2_limits(&limits),
            wait_for_stop(self.stopped.clone()),
        );
        let metrics = listeners.metrics.map(|metrics| {
            serve_http(
                self.incoming("metrics", metrics.listener, None),
                http::metrics_router(state.clone()),
                limits,
                self.held.clone(),
                wait_for_stop(self.stopped.clone()),
            )
        });
        let admin = listeners.admin.map(|(admin, endpoint)| {
            serve_http(
                self.incoming("admin", admin.listener, endpoint.tls),
                crate::edge::admin::router(state.limiter.clone(), endpoint.token),
                limits,
                self.held.clone(),
                wait_for_stop(self.stopped.clone()),
            )
        });
        let http = serve_http(
            self.incoming("http", listeners.http.listener, None),
            http::router(state),
            limits,
            self.held.clone(),
            wait_for_stop(self.stopped),
        );
        async move {
            let metrics = async {
                if let Some(metrics) = metrics {
                    metrics.await;
                }
            };
            let admin = async {
                if let Some(admin) = admin {
                    admin.await;
                }
            };
            tokio::join!(grpc, http, metrics, admin);
        }
    }

    /// The connections the `port`'s `listener` accepts, over TLS where `tls` is set.
    fn incoming(
        &self,
        port: &'static str,
        listener: impl Into<Listener>,
        tls: Option<Arc<ServerTls>>,
    ) -> Connections {
        let acceptor = Acceptor::new(port, listener, self.timeouts, self.handshaking.clone())
            .at_most(self.limits.max_connections);
        incoming(acceptor, tls, self.timeouts.handshake)
    }
}

/// The gRPC port's HTTP/2 limits: a connection age of 0 (or its grace) means none.
fn http2_limits(limits: &ConnectionLimits) -> Http2Limits {
    Http2Limits {
        max_concurrent_streams: limits.max_concurrent_streams,
        keepalive: millis(limits.keepalive_interval_ms),
        max_age: (limits.max_connection_age_ms > 0).then(|| millis(limits.max_connection_age_ms)),
        max_age_grace: (limits.max_connection_age_grace_ms > 0)
            .then(|| millis(limits.max_connection_age_grace_ms)),
    }
}

/// The connections `acceptor` accepts, after a TLS handshake within `handshake` where `tls`
/// is set (whose files are then watched for rotation).
fn incoming(acceptor: Acceptor, tls: Option<Arc<ServerTls>>, handshake: Duration) -> Connections {
    match tls {
        Some(tls) => {
            tls.spawn_reloader();
            Box::pin(tls.incoming(acceptor, handshake))
        }
        None => Box::pin(acceptor),
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The most an HTTP/1 connection's read buffer grows to: a request's headers must fit in it
/// (16 KiB, as HTTP/2's header list limit).
const HTTP1_READ_BUFFER: usize = 16 << 10;

/// Serves HTTP/1 and HTTP/2 on `incoming` until `stopped`, then closes the listener and lets
/// open connections finish their requests.
async fn serve_http(
    mut incoming: Connections,
    router: Router,
    limits: ConnectionLimits,
    held: Arc<HeldBytes>,
    stopped: impl Future<Output = ()>,
) {
    let keepalive = millis(limits.keepalive_interval_ms);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(millis(limits.handshake_timeout_ms))
        // A connection's read buffer (hyper's default grows to about 400 KB): a body streams
        // through it, so more only costs memory a connection at a time.
        .max_buf_size(HTTP1_READ_BUFFER);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .keep_alive_interval(keepalive)
        .keep_alive_timeout(keepalive);
    let request_timeout = millis(limits.request_timeout_ms);
    let graceful = GracefulShutdown::new();
    let mut stopped = pin!(stopped);
    loop {
        let Some(io) = next_until(&mut incoming, stopped.as_mut(), "HTTP").await else {
            break;
        };
        let (router, held) = (router.clone(), held.clone());
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let mut router = router.clone();
            let request = plain_body(request, &held).map(axum::body::Body::new);
            async move {
                let answer = tokio::time::timeout(
                    request_timeout,
                    tower::Service::call(&mut router, request),
                );
                Ok::<_, Infallible>(match answer.await {
                    Ok(Ok(response)) => response,
                    Err(_) => (
                        axum::http::StatusCode::REQUEST_TIMEOUT,
                        "the request took longer than connection_limits.request_timeout_ms\n",
                    )
                        .into_response(),
                    Ok(Err(never)) => match never {},
                })
            }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("HTTP connection closed: {error}");
            }
        });
    }
    drop(incoming);
    graceful.shutdown().await;
}

/// Probes an open circuit so the backend's recovery needs no traffic, logs the backend's
/// changes, and turns health NOT_SERVING while `readiness` says the server is not ready
/// (the backend failing, with `follows_backend`; no rule loaded, with `needs_rules`) and
/// SERVING once it is.
async fn watch_backend(
    limiter: Arc<RateLimiter>,
    health: tonic_health::server::HealthReporter,
    readiness: Readiness,
) {
    let mut healthy = true;
    // As `start` set it.
    let mut serving = starts_ready(&limiter, readiness);
    let mut ticks = tokio::time::interval(HEALTH_INTERVAL);
    loop {
        ticks.tick().await;
        let backend = limiter.backend();
        backend.probe_if_due().await;
        let now = backend.healthy();
        if now != healthy {
            healthy = now;
            match (healthy, readiness.follows_backend) {
                (true, _) => tracing::info!("backend answers again"),
                (false, true) => tracing::info!("backend unavailable; readiness follows it"),
                (false, false) => tracing::info!(
                    "backend unavailable; still ready, each rule's on_backend_error answers"
                ),
            }
        }
        let has_rules = !limiter.rules().domains.is_empty();
        let unready = readiness.unready_because(healthy, has_rules);
        if unready.is_none() == serving {
            continue;
        }
        serving = unready.is_none();
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        tracing::info!(
            ?status,
            reason = unready.unwrap_or("ready"),
            "readiness changed"
        );
        set_health(&health, status).await;
    }
}

/// Whether the server is ready as it starts (its backend taken as up until it fails).
fn starts_ready(limiter: &RateLimiter, readiness: Readiness) -> bool {
    let has_rules = !limiter.rules().domains.is_empty();
    readiness.unready_because(true, has_rules).is_none()
}

/// The gRPC health service name envoyproxy/ratelimit reports under.
const UPSTREAM_HEALTH_NAME: &str = "ratelimit";

/// Sets the overall status, the rate-limit services' and upstream's name for them.
async fn set_health(
    health: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
) {
    health.set_service_status("", status).await;
    // envoyproxy/ratelimit reports its health under the name `ratelimit` too.
    health
        .set_service_status(UPSTREAM_HEALTH_NAME, status)
        .await;
    for service in [
        <RateLimitServiceServer<GrpcService> as tonic::server::NamedService>::NAME,
        <RateLimitQuotaServiceServer<QuotaGrpc> as tonic::server::NamedService>::NAME,
    ] {
        health.set_service_status(service, status).await;
    }
}

impl RunningServer {
    /// Stops accepting work: health and readiness turn NOT_SERVING at once, in-flight
    /// requests get up to `grace` to finish.
    pub async fn shutdown(self, grace: Duration) -> Result<(), ServerError> {
        self.ready.store(false, Ordering::Release);
        // The watcher must not turn health back on once shutdown has turned it off.
        self.watcher.abort();
        let _ = self.watcher.await;
        set_health(&self.health, tonic_health::ServingStatus::NotServing).await;
        let _ = self.stop.send(true);
        match tokio::time::timeout(grace, self.tasks).await {
            Ok(joined) => Ok(joined?),
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "in-flight requests did not finish within the grace period"
                );
                Ok(())
            }
        }
    }

    /// Waits until the servers stop on their own (a listener failed).
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        Ok((&mut self.tasks).await?)
    }
}

async fn wait_for_stop(mut stopped: watch::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = stopped.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_given_the_scheme_the_listener_speaks() {
        let tcp = BoundAddr::Tcp("127.0.0.1:8081".parse().unwrap());
        assert_eq!(tcp.client_address(false), "http://127.0.0.1:8081");
        assert_eq!(tcp.client_address(true), "https://127.0.0.1:8081");
        let unix = BoundAddr::Unix("/run/floodgate/grpc.sock".into());
        assert_eq!(unix.client_address(false), "unix:/run/floodgate/grpc.sock");
        assert_eq!(unix.client_address(true), "unix:/run/floodgate/grpc.sock");
    }

    #[test]
    fn a_connection_age_of_zero_retires_no_connection() {
        let limits = ConnectionLimits {
            max_connection_age_ms: 0,
            max_connection_age_grace_ms: 0,
            ..ConnectionLimits::default()
        };
        let http2 = http2_limits(&limits);
        assert_eq!((http2.max_age, http2.max_age_grace), (None, None));
        let limits = ConnectionLimits {
            max_connection_age_ms: 30_000,
            max_connection_age_grace_ms: 5_000,
            ..limits
        };
        let http2 = http2_limits(&limits);
        assert_eq!(http2.max_age, Some(Duration::from_secs(30)));
        assert_eq!(http2.max_age_grace, Some(Duration::from_secs(5)));
    }
}
