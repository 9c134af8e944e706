//! `floodgate bench`: a closed-loop load generator over real gRPC.
//!
//! `concurrency` tasks share `connections` HTTP/2 connections; each sends one request, waits
//! for the answer, and sends the next, with descriptor values drawn uniformly from `keys`
//! distinct values. Latencies after the warm-up are kept whole and sorted for exact
//! percentiles. With `--server-pid`, the server's CPU time (user + system, from
//! `/proc/<pid>/stat`) over the measured interval is divided by the decisions made.

use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::codegen::http::{Request, Response, Uri};

use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The server's gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub addr: String,
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// The descriptor key; values are `k0` … `k<keys-1>`.
    #[arg(long, default_value = "user_id")]
    pub key: String,
    /// Distinct descriptor values.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u32,
    /// Descriptors per request (each with its own random value).
    #[arg(long, default_value_t = 1)]
    pub descriptors: usize,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// The server's process id, to report its CPU time per decision.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Redis processes (repeat the flag for a cluster), to report their CPU time per
    /// decision, summed.
    #[arg(long)]
    pub redis_pid: Vec<u32>,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Requests answered after the warm-up.
    pub requests: u64,
    /// Every request sent, the warm-up's included (to compare with a backend's own counts).
    pub sent: u64,
    pub errors: u64,
    pub over_limit: u64,
    pub seconds: f64,
    pub decisions_per_request: usize,
    /// Sorted latencies of successful requests, in microseconds.
    pub latencies_micros: Vec<u32>,
    /// CPU seconds spent over the measured interval, by whom: the server, Redis and the load
    /// generator itself, each when it was measured.
    pub cpu: Vec<(&'static str, f64)>,
}

impl Report {
    pub fn requests_per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    pub fn decisions(&self) -> u64 {
        self.requests * self.decisions_per_request as u64
    }

    /// The latency at quantile `q` (0..=1), in milliseconds.
    pub fn percentile_ms(&self, q: f64) -> f64 {
        if self.latencies_micros.is_empty() {
            return 0.0;
        }
        let rank = ((self.latencies_micros.len() as f64 * q).ceil() as usize).max(1) - 1;
        f64::from(self.latencies_micros[rank.min(self.latencies_micros.len() - 1)]) / 1000.0
    }

    /// CPU microseconds per decision of each measured process.
    pub fn cpu_micros_per_decision(&self) -> impl Iterator<Item = (&'static str, f64, f64)> {
        let decisions = self.decisions().max(1) as f64;
        self.cpu
            .iter()
            .map(move |&(who, seconds)| (who, seconds * 1e6 / decisions, seconds))
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "requests     {} in {:.1} s ({} errors, {} over limit; {} sent with the warm-up)",
            self.requests, self.seconds, self.errors, self.over_limit, self.sent
        )?;
        writeln!(
            f,
            "throughput   {:.0} requests/s, {:.0} decisions/s",
            self.requests_per_second(),
            self.decisions() as f64 / self.seconds
        )?;
        writeln!(
            f,
            "latency      p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms",
            self.percentile_ms(0.50),
            self.percentile_ms(0.99),
            self.percentile_ms(0.999),
            self.percentile_ms(1.0)
        )?;
        for (who, per, seconds) in self.cpu_micros_per_decision() {
            writeln!(
                f,
                "{:<12} {per:.2} µs CPU per decision ({seconds:.2} s, {:.2} cores)",
                who,
                seconds / self.seconds
            )?;
        }
        Ok(())
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    println!(
        "floodgate bench: {} in flight over {} connections, {} keys, {} descriptor(s)/request, {:.1} s after {:.1} s warm-up",
        args.concurrency, args.connections, args.keys, args.descriptors, args.duration, args.warmup
    );
    let report = measure(&args).await?;
    print!("{report}");
    Ok(())
}

/// Runs the load and returns what it measured.
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Report> {
    if args.connections == 0 || args.concurrency == 0 || args.keys == 0 || args.descriptors == 0 {
        bail!("connections, concurrency, keys and descriptors must be at least 1");
    }
    let origin: Uri = args
        .addr
        .parse()
        .with_context(|| format!("server address {:?}", args.addr))?;
    let mut connections = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        connections.push(Http2::connect(&origin).await?);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let until = measure_from + Duration::from_secs_f64(args.duration);

    let workers: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let client = RateLimitServiceClient::with_origin(
                connections[i % connections.len()].clone(),
                origin.clone(),
            );
            tokio::spawn(worker(client, args.clone(), measure_from, until))
        })
        .collect();

    tokio::time::sleep_until(measure_from.into()).await;
    let watched = Watched::new(args);
    let cpu_before = watched.cpu_seconds()?;
    let mut totals = Tally::default();
    for worker in workers {
        totals.merge(worker.await.context("bench worker")?);
    }
    let cpu_after = watched.cpu_seconds()?;
    totals.latencies.sort_unstable();
    Ok(Report {
        requests: totals.requests,
        sent: totals.sent,
        errors: totals.errors,
        over_limit: totals.over_limit,
        seconds: args.duration,
        decisions_per_request: args.descriptors,
        latencies_micros: totals.latencies,
        cpu: watched
            .names
            .iter()
            .zip(cpu_after.iter().zip(&cpu_before))
            .map(|(&who, (after, before))| (who, after - before))
            .collect(),
    })
}

/// The processes whose CPU time a run reports: the server and Redis when their pids are
/// given, and always the load generator itself (it shares the machine with them).
struct Watched {
    names: Vec<&'static str>,
    pids: Vec<Vec<u32>>,
}

impl Watched {
    fn new(args: &BenchArgs) -> Self {
        let mut watched = Watched {
            names: Vec::new(),
            pids: Vec::new(),
        };
        if let Some(pid) = args.server_pid {
            watched.add("server", vec![pid]);
        }
        if !args.redis_pid.is_empty() {
            watched.add("redis", args.redis_pid.clone());
        }
        watched.add("load gen", vec![std::process::id()]);
        watched
    }

    fn add(&mut self, name: &'static str, pids: Vec<u32>) {
        self.names.push(name);
        self.pids.push(pids);
    }

    /// CPU seconds so far of each entry (its processes summed).
    fn cpu_seconds(&self) -> anyhow::Result<Vec<f64>> {
        self.pids
            .iter()
            .map(|pids| {
                pids.iter()
                    .map(|&pid| process_cpu_seconds(pid))
                    .sum::<anyhow::Result<f64>>()
            })
            .collect()
    }
}

#[derive(Default)]
struct Tally {
    requests: u64,
    sent: u64,
    errors: u64,
    over_limit: u64,
    latencies: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.sent += other.sent;
        self.errors += other.errors;
        self.over_limit += other.over_limit;
        self.latencies.extend(other.latencies);
    }
}

/// One bare HTTP/2 connection, shared by the workers that clone it. tonic's `Channel` would
/// put a buffer task between every request and the connection; the load generator shares
/// the machine with the server it measures, so it spends as little CPU as it can.
#[derive(Clone)]
struct Http2(http2::SendRequest<tonic::body::Body>);

impl Http2 {
    async fn connect(origin: &Uri) -> anyhow::Result<Self> {
        let authority = origin
            .authority()
            .with_context(|| format!("server address {origin} has no host:port"))?;
        let tcp = tokio::net::TcpStream::connect(authority.as_str())
            .await
            .with_context(|| format!("connecting to {origin}"))?;
        tcp.set_nodelay(true)?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(tcp))
            .await
            .with_context(|| format!("HTTP/2 handshake with {origin}"))?;
        tokio::spawn(connection);
        Ok(Http2(sender))
    }
}

impl tower::Service<Request<tonic::body::Body>> for Http2 {
    type Response = Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

async fn worker(
    mut client: RateLimitServiceClient<Http2>,
    args: BenchArgs,
    measure_from: Instant,
    until: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut rng = fastrand::Rng::new();
    loop {
        let request = RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: (0..args.descriptors)
                .map(|_| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: args.key.clone(),
                        value: format!("k{}", rng.u32(0..args.keys)),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let sent = Instant::now();
        if sent >= until {
            return tally;
        }
        let result = client.should_rate_limit(request).await;
        tally.sent += 1;
        if sent < measure_from {
            continue;
        }
        tally.requests += 1;
        match result {
            Ok(response) => {
                if response.get_ref().overall_code == Code::OverLimit as i32 {
                    tally.over_limit += 1;
                }
                let micros = sent.elapsed().as_micros();
                tally
                    .latencies
                    .push(u32::try_from(micros).unwrap_or(u32::MAX));
            }
            Err(_) => tally.errors += 1,
        }
    }
}

/// User + system CPU seconds of a process, all threads, from `/proc/<pid>/stat` (in
/// USER_HZ = 100 ticks per second, fixed by the Linux ABI).
fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces; count fields after its closing ')'.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc stat format")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 overall are utime and stime: 12th and 13th after the name.
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .context("short /proc stat")?
            .parse::<u64>()
            .context("bad /proc stat field")? as f64)
    };
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_sorted_latencies() {
        let report = Report {
            requests: 1000,
            sent: 1200,
            errors: 0,
            over_limit: 0,
            seconds: 1.0,
            decisions_per_request: 1,
            latencies_micros: (1..=1000).collect(),
            cpu: vec![("server", 0.5)],
        };
        assert_eq!(report.percentile_ms(0.5), 0.5);
        assert_eq!(report.percentile_ms(0.99), 0.99);
        assert_eq!(report.percentile_ms(1.0), 1.0);
        let cpu: Vec<_> = report.cpu_micros_per_decision().collect();
        assert_eq!(cpu, [("server", 500.0, 0.5)]);
    }

    #[test]
    fn own_process_cpu_time_is_readable() {
        let cpu = process_cpu_seconds(std::process::id()).unwrap();
        assert!(cpu >= 0.0);
    }
}
