//! Rate Limit Quota Service reports of many buckets, against the real server (and a real
//! redis-server): how long floodgate takes to charge every bucket to its counters and
//! answer, and what that costs in CPU per bucket, the server's and Redis', read from
//! `/proc` as `floodgate-bench` reads them. Each bucket is a user of its own.
//!
//! `cargo bench --bench rlqs_report` (redis-server on the PATH). Settings, from the
//! environment:
//!
//! - `BACKENDS` (default `redis`): `redis`, `memory`, or both (`"redis memory"`);
//! - `STREAMS` (default 1) streams, each a data plane of its own on a connection of its own,
//!   reporting the same `BUCKETS` (default 10000) buckets `REPORTS` (default 5) times;
//! - `SPREAD` (seconds; default 0 for one stream, 5 for more): a report cycle's length, the
//!   streams' reports spread evenly over it as a fleet's Envoys send them (each on its own
//!   5 s timer); 0 sends each report as soon as the last was answered;
//! - `SERVER_BIN` measures another build of the server beside this tree's release build,
//!   `ROUNDS` (default 1) times, alternated (`THIS_TREE=0`: that build alone);
//! - `COMMANDS=1` prints what Redis ran for the steady reports, by command (its
//!   `INFO commandstats`, commands run by the scripts included);
//! - `RESETS=N` measures instead what a window's reset costs: the rule's window is 10 s, the
//!   streams report every 5 s between 1 s and 4.5 s after each 5 s of the epoch, so every
//!   bucket's window resets 5.5–9 s after its last report and the server pushes each stream
//!   all its buckets' new assignments at once, 20 ms after each of `N` resets. Measured: how
//!   long after the reset each push arrived, the buckets the reports' answers left out, and
//!   the CPU of the 950 ms after each reset per pair pushed (no report falls in them).
//!
//! The first cycle creates the counters; time and CPU are of the cycles after it.

#[path = "../tests/harness/mod.rs"]
mod harness;
#[path = "../tests/redis_harness/mod.rs"]
mod redis_harness;

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use floodgate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
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

/// The rule of a `RESETS` run: a fixed window of [`RESET_WINDOW`], shorter than two report
/// cycles, so that the report before each reset is a bucket's last before it.
const RESET_RULES: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 1000000}
";
const RESET_WINDOW: Duration = Duration::from_secs(10);
/// Envoy's report interval: a `RESETS` run's report cycle.
const CYCLE: Duration = Duration::from_secs(5);

/// What a run is: its streams, their buckets and reports, and the cycle they are spread over
/// (or the resets it measures).
#[derive(Clone, Copy)]
struct Shape {
    streams: usize,
    buckets: usize,
    reports: usize,
    spread: Duration,
    resets: usize,
}

impl Shape {
    fn from_env() -> Shape {
        let streams = setting("STREAMS", 1).max(1);
        let spread = setting("SPREAD", if streams > 1 { 5 } else { 0 });
        Shape {
            streams,
            buckets: setting("BUCKETS", 10_000),
            reports: setting("REPORTS", 5).max(2),
            spread: Duration::from_secs(spread as u64),
            resets: setting("RESETS", 0),
        }
    }

    /// When stream `stream` sends its report of cycle `cycle`, after `start`; `None`: as soon
    /// as its last report was answered.
    fn sends_at(&self, start: Instant, stream: usize, cycle: usize) -> Option<Instant> {
        if self.spread.is_zero() {
            return None;
        }
        let phase = self.spread.mul_f64(stream as f64 / self.streams as f64);
        Some(start + self.spread * cycle as u32 + phase)
    }

    /// The (bucket, stream) pairs the steady cycles charged.
    fn steady_pairs(&self) -> f64 {
        (self.streams * self.buckets * (self.reports - 1)) as f64
    }
}

/// A report of `buckets` users, which let one to four requests through in `elapsed` s (as
/// real buckets, each its own: a report's counts differ from bucket to bucket).
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
                num_requests_allowed: 1 + i as u64 % 4,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

/// CPU time every thread of process `pid` has run so far (`/proc/<pid>/task/*/schedstat`,
/// in nanoseconds: the ticks of `/proc/<pid>/stat` are too coarse for a report of a few
/// milliseconds).
fn cpu_time(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process' threads");
    let nanos: u64 = tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    Duration::from_nanos(nanos)
}

/// The resident memory of process `pid` (`VmRSS` in `/proc/<pid>/status`), in bytes.
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib = (status.lines())
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        });
    kib.expect("VmRSS") << 10
}

/// What a run measured: each steady report's time to its answer, and the CPU the server
/// and Redis (when there is one) spent on the steady cycles.
struct Measured {
    took: Vec<Duration>,
    server_cpu: Duration,
    redis_cpu: Option<Duration>,
    commands: Option<String>,
    /// The server's resident memory at the end, in bytes.
    resident: u64,
}

impl Measured {
    fn print(&self, name: &str, backend: &str, shape: &Shape) {
        let mut took = self.took.clone();
        took.sort();
        let at = |part: f64| took[((took.len() - 1) as f64 * part).round() as usize];
        let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
        let per_pair = |cpu: Duration| cpu.as_secs_f64() * 1e6 / shape.steady_pairs();
        let redis = (self.redis_cpu).map_or(String::new(), |cpu| {
            format!(", Redis {:.2} µs", per_pair(cpu))
        });
        println!(
            "{name}, {backend}, {} × {} buckets{}: ms per report: median {:.0}, p99 {:.0}, max {:.0}; \
             CPU per bucket per report: server {:.2} µs{redis}; server resident {} MiB",
            shape.streams,
            shape.buckets,
            if shape.spread.is_zero() {
                String::from(", back to back")
            } else {
                format!(" over {} s", shape.spread.as_secs())
            },
            ms(at(0.5)),
            ms(at(0.99)),
            ms(at(1.0)),
            per_pair(self.server_cpu),
            self.resident >> 20,
        );
        if let Some(commands) = &self.commands {
            println!("{commands}");
        }
    }
}

/// A server started by `prefix` (empty: this tree's build) with `rules` on `backend`, on a
/// fresh Redis when it is `redis`.
fn serve(prefix: &[&str], backend: &str, rules: &str) -> (Option<RedisServer>, Floodgate) {
    let redis = (backend == "redis").then(RedisServer::start);
    let mut flags = vec!["--backend", backend];
    let url = redis.as_ref().map(RedisServer::url);
    if let Some(url) = &url {
        flags.extend(["--redis-url", url.as_str()]);
    }
    let server = Floodgate::start_wrapped(prefix, &[("bench.yaml", rules)], &flags, &[]);
    (redis, server)
}

/// Runs `shape` against a server started by `prefix` (empty: this tree's build) on
/// `backend`, on a fresh Redis when it is `redis`.
async fn measure(prefix: &[&str], backend: &str, shape: Shape) -> Measured {
    let (redis, server) = serve(prefix, backend, RULES);
    let mut streams = Vec::new();
    for _ in 0..shape.streams {
        streams.push(harness::quota_stream(&server).await);
    }
    let first = Arc::new(report(shape.buckets, 0));
    let steady = Arc::new(report(shape.buckets, 5));
    let redis_pid = redis.as_ref().map(RedisServer::pid);
    let sample = || {
        if let Some(redis) = &redis {
            redis.command(&["CONFIG", "RESETSTAT"]);
        }
        (cpu_time(server.pid()), redis_pid.map(cpu_time))
    };
    // The first cycle creates the counters. Back to back, every stream's first report goes
    // at once and the steady cycles start when all are answered; spread, it is the first
    // of the cycles and the steady ones are measured from the second.
    let start = Instant::now() + Duration::from_millis(100);
    let mut from_cycle = 0;
    if shape.spread.is_zero() {
        let first_cycle = (streams.iter_mut())
            .map(|(reports, answers)| one_report(reports, answers, &first, shape.buckets));
        let answered: Result<Vec<_>, _> = futures_util::future::join_all(first_cycle)
            .await
            .into_iter()
            .collect();
        answered.unwrap_or_else(|why| fail(&server, &why));
        from_cycle = 1;
    }
    let mut cpu_before = from_cycle.eq(&1).then(&sample);
    let cycles = (streams.into_iter().enumerate()).map(|(index, (reports, mut answers))| {
        let (first, steady) = (first.clone(), steady.clone());
        tokio::spawn(async move {
            let mut took = Vec::new();
            for cycle in from_cycle..shape.reports {
                let at = shape.sends_at(start, index, cycle);
                if let Some(at) = at {
                    tokio::time::sleep_until(at.into()).await;
                }
                let report = if cycle == 0 { &first } else { &steady };
                let answered = one_report(&reports, &mut answers, report, shape.buckets).await;
                if cycle > 0 {
                    took.push(answered?);
                }
            }
            Ok::<_, String>(took)
        })
    });
    let cycles: Vec<_> = cycles.collect();
    if cpu_before.is_none() {
        tokio::time::sleep_until((start + shape.spread).into()).await;
        cpu_before = Some(sample());
    }
    let cpu_before = cpu_before.expect("sampled");
    let mut took: Vec<Duration> = Vec::new();
    for stream in futures_util::future::join_all(cycles).await {
        match stream.expect("a stream's run") {
            Ok(answered) => took.extend(answered),
            Err(why) => fail(&server, &why),
        }
    }
    let server_cpu = cpu_time(server.pid()) - cpu_before.0;
    let redis_cpu = (redis_pid.zip(cpu_before.1)).map(|(pid, before)| cpu_time(pid) - before);
    let commands = (redis.as_ref())
        .filter(|_| std::env::var("COMMANDS").is_ok_and(|on| on == "1"))
        .map(|redis| commands_per_bucket(redis, &shape));
    Measured {
        took,
        server_cpu,
        redis_cpu,
        commands,
        resident: resident(server.pid()),
    }
}

/// Sends `report` on a stream and waits for its answer: how long that took, or why not
/// every bucket was answered (the backend did not keep up).
async fn one_report(
    reports: &tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: &mut tonic::Streaming<RateLimitQuotaResponse>,
    report: &RateLimitQuotaUsageReports,
    buckets: usize,
) -> Result<Duration, String> {
    let sent = Instant::now();
    reports.send(report.clone()).await.expect("sent");
    let answer = answers.message().await.expect("an answer");
    let took = sent.elapsed();
    let answered = answer.expect("not the end").bucket_action.len();
    if answered != buckets {
        return Err(format!("{answered} of {buckets} buckets answered"));
    }
    Ok(took)
}

/// What a `RESETS` run measured: each push, how long after its reset it arrived and the
/// buckets it carried, and the CPU of the server and Redis in the 950 ms after each reset.
struct Pushes {
    pushes: Vec<(Duration, usize)>,
    /// Buckets the reports' answers left out (the backend could not count them).
    unanswered: usize,
    server_cpu: Duration,
    redis_cpu: Option<Duration>,
}

impl Pushes {
    fn print(&self, name: &str, backend: &str, shape: &Shape) {
        let mut after: Vec<Duration> = self.pushes.iter().map(|&(after, _)| after).collect();
        after.sort();
        let at = |part: f64| after[((after.len() - 1) as f64 * part).round() as usize];
        let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
        let pairs = (shape.streams * shape.buckets * shape.resets) as f64;
        let per_pair = |cpu: Duration| cpu.as_secs_f64() * 1e6 / pairs;
        let redis = (self.redis_cpu).map_or(String::new(), |cpu| {
            format!(", Redis {:.2} µs", per_pair(cpu))
        });
        let fewest = self.pushes.iter().map(|&(_, buckets)| buckets).min();
        println!(
            "{name}, {backend}, {} × {} buckets, {} resets: {} pushes (fewest buckets in one: \
             {}; buckets the reports' answers left out: {}); ms after the reset: median {:.0}, \
             p99 {:.0}, max {:.0}; CPU per pair pushed: server {:.2} µs{redis}",
            shape.streams,
            shape.buckets,
            shape.resets,
            self.pushes.len(),
            fewest.unwrap_or(0),
            self.unanswered,
            ms(at(0.5)),
            ms(at(0.99)),
            ms(at(1.0)),
            per_pair(self.server_cpu),
        );
    }
}

/// Runs a `RESETS` run of `shape` against a server started by `prefix` on `backend`: the
/// streams report between 1 s and 4.5 s after each 5 s of the epoch; whatever a stream
/// reads while it has no report out is a push (one that comes later than 1 s after its
/// reset would be taken for a report's answer: every stream's push of every reset is
/// counted, so the count says so).
async fn measure_resets(prefix: &[&str], backend: &str, shape: Shape) -> Pushes {
    let (redis, server) = serve(prefix, backend, RESET_RULES);
    let mut streams = Vec::new();
    for _ in 0..shape.streams {
        streams.push(harness::quota_connection(&server).await);
    }
    // The windows are aligned on the epoch: the first report cycle starts at the next
    // boundary, and the resets measured are the boundaries after it.
    let since_epoch = (SystemTime::now().duration_since(SystemTime::UNIX_EPOCH))
        .expect("after the epoch")
        .as_micros();
    let into_window = (since_epoch % RESET_WINDOW.as_micros()) as u64;
    let first = Instant::now() + (RESET_WINDOW - Duration::from_micros(into_window));
    let resets: Arc<Vec<Instant>> = Arc::new(
        (1..=shape.resets)
            .map(|n| first + RESET_WINDOW * n as u32)
            .collect(),
    );
    let steady = Arc::new(report(shape.buckets, 5));
    let runs = (streams.into_iter().enumerate()).map(|(index, (reports, mut answers))| {
        let (steady, resets) = (steady.clone(), resets.clone());
        let phase = Duration::from_secs(1)
            + Duration::from_millis(3_500).mul_f64(index as f64 / shape.streams as f64);
        tokio::spawn(async move {
            let (mut pushes, mut unanswered) = (Vec::new(), 0);
            let mut push = |pushed: RateLimitQuotaResponse| {
                let arrived = Instant::now();
                let reset = (resets.iter().rev().find(|&&reset| reset <= arrived))
                    .ok_or_else(|| format!("a push of {} buckets {:?} after the first cycle began, before any reset", pushed.bucket_action.len(), arrived - first))?;
                pushes.push((arrived - *reset, pushed.bucket_action.len()));
                Ok::<_, String>(())
            };
            for cycle in 0..=2 * shape.resets {
                let at = first + CYCLE * cycle as u32 + phase;
                while let Ok(read) = tokio::time::timeout_at(at.into(), answers.recv()).await {
                    push((read.ok_or("the stream ended")?).map_err(|s| s.to_string())?)?;
                }
                reports.send(steady.as_ref().clone()).await.expect("sent");
                let read = answers.recv().await.ok_or("the stream ended")?;
                let answered = read.map_err(|s| s.to_string())?.bucket_action.len();
                unanswered += shape.buckets - answered;
            }
            Ok::<_, String>((pushes, unanswered))
        })
    });
    let runs: Vec<_> = runs.collect();
    let redis_pid = redis.as_ref().map(RedisServer::pid);
    let (mut server_cpu, mut redis_cpu) = (Duration::ZERO, Duration::ZERO);
    // No report is out in the 950 ms after a reset: what the processes spend then is the
    // pushes'.
    for &reset in resets.iter() {
        tokio::time::sleep_until(reset.into()).await;
        let before = (cpu_time(server.pid()), redis_pid.map(cpu_time));
        tokio::time::sleep_until((reset + Duration::from_millis(950)).into()).await;
        server_cpu += cpu_time(server.pid()) - before.0;
        if let (Some(pid), Some(before)) = (redis_pid, before.1) {
            redis_cpu += cpu_time(pid) - before;
        }
    }
    let (mut pushes, mut unanswered) = (Vec::new(), 0);
    for run in futures_util::future::join_all(runs).await {
        match run.expect("a stream's run") {
            Ok((pushed, left)) => {
                pushes.extend(pushed);
                unanswered += left;
            }
            Err(why) => fail(&server, &why),
        }
    }
    Pushes {
        pushes,
        unanswered,
        server_cpu,
        redis_cpu: redis_pid.map(|_| redis_cpu),
    }
}

/// Ends the run: `why`, and what the server logged last.
fn fail(server: &Floodgate, why: &str) -> ! {
    let log = server.stderr();
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    panic!("{why}; the server's log ends:\n{}", tail.join("\n"));
}

/// What Redis ran since its statistics were reset, per (bucket, stream) pair of the
/// steady cycles: calls and µs of each command (`INFO commandstats`).
fn commands_per_bucket(redis: &RedisServer, shape: &Shape) -> String {
    let stats = redis.command(&["INFO", "commandstats"]);
    let pairs = shape.steady_pairs();
    let mut lines = Vec::new();
    for line in stats.lines() {
        let Some((name, fields)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(command) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        let field = |wanted: &str| {
            (fields.split(','))
                .find_map(|field| field.strip_prefix(wanted)?.strip_prefix('=')?.parse().ok())
                .unwrap_or(0.0_f64)
        };
        lines.push((
            field("usec"),
            format!(
                "    {command:<16} {:>7.3} calls, {:>6.2} µs per bucket",
                field("calls") / pairs,
                field("usec") / pairs
            ),
        ));
    }
    lines.sort_by(|a, b| b.0.total_cmp(&a.0));
    let lines: Vec<String> = lines.into_iter().map(|(_, line)| line).collect();
    format!("  Redis, by command:\n{}", lines.join("\n"))
}

fn main() {
    let shape = Shape::from_env();
    let backends = std::env::var("BACKENDS").unwrap_or_else(|_| "redis".into());
    let other = std::env::var("SERVER_BIN").ok();
    // Runs `other` in place of the binary the harness names (its first argument).
    let swap = "bin=$0; shift; exec \"$bin\" \"$@\"";
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    for round in 1..=setting("ROUNDS", 1) {
        let mut builds: Vec<(&str, Vec<&str>)> = Vec::new();
        if other.is_none() || setting("THIS_TREE", 1) == 1 {
            builds.push(("this tree", Vec::new()));
        }
        if let Some(other) = &other {
            builds.push((other.as_str(), vec!["sh", "-c", swap, other.as_str()]));
        }
        for backend in backends.split_whitespace() {
            for (name, prefix) in &builds {
                let name = format!("round {round}, {name}");
                if shape.resets > 0 {
                    let pushes = runtime.block_on(measure_resets(prefix, backend, shape));
                    pushes.print(&name, backend, &shape);
                } else {
                    let measured = runtime.block_on(measure(prefix, backend, shape));
                    measured.print(&name, backend, &shape);
                }
            }
        }
    }
}
