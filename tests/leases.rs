//! Quota leases (`lease: true`) against real Redis and the real binary: replicas decide a
//! counter's hits from blocks of its quota taken out of the shared count, so the limit holds
//! across replicas by construction, and a replica keeps deciding while Redis stalls for as
//! long as its block lasts.

mod harness;
mod redis_harness;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::{Floodgate, OK, OVER_LIMIT, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::cluster::{Failover, Node, RedisCluster};
use redis_harness::delay::DelayedLink;

const RULES: &str = "
domain: leased
descriptors:
  - key: tenant
    value: hourly
    rate_limit: {unit: hour, requests_per_unit: 200, lease: true}
  - key: tenant
    value: bucket
    rate_limit: {unit: hour, requests_per_unit: 200, algorithm: token_bucket, lease: true}
  - key: tenant
    value: plenty
    on_backend_error: fail_closed
    rate_limit: {unit: hour, requests_per_unit: 1000000000, lease: true}
  - key: tenant
    value: idle
    rate_limit: {unit: hour, requests_per_unit: 1000, lease: true}
  - key: tenant
    value: second
    rate_limit: {unit: second, requests_per_unit: 50, lease: true}
  - key: tenant
    value: moving
    rate_limit: {unit: hour, requests_per_unit: 20000, lease: true}
  - key: tenant
    value: once
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    value: once-leased
    rate_limit: {unit: hour, requests_per_unit: 1, lease: true}
";

type Client = RateLimitServiceClient<tonic::transport::Channel>;

/// Client tasks a replica: each asks, one request at a time, on its own connection.
const CLIENTS: usize = 16;

/// A floodgate on the standalone Redis at `url`.
fn floodgate_on(url: &str) -> Floodgate {
    floodgate_with(&["--backend", "redis", "--redis-url", url])
}

fn floodgate_with(backend: &[&str]) -> Floodgate {
    Floodgate::start(&[("leased.yaml", RULES)], backend)
}

/// Asks for `tenant` from [`CLIENTS`] tasks on `server` for `period`: every answer's code
/// in the order each task got them (an error as `None`).
async fn codes_for(server: &Floodgate, tenant: &str, period: Duration) -> Vec<Vec<Option<i32>>> {
    let deadline = tokio::time::Instant::now() + period;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let mut client = server.client().await;
        let ask = request("leased", vec![descriptor(&[("tenant", tenant)])]);
        tasks.push(tokio::spawn(async move {
            let mut codes = Vec::new();
            while tokio::time::Instant::now() < deadline {
                let answer = client.should_rate_limit(ask.clone()).await;
                codes.push(answer.ok().map(|answer| answer.into_inner().overall_code));
            }
            codes
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.expect("a client task"));
    }
    all
}

/// Waits for the next hour when the current one ends within `room`: a fixed window of an
/// hour must not reset under a test that counts it.
async fn clear_of_the_hour(room: Duration) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    let left = 3600 - now.as_secs() % 3600;
    if Duration::from_secs(left) < room {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// Hammers `tenant` from [`CLIENTS`] tasks on each of `servers` until every task has been
/// refused `refusals` times in a row and for half a second (a replica that knows the count
/// exhausted refuses at once, and asks Redis again every 100 ms: quota another gave back
/// comes within that), or a minute passed: what each server admitted.
async fn hammer(servers: &[&Floodgate], tenant: &str, refusals: u32) -> Vec<u64> {
    let admitted: Vec<Arc<AtomicU64>> = servers.iter().map(|_| Arc::default()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut tasks = Vec::new();
    for (server, admitted) in servers.iter().zip(&admitted) {
        for _ in 0..CLIENTS {
            let mut client = server.client().await;
            let admitted = admitted.clone();
            let ask = request("leased", vec![descriptor(&[("tenant", tenant)])]);
            tasks.push(tokio::spawn(async move {
                let mut refused_in_a_row = 0;
                let mut refused_since = tokio::time::Instant::now();
                let settled = |refused: u32, since: tokio::time::Instant| {
                    refused >= refusals && since.elapsed() >= Duration::from_millis(500)
                };
                while !settled(refused_in_a_row, refused_since)
                    && tokio::time::Instant::now() < deadline
                {
                    // A busy machine's debug build may miss Redis' wait now and then: the
                    // rule's policy (an error) answers, which admits nothing.
                    let Ok(answer) = client.should_rate_limit(ask.clone()).await else {
                        continue;
                    };
                    let code = answer.into_inner().overall_code;
                    if code == OK {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        refused_in_a_row = 0;
                    } else {
                        assert_eq!(code, OVER_LIMIT);
                        if refused_in_a_row == 0 {
                            refused_since = tokio::time::Instant::now();
                        }
                        refused_in_a_row += 1;
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("a client task");
    }
    admitted.iter().map(|a| a.load(Ordering::SeqCst)).collect()
}

/// Two replicas, sixteen clients each, on one counter of 200 an hour: never more than 200
/// admitted, and all but the last two or fewer while both keep asking.
async fn two_replicas_share(tenant: &str, backend: &[&str]) {
    clear_of_the_hour(Duration::from_secs(90)).await;
    let (one, two) = (floodgate_with(backend), floodgate_with(backend));
    let admitted = hammer(&[&one, &two], tenant, 50).await;
    let total: u64 = admitted.iter().sum();
    assert!(total <= 200, "{total} admitted of 200: {admitted:?}");
    assert!(total >= 198, "{total} admitted of 200: {admitted:?}");
    let decided: f64 = [&one, &two]
        .iter()
        .map(|server| server.metric("floodgate_lease_decisions_total"))
        .sum();
    assert!(decided >= 100.0, "{decided} decided from blocks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_admit_a_fixed_window_of_200_between_them_and_never_more() {
    let redis = RedisServer::start();
    two_replicas_share(
        "hourly",
        &["--backend", "redis", "--redis-url", &redis.url()],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_admit_a_token_bucket_of_200_between_them_and_never_more() {
    // 200 an hour refills a token every 18 s: within the test's seconds, none or one.
    let redis = RedisServer::start();
    two_replicas_share(
        "bucket",
        &["--backend", "redis", "--redis-url", &redis.url()],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_a_cluster_admit_200_between_them_and_never_more() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    two_replicas_share(
        "hourly",
        &["--backend", "redis-cluster", "--redis-url", &seeds],
    )
    .await;
}

/// Windows of a second, 50 each, leased by two replicas for eight seconds, with demand
/// that leaves blocks half spent at one reset and takes the whole window after it: a steady
/// 40 a second over both replicas (under the limit: each replica holds part of a block
/// when its window ends), and on even seconds a burst from sixteen clients a replica in the
/// window's first 200 ms. A block spent after its window ended would add what it held to
/// the burst's window. Each admitted request is put in the window its answer names (the
/// instant it came plus `duration_until_reset`, to the nearest second; the window running
/// then when it names none left): no window admits more than 50, and each whole burst
/// window at least 45.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leased_windows_of_a_second_hold_at_every_reset() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (one, two) = (floodgate_on(&url), floodgate_on(&url));
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    let end = start.as_secs() + 9;
    let mut tasks = Vec::new();
    for server in [&one, &two] {
        // The steady client: one request every 50 ms (20 a second a replica).
        let steady = (0..1).map(|_| Duration::ZERO);
        // The burst clients: from each even second to 200 ms into it.
        let bursts = (0..CLIENTS).map(|_| Duration::from_millis(200));
        for burst in steady.chain(bursts) {
            let mut client = server.client().await;
            let ask = request("leased", vec![descriptor(&[("tenant", "second")])]);
            tasks.push(tokio::spawn(async move {
                let mut windows = Vec::new();
                loop {
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .expect("after 1970");
                    if now.as_secs() >= end {
                        return windows;
                    }
                    let into = now - Duration::from_secs(now.as_secs());
                    let bursting = now.as_secs().is_multiple_of(2) && into < burst;
                    if burst > Duration::ZERO && !bursting {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let Ok(answer) = client.should_rate_limit(ask.clone()).await else {
                        continue;
                    };
                    let answer = answer.into_inner();
                    if answer.overall_code == OK {
                        let reset = (answer.statuses[0].duration_until_reset)
                            .map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
                        let now = SystemTime::now().duration_since(UNIX_EPOCH);
                        let now = now.expect("after 1970").as_secs_f64();
                        // A window that has ended names no time left: a hit decided in it
                        // after its end (from a block) belongs to the window running now.
                        let window = if reset > 0.0 {
                            (now + reset).round()
                        } else {
                            now.floor() + 1.0
                        };
                        windows.push(window as u64);
                    }
                    if burst == Duration::ZERO {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }));
        }
    }
    let mut admitted = std::collections::BTreeMap::<u64, u64>::new();
    for task in tasks {
        for window in task.await.expect("a client task") {
            *admitted.entry(window).or_default() += 1;
        }
    }
    for (window, count) in &admitted {
        assert!(
            *count <= 50,
            "{count} admitted in the window ending at {window}: {admitted:?}"
        );
    }
    // The windows ending at an odd second began at an even one: a burst's. The first and
    // the last were not asked for whole.
    let first = start.as_secs() + 2;
    let bursts: Vec<u64> = (first..end).filter(|second| second % 2 == 1).collect();
    assert!(bursts.len() >= 3, "{bursts:?}");
    for window in bursts {
        let count = admitted.get(&window).copied().unwrap_or(0);
        assert!(
            count >= 45,
            "{count} admitted in the window ending at {window}: {admitted:?}"
        );
    }
}

/// With `consume_on_reject: false`, a request another hit rejects takes nothing from a
/// block either: whether Redis rejected the other hit (`once`, 1 an hour) or a block
/// refused it here (`once-leased`, exhausted). What the leased counter has left (the shared
/// count at the last take and the block: a take moves quota from one to the other) drops
/// by the requests admitted only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rejected_request_takes_nothing_from_a_block_when_it_must_not() {
    clear_of_the_hour(Duration::from_secs(90)).await;
    let redis = RedisServer::start();
    let server = Floodgate::start(
        &[("leased.yaml", RULES)],
        &[
            "--backend",
            "redis",
            "--redis-url",
            &redis.url(),
            "--consume-on-reject",
            "false",
        ],
    );
    let mut client = server.client().await;
    let plenty = descriptor(&[("tenant", "plenty")]);
    let left = async |client: &mut Client| {
        let ask = request("leased", vec![descriptor(&[("tenant", "plenty")])]);
        let answer = client.should_rate_limit(ask).await.expect("an answer");
        answer.into_inner().statuses[0].limit_remaining
    };
    // A block for `plenty`; `once-leased` exhausted and known to be (its take refused).
    for _ in 0..20 {
        left(&mut client).await;
    }
    let exhaust = request("leased", vec![descriptor(&[("tenant", "once-leased")])]);
    for _ in 0..3 {
        client
            .should_rate_limit(exhaust.clone())
            .await
            .expect("an answer");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let before = left(&mut client).await;
    for other in ["once", "once-leased"] {
        let pair = request(
            "leased",
            vec![plenty.clone(), descriptor(&[("tenant", other)])],
        );
        for _ in 0..5 {
            let answer = client
                .should_rate_limit(pair.clone())
                .await
                .expect("an answer");
            let code = answer.into_inner().overall_code;
            assert!(code == OK || code == OVER_LIMIT, "{code}");
        }
    }
    let after = left(&mut client).await;
    // One pair admitted (`once`'s only request), and the last ask.
    assert_eq!(before - after, 2, "{before} left before, {after} after");
}

/// Redis moves under leases: while two replicas spend a counter of 20,000 an hour in
/// blocks, every slot of the primary holding it moves to another (`redis-cli --cluster
/// reshard`, as an operator runs it). A block is an ordinary hit, moved with its key: never
/// more than the limit, and the quota lost to takes cut off mid-move is small.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshard_under_leases_never_admits_more_than_the_limit() {
    let cluster = Arc::new(RedisCluster::start());
    let (total, home) = spent_while_the_cluster_changes(&cluster, |cluster, home| {
        let other = (cluster.primaries().into_iter())
            .find(|&primary| primary != home)
            .expect("another primary");
        cluster.reshard(home, other, 16_384 / 3 + 1);
    })
    .await;
    assert!(total >= 19_900, "{total} admitted of 20,000");
    let now = counters_primary(&cluster).expect("the counter's primary");
    assert_ne!(now, home, "the counter moved");
}

/// A graceful failover of the leased counter's primary (`CLUSTER FAILOVER` on its replica:
/// the primary stops taking writes until the replica caught up) while two replicas spend it
/// in blocks: takes sent meanwhile are redirected to the new primary and keep their wait, so
/// never more than the limit and little lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_under_leases_never_admits_more_than_the_limit() {
    let cluster = Arc::new(RedisCluster::start());
    let (total, home) = spent_while_the_cluster_changes(&cluster, |cluster, home| {
        cluster.failover(cluster.replica_of(home), Failover::Graceful);
    })
    .await;
    assert!(total >= 19_900, "{total} admitted of 20,000");
    let now = counters_primary(&cluster).expect("the counter's primary");
    assert_ne!(now, home, "the counter's primary changed");
}

/// The primary that holds the `moving` counter's keys, if any does.
fn counters_primary(cluster: &RedisCluster) -> Option<Node> {
    (cluster.primaries().into_iter())
        .find(|&primary| (cluster.keys(primary).iter()).any(|key| key.contains("moving")))
}

/// Two replicas on `cluster` spend `moving` (20,000 an hour) in blocks while `change` runs
/// on it, given the counter's primary, 300 ms in; then, once what a replica still held went
/// back (its idle second), the rest is asked for. What they admitted in all, never more
/// than the limit (asserted here), and the primary that held the counter before.
async fn spent_while_the_cluster_changes(
    cluster: &Arc<RedisCluster>,
    change: impl FnOnce(&RedisCluster, Node) + Send + 'static,
) -> (u64, Node) {
    clear_of_the_hour(Duration::from_secs(300)).await;
    let seeds = cluster.seeds();
    let backend = ["--backend", "redis-cluster", "--redis-url", &seeds];
    let (one, two) = (floodgate_with(&backend), floodgate_with(&backend));
    let ask = request("leased", vec![descriptor(&[("tenant", "moving")])]);
    let mut client = one.client().await;
    client.should_rate_limit(ask).await.expect("an answer");
    let home = counters_primary(cluster).expect("the counter's primary");
    let changing = cluster.clone();
    let change = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        change(&changing, home);
        std::time::Instant::now()
    });
    let admitted = hammer(&[&one, &two], "moving", 50).await;
    let spent = std::time::Instant::now();
    let changed = tokio::task::spawn_blocking(move || change.join().expect("the change"))
        .await
        .expect("the change's thread");
    eprintln!(
        "changed {:?} before the quota was spent",
        spent.checked_duration_since(changed)
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rest = hammer(&[&one, &two], "moving", 50).await;
    let total: u64 = admitted.iter().chain(&rest).sum::<u64>() + 1;
    eprintln!("admitted {total} of 20,000: {admitted:?} then {rest:?}");
    assert!(
        total <= 20_000,
        "{total} admitted of 20,000: {admitted:?} {rest:?}"
    );
    (total, home)
}

/// A replica that stops asking gives its block back: the other gets all of the limit.
/// While it holds its block, the other is refused at most what that block holds
/// (`floodgate_lease_held`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_replica_gives_its_block_back_and_the_other_gets_all_of_the_limit() {
    clear_of_the_hour(Duration::from_secs(90)).await;
    let redis = RedisServer::start();
    let (one, two) = (floodgate_on(&redis.url()), floodgate_on(&redis.url()));
    // One asks for a while (its blocks follow its demand), then stops.
    let ask = request("leased", vec![descriptor(&[("tenant", "idle")])]);
    let mut client = one.client().await;
    let mut first = 0;
    for _ in 0..300 {
        let answer = client
            .should_rate_limit(ask.clone())
            .await
            .expect("an answer");
        first += u64::from(answer.into_inner().overall_code == OK);
    }
    // A take out when the asking stopped lands first (well within the idle second).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held = one.metric("floodgate_lease_held") as u64;
    // The other takes all it can at once: all but what the first holds (and what the
    // other's own last take may hold when its clients stop).
    let second = hammer(&[&two], "idle", 20).await[0];
    let own = two.metric("floodgate_lease_held") as u64;
    assert!(
        first + second + held + own >= 1000 && first + second <= 1000,
        "{first} + {second} admitted, {held} held by the idle replica, {own} by the other"
    );
    // Within the idle second and a sweep, the block is back, and the rest is the other's.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(one.metric("floodgate_lease_held"), 0.0);
    let rest = hammer(&[&two], "idle", 20).await[0];
    assert_eq!(first + second + rest, 1000, "{first} + {second} + {rest}");
}

/// A Redis 50 ms away, farther than the 15 ms command timeout: requests it would decide are
/// answered by their policy at once (`fail_closed`), but a lease's take waits for it, off
/// the request path, and a hit that finds the block spent while the next is on its way
/// waits for that one (within its own 40 ms), so from each client's first block on nearly
/// every request is decided from blocks, and the limit still holds. Default settings,
/// counted from the very start: the ramp from the first block (one hit) to the demand's
/// size is in it. (At
/// 95e5fc0 this count was 95.0–99.7% over seven runs; with the lane's connection kept and
/// takes sent beside the calls out, 99.5–99.6%, and 98.7–99.3% with a release server;
/// with the hits waiting, 99.9%.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_farther_than_the_timeout_still_leases_blocks() {
    clear_of_the_hour(Duration::from_secs(90)).await;
    let redis = RedisServer::start();
    let link = DelayedLink::to(redis.port(), Duration::from_millis(50)).await;
    let server = floodgate_on(&link.url());
    let (mut after_first, mut decided) = (0, 0);
    for codes in codes_for(&server, "plenty", Duration::from_secs(4)).await {
        let Some(first) = codes.iter().position(|code| *code == Some(OK)) else {
            continue;
        };
        after_first += codes.len() - first;
        decided += (codes[first..].iter())
            .filter(|code| **code == Some(OK))
            .count();
    }
    assert!(after_first > 0, "no block came");
    eprintln!("{decided} of {after_first} decided from blocks after each client's first");
    assert!(
        decided * 100 >= after_first * 99,
        "{decided} of {after_first} decided from blocks after each client's first"
    );
    let round_trip = server.metric("floodgate_redis_round_trip_seconds");
    assert!(round_trip > 0.015, "Redis measured {round_trip} s away");
    // A limit of 1,000 through the same far link: never more.
    let admitted = hammer(&[&server], "idle", 20).await[0];
    assert!(admitted <= 1000, "{admitted} admitted of 1000");
}

/// While Redis is stopped (SIGSTOP, 1.5 s), a leased counter with a block left keeps
/// answering from it, not by its `fail_closed` policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_redis_leaves_a_leased_counter_deciding_from_its_block() {
    let redis = RedisServer::start();
    let server = floodgate_on(&redis.url());
    let ask = request("leased", vec![descriptor(&[("tenant", "plenty")])]);
    // Demand for a while: the blocks grow with it.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(server.client().await);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < deadline {
        let asks = clients
            .iter_mut()
            .map(|client| client.should_rate_limit(ask.clone()));
        // Before the first blocks, a busy machine's Redis calls may miss their wait
        // (`fail_closed` answers): only the answers during the stop are judged.
        futures_util::future::join_all(asks).await;
    }
    let held = server.metric("floodgate_lease_held") as u64;
    assert!(held >= 20, "the block holds {held}");
    redis.freeze();
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..held.min(50) / 2 {
        let answer = client.should_rate_limit(ask.clone()).await;
        codes.push(answer.expect("an answer").into_inner().overall_code);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.thaw();
    assert!(codes.iter().all(|&code| code == OK), "{codes:?}");
}
