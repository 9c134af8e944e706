//! Connections retired at `max_connection_age_ms`, against the real binary: clients calling
//! without pause over connections that are retired every few hundred milliseconds lose no
//! call, and move to new connections; a retired connection's call in flight finishes within
//! the grace, and is cut at its end.

mod harness;
mod redis_harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{Floodgate, OK, RawCall, descriptor, request};
use redis_harness::delay::DelayedLink;

const RULES: &str = "
domain: age
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100000000}
";

const CLIENTS: usize = 8;

fn floodgate(env: &[(&str, &str)]) -> Floodgate {
    Floodgate::start_with_env(&[("age.yaml", RULES)], &[], env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_calling_through_retirements_lose_no_call_and_reconnect() {
    let server = floodgate(&[("FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_MS", "300")]);
    // A relay that counts the connections the clients open (no delay added).
    let relay = DelayedLink::to(server.grpc_addr.port(), Duration::ZERO).await;
    let address = relay.url().replace("redis://", "http://");
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let channel = tonic::transport::Endpoint::from_shared(address.clone())
            .expect("an address")
            .connect()
            .await
            .expect("connects");
        let mut client_stub = RateLimitServiceClient::new(channel);
        let (stop, failed) = (stop.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            let user = format!("user-{client}");
            let mut answered = 0;
            while !stop.load(Ordering::Relaxed) {
                let ask = request("age", vec![descriptor(&[("user", &user)])]);
                match client_stub.should_rate_limit(ask).await {
                    Ok(answer) => {
                        assert_eq!(answer.get_ref().overall_code, OK);
                        answered += 1;
                    }
                    // Sent again, as gRPC's own clients do (transparent retry).
                    Err(status) if not_processed(&status) => {}
                    Err(status) => {
                        eprintln!("failed: {status:?}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            answered
        }));
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for client in clients {
        answered += client.await.expect("a client");
    }
    let failed = failed.load(Ordering::Relaxed);
    assert_eq!(
        failed,
        0,
        "{failed} calls failed, {answered} answered\n{}",
        server.stderr()
    );
    assert!(answered > 100, "{answered} answered");
    // Each client's connection is retired every 270-330 ms: some 7 times in 2.5 s.
    let connections = relay.connections();
    assert!(
        connections >= 3 * CLIENTS,
        "{connections} connections for {CLIENTS} clients: were they retired?"
    );
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
}

/// Whether the server never processed a call: the client had it ready for a connection
/// that had received GOAWAY (hyper's "canceled"), or sent it after the connection's last
/// stream (h2's GOAWAY error, NO_ERROR: RFC 9113 §6.8 says such a stream was not
/// processed). grpc-go and gRPC's C core send such a call again on another connection
/// (transparent retry); tonic's client answers it with an error instead.
fn not_processed(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if (error.downcast_ref::<hyper::Error>()).is_some_and(hyper::Error::is_canceled)
            || (error.downcast_ref::<h2::Error>())
                .is_some_and(|e| e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR))
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// Sends a held call's message and reads its gRPC status.
async fn finish(call: &mut RawCall) -> Option<String> {
    let message = request("age", vec![descriptor(&[("user", "held")])]);
    call.body
        .send_data(harness::grpc_frame(&message), true)
        .ok()?;
    harness::grpc_status(&mut call.response).await
}

#[tokio::test]
async fn a_retired_connections_call_in_flight_finishes_then_the_connection_closes() {
    let server = floodgate(&[
        ("FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_MS", "300"),
        (
            "FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_GRACE_MS",
            "3000",
        ),
    ]);
    let mut call = harness::raw_call(server.grpc_addr, &[]).await;
    // Past the age (at most 330 ms): GOAWAY is out, the call is still in flight.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(finish(&mut call).await.as_deref(), Some("0"), "answered OK");
    // Its last call done, the retired connection closes, long before the grace ends.
    let closed = tokio::time::timeout(Duration::from_millis(1500), call.connection).await;
    assert!(
        closed.is_ok(),
        "the connection stayed open after its last call"
    );
}

#[tokio::test]
async fn a_retired_connection_is_closed_at_the_end_of_its_grace() {
    let server = floodgate(&[
        ("FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_MS", "300"),
        (
            "FLOODGATE_CONNECTION_LIMITS__MAX_CONNECTION_AGE_GRACE_MS",
            "300",
        ),
    ]);
    let call = harness::raw_call(server.grpc_addr, &[]).await;
    // The call never ends (its body is held): the connection is cut at age + grace (at
    // most 630 ms), not at the request timeout (10 s).
    let closed = tokio::time::timeout(Duration::from_secs(3), call.connection).await;
    assert!(closed.is_ok(), "the connection outlived its grace");
    drop(call.body);
}
