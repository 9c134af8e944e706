//! What the client decides when floodgate cannot answer: the failure mode, after retries on
//! UNAVAILABLE only. Attempts are counted as the connections the channel opens (each attempt
//! on a channel without a connection opens one), never inferred from elapsed time.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{DOMAIN, Floodgate};
use floodgate_client::{Client, Descriptor, FailureMode, Retry};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

const THREE_RETRIES: Retry = Retry {
    max_retries: 3,
    initial_backoff: Duration::from_millis(1),
    max_backoff: Duration::from_millis(4),
};

/// A channel to `addr` that counts every connection it tries to open.
fn counting_channel(addr: SocketAddr, connections: Arc<AtomicUsize>) -> Channel {
    let connector = tower::service_fn(move |_: http::Uri| {
        let connections = connections.clone();
        async move {
            connections.fetch_add(1, Ordering::SeqCst);
            TcpStream::connect(addr).await.map(TokioIo::new)
        }
    });
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URL")
        .connect_with_connector_lazy(connector)
}

/// A client of a floodgate that ran on `addr` and is now stopped, with a timeout long enough
/// that every retry happens.
fn client_of_stopped_server(mode: FailureMode) -> (Client, Arc<AtomicUsize>) {
    let mut server = Floodgate::start(&[]);
    server.stop();
    let connections = Arc::new(AtomicUsize::new(0));
    let client = Client::new(counting_channel(server.grpc_addr, connections.clone()))
        .failure_mode(mode)
        .retry(THREE_RETRIES)
        .timeout(Duration::from_secs(5));
    (client, connections)
}

fn descriptors() -> [Descriptor; 2] {
    [
        Descriptor::new().entry("user_id", "erin"),
        Descriptor::new().entry("tenant", "acme"),
    ]
}

#[tokio::test]
async fn fail_open_allows_after_retrying_a_stopped_server() {
    let (client, connections) = client_of_stopped_server(FailureMode::Open);

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert_eq!(
        connections.load(Ordering::SeqCst),
        4,
        "one attempt and three retries"
    );
    assert!(decision.allowed && decision.degraded);
    assert_eq!(
        decision.statuses.len(),
        2,
        "one status per descriptor, even degraded"
    );
    assert!(
        decision
            .statuses
            .iter()
            .all(|status| status.allowed && status.limit.is_none())
    );
    assert!(decision.headers.is_empty());
}

#[tokio::test]
async fn fail_closed_rejects_after_retrying_a_stopped_server() {
    let (client, connections) = client_of_stopped_server(FailureMode::Closed);

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert_eq!(
        connections.load(Ordering::SeqCst),
        4,
        "one attempt and three retries"
    );
    assert!(!decision.allowed && decision.degraded);
    assert!(decision.statuses.iter().all(|status| !status.allowed));
}

#[tokio::test]
async fn no_retries_means_one_attempt() {
    let (client, connections) = client_of_stopped_server(FailureMode::Open);
    let client = client.retry(Retry::NONE);

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert_eq!(connections.load(Ordering::SeqCst), 1);
    assert!(decision.degraded);
}

#[tokio::test]
async fn a_server_that_does_not_answer_in_time_is_not_retried() {
    let server = Floodgate::start(&[]);
    server.freeze();
    let connections = Arc::new(AtomicUsize::new(0));
    let client = Client::new(counting_channel(server.grpc_addr, connections.clone()))
        .failure_mode(FailureMode::Closed)
        .retry(THREE_RETRIES)
        .timeout(Duration::from_millis(200));

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert!(
        !decision.allowed && decision.degraded,
        "the timeout hands over to the failure mode"
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "a deadline is not UNAVAILABLE"
    );
}
