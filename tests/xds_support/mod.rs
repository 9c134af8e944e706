//! A management server for the tests: the Aggregated Discovery Service (State of the World)
//! over tonic, on a free loopback port, plain or over (mutual) TLS. It sends every stream
//! the snapshot the test sets, and each new one as it is set, and keeps every request it
//! receives (subscriptions, ACKs, NACKs) for the test to read.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use floodgate::proto::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use floodgate::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use floodgate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use floodgate::xds::TYPE_URL;
use prost::Message;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// What the server sends: a version and its configurations.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub version: String,
    pub configs: Vec<RateLimitConfig>,
}

impl Snapshot {
    /// One configuration, `name`, for `domain`: the descriptor `key` limited to
    /// `per_minute` requests a minute.
    pub fn limit(version: &str, domain: &str, key: &str, per_minute: u32) -> Snapshot {
        Snapshot {
            version: version.into(),
            configs: vec![config(domain, key, Some(RateLimitUnit::Minute), per_minute)],
        }
    }

    /// One configuration for `domain` with `count` small descriptors, `key` with the values
    /// `000000`, `000001`, …, each limited to 1 a minute: a snapshot many times larger as
    /// rule text than on the wire.
    pub fn many(version: &str, domain: &str, key: &str, count: usize) -> Snapshot {
        let mut config = config(domain, key, Some(RateLimitUnit::Minute), 1);
        let template = config.descriptors.remove(0);
        config.descriptors = (0..count)
            .map(|n| RateLimitDescriptor {
                value: format!("{n:06}"),
                ..template.clone()
            })
            .collect();
        Snapshot {
            version: version.into(),
            configs: vec![config],
        }
    }

    /// The bytes of the gRPC message that carries it.
    pub fn encoded_len(&self) -> usize {
        response(self, 0).encoded_len()
    }
}

/// A configuration named after `domain` with one descriptor `key` (its unit `None`:
/// UNKNOWN, which no rule file accepts).
pub fn config(
    domain: &str,
    key: &str,
    unit: Option<RateLimitUnit>,
    requests_per_unit: u32,
) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{domain}-limits"),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit.unwrap_or(RateLimitUnit::Unknown) as i32,
                requests_per_unit,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// TLS for the server: its certificate and key, and the CA client certificates must chain
/// to (`None`: clients are not asked for one).
pub struct Tls {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Option<Vec<u8>>,
}

impl Tls {
    /// The server's certificate and key, and `client_ca` required of clients (mutual TLS):
    /// the files read.
    pub fn mutual(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: &std::path::Path,
    ) -> Tls {
        let read = |path: &std::path::Path| std::fs::read(path).expect("a certificate file");
        Tls {
            cert: read(cert),
            key: read(key),
            client_ca: Some(read(client_ca)),
        }
    }
}

/// The running server; stopped (its streams closed) when dropped.
pub struct XdsServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    snapshot: watch::Sender<Option<Snapshot>>,
    /// Set when the server stops: every stream ends.
    closing: watch::Sender<bool>,
    requests: Mutex<Vec<DiscoveryRequest>>,
    arrived: Notify,
}

impl XdsServer {
    /// A server on a free port, with no snapshot yet.
    pub async fn start(tls: Option<Tls>) -> XdsServer {
        Self::start_on("127.0.0.1:0".parse().expect("an address"), tls).await
    }

    /// A server on `addr` (a restarted server reuses its predecessor's port).
    pub async fn start_on(addr: SocketAddr, tls: Option<Tls>) -> XdsServer {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("the xDS server binds");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            snapshot: watch::channel(None).0,
            closing: watch::channel(false).0,
            requests: Mutex::new(Vec::new()),
            arrived: Notify::new(),
        });
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            let mut config = ServerTlsConfig::new().identity(Identity::from_pem(tls.cert, tls.key));
            if let Some(ca) = tls.client_ca {
                config = config.client_ca_root(Certificate::from_pem(ca));
            }
            builder = builder.tls_config(config).expect("a TLS configuration");
        }
        let (stop, stopped) = oneshot::channel();
        let service = AggregatedDiscoveryServiceServer::new(Ads(shared.clone()));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(async move {
            let _ = builder
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
        });
        XdsServer {
            addr,
            shared,
            stop: Some(stop),
            task,
        }
    }

    /// `http://` (or `https://`) and the address.
    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }

    /// Sends `snapshot` on every stream, open now or later.
    pub fn push(&self, snapshot: Snapshot) {
        self.shared.snapshot.send_replace(Some(snapshot));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.shared.requests.lock().expect("not poisoned").clone()
    }

    /// Waits (up to 10 s) for a request that satisfies `wanted`, and returns it.
    pub async fn request_where(
        &self,
        what: &str,
        wanted: impl Fn(&DiscoveryRequest) -> bool,
    ) -> DiscoveryRequest {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let arrived = self.shared.arrived.notified();
            if let Some(found) = self.requests().into_iter().find(|r| wanted(r)) {
                return found;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!("no {what} within 10 s; requests: {:#?}", self.requests());
            }
        }
    }

    /// Waits for the ACK of `version`: a request carrying it with no error.
    pub async fn ack_of(&self, version: &str) -> DiscoveryRequest {
        self.request_where(&format!("ACK of {version:?}"), |r| {
            r.version_info == version && !r.response_nonce.is_empty() && r.error_detail.is_none()
        })
        .await
    }

    /// Waits for a NACK: a request with an error.
    pub async fn nack(&self) -> DiscoveryRequest {
        self.request_where("NACK", |r| r.error_detail.is_some())
            .await
    }

    /// Ends every stream and stops serving, as a server that goes away does.
    pub async fn stop(mut self) {
        self.shared.closing.send_replace(true);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let stopped = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
        assert!(stopped.is_ok(), "the xDS server did not stop");
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Ads(Arc<Shared>);

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut incoming = request.into_inner();
        let shared = self.0.clone();
        let (responses, outgoing) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut snapshots = shared.snapshot.subscribe();
            snapshots.mark_changed();
            let mut closing = shared.closing.subscribe();
            let mut nonce = 0u64;
            loop {
                tokio::select! {
                    _ = closing.changed() => break,
                    received = incoming.message() => match received {
                        Ok(Some(request)) => {
                            shared.requests.lock().expect("not poisoned").push(request);
                            shared.arrived.notify_waiters();
                        }
                        _ => break,
                    },
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let Some(snapshot) = snapshots.borrow_and_update().clone() else {
                            continue;
                        };
                        nonce += 1;
                        if responses.send(Ok(response(&snapshot, nonce))).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outgoing))))
    }
}

fn response(snapshot: &Snapshot, nonce: u64) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: snapshot.version.clone(),
        resources: (snapshot.configs.iter())
            .map(|config| pbjson_types::Any {
                type_url: TYPE_URL.into(),
                value: config.encode_to_vec().into(),
            })
            .collect(),
        canary: false,
        type_url: TYPE_URL.into(),
        nonce: format!("n{nonce}"),
    }
}
