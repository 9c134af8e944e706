//! Retries and the one deadline against floodgate on a real Redis that is frozen or gone.
//! Attempts are counted by the server's own metrics (`floodgate_requests_total`), never
//! inferred from elapsed time.
//!
//! - A frozen Redis makes floodgate answer `UNAVAILABLE` without `floodgate-counted: none`:
//!   the script may have run before the timeout.
//! - No Redis at all makes it answer `UNAVAILABLE` with the marker: nothing was counted.

mod common;

use std::time::Duration;

use common::redis::{Redis, free_port};
use common::{DOMAIN, Floodgate};
use floodgate_client::{Client, Decision, Descriptor, FailureMode, Retry};

/// floodgate's breaker opens when Redis stays silent for a window; these tests keep it shut,
/// so that every answer comes from a call to Redis.
const BREAKER_SHUT: (&str, &str) = ("FLOODGATE_REDIS_BREAKER_WINDOW_MS", "600000");

fn alice() -> [Descriptor; 1] {
    [Descriptor::new().entry("user_id", "alice")]
}

/// A client whose retries are quick and whose deadline is far away.
async fn patient_client(server: &Floodgate, max_attempts: u32) -> Client {
    server.client().await.retry(Retry {
        max_attempts,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
    })
}

/// floodgate on a Redis that answered once and is now frozen; `command_timeout_ms` is how
/// long floodgate waits for it (it waits less when the caller's deadline comes first).
async fn floodgate_on_frozen_redis(command_timeout_ms: &str) -> (Floodgate, Redis) {
    let redis = Redis::start();
    let server = Floodgate::on_redis(
        &redis.url(),
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", command_timeout_ms),
            BREAKER_SHUT,
        ],
    );
    let warm = server
        .client()
        .await
        .should_rate_limit(DOMAIN, &alice(), 1)
        .await
        .unwrap();
    assert!(!warm.degraded, "floodgate answers while Redis runs");
    redis.freeze();
    (server, redis)
}

/// floodgate pointed at a port where no Redis listens.
fn floodgate_without_redis() -> Floodgate {
    let url = format!("redis://127.0.0.1:{}", free_port());
    Floodgate::on_redis(&url, &[BREAKER_SHUT])
}

fn assert_failed_open(decision: &Decision) {
    assert!(
        decision.allowed && decision.degraded,
        "the failure mode (open) decides: {decision:?}"
    );
}

#[tokio::test]
async fn an_unavailable_that_may_have_counted_is_sent_once() {
    let (server, _redis) = floodgate_on_frozen_redis("200").await;
    let client = patient_client(&server, 4).await;

    let decision = client.should_rate_limit(DOMAIN, &alice(), 1).await.unwrap();

    assert_failed_open(&decision);
    assert_eq!(server.calls_answered("UNAVAILABLE"), 1);
}

#[tokio::test]
async fn an_unavailable_that_counted_nothing_is_retried_up_to_max_attempts() {
    let server = floodgate_without_redis();
    let client = patient_client(&server, 4)
        .await
        .failure_mode(FailureMode::Closed);

    let decision = client.should_rate_limit(DOMAIN, &alice(), 1).await.unwrap();

    assert!(!decision.allowed && decision.degraded, "failed closed");
    assert_eq!(server.calls_answered("UNAVAILABLE"), 4);
}

#[tokio::test]
async fn retry_possibly_counted_retries_an_unmarked_unavailable_too() {
    let (server, _redis) = floodgate_on_frozen_redis("200").await;
    let client = patient_client(&server, 3)
        .await
        .retry_possibly_counted(true);

    let decision = client.should_rate_limit(DOMAIN, &alice(), 1).await.unwrap();

    assert_failed_open(&decision);
    assert_eq!(server.calls_answered("UNAVAILABLE"), 3);
}

/// floodgate waits for a frozen Redis until most of what the caller has left (its share of
/// `grpc-timeout`), then answers `UNAVAILABLE`. A client that gave each attempt its own
/// timeout would make all five attempts; one deadline leaves room for about one, since each
/// attempt only gets what the ones before it left. Five would need four pauses drawn below
/// 200, 40, 8 and 1.6 ms out of up to a second each: about one chance in ten million.
#[tokio::test]
async fn one_deadline_covers_every_attempt_and_pause() {
    let (server, _redis) = floodgate_on_frozen_redis("60000").await;
    let client = server
        .client()
        .await
        .timeout(Duration::from_secs(1))
        .retry(Retry {
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
        })
        .retry_possibly_counted(true);

    let decision = client.should_rate_limit(DOMAIN, &alice(), 1).await.unwrap();

    assert_failed_open(&decision);
    let attempts = server.calls_answered("UNAVAILABLE");
    assert!(
        (1..5).contains(&attempts),
        "{attempts} attempts: the deadline, not max_attempts, ended the call"
    );
}
