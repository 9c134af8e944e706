//! One Rate Limit Quota Service report of many buckets, against a real redis-server: how
//! long floodgate takes to charge every bucket to its counters and answer. Each bucket is a
//! user of its own, so every report touches as many counters as it has buckets.
//!
//! `cargo bench --bench rlqs_report` (redis-server on the PATH). `BUCKETS` (default 10000)
//! buckets a report, `REPORTS` (default 5) reports on one stream, the first of them a new
//! bucket's (its counters are created); `SERVER_BIN` measures another build of the server
//! (default: this tree's release build), `ROUNDS` (default 1) alternates them with it.

#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "../tests/redis_harness/mod.rs"]
mod redis_harness;

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use harness::Floodgate;
use redis_harness::RedisServer;
use support::setting;

const RULES: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
";

/// A report of `buckets` users, each of which let one request through in `elapsed` s.
fn report(buckets: usize, elapsed: i64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "bench".into(),
        bucket_quota_usages: (0..buckets)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: HashMap::from([("user".to_owned(), format!("user-{i}"))]),
                }),
                time_elapsed: Some(pbjson_types::Duration {
                    seconds: elapsed,
                    nanos: 0,
                }),
                num_requests_allowed: 1,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

/// How long each of `reports` reports of `buckets` buckets took to be answered, on one
/// stream to a server started by `prefix` (empty: this tree's build) on a fresh Redis.
async fn measure(prefix: &[&str], buckets: usize, reports: usize) -> Vec<Duration> {
    let redis = RedisServer::start();
    let server = Floodgate::start_wrapped(
        prefix,
        &[("bench.yaml", RULES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[],
    );
    let address = format!("http://{}", server.grpc_addr);
    let mut client = RateLimitQuotaServiceClient::connect(address)
        .await
        .expect("a connection");
    let (sender, outgoing) = tokio::sync::mpsc::channel(1);
    let outgoing = futures_util::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|report| (report, outgoing))
    });
    let mut answers = (client.stream_rate_limit_quotas(outgoing).await)
        .expect("the stream opens")
        .into_inner();
    let mut took = Vec::new();
    for index in 0..reports {
        let elapsed = if index == 0 { 0 } else { 5 };
        let sent = Instant::now();
        sender.send(report(buckets, elapsed)).await.expect("sent");
        let answer = (answers.message().await)
            .expect("an answer")
            .expect("not the end");
        took.push(sent.elapsed());
        let answered = answer.bucket_action.len();
        assert_eq!(
            answered, buckets,
            "every bucket answered (the backend kept up)"
        );
    }
    took
}

fn main() {
    let (buckets, reports) = (setting("BUCKETS", 10_000), setting("REPORTS", 5));
    let other = std::env::var("SERVER_BIN").ok();
    // Runs `other` in place of the binary the harness names (its first argument).
    let swap = "bin=$0; shift; exec \"$bin\" \"$@\"";
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    for round in 1..=setting("ROUNDS", 1) {
        let mut builds: Vec<(&str, Vec<&str>)> = vec![("this tree", Vec::new())];
        if let Some(other) = &other {
            builds.push((other.as_str(), vec!["sh", "-c", swap, other.as_str()]));
        }
        for (name, prefix) in builds {
            let took = runtime.block_on(measure(&prefix, buckets, reports));
            let ms: Vec<String> = (took.iter())
                .map(|took| format!("{:.0}", took.as_secs_f64() * 1000.0))
                .collect();
            println!(
                "round {round}, {name}: {buckets} buckets a report, ms per report: {} (first: new counters)",
                ms.join(" ")
            );
        }
    }
}
