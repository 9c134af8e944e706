//! `floodgate bench`: a closed-loop load generator over real gRPC.
//!
//! `concurrency` tasks share `connections` HTTP/2 connections; each sends one request, waits
//! for the answer, and sends the next, with descriptor values drawn uniformly from `keys`
//! distinct values. Latencies after the warm-up are kept whole and sorted for exact
//! percentiles. With `--server-pid`, the server's CPU time (user + system, from
//! `/proc/<pid>/stat`) over the measured interval is divided by the decisions made.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tonic::transport::{Channel, Endpoint};

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
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub requests: u64,
    pub errors: u64,
    pub over_limit: u64,
    pub seconds: f64,
    pub decisions_per_request: usize,
    /// Sorted latencies of successful requests, in microseconds.
    pub latencies_micros: Vec<u32>,
    pub server_cpu_seconds: Option<f64>,
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

    pub fn server_cpu_micros_per_decision(&self) -> Option<f64> {
        let decisions = self.decisions();
        self.server_cpu_seconds
            .filter(|_| decisions > 0)
            .map(|cpu| cpu * 1e6 / decisions as f64)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "requests     {} in {:.1} s ({} errors, {} over limit)",
            self.requests, self.seconds, self.errors, self.over_limit
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
        if let (Some(cpu), Some(per)) = (
            self.server_cpu_seconds,
            self.server_cpu_micros_per_decision(),
        ) {
            writeln!(
                f,
                "server CPU   {per:.2} µs per decision ({cpu:.2} s CPU, {:.2} cores)",
                cpu / self.seconds
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
    let mut channels = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        // One Endpoint::connect per channel: each is its own HTTP/2 connection.
        let channel = Endpoint::from_shared(args.addr.clone())?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to {}", args.addr))?;
        channels.push(channel);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let until = measure_from + Duration::from_secs_f64(args.duration);

    let workers: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
            tokio::spawn(worker(client, args.clone(), measure_from, until))
        })
        .collect();

    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = args.server_pid.map(process_cpu_seconds).transpose()?;
    let mut totals = Tally::default();
    for worker in workers {
        totals.merge(worker.await.context("bench worker")?);
    }
    let cpu_after = args.server_pid.map(process_cpu_seconds).transpose()?;
    totals.latencies.sort_unstable();
    Ok(Report {
        requests: totals.requests,
        errors: totals.errors,
        over_limit: totals.over_limit,
        seconds: args.duration,
        decisions_per_request: args.descriptors,
        latencies_micros: totals.latencies,
        server_cpu_seconds: cpu_before
            .zip(cpu_after)
            .map(|(before, after)| after - before),
    })
}

#[derive(Default)]
struct Tally {
    requests: u64,
    errors: u64,
    over_limit: u64,
    latencies: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.over_limit += other.over_limit;
        self.latencies.extend(other.latencies);
    }
}

async fn worker(
    mut client: RateLimitServiceClient<Channel>,
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
            errors: 0,
            over_limit: 0,
            seconds: 1.0,
            decisions_per_request: 1,
            latencies_micros: (1..=1000).collect(),
            server_cpu_seconds: Some(0.5),
        };
        assert_eq!(report.percentile_ms(0.5), 0.5);
        assert_eq!(report.percentile_ms(0.99), 0.99);
        assert_eq!(report.percentile_ms(1.0), 1.0);
        assert_eq!(report.server_cpu_micros_per_decision(), Some(500.0));
    }

    #[test]
    fn own_process_cpu_time_is_readable() {
        let cpu = process_cpu_seconds(std::process::id()).unwrap();
        assert!(cpu >= 0.0);
    }
}
