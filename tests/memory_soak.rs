//! The Helm chart's memory limit, held against hostile clients. For each load a client can
//! send, the real binary starts with default settings in a cgroup with the chart's 288 MiB
//! limit, while a well-behaved client asks it for a decision every 10 ms: unfinished request
//! bodies on many streams, on many connections, with large headers; RLQS reports that never
//! end; idle connections past the connection limit; a new counter on every descriptor; RLQS
//! buckets that are each new; and every unknown domain a client can name. Under each, the
//! server is never killed, its peak stays under 200 MiB, and the well-behaved client is
//! decided, within 100 ms (1% of stragglers allowed on a busy machine). `/metrics` stays
//! under 16 MB throughout.

mod harness;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use harness::hostile::{self, RLQS, SHOULD_RATE_LIMIT, Unfinished};
use harness::memory::MemoryLimit;
use harness::{Floodgate, OK, cpu, descriptor, request};

const RULES: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: tenant
    detailed_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000000}
";

/// The chart's `resources.limits.memory`.
const CHART_LIMIT: u64 = 288 << 20;

/// The most the server may hold at its peak under any one load.
const PEAK: u64 = 200 << 20;

/// How long each load is held.
const HOLD: Duration = Duration::from_secs(3);

/// The body of unfinished calls: 3 connections of 128 calls announcing 1 MiB and sending it.
const UNFINISHED: Unfinished = Unfinished {
    path: SHOULD_RATE_LIMIT,
    connections: 3,
    streams: 128,
    announce: 1 << 20,
    send: 1 << 20,
    header_bytes: 0,
};

/// The well-behaved client's answers: how long each took, and the ones that were no decision.
#[derive(Default)]
struct Observed {
    latencies: Vec<Duration>,
    failures: Vec<String>,
}

/// Asks the server at `addr` for one decision every 10 ms, on a connection of its own,
/// until `stop`. Runs on a thread and runtime of its own, so that the load's work in this
/// process never delays it.
fn well_behaved(
    addr: SocketAddr,
    observed: Arc<Mutex<Observed>>,
    stop: Arc<tokio::sync::Notify>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connecting to floodgate");
            let ask = request("d", vec![descriptor(&[("user", "alice")])]);
            let mut ticks = tokio::time::interval(Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    () = stop.notified() => return,
                }
                let mut call = tonic::Request::new(ask.clone());
                call.set_timeout(Duration::from_secs(5));
                let started = Instant::now();
                let answer = client.should_rate_limit(call).await;
                let took = started.elapsed();
                let mut observed = observed.lock().unwrap();
                observed.latencies.push(took);
                match answer {
                    Ok(answer) if answer.get_ref().overall_code == OK => {}
                    Ok(answer) => observed.failures.push(format!("{:?}", answer.get_ref())),
                    Err(status) => observed.failures.push(status.to_string()),
                }
            }
        });
    })
}

/// Starts a server under the chart's limit, runs `load` against it beside the well-behaved
/// client, and checks what the module promises. `load` says what it did.
async fn under_the_chart_limit<F, Fut>(name: &str, load: F)
where
    F: FnOnce(Arc<Floodgate>) -> Fut,
    Fut: Future<Output = String>,
{
    let limit = match MemoryLimit::new(CHART_LIMIT) {
        Ok(limit) => limit,
        Err(why) => panic!("this test needs a memory cgroup: {why}"),
    };
    let prefix = limit.prefix(cpu::URGENT);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let server = Arc::new(Floodgate::start_wrapped(
        &prefix,
        &[("d.yaml", RULES)],
        &[],
        &[],
    ));
    let observed = Arc::new(Mutex::new(Observed::default()));
    let stop = Arc::new(tokio::sync::Notify::new());
    let client = well_behaved(server.grpc_addr, observed.clone(), stop.clone());
    // The client's connection first: a load past the connection limit does not keep it out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let what = load(server.clone()).await;
    stop.notify_one();
    client.join().expect("the well-behaved client");
    let (status, page) = server.http("GET", "/metrics", "");
    assert_eq!(status, 200, "{name}");
    let peak = server.peak_rss();
    let observed = observed.lock().unwrap();
    let mut latencies = observed.latencies.clone();
    latencies.sort();
    let slow = (latencies.iter())
        .filter(|took| **took > Duration::from_millis(100))
        .count();
    eprintln!(
        "{name}: {what}; peak {} MiB resident ({} MiB charged to the cgroup), /metrics {} \
         bytes; the well-behaved client: {} calls, median {:?}, 99th percentile {:?}, {slow} \
         over 100 ms",
        peak >> 20,
        limit.peak() >> 20,
        page.len(),
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 99 / 100],
    );
    assert_eq!(limit.kills(), 0, "{name}: the kernel killed the server");
    assert!(peak <= PEAK, "{name}: peak RSS {} MiB", peak >> 20);
    assert!(
        page.len() < 16 << 20,
        "{name}: /metrics is {} bytes",
        page.len()
    );
    assert!(
        observed.failures.is_empty(),
        "{name}: {:?}",
        observed.failures
    );
    assert!(latencies.len() > 100, "{name}: {} calls", latencies.len());
    assert!(
        slow * 100 <= latencies.len(),
        "{name}: {slow} of {} calls over 100 ms",
        latencies.len()
    );
}

/// Runs `load`'s unfinished calls for [`HOLD`]; what the server answered them.
async fn unfinished(server: Arc<Floodgate>, load: Unfinished) -> String {
    let held = hostile::unfinished(server.grpc_addr, load).await;
    tokio::time::sleep(HOLD).await;
    let answers = held.answers();
    let refused = (answers.iter())
        .filter(|status| status.as_deref() == Some("8"))
        .count();
    let mut statuses: Vec<_> = answers
        .iter()
        .map(|status| status.as_deref().unwrap_or("reset"))
        .collect();
    statuses.sort();
    statuses.dedup();
    format!(
        "{} calls opened, {} ended by the server ({refused} with RESOURCE_EXHAUSTED; {statuses:?})",
        held.calls(),
        answers.len()
    )
}

/// A request of 64 descriptors, each a new user of about 1 KiB (64 new counters), the first a new
/// `detailed_metric` series too.
fn new_users(round: usize) -> RateLimitRequest {
    let mut descriptors: Vec<_> = (0..64)
        .map(|i| descriptor(&[("user", &format!("{round}-{i}-{}", "u".repeat(1000)))]))
        .collect();
    descriptors[0] = descriptor(&[("tenant", &format!("t{round}")), ("user", "u")]);
    request("d", descriptors)
}

/// Sends requests that each make 64 new counters, from 4 clients until the counters in
/// memory reach the default cap (400,000) or 10 s pass; how many were made.
async fn many_keys(server: Arc<Floodgate>) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    let mut tasks = Vec::new();
    for client in 0..4 {
        let mut grpc = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut sent = 0;
            while Instant::now() < until && sent * 4 * 64 < 450_000 {
                let ask = new_users(sent * 4 + client);
                grpc.should_rate_limit(ask).await.expect("a decision");
                sent += 1;
            }
            sent
        }));
    }
    let mut sent = 0;
    for task in tasks {
        sent += task.await.expect("client");
    }
    format!("{} new counters", sent * 64)
}

/// Reports, on 4 RLQS streams for [`HOLD`], 1,000 buckets at a time, each a new 1 KiB user,
/// five reports a second on each (Envoy reports every 5 s: this is a fleet's worth).
async fn many_buckets(server: Arc<Floodgate>) -> String {
    let until = Instant::now() + HOLD;
    let mut tasks = Vec::new();
    for stream in 0..4 {
        let (reports, mut answers) = harness::quota_stream(&server).await;
        tasks.push(tokio::spawn(async move {
            let mut reported = 0;
            while Instant::now() < until {
                let user = |i| format!("{stream}-{reported}-{i}-{}", "u".repeat(1000));
                let usages = (0..1000)
                    .map(|i| BucketQuotaUsage {
                        bucket_id: Some(BucketId {
                            bucket: [("user".to_owned(), user(i))].into(),
                        }),
                        time_elapsed: Some(pbjson_types::Duration {
                            seconds: 1,
                            nanos: 0,
                        }),
                        num_requests_allowed: 1,
                        num_requests_denied: 0,
                    })
                    .collect();
                let report = RateLimitQuotaUsageReports {
                    domain: "d".into(),
                    bucket_quota_usages: usages,
                };
                if reports.send(report).await.is_err() {
                    break;
                }
                match answers.message().await {
                    Ok(Some(_)) => reported += 1000,
                    other => panic!("the report was refused: {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            reported
        }));
    }
    let mut reported = 0;
    for task in tasks {
        reported += task.await.expect("stream");
    }
    format!("{reported} new buckets reported")
}

/// Asks for decisions in 2,000 domains no rule names, each as long as a domain may be.
async fn unknown_domains(server: Arc<Floodgate>) -> String {
    let mut grpc = server.client().await;
    for i in 0..2000 {
        let domain = format!("{i:04}-{}", "x".repeat(1019));
        let ask = request(&domain, vec![descriptor(&[("user", "u")])]);
        grpc.should_rate_limit(ask).await.expect("a decision");
    }
    "2000 unknown domains of 1 KiB".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_load_takes_the_server_past_the_charts_memory_limit() {
    cpu::make_this_process_urgent();
    // The loads' own connections: thousands of descriptors.
    floodgate::edge::listener::raise_open_files_limit().expect("the open files limit");
    let plain = UNFINISHED;
    under_the_chart_limit("3 connections x 128 unfinished 1 MiB bodies", |server| {
        unfinished(server, plain)
    })
    .await;
    under_the_chart_limit(
        "2 connections x 1024 calls announcing the largest request, sending 10 bytes",
        |server| {
            let load = Unfinished {
                connections: 2,
                streams: 1024,
                announce: 1_330_000,
                send: 10,
                ..plain
            };
            unfinished(server, load)
        },
    )
    .await;
    under_the_chart_limit(
        "1000 connections x 4 unfinished bodies, 64 KiB sent",
        |server| {
            let load = Unfinished {
                connections: 1000,
                streams: 4,
                send: 64 << 10,
                ..plain
            };
            unfinished(server, load)
        },
    )
    .await;
    under_the_chart_limit(
        "2 connections x 1024 stalled calls with 12 KiB of headers",
        |server| {
            let load = Unfinished {
                connections: 2,
                streams: 1024,
                announce: 100,
                send: 0,
                header_bytes: 12 << 10,
                ..plain
            };
            unfinished(server, load)
        },
    )
    .await;
    under_the_chart_limit(
        "4 connections x 256 RLQS streams, 1 MiB reports unfinished",
        |server| {
            let load = Unfinished {
                path: RLQS,
                connections: 4,
                streams: 256,
                ..plain
            };
            unfinished(server, load)
        },
    )
    .await;
    under_the_chart_limit(
        "1100 HTTP connections, a 2 MB JSON body each, 256 KiB sent",
        |server| async move {
            let held = hostile::unfinished_json(server.http_addr, 1100, 256 << 10).await;
            tokio::time::sleep(HOLD).await;
            format!("{} connections opened", held.calls())
        },
    )
    .await;
    under_the_chart_limit("2500 idle connections", |server| async move {
        let idle = hostile::idle_connections(server.grpc_addr, 2500).await;
        tokio::time::sleep(HOLD).await;
        format!("{} connections opened", idle.running())
    })
    .await;
    under_the_chart_limit("new 1 KiB users on every descriptor", many_keys).await;
    under_the_chart_limit("RLQS buckets of new 1 KiB users", many_buckets).await;
    under_the_chart_limit("unknown domains", unknown_domains).await;
}
