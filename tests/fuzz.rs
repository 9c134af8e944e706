//! Fuzzing on stable Rust, bounded in time, inside the test command: the rule loader, the
//! gRPC request (protobuf bytes decoded and decided), `POST /json` (the whole HTTP handler)
//! and an RLQS usage report (decoded and answered as a stream's first and second report)
//! are fed inputs mutated from seeds, and must answer every one without a panic, an abort
//! or a hang.
//!
//! cargo-fuzz needs a nightly compiler and libFuzzer, which this project's machines lack, so
//! this is a plain mutational fuzzer: seeds (the example rules, every regression input, a
//! few requests), mutated by byte flips, interesting values, insertions, deletions, repeated
//! chunks (which build deep nesting) and splices; an input that loads (or decides) cleanly
//! joins the seeds, so mutations reach past the first error. It is deterministic for a seed
//! (`FLOODGATE_FUZZ_SEED`), and runs each target for `FLOODGATE_FUZZ_SECONDS` (default 5; the
//! full suite, `FLOODGATE_TEST_FULL=1 scripts/test.sh` as CI runs it, gives each 15).
//!
//! **Crashes are kept.** Each target runs in a child process (this test binary, run again
//! for one target) that writes every input to a file before trying it. If the child panics,
//! aborts (a stack overflow cannot be caught) or hangs, the parent copies the input into
//! `tests/fuzz/regressions/<target>/` and fails, naming it; every file there is tried first
//! on each run, so once committed it is a regression test.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::backend::{Backend, MemoryBackend};
use floodgate::clock::SystemClock;
use floodgate::edge::http::{HttpState, router};
use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use floodgate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use floodgate::quota::QuotaService;
use floodgate::rules::RuleSet;
use floodgate::service::{RateLimiter, ServiceOptions};
use prost::Message;

const TARGETS: [&str; 4] = ["rules", "grpc_request", "json_request", "rlqs_report"];

/// Which target a child process runs, and where it writes the input it is trying.
/// How long each target runs unless `FLOODGATE_FUZZ_SECONDS` says.
const DEFAULT_SECONDS: u64 = 5;
const CHILD_TARGET: &str = "FLOODGATE_FUZZ_CHILD_TARGET";
const CHILD_INPUT: &str = "FLOODGATE_FUZZ_CHILD_INPUT";

fn regressions(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fuzz/regressions/{target}"))
}

#[test]
fn fuzz_rules() {
    supervise("rules");
}

#[test]
fn fuzz_grpc_request() {
    supervise("grpc_request");
}

#[test]
fn fuzz_json_request() {
    supervise("json_request");
}

#[test]
fn fuzz_rlqs_report() {
    supervise("rlqs_report");
}

/// The child's entry point: does nothing unless this process was started as a child.
#[test]
fn fuzz_child() {
    let Ok(target) = std::env::var(CHILD_TARGET) else {
        return;
    };
    let input = PathBuf::from(std::env::var(CHILD_INPUT).expect("input path"));
    let seconds: u64 = env_number("FLOODGATE_FUZZ_SECONDS", DEFAULT_SECONDS);
    let seed: u64 = env_number("FLOODGATE_FUZZ_SEED", 0x5eed);
    let target = Target::new(&target);
    let runs = run(&target, &input, Duration::from_secs(seconds), seed);
    println!("fuzz {}: {runs} inputs", target.name);
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// Runs `target` in a child process and keeps the input of any crash.
fn supervise(target: &str) {
    assert!(TARGETS.contains(&target));
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("input");
    let seconds = env_number("FLOODGATE_FUZZ_SECONDS", DEFAULT_SECONDS);
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "fuzz_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_TARGET, target)
        .env(CHILD_INPUT, &input)
        .spawn()
        .expect("the fuzzing child starts");
    // A hang is a crash too: the child gets its time and a minute more.
    let bound = Instant::now() + Duration::from_secs(seconds + 60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("child status") {
            break Some(status);
        }
        if Instant::now() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if status.is_some_and(|status| status.success()) {
        return;
    }
    let bytes = std::fs::read(&input).unwrap_or_default();
    let kept = regressions(target).join(format!("crash-{:016x}", fnv(&bytes)));
    std::fs::create_dir_all(kept.parent().expect("a directory")).expect("mkdir");
    std::fs::write(&kept, &bytes).expect("keeping the crash");
    panic!(
        "fuzz {target}: the child {} on an input of {} bytes, kept as {}",
        match status {
            Some(status) => format!("failed ({status})"),
            None => "hung".to_owned(),
        },
        bytes.len(),
        kept.display()
    );
}

/// Tries every regression input, then mutated ones until `time` is up; how many.
fn run(target: &Target, input: &Path, time: Duration, seed: u64) -> usize {
    let mut file = std::fs::File::create(input).expect("the input file");
    let mut corpus = target.seeds();
    let mut regression: Vec<Vec<u8>> = std::fs::read_dir(regressions(target.name))
        .into_iter()
        .flatten()
        .filter_map(|entry| std::fs::read(entry.ok()?.path()).ok())
        .collect();
    regression.sort();
    let mut try_one = |bytes: &[u8]| -> bool {
        file.set_len(0).expect("truncate");
        use std::os::unix::fs::FileExt;
        file.write_all_at(bytes, 0).expect("write the input");
        file.flush().expect("flush");
        target.attempt(bytes)
    };
    for bytes in &regression {
        try_one(bytes);
    }
    corpus.extend(regression);
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed() < time {
        let mut bytes = corpus[rng.usize(..corpus.len())].clone();
        for _ in 0..rng.usize(1..=4) {
            let other = &corpus[rng.usize(..corpus.len())];
            mutate(&mut rng, &mut bytes, other);
        }
        bytes.truncate(1 << 17);
        if try_one(&bytes) && corpus.len() < 4096 {
            corpus.push(bytes);
        }
        runs += 1;
    }
    runs
}

/// One random change to `bytes`; `other` is another corpus entry, for splices.
fn mutate(rng: &mut fastrand::Rng, bytes: &mut Vec<u8>, other: &[u8]) {
    const INTERESTING: [&[u8]; 12] = [
        b"\x00",
        b"\xff",
        b"-1",
        b"18446744073709551615",
        b"4294967296",
        b"[",
        b"{",
        b"- ",
        b"&a ",
        b"*a",
        b"\n  ",
        b"\xc3\x28",
    ];
    let at = |rng: &mut fastrand::Rng, len: usize| rng.usize(..=len);
    match rng.u8(..7) {
        0 if !bytes.is_empty() => {
            let i = rng.usize(..bytes.len());
            bytes[i] ^= 1 << rng.u8(..8);
        }
        1 => {
            let i = at(rng, bytes.len());
            let value = INTERESTING[rng.usize(..INTERESTING.len())];
            bytes.splice(i..i, value.iter().copied());
        }
        2 if !bytes.is_empty() => {
            let i = rng.usize(..bytes.len());
            let end = (i + rng.usize(1..=16)).min(bytes.len());
            bytes.drain(i..end);
        }
        3 if !bytes.is_empty() => {
            // A chunk repeated many times: deep nesting, long lists, huge numbers.
            let i = rng.usize(..bytes.len());
            let end = (i + rng.usize(1..=8)).min(bytes.len());
            let chunk = bytes[i..end].to_vec();
            let times = if rng.u8(..8) == 0 {
                rng.usize(2..=32_768)
            } else {
                rng.usize(2..=512)
            };
            bytes.splice(end..end, chunk.repeat(times));
        }
        4 if !other.is_empty() => {
            let from = rng.usize(..other.len());
            let to = (from + rng.usize(1..=64)).min(other.len());
            let i = at(rng, bytes.len());
            bytes.splice(i..i, other[from..to].iter().copied());
        }
        5 if !bytes.is_empty() => {
            let i = rng.usize(..bytes.len());
            bytes[i] = rng.u8(..);
        }
        _ => {
            let i = at(rng, bytes.len());
            bytes.insert(i, rng.u8(..));
        }
    }
}

/// What a target feeds its input to.
struct Target {
    name: &'static str,
    limiter: Arc<RateLimiter>,
    quota: QuotaService,
    /// Keeps `quota`'s streams from seeing a shutdown.
    _running: tokio::sync::watch::Sender<bool>,
    runtime: tokio::runtime::Runtime,
}

const RULES: &str = "\
domain: fuzz
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /v1/*
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 10, algorithm: token_bucket, burst: 3}
";

impl Target {
    fn new(name: &str) -> Self {
        let name = TARGETS
            .into_iter()
            .find(|known| *known == name)
            .expect("a known target");
        let rules = RuleSet::from_sources(&[("fuzz.yaml".into(), RULES.into())]).expect("rules");
        let memory = Arc::new(MemoryBackend::new(Arc::new(SystemClock), 10_000));
        let limiter = Arc::new(RateLimiter::new(
            rules,
            Backend::memory(memory.clone()),
            memory,
            ServiceOptions::default(),
        ));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (running, stopped) = tokio::sync::watch::channel(false);
        Target {
            name,
            quota: QuotaService::new(limiter.clone(), stopped),
            _running: running,
            limiter,
            runtime,
        }
    }

    fn seeds(&self) -> Vec<Vec<u8>> {
        match self.name {
            "rules" => {
                let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules");
                let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(examples)
                    .expect("examples/rules")
                    .filter_map(|entry| std::fs::read(entry.ok()?.path()).ok())
                    .collect();
                seeds.sort();
                seeds.push(RULES.as_bytes().to_vec());
                seeds
            }
            "grpc_request" => sample_requests()
                .iter()
                .map(Message::encode_to_vec)
                .collect(),
            "rlqs_report" => sample_reports()
                .iter()
                .map(Message::encode_to_vec)
                .collect(),
            _ => sample_requests()
                .iter()
                .map(|request| serde_json::to_vec(request).expect("json"))
                .collect(),
        }
    }

    /// Feeds `bytes` to the target; whether it was accepted (it joins the corpus).
    fn attempt(&self, bytes: &[u8]) -> bool {
        match self.name {
            "rules" => {
                let text = String::from_utf8_lossy(bytes).into_owned();
                RuleSet::from_sources(&[("fuzz.yaml".into(), text)]).is_ok()
            }
            "grpc_request" => match RateLimitRequest::decode(bytes) {
                Ok(request) => self
                    .runtime
                    .block_on(self.limiter.should_rate_limit(&request))
                    .is_ok(),
                Err(_) => false,
            },
            "rlqs_report" => match RateLimitQuotaUsageReports::decode(bytes) {
                Ok(report) => self.runtime.block_on(self.report_twice(report)),
                Err(_) => false,
            },
            _ => self.runtime.block_on(self.post_json(bytes)),
        }
    }

    /// Sends `report` twice on one stream; whether the first was answered. A refusal must
    /// stay short enough for a client's header limit.
    async fn report_twice(&self, report: RateLimitQuotaUsageReports) -> bool {
        let sent = self.quota.replay(vec![report.clone(), report]).await;
        for refusal in sent.iter().filter_map(|answer| answer.as_ref().err()) {
            let length = refusal.message().len();
            assert!(length <= 2_000, "a refusal of {length} bytes");
        }
        matches!(sent.first(), Some(Ok(_)))
    }

    async fn post_json(&self, bytes: &[u8]) -> bool {
        let mut app = router(HttpState {
            limiter: self.limiter.clone(),
            ready: Arc::new(true.into()),
            readiness: floodgate::server::Readiness::default(),
        });
        let request = axum::http::Request::post("/json")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(bytes.to_vec()))
            .expect("request");
        let response = tower::Service::call(&mut app, request)
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        assert!(
            status.is_success() || status.as_u16() == 429 || status.as_u16() == 400,
            "/json answered {status}"
        );
        status.is_success() || status.as_u16() == 429
    }
}

fn sample_requests() -> Vec<RateLimitRequest> {
    let json = [
        r#"{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#,
        r#"{"domain":"fuzz","hitsAddend":3,"descriptors":[{"entries":[{"key":"path","value":"/v1/x"},{"key":"method","value":"GET"}]}]}"#,
        r#"{"domain":"fuzz","descriptors":[{"entries":[{"key":"user","value":"bob"}],"limit":{"requestsPerUnit":2,"unit":"MINUTE"},"hitsAddend":"1"}]}"#,
        r#"{"domain":"other","descriptors":[{"entries":[{"key":"k","value":"v"}]},{"entries":[{"key":"user","value":"c"}]}]}"#,
    ];
    json.iter()
        .map(|text| serde_json::from_str(text).expect("a sample request"))
        .collect()
}

/// Usage reports for the rules above: one bucket, a nested one in the other order, an
/// unknown one beside a known one, one past its limit with a long elapsed time, and one
/// with every number at the top of its range.
fn sample_reports() -> Vec<RateLimitQuotaUsageReports> {
    let usage = |entries: &[(&str, &str)], allowed: u64, seconds: i64| BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: (entries.iter())
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        time_elapsed: Some(pbjson_types::Duration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: 1,
    };
    let report = |usages: Vec<BucketQuotaUsage>| RateLimitQuotaUsageReports {
        domain: "fuzz".into(),
        bucket_quota_usages: usages,
    };
    vec![
        report(vec![usage(&[("user", "alice")], 3, 0)]),
        report(vec![usage(&[("method", "GET"), ("path", "/v1/x")], 1, 5)]),
        report(vec![
            usage(&[("user", "bob")], 2, 5),
            usage(&[("nobody", "x")], 1, 5),
        ]),
        report(vec![usage(&[("user", "carol")], 1_000, 3_600)]),
        report(vec![usage(&[("user", "dave")], u64::MAX, i64::MAX)]),
    ]
}

/// FNV-1a: a stable name for a kept input.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
