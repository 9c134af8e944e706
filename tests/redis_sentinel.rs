//! The redis-sentinel backend end to end: real `floodgate` binaries on the primary that three
//! real sentinels name, through a crash failover and a demotion behind their back.

mod harness;
mod redis_harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use floodgate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use harness::{ALGORITHMS, EVERY_ALGORITHM, Floodgate, admitted, descriptor, request};
use redis_harness::sentinel::Sentinels;

const OK: i32 = Code::Ok as i32;
const OVER_LIMIT: i32 = Code::OverLimit as i32;

/// A floodgate on the primary `sentinels` name, with a command timeout a debug build on a
/// loaded machine always meets.
fn start(sentinels: &Sentinels) -> Floodgate {
    let flags = sentinels.backend_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Floodgate::start_with_env(
        &[("rules.yaml", EVERY_ALGORITHM)],
        &flags,
        &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
    )
}

/// One request on the descriptor (`key`, `value`) of the `global` domain.
fn ask_for(key: &str, value: &str) -> RateLimitRequest {
    request("global", vec![descriptor(&[(key, value)])])
}

/// Sends `count` requests one after the other; all must be admitted.
async fn admit(server: &Floodgate, req: &RateLimitRequest, count: usize) {
    for _ in 0..count {
        assert_eq!(server.ask(req.clone()).await.overall_code, OK);
    }
}

/// Asks until a request is answered (not a gRPC error) or `bound` passes.
async fn first_answer(
    server: &Floodgate,
    req: &RateLimitRequest,
    bound: Duration,
) -> RateLimitResponse {
    let deadline = Instant::now() + bound;
    let mut client = server.client().await;
    loop {
        match client.should_rate_limit(req.clone()).await {
            Ok(response) => return response.into_inner(),
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!(
                "no answer within {bound:?}: {status:?}\n{}",
                server.stderr()
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decisions_are_exact_on_the_primary_the_sentinels_name() {
    let sentinels = Sentinels::start();
    let server = start(&sentinels);
    for algorithm in ALGORITHMS {
        let allowed = admitted(&[&server], &ask_for(algorithm, "shared"), 8, 8).await;
        assert_eq!(
            allowed, 50,
            "{algorithm}: 64 requests against a limit of 50"
        );
    }
    let keys = sentinels.primary().command(&["DBSIZE"]);
    assert_ne!(keys, "0", "the counters live on the primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_primary_is_replaced_without_a_restart_and_no_counter_overshoots() {
    let mut sentinels = Sentinels::start();
    let server = Arc::new(start(&sentinels));
    let req = ask_for("fixed_window", "failover");
    admit(&server, &req, 20).await;
    // Replication is asynchronous: a crash can lose the last writes (Redis' own trade-off).
    // Waiting for the replica here makes the count after the failover exact.
    assert_eq!(sentinels.primary().command(&["WAIT", "1", "5000"]), "1");
    let old_port = sentinels.primary().port();

    // Traffic keeps coming while the primary is dead and the sentinels replace it.
    let stop = Arc::new(AtomicBool::new(false));
    let admitted_meanwhile = Arc::new(AtomicUsize::new(0));
    let traffic = tokio::spawn({
        let (server, req) = (server.clone(), req.clone());
        let (stop, admitted) = (stop.clone(), admitted_meanwhile.clone());
        async move {
            let mut client = server.client().await;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(response) = client.should_rate_limit(req.clone()).await
                    && response.get_ref().overall_code == OK
                {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    sentinels.kill_primary();
    let new_port = tokio::task::block_in_place(|| sentinels.wait_for_failover(old_port).port());
    stop.store(true, Ordering::Relaxed);
    traffic.await.expect("the traffic task");
    let answer = first_answer(&server, &req, Duration::from_secs(10)).await;

    // 20 before, `meanwhile` during the failover, and this one: 29 - meanwhile remain.
    let meanwhile = admitted_meanwhile.load(Ordering::Relaxed);
    let remaining = answer.statuses[0].limit_remaining as usize;
    assert!(
        answer.overall_code == OK && remaining + meanwhile <= 29,
        "the new primary (port {new_port}) lost the count: {remaining} remaining after \
         {meanwhile} admitted during the failover"
    );
    let mut total = 21 + meanwhile;
    loop {
        let response = server.ask(req.clone()).await;
        if response.overall_code == OVER_LIMIT {
            break;
        }
        total += 1;
        assert!(total <= 50, "more than 50 admitted against a limit of 50");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_demoted_under_open_connections_is_left_for_the_new_one() {
    let sentinels = Sentinels::start();
    let server = start(&sentinels);
    let req = ask_for("fixed_window", "demoted");
    // Every pooled connection is open to the primary.
    admit(&server, &req, 10).await;
    assert_eq!(sentinels.primary().command(&["WAIT", "1", "5000"]), "1");
    let old = sentinels.primary().port();

    let new = sentinels.swap_roles_keeping_clients().port();
    let answer = first_answer(&server, &req, Duration::from_secs(10)).await;
    assert_eq!(
        answer.statuses[0].limit_remaining, 39,
        "the count continues on the new primary (port {new})"
    );
    let old_errors = sentinels.replica().command(&["INFO", "errorstats"]);
    assert!(
        old.ne(&new) && old_errors.contains("errorstat_READONLY"),
        "the connections to the old primary were used, and refused: {old_errors}"
    );
    // Every connection now goes to the new primary: no request fails any more.
    admit(&server, &req, 10).await;
}
