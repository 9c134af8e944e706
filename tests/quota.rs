//! The Rate Limit Quota Service (RLQS) at the protocol level, against the real binary: a
//! gRPC client plays Envoy's `rate_limit_quota` filter, reporting buckets over one stream.
//! Usage is charged to the counters ShouldRateLimit uses; assignments follow what is left.

mod harness;
mod redis_harness;

use std::collections::HashMap;
use std::time::Duration;

use floodgate::limiter::Algorithm;
use floodgate::proto::envoy::r#type::v3::RateLimitStrategy;
use floodgate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use harness::{Floodgate, OK, OVER_LIMIT, descriptor, request};
use redis_harness::RedisServer;
use redis_harness::cluster::RedisCluster;
use redis_harness::delay::DelayedLink;
use redis_harness::sentinel::{MASTER, Sentinels};
use tokio::sync::mpsc;
use tonic::Streaming;

const RULES: &str = "
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: hour, requests_per_unit: 5}
";

/// One stream: reports go in, answers come out.
struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn open(server: &Floodgate) -> Stream {
        let (reports, answers) = harness::quota_stream(server).await;
        Stream { reports, answers }
    }

    /// Sends one report that is refused: the actions answered before the stream ended, and
    /// the status it ended with.
    async fn refused(
        &mut self,
        domain: &str,
        usages: Vec<BucketQuotaUsage>,
    ) -> (Vec<BucketAction>, tonic::Status) {
        let report = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages,
        };
        self.reports.send(report).await.expect("the stream is open");
        let mut actions = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), self.answers.message());
            match next.await.expect("an answer within 10 s") {
                Ok(Some(answer)) => actions.extend(answer.bucket_action),
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => return (actions, status),
            }
        }
    }

    /// Reports 3 requests of the bucket `entries` every 100 ms until an answer is `done`
    /// (`what` names it), for at most 10 s.
    async fn report_until(
        &mut self,
        entries: &[(&str, &str)],
        what: &str,
        done: impl Fn(&RateLimitQuotaResponse) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let answer = self.report("quota", vec![usage(entries, 3, 100)]).await;
            let answer = answer.expect("an answer");
            if done(&answer) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never {what}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends one report without waiting for an answer.
    async fn send(&mut self, domain: &str, usages: Vec<BucketQuotaUsage>) {
        let report = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages,
        };
        self.reports.send(report).await.expect("the stream is open");
    }

    /// Sends one report and waits for its answer (or the stream's end, as an error).
    async fn report(
        &mut self,
        domain: &str,
        usages: Vec<BucketQuotaUsage>,
    ) -> Result<RateLimitQuotaResponse, tonic::Status> {
        let report = RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages,
        };
        self.reports.send(report).await.expect("the stream is open");
        let answer = tokio::time::timeout(Duration::from_secs(10), self.answers.message())
            .await
            .expect("an answer within 10 s")?;
        Ok(answer.expect("an answer, not the end"))
    }
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: (entries.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

/// A usage report of `allowed` requests over `elapsed_ms` (0: the bucket's first report).
fn usage(entries: &[(&str, &str)], allowed: u64, elapsed_ms: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(bucket(entries)),
        time_elapsed: Some(pbjson_types::Duration {
            seconds: (elapsed_ms / 1000) as i64,
            nanos: ((elapsed_ms % 1000) * 1_000_000) as i32,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

/// The strategy and time to live of the answer's only action.
fn assignment(answer: &RateLimitQuotaResponse) -> (Strategy, Duration) {
    assert_eq!(answer.bucket_action.len(), 1, "{answer:?}");
    let Some(Action::QuotaAssignmentAction(action)) = &answer.bucket_action[0].bucket_action else {
        panic!("an assignment: {answer:?}");
    };
    let Some(RateLimitStrategy {
        strategy: Some(strategy),
    }) = &action.rate_limit_strategy
    else {
        panic!("a strategy: {answer:?}");
    };
    let ttl = action.assignment_time_to_live.expect("a time to live");
    let ttl = Duration::new(ttl.seconds as u64, ttl.nanos as u32);
    (*strategy, ttl)
}

fn is_blanket(strategy: &Strategy, rule: BlanketRule) -> bool {
    matches!(strategy, Strategy::BlanketRule(r) if *r == rule as i32)
}

#[tokio::test]
async fn reported_usage_is_charged_to_the_counters_should_rate_limit_uses() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let mut stream = Stream::open(&server).await;
    let alice = [("user", "alice")];
    // The first report subscribes: a token bucket over the quota left.
    let first = stream.report("quota", vec![usage(&alice, 1, 0)]).await;
    let (strategy, _) = assignment(&first.expect("an answer"));
    assert!(matches!(strategy, Strategy::TokenBucket(_)), "{strategy:?}");
    // ShouldRateLimit sees the RLQS usage: 10 - 1 - this request = 8 left.
    let ask = request("quota", vec![descriptor(&alice)]);
    let rls = server.ask(ask.clone()).await;
    assert_eq!((rls.overall_code, rls.statuses[0].limit_remaining), (OK, 8));
    // Eight more let through by the data plane exhaust it: DENY_ALL until the hour ends.
    // (It refused 3 more.)
    let eight = BucketQuotaUsage {
        num_requests_denied: 3,
        ..usage(&alice, 8, 1000)
    };
    let exhausted = stream.report("quota", vec![eight]).await;
    let (strategy, ttl) = assignment(&exhausted.expect("an answer"));
    assert!(is_blanket(&strategy, BlanketRule::DenyAll), "{strategy:?}");
    assert!(
        ttl > Duration::ZERO && ttl <= Duration::from_secs(3600),
        "{ttl:?}"
    );
    assert_eq!(server.ask(ask).await.overall_code, OVER_LIMIT);
    // What /metrics says of it.
    let figures = [
        ("floodgate_rlqs_streams_opened_total", 1.0),
        ("floodgate_rlqs_streams", 1.0),
        ("floodgate_rlqs_buckets", 1.0),
        ("floodgate_rlqs_reports_total", 2.0),
        (
            r#"floodgate_rlqs_assignments_total{strategy="token_bucket"}"#,
            1.0,
        ),
        (
            r#"floodgate_rlqs_assignments_total{strategy="deny_all"}"#,
            1.0,
        ),
    ];
    for (name, value) in figures {
        assert_eq!(server.metric(name), value, "{name}");
    }
    // The rule's statistics count RLQS usage as ShouldRateLimit requests: 12 reported (9
    // let through, 3 refused by the data plane) and the 2 asked; 3 refused and the last
    // ShouldRateLimit over the limit.
    let rule = |stat: &str| {
        let name = format!("ratelimit_service_rate_limit_{stat}{{domain=\"quota\",key1=\"user\"}}");
        server.metric(&name)
    };
    assert_eq!(rule("total_hits"), 14.0);
    assert_eq!(rule("over_limit"), 4.0);
    assert_eq!(rule("within_limit"), 10.0);
    drop(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.metric("floodgate_rlqs_streams") != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream is still counted open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.metric("floodgate_rlqs_buckets"), 0.0);
}

#[tokio::test]
async fn a_bucket_matches_its_rule_whatever_the_order_of_its_entries() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let mut stream = Stream::open(&server).await;
    // A BucketId has no order; the rule tree does (tenant, then plan).
    let free = [("plan", "free"), ("tenant", "acme")];
    let answer = stream.report("quota", vec![usage(&free, 5, 0)]).await;
    let (strategy, _) = assignment(&answer.expect("an answer"));
    assert!(
        is_blanket(&strategy, BlanketRule::DenyAll),
        "5 of 5 used: {strategy:?}"
    );
    let ask = request(
        "quota",
        vec![descriptor(&[("tenant", "acme"), ("plan", "free")])],
    );
    assert_eq!(server.ask(ask).await.overall_code, OVER_LIMIT);
}

/// A bucket no rule matches gets no assignment (the data plane applies its own
/// `no_assignment_behavior`), is counted by domain, charges nothing, and the stream goes
/// on: the report's other buckets are answered, later reports too, and a rule added since
/// is found by the same stream.
#[tokio::test]
async fn buckets_no_rule_matches_get_no_assignment_and_the_stream_goes_on() {
    let server = Floodgate::start(
        &[("quota.yaml", RULES)],
        &["--rules-reload-interval-ms", "100"],
    );
    // A domain without rules: nothing is sent back, and the stream stays open.
    let mut elsewhere = Stream::open(&server).await;
    elsewhere
        .send("elsewhere", vec![usage(&[("user", "x")], 100, 0)])
        .await;
    elsewhere
        .send("", vec![usage(&[("user", "y")], 100, 0)])
        .await;
    let unknown = "floodgate_rlqs_unmatched_buckets_total{domain=\"(unknown)\"}";
    server.wait_for_metric(unknown, 2.0).await;

    let mut stream = Stream::open(&server).await;
    let long = "v".repeat(100);
    let report = vec![
        usage(&[("user", "bob")], 3, 0),
        usage(&[("nobody", "x")], 100, 0),
        usage(&[("plan", "free")], 100, 0),
        usage(&[("nobody", &long)], 100, 0),
        usage(&[("tenant", "acme"), ("plan", "gold")], 100, 0),
    ];
    let answered = stream.report("quota", report).await.expect("an answer");
    assert_eq!(answered.bucket_action.len(), 1, "{answered:?}");
    let (strategy, _) = assignment(&answered);
    assert!(matches!(strategy, Strategy::TokenBucket(_)), "{strategy:?}");
    assert_eq!(
        answered.bucket_action[0].bucket_id,
        Some(bucket(&[("user", "bob")]))
    );
    let matched_later = stream.report(
        "quota",
        vec![
            usage(&[("nobody", "x")], 1, 1000),
            usage(&[("user", "bob")], 0, 1000),
        ],
    );
    let answered = matched_later.await.expect("the stream goes on");
    assert_eq!(answered.bucket_action.len(), 1, "{answered:?}");
    assert_eq!(
        server.metric("floodgate_rlqs_unmatched_buckets_total{domain=\"quota\"}"),
        5.0
    );
    assert_eq!(
        server.metric("floodgate_rlqs_refused_reports_total{code=\"INVALID_ARGUMENT\"}"),
        0.0
    );
    assert_eq!(server.metric("floodgate_rlqs_streams"), 2.0);
    // The matched bucket's usage was charged; the others charged nothing.
    let rls = server
        .ask(request("quota", vec![descriptor(&[("user", "bob")])]))
        .await;
    assert_eq!(
        rls.statuses[0].limit_remaining, 6,
        "3 charged, then this one"
    );
    assert!(
        server
            .stderr()
            .matches("an RLQS bucket matches no rule")
            .count()
            == 2,
        "logged once a stream:\n{}",
        server.stderr()
    );

    // A rule added since is found by the same stream's next report.
    let with_nobody =
        format!("{RULES}  - key: nobody\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n");
    std::fs::write(server.rules_dir.path().join("quota.yaml"), with_nobody).expect("a write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let both = vec![
            usage(&[("nobody", "x")], 0, 100),
            usage(&[("user", "bob")], 0, 100),
        ];
        let answer = stream.report("quota", both).await.expect("an answer");
        if answer.bucket_action.len() == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never assigned: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A stream's later reports may leave the domain out.
    let mut stream = Stream::open(&server).await;
    let first = stream
        .report("quota", vec![usage(&[("user", "carol")], 0, 0)])
        .await;
    assert!(first.is_ok(), "{first:?}");
    let later = stream
        .report("", vec![usage(&[("user", "dave")], 0, 1000)])
        .await;
    let (strategy, _) = assignment(&later.expect("an answer"));
    assert!(matches!(strategy, Strategy::TokenBucket(_)), "{strategy:?}");
}

/// A report that does not decode (bytes that are no report, or one past the size a message
/// may have) ends the stream with INVALID_ARGUMENT saying why, though the data plane keeps
/// its side open: never OK, as if it had hung up.
#[tokio::test]
async fn a_report_that_does_not_decode_ends_the_stream_with_invalid_argument() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let path = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";
    let mut not_a_report = vec![0u8, 0, 0, 0, 6];
    not_a_report.extend_from_slice(&[0xff; 6]);
    // 5 MB announced (past the 4 MiB a message may have), a first part of it sent.
    let mut too_large = vec![0u8];
    too_large.extend_from_slice(&5_000_000u32.to_be_bytes());
    too_large.extend_from_slice(&[0; 1024]);
    for (frame, why) in [(not_a_report, "does not decode"), (too_large, "too large")] {
        let mut call = harness::raw_call_to(server.grpc_addr, path, &[]).await;
        call.body.send_data(frame.into(), false).expect("sent");
        let ended = harness::grpc_status_and_message(&mut call.response).await;
        let (status, message) = ended.expect("a status");
        assert_eq!(status, "3", "INVALID_ARGUMENT: {message}");
        assert!(message.contains(why), "{message}");
    }
    let refused = r#"floodgate_rlqs_refused_reports_total{code="INVALID_ARGUMENT"}"#;
    assert_eq!(server.metric(refused), 2.0);
}

/// Usage charged after the fact counts in the rule's statistics as the same requests sent
/// one by one through ShouldRateLimit would: 10 let through on a count of 17 of 20 (near
/// the limit from 16) are 3 within and near it, 7 over it. A report of the most requests a
/// count can hold stops the counters there rather than wrapping them.
#[tokio::test]
async fn usage_is_split_at_the_limit_as_single_hits_are_and_counts_never_wrap() {
    const TWENTY: &str = "
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 20}
";
    let server = Floodgate::start(&[("quota.yaml", TWENTY)], &[]);
    let mut stream = Stream::open(&server).await;
    let carol = [("user", "carol")];
    (stream.report("quota", vec![usage(&carol, 17, 0)]).await).expect("an answer");
    (stream.report("quota", vec![usage(&carol, 10, 1000)]).await).expect("an answer");
    let rule = |stat: &str| {
        let name = format!("ratelimit_service_rate_limit_{stat}{{domain=\"quota\",key1=\"user\"}}");
        server.metric(&name)
    };
    assert_eq!(
        [
            rule("total_hits"),
            rule("within_limit"),
            rule("near_limit"),
            rule("over_limit")
        ],
        [27.0, 20.0, 4.0, 7.0],
        "17 within (1 near); then 3 within and near, 7 over"
    );
    let most = BucketQuotaUsage {
        num_requests_denied: u64::MAX,
        ..usage(&carol, u64::MAX, 1000)
    };
    (stream.report("quota", vec![most]))
        .await
        .expect("an answer");
    assert_eq!(rule("total_hits"), u64::MAX as f64);
    assert_eq!(rule("over_limit"), u64::MAX as f64);
}

/// The split at the limit holds for every algorithm a rule can name, on Redis as in memory:
/// each charge's look reads the counter as the charge finds it.
#[tokio::test]
async fn usage_is_split_at_the_limit_for_every_algorithm_on_both_backends() {
    let mut rules = String::from("domain: quota\ndescriptors:\n");
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        rules.push_str(&format!(
            "  - key: {name}\n    rate_limit: {{unit: hour, requests_per_unit: 20, algorithm: {name}}}\n"
        ));
    }
    let redis = RedisServer::start();
    let url = redis.url();
    for backend in [&[][..], &["--backend", "redis", "--redis-url", &url][..]] {
        let server = Floodgate::start(&[("quota.yaml", &rules)], backend);
        let mut stream = Stream::open(&server).await;
        for algorithm in Algorithm::ALL {
            let user = [(algorithm.name(), "carol")];
            (stream.report("quota", vec![usage(&user, 17, 0)]).await).expect("an answer");
            (stream.report("quota", vec![usage(&user, 10, 1000)]).await).expect("an answer");
            let rule = |stat: &str| {
                server.metric(&format!(
                    "ratelimit_service_rate_limit_{stat}{{domain=\"quota\",key1=\"{}\"}}",
                    algorithm.name()
                ))
            };
            assert_eq!(
                [rule("total_hits"), rule("within_limit"), rule("over_limit")],
                [27.0, 20.0, 7.0],
                "{} {backend:?}: 17 within, then 3 within and 7 over",
                algorithm.name()
            );
        }
    }
}

#[tokio::test]
async fn a_bucket_whose_rule_is_removed_is_abandoned() {
    let server = Floodgate::start(
        &[("quota.yaml", RULES)],
        &["--rules-reload-interval-ms", "100"],
    );
    let mut stream = Stream::open(&server).await;
    let carol = [("user", "carol")];
    let first = stream.report("quota", vec![usage(&carol, 0, 0)]).await;
    assert!(first.is_ok());
    let without_users = RULES.replace(
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
        "",
    );
    std::fs::write(server.rules_dir.path().join("quota.yaml"), without_users).expect("a write");
    let abandoned = |answer: &RateLimitQuotaResponse| {
        matches!(
            answer.bucket_action[0].bucket_action,
            Some(Action::AbandonAction(_))
        )
    };
    stream.report_until(&carol, "abandoned", abandoned).await;
    assert_eq!(server.metric("floodgate_rlqs_abandoned_total"), 1.0);
    assert_eq!(server.metric("floodgate_rlqs_buckets"), 0.0);
}

/// A bucket whose rule changes (its limit lowered by a reload) is matched again, and
/// assigned from the new limit at its next report on the same stream.
#[tokio::test]
async fn a_bucket_whose_rule_changes_is_assigned_from_the_new_rule() {
    let server = Floodgate::start(
        &[("quota.yaml", RULES)],
        &["--rules-reload-interval-ms", "100"],
    );
    let mut stream = Stream::open(&server).await;
    let erin = [("user", "erin")];
    let first = stream.report("quota", vec![usage(&erin, 3, 0)]).await;
    let (strategy, _) = assignment(&first.expect("an answer"));
    assert!(matches!(strategy, Strategy::TokenBucket(_)), "{strategy:?}");
    let lowered = RULES.replace("requests_per_unit: 10}", "requests_per_unit: 2}");
    std::fs::write(server.rules_dir.path().join("quota.yaml"), lowered).expect("a write");
    let denied =
        |answer: &RateLimitQuotaResponse| is_blanket(&assignment(answer).0, BlanketRule::DenyAll);
    stream
        .report_until(&erin, "assigned from 2 an hour", denied)
        .await;
}

/// What cannot be read ends the stream with INVALID_ARGUMENT. A report without a domain, or
/// naming another, charges nothing. A bucket that cannot be a descriptor (no entries, an
/// empty or oversized one) is refused alone: the report's other buckets are answered and
/// charged first, so one bucket built from a client's odd header does not cost a data
/// plane every assignment.
#[tokio::test]
async fn a_report_the_protocol_forbids_ends_the_stream_with_invalid_argument() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let long = "v".repeat(1025);
    let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let cases: [(&str, Vec<BucketQuotaUsage>, usize, &str); 6] = [
        (
            "",
            vec![usage(&[("user", "a")], 3, 0)],
            0,
            "names no domain",
        ),
        (
            "quota",
            vec![usage(&[], 0, 0)],
            0,
            "bucket_quota_usages[0]: a bucket_id with no entries",
        ),
        (
            "quota",
            vec![usage(&[("user", "a")], 5, 0), usage(&[("user", "")], 0, 0)],
            1,
            "bucket_quota_usages[1]: a bucket_id entry with an empty name or value",
        ),
        (
            "quota",
            vec![usage(&[("user", &long)], 1, 0)],
            0,
            "bucket_quota_usages[0]: the value of bucket_id entry \"user\" is 1025 bytes; \
             at most 1024 are allowed",
        ),
        (
            "quota",
            vec![usage(&many, 1, 0)],
            0,
            "bucket_quota_usages[0]: a bucket_id of 17 entries; at most 16 are allowed",
        ),
        (
            "quota",
            vec![
                usage(&[("user", "")], 0, 0),
                usage(&[("nobody", "x")], 0, 0),
                usage(&[], 0, 0),
            ],
            0,
            "bucket_quota_usages[0]: a bucket_id entry with an empty name or value; \
             bucket_quota_usages[2]: a bucket_id with no entries",
        ),
    ];
    for (domain, usages, answered, message) in cases {
        let mut stream = Stream::open(&server).await;
        let (actions, refused) = stream.refused(domain, usages).await;
        assert_eq!(actions.len(), answered, "{actions:?}");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(message), "{refused:?}");
    }
    assert_eq!(
        server.metric("floodgate_rlqs_refused_reports_total{code=\"INVALID_ARGUMENT\"}"),
        6.0
    );
    // The report without a domain charged nothing; the bucket before the bad one, its 5.
    let rls = (server.ask(request("quota", vec![descriptor(&[("user", "a")])]))).await;
    assert_eq!(rls.statuses[0].limit_remaining, 4);
    // Counts at the top of their range are taken as they are, never overflowed.
    let mut stream = Stream::open(&server).await;
    let huge = BucketQuotaUsage {
        num_requests_denied: u64::MAX,
        ..usage(&[("user", "huge")], u64::MAX, 1)
    };
    let answer = stream.report("quota", vec![huge]).await.expect("an answer");
    let (strategy, _) = assignment(&answer);
    assert!(is_blanket(&strategy, BlanketRule::DenyAll), "{strategy:?}");
    // The server still answers.
    let mut stream = Stream::open(&server).await;
    assert!(
        stream
            .report("quota", vec![usage(&[("user", "a")], 0, 0)])
            .await
            .is_ok()
    );
}

/// A refusal quotes what it refuses, cut short: a domain of 100,000 characters, a bucket of
/// 10,000 entries or one of 16 long ones is refused with a status of a few hundred bytes,
/// which every client can read, not one its header limits would drop.
#[tokio::test]
async fn refusals_quote_long_names_and_buckets_cut_short() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let long_domain = "d".repeat(100_000);
    let mut stream = Stream::open(&server).await;
    let refused = (stream.report(&long_domain, vec![usage(&[], 0, 0)]))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().len() < 400, "{}", refused.message().len());

    let names: Vec<String> = (0..10_000).map(|i| format!("key-{i:0>200}")).collect();
    let value = "v".repeat(1000);
    let wide: Vec<(&str, &str)> = (names.iter()).map(|name| (name.as_str(), "v")).collect();
    let long: Vec<(&str, &str)> = (names.iter().take(16))
        .map(|name| (name.as_str(), value.as_str()))
        .collect();
    for bucket in [wide, long] {
        let mut stream = Stream::open(&server).await;
        let bucket = vec![usage(&bucket, 0, 0), usage(&[("", "v")], 0, 0)];
        let refused = (stream.report("quota", bucket)).await.expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().len() < 800, "{}", refused.message());
    }
    // A domain without rules is named, cut short, in the one line a stream logs.
    let mut stream = Stream::open(&server).await;
    stream
        .send(&long_domain, vec![usage(&[("user", "x")], 0, 0)])
        .await;
    let unknown = "floodgate_rlqs_unmatched_buckets_total{domain=\"(unknown)\"}";
    server.wait_for_metric(unknown, 1.0).await;
    let logged = server.stderr();
    let line = (logged.lines())
        .find(|line| line.contains("matches no rule"))
        .expect("a log line");
    assert!(line.len() < 2_000, "{line}");

    let mut stream = Stream::open(&server).await;
    (stream
        .report("quota", vec![usage(&[("user", "x")], 0, 0)])
        .await)
        .expect("an answer");
    let other = stream.report(&long_domain, vec![usage(&[("user", "x")], 0, 0)]);
    let refused = other.await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().len() < 400, "{}", refused.message().len());
}

/// A report's `time_elapsed` is taken within 1 s to 1 min, whatever it says: the longest
/// a data plane can claim gives an assignment that lives three minutes, not centuries, and
/// a negative one counts as a first report.
#[tokio::test]
async fn a_reports_elapsed_time_is_taken_within_bounds() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let mut stream = Stream::open(&server).await;
    for (seconds, longest_ttl) in [(i64::MAX, 180), (-5, 15), (0, 15)] {
        let report = BucketQuotaUsage {
            time_elapsed: Some(pbjson_types::Duration { seconds, nanos: 0 }),
            ..usage(&[("user", "frank")], 1, 0)
        };
        let answer = stream.report("quota", vec![report]).await;
        let (strategy, ttl) = assignment(&answer.expect("an answer"));
        assert!(matches!(strategy, Strategy::TokenBucket(_)), "{strategy:?}");
        assert!(
            ttl <= Duration::from_secs(longest_ttl),
            "{seconds} s elapsed: {ttl:?}"
        );
    }
}

/// A window's new assignment is pushed after the window resets, never before, however long
/// the backend took to count. A report of 5,000 buckets is some forty backend calls, four at
/// a time: its last buckets are counted long after the report was read. A reset placed from
/// the report's instant came that much early for them (less the 20 ms a push waits), and
/// their push sent what was left of the old window, with nothing after the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_pushed_after_the_window_resets_however_long_the_count_took() {
    let redis = RedisServer::start();
    let server = Floodgate::start(
        &[("quota.yaml", &ten_second_rule(10))],
        &["--backend", "redis", "--redis-url", &redis.url()],
    );
    let mut stream = Stream::open(&server).await;
    // The report goes 4.5 s before a reset: its next one would come after it.
    let phase = unix_micros() % WINDOW;
    let until = (5_500_000 + WINDOW - phase) % WINDOW;
    tokio::time::sleep(Duration::from_micros(until as u64)).await;
    let resets_at = (unix_micros() / WINDOW + 1) * WINDOW;
    let names: Vec<String> = (0..5_000).map(|i| format!("user-{i}")).collect();
    let usages = (names.iter())
        .map(|name| usage(&[("user", name.as_str())], 10, 1000))
        .collect();
    let answer = stream.report("quota", usages).await.expect("an answer");
    assert_eq!(answer.bucket_action.len(), 5_000);
    let mut pushed = 0;
    while pushed < 5_000 {
        let next = tokio::time::timeout(Duration::from_secs(8), stream.answers.message());
        let push = (next.await.expect("the pushes within 8 s"))
            .expect("the stream goes on")
            .expect("a push");
        let arrived = unix_micros();
        assert!(
            arrived >= resets_at,
            "{} buckets pushed {} ms before the reset",
            push.bucket_action.len(),
            (resets_at - arrived) / 1000
        );
        for action in &push.bucket_action {
            let Some(Action::QuotaAssignmentAction(assigned)) = &action.bucket_action else {
                panic!("an assignment: {action:?}");
            };
            let strategy = assigned.rate_limit_strategy.and_then(|s| s.strategy);
            assert!(
                !matches!(strategy, Some(s) if is_blanket(&s, BlanketRule::DenyAll)),
                "the new window's quota: {strategy:?}"
            );
        }
        pushed += push.bucket_action.len();
    }
}

/// A report read just after its window's reset charges the new window only what was let
/// through after the reset, however late the answer before it came. Redis is 150 ms away:
/// the reset it names at a report is placed 150 ms late from when its answer was read, and
/// a report that came between the true reset and that estimate was charged whole to the
/// new window (Redis counts it there), the old window's 30 requests with it. Each stream
/// reports its 30 at its own moment after the reset (a stream answers its reports in turn,
/// each a 300 ms round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_just_after_the_reset_charges_the_new_window_only_what_came_after_it() {
    const AFTER_RESET_MS: [u64; 3] = [10, 60, 120];
    let redis = RedisServer::start();
    let link = DelayedLink::to(redis.port(), Duration::from_millis(150)).await;
    let server = Floodgate::start_with_env(
        &[("quota.yaml", &ten_second_rule(100))],
        &["--backend", "redis", "--redis-url", &link.url()],
        &[
            ("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000"),
            ("FLOODGATE_REDIS_CONNECT_TIMEOUT_MS", "2000"),
            ("FLOODGATE_REDIS_STARTUP__MAX_ELAPSED_MS", "10000"),
        ],
    );
    let mut streams = Vec::new();
    for _ in AFTER_RESET_MS {
        streams.push(Stream::open(&server).await);
    }
    // The first reports go 2 s before a reset.
    let phase = unix_micros() % WINDOW;
    let until = (2 * WINDOW - 2_000_000 - phase) % WINDOW;
    tokio::time::sleep(Duration::from_micros(until as u64)).await;
    let resets_at = (unix_micros() / WINDOW + 1) * WINDOW;
    let users: Vec<String> = (0..AFTER_RESET_MS.len())
        .map(|i| format!("late-{i}"))
        .collect();
    let first = (streams.iter_mut().zip(&users)).map(|(stream, user)| async move {
        let usage = usage(&[("user", user.as_str())], 0, 0);
        stream
            .report("quota", vec![usage])
            .await
            .expect("an answer");
    });
    futures_util::future::join_all(first).await;
    // Then each lets 30 through before the reset (its assignment allowed 2 and 20 a
    // second), and reports them just after it.
    let after = (streams.iter_mut().zip(&users).zip(AFTER_RESET_MS)).map(
        |((stream, user), after_ms)| async move {
            let at = resets_at + u128::from(after_ms) * 1000;
            let wait = at.saturating_sub(unix_micros());
            tokio::time::sleep(Duration::from_micros(wait as u64)).await;
            let usage = usage(&[("user", user.as_str())], 30, 2000);
            stream
                .report("quota", vec![usage])
                .await
                .expect("an answer");
        },
    );
    futures_util::future::join_all(after).await;
    assert!(
        unix_micros() < resets_at + WINDOW,
        "the reports were answered in the window after the reset"
    );
    // What came in the last 150 ms before the reset (Redis' estimate of it placed early by
    // its one way) may be charged to the new window, 3 or 4; the late estimate charged
    // all 30.
    for (user, after_ms) in users.iter().zip(AFTER_RESET_MS) {
        let ask = request("quota", vec![descriptor(&[("user", user.as_str())])]);
        let remaining = server.ask(ask).await.statuses[0].limit_remaining;
        assert!(
            remaining >= 90,
            "{user}, reported {after_ms} ms after the reset: {remaining} left of 100"
        );
    }
}

/// The rules of the two tests above: `limit` a user per 10 s windows ([`WINDOW`]).
fn ten_second_rule(limit: u32) -> String {
    format!(
        "domain: quota\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, unit_multiplier: 10, requests_per_unit: {limit}}}\n"
    )
}

/// The windows of [`ten_second_rule`], in µs.
const WINDOW: u128 = 10_000_000;

fn unix_micros() -> u128 {
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
        .expect("after the epoch")
        .as_micros()
}

/// 10,000 buckets in one report, on a real Redis: charged together, in calls of many
/// buckets, and each answered in the report's order with its own bucket's quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_buckets_on_one_stream_are_each_answered() {
    let redis = RedisServer::start();
    // Charging 10,000 buckets is a second of a debug build's CPU, within the report's
    // deadline on an idle machine: the server runs above a busy machine's other work.
    let server = Floodgate::start_wrapped(
        &harness::cpu::URGENT_PREFIX,
        &[("quota.yaml", RULES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
        &[],
    );
    let mut stream = Stream::open(&server).await;
    let names: Vec<String> = (0..10_000).map(|i| format!("user-{i}")).collect();
    // User i let through i mod 11 requests: every call's buckets differ.
    let allowed = |i: usize| (i % 11) as u64;
    let usages = (names.iter().enumerate())
        .map(|(i, name)| usage(&[("user", name.as_str())], allowed(i), 0))
        .collect();
    let answer = stream.report("quota", usages).await.expect("an answer");
    assert_eq!(answer.bucket_action.len(), 10_000);
    for (i, action) in answer.bucket_action.iter().enumerate() {
        assert_eq!(action.bucket_id, Some(bucket(&[("user", &names[i])])));
        let Some(Action::QuotaAssignmentAction(assigned)) = &action.bucket_action else {
            panic!("bucket {i}: {action:?}");
        };
        let strategy = assigned.rate_limit_strategy.and_then(|s| s.strategy);
        // 10 an hour: those that let 10 or more through are denied, the others not.
        let denied = matches!(strategy, Some(s) if is_blanket(&s, BlanketRule::DenyAll));
        assert_eq!(denied, allowed(i) >= 10, "bucket {i}: {strategy:?}");
    }
    for i in [0, 4_999, 5_003, 9_999] {
        let rls = (server.ask(request("quota", vec![descriptor(&[("user", &names[i])])]))).await;
        let expected = 10u64.saturating_sub(allowed(i) + 1);
        assert_eq!(
            u64::from(rls.statuses[0].limit_remaining),
            expected,
            "user {i}: {} charged, then this one",
            allowed(i)
        );
    }
}

/// A data plane that leaves in the middle of a report (10,000 buckets being charged) costs
/// the server nothing: the stream is closed, and other streams are answered.
#[tokio::test]
async fn a_stream_cut_mid_report_is_closed_and_the_rest_served() {
    let server = Floodgate::start(&[("quota.yaml", RULES)], &[]);
    let stream = Stream::open(&server).await;
    let names: Vec<String> = (0..10_000).map(|i| format!("gone-{i}")).collect();
    let usages = (names.iter())
        .map(|name| usage(&[("user", name.as_str())], 1, 0))
        .collect();
    let report = RateLimitQuotaUsageReports {
        domain: "quota".into(),
        bucket_quota_usages: usages,
    };
    stream.reports.send(report).await.expect("sent");
    drop(stream);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.metric("floodgate_rlqs_streams") != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cut stream stays open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut other = Stream::open(&server).await;
    let answer = other
        .report("quota", vec![usage(&[("user", "x")], 0, 0)])
        .await;
    assert!(answer.is_ok(), "{answer:?}");
}

#[tokio::test]
async fn shutdown_ends_the_streams_so_data_planes_go_elsewhere() {
    let server = Floodgate::start_with_env(
        &[("quota.yaml", RULES)],
        &[],
        &[("FLOODGATE_SHUTDOWN_GRACE", "30")],
    );
    let mut stream = Stream::open(&server).await;
    assert!(
        stream
            .report("quota", vec![usage(&[("user", "d")], 0, 0)])
            .await
            .is_ok()
    );
    let started = std::time::Instant::now();
    let (status, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminated");
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the open stream did not hold the shutdown for its 30 s grace"
    );
    let ended = stream.answers.message().await;
    assert!(
        matches!(&ended, Err(status) if status.code() == tonic::Code::Unavailable),
        "{ended:?}"
    );
}

/// The tokens a second of a token-bucket assignment (fractional below one a second).
fn rate(answer: &RateLimitQuotaResponse) -> f64 {
    let (strategy, _) = assignment(answer);
    let Strategy::TokenBucket(bucket) = strategy else {
        panic!("a token bucket: {answer:?}");
    };
    let fill = bucket.fill_interval.expect("a fill interval");
    let fill = fill.seconds as f64 + f64::from(fill.nanos) / 1e9;
    f64::from(bucket.tokens_per_fill.expect("tokens per fill").value) / fill
}

/// What each bucket of `answer` was told, by the value of its one entry: its strategy,
/// or `None` for an abandoned bucket.
fn strategies(answer: &RateLimitQuotaResponse) -> HashMap<String, Option<Strategy>> {
    (answer.bucket_action.iter())
        .map(|action| {
            let id = action.bucket_id.as_ref().expect("a bucket id");
            let value = id.bucket.values().next().expect("an entry").clone();
            let strategy = match &action.bucket_action {
                Some(Action::QuotaAssignmentAction(assigned)) => {
                    assigned.rate_limit_strategy.and_then(|s| s.strategy)
                }
                _ => None,
            };
            (value, strategy)
        })
        .collect()
}

/// A shadow-mode rule is counted but never enforced: over its limit it is still
/// `ALLOW_ALL`. With the backend gone, each bucket gets its rule's `on_backend_error`:
/// `fail_open` `ALLOW_ALL`, `fail_closed` `DENY_ALL`, `local` an assignment counted in
/// process, and `error` nothing (the data plane's assignment runs out, then its
/// `expired_assignment_behavior` applies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_denies_and_a_dead_backend_gets_each_rules_policy() {
    const POLICIES: &str = "
domain: policies
descriptors:
  - key: rule
    value: shadow
    rate_limit: {unit: hour, requests_per_unit: 5}
    shadow_mode: true
  - key: rule
    value: enforced
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: rule
    value: open
    rate_limit: {unit: hour, requests_per_unit: 5}
    on_backend_error: fail_open
  - key: rule
    value: closed
    rate_limit: {unit: hour, requests_per_unit: 5}
    on_backend_error: fail_closed
  - key: rule
    value: local
    rate_limit: {unit: hour, requests_per_unit: 5}
    on_backend_error: local
  - key: rule
    value: error
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    let redis = RedisServer::start();
    let server = Floodgate::start(
        &[("policies.yaml", POLICIES)],
        &["--backend", "redis", "--redis-url", &redis.url()],
    );
    let mut stream = Stream::open(&server).await;
    let rule = |value: &str, allowed: u64| usage(&[("rule", value)], allowed, 1000);
    let answer = (stream.report("policies", vec![rule("shadow", 10), rule("enforced", 10)]))
        .await
        .expect("an answer");
    let told = strategies(&answer);
    let allow_all = |strategy: &Option<Strategy>| matches!(strategy, Some(s) if is_blanket(s, BlanketRule::AllowAll));
    let deny_all = |strategy: &Option<Strategy>| matches!(strategy, Some(s) if is_blanket(s, BlanketRule::DenyAll));
    assert!(allow_all(&told["shadow"]), "{told:?}");
    assert!(deny_all(&told["enforced"]), "{told:?}");

    drop(redis);
    let report = ["open", "closed", "local", "error"].map(|value| rule(value, 2));
    let answer = (stream.report("policies", report.to_vec()))
        .await
        .expect("an answer");
    let told = strategies(&answer);
    assert!(allow_all(&told["open"]), "{told:?}");
    assert!(deny_all(&told["closed"]), "{told:?}");
    assert!(
        matches!(told["local"], Some(Strategy::TokenBucket(_))),
        "{told:?}"
    );
    assert!(!told.contains_key("error"), "{told:?}");
    // The local policy counts in process: 2 and then 4 more are over 5.
    let answer = (stream.report("policies", vec![rule("local", 4)]))
        .await
        .expect("an answer");
    let told = strategies(&answer);
    assert!(deny_all(&told["local"]), "{told:?}");
}

/// A stream that goes away returns its share: its demand is summed in the periods of 5 s
/// it reported in and the next, so within 10 s the instance left is given the whole quota
/// again.
#[tokio::test]
async fn a_departed_instances_share_returns_to_the_others() {
    const BIG: &str = "
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 36000}
";
    let server = Floodgate::start(&[("quota.yaml", BIG)], &[]);
    let asked = |denied: u64, elapsed_ms: u64| BucketQuotaUsage {
        num_requests_denied: denied,
        ..usage(&[("user", "shared")], 0, elapsed_ms)
    };
    let mut busy = Stream::open(&server).await;
    (busy.report("quota", vec![asked(900, 5000)]).await).expect("an answer");
    let mut modest = Stream::open(&server).await;
    let answer = modest.report("quota", vec![asked(100, 5000)]).await;
    let shared = rate(&answer.expect("an answer"));
    drop(busy);
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answer = modest.report("quota", vec![asked(20, 1000)]).await;
        let alone = rate(&answer.expect("an answer"));
        if alone > 4.0 * shared {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{alone} a second, {shared} while shared: the departed demand still counts"
        );
    }
}

/// Demand is shared across replicas: an instance on one floodgate gets its share against
/// the demand another instance reported to another floodgate on the same Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_different_replicas_share_the_quota_by_demand() {
    let redis = RedisServer::start();
    shared_by_demand(&["--backend", "redis", "--redis-url", &redis.url()]).await;
}

/// The same on a Redis Cluster, where a bucket's counter and its demand live on whichever
/// nodes their keys hash to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_a_redis_cluster_share_the_quota_by_demand() {
    let cluster = RedisCluster::start();
    shared_by_demand(&[
        "--backend",
        "redis-cluster",
        "--redis-url",
        &cluster.seeds(),
    ])
    .await;
}

/// The same through Redis Sentinel, on the primary the sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_through_sentinel_share_the_quota_by_demand() {
    let sentinels = Sentinels::start();
    let urls = sentinels.urls();
    let flags = ["--backend", "redis-sentinel", "--redis-url", &urls];
    shared_by_demand(&[&flags[..], &["--redis-sentinel-master", MASTER]].concat()).await;
}

/// Two replicas started with `backend` flags: an instance reporting to one of them is
/// given its share against the demand another instance reported to the other, and the
/// usage both report is the count ShouldRateLimit answers from on either.
async fn shared_by_demand(backend: &[&str]) {
    const BIG: &str = "
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 36000}
";
    let replica = || {
        Floodgate::start_with_env(
            &[("quota.yaml", BIG)],
            backend,
            &[("FLOODGATE_REDIS_COMMAND_TIMEOUT_MS", "2000")],
        )
    };
    let (one, two) = (replica(), replica());
    let reported = |entries: &[(&str, &str)], allowed: u64, denied: u64| BucketQuotaUsage {
        num_requests_denied: denied,
        ..usage(entries, allowed, 5000)
    };
    // Alone, an instance asking 20 a second gets the rule's pace, 10 a second.
    let mut alone = Stream::open(&two).await;
    let control = rate(
        &alone
            .report("quota", vec![reported(&[("user", "solo")], 0, 100)])
            .await
            .expect("an answer"),
    );
    // With another instance on the other replica asking 180 a second, a tenth of that.
    let mut busy = Stream::open(&one).await;
    busy.report("quota", vec![reported(&[("user", "shared")], 600, 300)])
        .await
        .expect("an answer");
    let mut modest = Stream::open(&two).await;
    let shared = rate(
        &modest
            .report("quota", vec![reported(&[("user", "shared")], 100, 0)])
            .await
            .expect("an answer"),
    );
    let ratio = shared / control;
    assert!(
        (0.09..0.11).contains(&ratio),
        "{shared} a second shared against {control} alone: the other replica's demand counts"
    );
    // Both instances' allowed requests are one count, whichever replica is asked.
    for server in [&one, &two] {
        let rls = (server.ask(request("quota", vec![descriptor(&[("user", "shared")])]))).await;
        let remaining = rls.statuses[0].limit_remaining;
        assert!(
            (36_000 - 700 - 2..=36_000 - 700 - 1).contains(&remaining),
            "remaining {remaining}: 700 charged, then this request (and the other's)"
        );
    }
}
