//! What a Rate Limit Quota Service report costs when its buckets match no rule, against one
//! whose buckets do: in process, on the memory backend, so that only floodgate's own work
//! is timed. Buckets have six entries; those no rule matches have six keys no level of the
//! rule tree knows, or (the costliest for the tree walk) five that lead down the tree and a
//! sixth that does not.
//!
//! `cargo bench --bench rlqs_unmatched`. `BUCKETS` (default 10000) buckets a report,
//! `ROUNDS` (default 5) rounds of each kind, a new stream's first report (every bucket is
//! matched) and its second (the stream remembers each bucket's match).

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::backend::{Backend, MemoryBackend};
use floodgate::clock::SystemClock;
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use floodgate::quota::QuotaService;
use floodgate::rules::RuleSet;
use floodgate::service::{RateLimiter, ServiceOptions};
use support::setting;

/// Six levels, each a key-only default: any value of k1, then k2, … then k6 is one rule.
const RULES: &str = "
domain: bench
descriptors:
  - key: k1
    descriptors:
      - key: k2
        descriptors:
          - key: k3
            descriptors:
              - key: k4
                descriptors:
                  - key: k5
                    descriptors:
                      - key: k6
                        rate_limit: {unit: hour, requests_per_unit: 1000000}
";

/// A report of `buckets` buckets whose entries have the keys `keys`, values of their own.
fn report(buckets: usize, keys: [&str; 6]) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "bench".into(),
        bucket_quota_usages: (0..buckets)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: (keys.iter().rev())
                        .map(|key| (key.to_string(), format!("{key}-{i}")))
                        .collect::<HashMap<_, _>>(),
                }),
                time_elapsed: Some(pbjson_types::Duration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 1,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

/// The time one new stream takes to answer `report` twice: (first, second).
async fn timed(
    service: &QuotaService,
    report: &RateLimitQuotaUsageReports,
) -> (Duration, Duration) {
    let (reports, mut answers) = service.connect();
    let mut times = [Duration::ZERO; 2];
    for time in &mut times {
        let started = Instant::now();
        reports
            .send(report.clone())
            .await
            .expect("the stream is open");
        // A report of matched buckets is answered; one of unmatched buckets is not, so a
        // report of one matched bucket follows it, and its answer marks the end.
        let marker = report_of_one_matched();
        reports.send(marker).await.expect("the stream is open");
        let mut answered = 0;
        while answered < 1 + usize::from(report_matches(report)) {
            answers
                .recv()
                .await
                .expect("an answer")
                .expect("not refused");
            answered += 1;
        }
        *time = started.elapsed();
    }
    // The stream ends (and its buckets are dropped) before the next kind is timed.
    drop(reports);
    while answers.recv().await.is_some() {}
    (times[0], times[1])
}

fn report_of_one_matched() -> RateLimitQuotaUsageReports {
    let mut one = report(1, ["k1", "k2", "k3", "k4", "k5", "k6"]);
    one.bucket_quota_usages[0].bucket_id = Some(BucketId {
        bucket: [
            ("k1", "m"),
            ("k2", "m"),
            ("k3", "m"),
            ("k4", "m"),
            ("k5", "m"),
            ("k6", "m"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into(),
    });
    one
}

fn report_matches(report: &RateLimitQuotaUsageReports) -> bool {
    let keys = |usage: &BucketQuotaUsage| {
        let mut keys: Vec<String> = (usage.bucket_id.as_ref())
            .map(|id| id.bucket.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    };
    (report.bucket_quota_usages.first())
        .is_some_and(|usage| keys(usage) == ["k1", "k2", "k3", "k4", "k5", "k6"])
}

fn main() {
    let buckets = setting("BUCKETS", 10_000);
    let rounds = setting("ROUNDS", 5);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let rules = RuleSet::from_sources(&[("bench.yaml".into(), RULES.into())]).expect("rules");
    let memory = Arc::new(MemoryBackend::new(Arc::new(SystemClock), 10_000_000));
    let limiter = RateLimiter::new(
        rules,
        Backend::memory(memory.clone()),
        memory,
        ServiceOptions::default(),
    );
    let (_running, stopped) = tokio::sync::watch::channel(false);
    let service = QuotaService::new(Arc::new(limiter), stopped);
    let kinds = [
        (
            "matched",
            report(buckets, ["k1", "k2", "k3", "k4", "k5", "k6"]),
        ),
        (
            "unmatched, no key known",
            report(buckets, ["a", "b", "c", "d", "e", "f"]),
        ),
        (
            "unmatched, the sixth key wrong",
            report(buckets, ["k1", "k2", "k3", "k4", "k5", "x"]),
        ),
    ];
    println!(
        "one report of {buckets} buckets of 6 entries, ms: a new stream's first report, then its second"
    );
    for round in 1..=rounds {
        for (kind, report) in &kinds {
            let (first, second) = runtime.block_on(timed(&service, report));
            println!(
                "round {round}  {kind:<32} {:>8.1} {:>8.1}",
                first.as_secs_f64() * 1e3,
                second.as_secs_f64() * 1e3
            );
        }
    }
}
