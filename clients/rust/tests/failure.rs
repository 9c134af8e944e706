//! What the client decides when floodgate itself cannot answer: stopped, frozen, or lost
//! mid-call. Attempts are counted as the connections the channel opens (each attempt on a
//! channel without a connection opens one), never inferred from elapsed time. The retries
//! that floodgate's own answers call for are in `retry.rs`.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{DOMAIN, Floodgate};
use floodgate_client::{Client, Descriptor, Error, FailureMode, Retry};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const FOUR_ATTEMPTS: Retry = Retry {
    max_attempts: 4,
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
        .retry(FOUR_ATTEMPTS)
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
async fn fail_open_allows_after_retrying_a_connection_that_never_opened() {
    let (client, connections) = client_of_stopped_server(FailureMode::Open);

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert_eq!(
        connections.load(Ordering::SeqCst),
        4,
        "a refused connection sent nothing, so every attempt is made"
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
async fn fail_closed_rejects_after_retrying_a_connection_that_never_opened() {
    let (client, connections) = client_of_stopped_server(FailureMode::Closed);

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert_eq!(connections.load(Ordering::SeqCst), 4);
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
async fn a_passed_deadline_is_not_retried_and_the_failure_mode_decides() {
    let server = Floodgate::start(&[]);
    server.freeze();
    let connections = Arc::new(AtomicUsize::new(0));
    let client = Client::new(counting_channel(server.grpc_addr, connections.clone()))
        .failure_mode(FailureMode::Closed)
        .retry(FOUR_ATTEMPTS)
        .timeout(Duration::from_millis(200));

    let decision = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .unwrap();

    assert!(
        !decision.allowed && decision.degraded,
        "the deadline hands over to the failure mode"
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "no time is left for another attempt"
    );
}

/// Sends a call to a frozen floodgate and kills the server once the request is on its way;
/// the failure mode (closed) decides. Returns the connections the call opened.
async fn call_lost_after_sending(client_options: fn(Client) -> Client) -> usize {
    let mut server = Floodgate::start(&[]);
    server.freeze();
    let connections = Arc::new(AtomicUsize::new(0));
    let client = client_options(
        Client::new(counting_channel(server.grpc_addr, connections.clone()))
            .failure_mode(FailureMode::Closed)
            .retry(FOUR_ATTEMPTS)
            .timeout(Duration::from_secs(5)),
    );
    let call =
        tokio::spawn(async move { client.should_rate_limit(DOMAIN, &descriptors(), 1).await });
    while connections.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The kernel accepts for the frozen process: give the request time to be written.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop();
    let decision = call.await.expect("the call task").unwrap();
    assert!(!decision.allowed && decision.degraded);
    connections.load(Ordering::SeqCst)
}

#[tokio::test]
async fn a_connection_lost_after_the_request_went_out_is_not_retried() {
    let connections = call_lost_after_sending(|client| client).await;

    assert_eq!(
        connections, 1,
        "the request may have been counted: the failure mode decides at once"
    );
}

#[tokio::test]
async fn retry_possibly_counted_sends_a_call_lost_in_transport_again() {
    let connections = call_lost_after_sending(|client| client.retry_possibly_counted(true)).await;

    assert_eq!(
        connections, 4,
        "the lost call is sent again, and the refused connections after it too"
    );
}

#[tokio::test]
async fn an_error_outside_the_fail_open_set_is_returned_not_degraded() {
    let server = Floodgate::start(&[]);
    // floodgate's HTTP port speaks HTTP/2 too, but serves no gRPC: a 404, UNIMPLEMENTED.
    let channel = Endpoint::from_shared(format!("http://{}", server.http_addr))
        .expect("a valid URL")
        .connect_lazy();
    let client = Client::new(channel).timeout(Duration::from_secs(5));

    let error = client
        .should_rate_limit(DOMAIN, &descriptors(), 1)
        .await
        .expect_err("UNIMPLEMENTED is not the failure mode's to decide");

    let Error::Status(status) = error else {
        panic!("expected Error::Status, got {error:?}");
    };
    assert_eq!(status.code(), Code::Unimplemented);
}
