//! `floodgate-bench` (also run as `floodgate bench`): a load generator over real gRPC, in
//! two ways.
//!
//! - The closed loop (the default) keeps `--concurrency` requests in flight over
//!   `--connections` HTTP/2 connections: it finds the most the server does at that
//!   concurrency.
//! - The open loop (`--rate`) sends requests on a fixed schedule whether or not earlier ones
//!   were answered, as independent clients do: it shows latency and failures at a given
//!   load, saturation and beyond included, each latency counted from when its request was
//!   due.
//!
//! Descriptor values are drawn uniformly from `--keys` distinct values. Every request carries
//! a deadline (`--timeout-ms`) and ends in one [`AnswerClass`](outcome::AnswerClass). Over the measured interval (after
//! `--warmup`) a run reports each outcome's count and rate, exact latency percentiles of the
//! decided requests, the CPU time per decision of the server, Redis and the generator itself
//! (from `/proc/<pid>/stat`) and the Redis commands per decision (from `INFO commandstats`),
//! as text or as one TSV row.
//!
//! A binary of its own, beside the server's: the server carries none of it, and the load
//! generator links only the library's wire types.

mod closed;
mod connection;
mod cpu;
mod exchange;
mod open;
mod outcome;
mod redis_commands;
mod report;
mod tsv;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;

pub use report::{Latencies, Mode, Report};

use connection::Connections;
use cpu::Watched;
use exchange::RequestShape;
use redis_commands::RedisNodes;

// A flag given twice takes its last value, so scripts can put their defaults first and let
// the caller's flags override them.
#[derive(Debug, Clone, clap::Args)]
#[command(args_override_self = true)]
pub struct BenchArgs {
    /// The server's gRPC address: `http://host:port`, or `unix:/path` for its Unix socket.
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
    /// Requests in flight, in the closed loop (ignored with --rate).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Open loop: requests per second over all connections, sent on schedule whether or not
    /// earlier ones were answered. Without it, the closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: the most requests outstanding; a request due while this many are out is
    /// not sent, and counted as dropped by the generator.
    #[arg(long, default_value_t = 50_000)]
    pub max_in_flight: u32,
    /// Each request's deadline in milliseconds, sent as `grpc-timeout`; the generator gives
    /// up on a request (DEADLINE_EXCEEDED) once it passes.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
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
    /// A Redis the server uses, as host:port (repeat the flag for a cluster), to report the
    /// commands it ran per decision, from INFO commandstats.
    #[arg(long)]
    pub redis_addr: Vec<String>,
    /// Output: text for people, or one tab-separated header and row for scripts.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// With --format tsv: the row alone, without the header line.
    #[arg(long)]
    pub no_header: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Tsv,
}

impl BenchArgs {
    /// Refuses values the load cannot run with (before they could panic it).
    fn check(&self) -> anyhow::Result<()> {
        if self.connections == 0 || self.concurrency == 0 || self.keys == 0 || self.descriptors == 0
        {
            bail!("connections, concurrency, keys and descriptors must be at least 1");
        }
        if !(self.duration.is_finite() && self.duration > 0.0) {
            bail!("--duration must be a positive number of seconds");
        }
        if !(self.warmup.is_finite() && self.warmup >= 0.0) {
            bail!("--warmup must be zero or a positive number of seconds");
        }
        if self
            .rate
            .is_some_and(|rate| !(rate.is_finite() && rate > 0.0))
        {
            bail!("--rate must be a positive number of requests per second");
        }
        if self.max_in_flight == 0 || self.timeout_ms == 0 {
            bail!("--max-in-flight and --timeout-ms must be at least 1");
        }
        if self.max_in_flight as usize > tokio::sync::Semaphore::MAX_PERMITS {
            bail!("--max-in-flight is above what this platform can count");
        }
        Ok(())
    }

    fn mode(&self) -> Mode {
        match self.rate {
            None => Mode::Closed {
                concurrency: self.concurrency,
            },
            Some(rate) => Mode::Open {
                rate,
                max_in_flight: self.max_in_flight,
            },
        }
    }

    /// What the run will do, in one line for people.
    fn describe(&self) -> String {
        let load = match self.mode() {
            Mode::Closed { concurrency } => format!("closed loop, {concurrency} in flight"),
            Mode::Open {
                rate,
                max_in_flight,
            } => format!("open loop, {rate} requests/s (at most {max_in_flight} in flight)"),
        };
        format!(
            "floodgate bench: {load} over {} connections, {} keys, {} descriptor(s)/request, \
             {:.1} s after {:.1} s warm-up, {} ms timeout",
            self.connections,
            self.keys,
            self.descriptors,
            self.duration,
            self.warmup,
            self.timeout_ms
        )
    }
}

/// A run's timeline: load from `start`, measured from `measure_from` (after the warm-up)
/// until `until`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub start: Instant,
    pub measure_from: Instant,
    pub until: Instant,
}

impl Window {
    fn new(start: Instant, warmup: f64, duration: f64) -> Window {
        let measure_from = start + Duration::from_secs_f64(warmup);
        Window {
            start,
            measure_from,
            until: measure_from + Duration::from_secs_f64(duration),
        }
    }

    /// Whether a request due at `due` is one the run measures.
    pub fn measures(&self, due: Instant) -> bool {
        self.measure_from <= due && due < self.until
    }
}

/// The same allocator as the server's: the generator's own CPU per decision is one of the
/// figures it reports, and its request path allocates as the server's does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "floodgate-bench",
    version = floodgate::LONG_VERSION,
    about = "Load-test a running rate-limit server over gRPC and report throughput and latency"
)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    let args = Cli::parse().args;
    let ran = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
        .and_then(|runtime| runtime.block_on(run(args)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("floodgate-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the load and prints what it measured.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.format == OutputFormat::Text {
        println!("{}", args.describe());
    }
    let report = measure(&args).await?;
    match args.format {
        OutputFormat::Text => print!("{report}"),
        OutputFormat::Tsv => {
            if !args.no_header {
                println!("{}", tsv::header());
            }
            println!("{}", tsv::row(&report));
            // What the row cannot hold goes to stderr, for whoever watches the run.
            for (failure, count) in &report.failures {
                eprintln!("failures: {count} × {failure}");
            }
            if let Some(warning) = report.dropped_warning() {
                eprintln!("{warning}");
            }
        }
    }
    Ok(())
}

/// Failures a report lists, the most common first.
const MOST_COMMON_FAILURES: usize = 3;

/// Runs the load and returns what it measured.
pub async fn measure(args: &BenchArgs) -> anyhow::Result<Report> {
    args.check()?;
    let connections = Connections::open(&args.addr, args.connections).await?;
    let clients = connections.clients();
    let mut redis = RedisNodes::connect(&args.redis_addr).await?;
    let watched = Watched::new(args.server_pid, &args.redis_pid);
    let shape = Arc::new(RequestShape {
        domain: args.domain.clone(),
        key: args.key.clone(),
        keys: args.keys,
        descriptors: args.descriptors,
    });
    let timeout = Duration::from_millis(args.timeout_ms);
    let window = Window::new(Instant::now(), args.warmup, args.duration);
    let load = match args.rate {
        None => closed::start(&clients, args.concurrency, shape, timeout, window),
        Some(rate) => open::start(clients, rate, args.max_in_flight, shape, timeout, window),
    };

    tokio::time::sleep_until(window.measure_from.into()).await;
    let cpu_before = watched.cpu_seconds()?;
    let redis_before = redis.read().await?;
    let redials_before = connections.redials();
    let tally = load.await.context("bench load")??;
    let cpu_after = watched.cpu_seconds()?;
    let redis_after = redis.read().await?;

    Ok(Report {
        mode: args.mode(),
        seconds: args.duration,
        descriptors_per_request: args.descriptors,
        timeout,
        counts: tally.counts,
        latency: Latencies::new(tally.latencies_micros),
        service: Latencies::new(tally.service_micros),
        failures: tally.failures.most_common(MOST_COMMON_FAILURES),
        redials: connections.redials() - redials_before,
        cpu: cpu::spent(&cpu_before, &cpu_after),
        redis_commands: (!args.redis_addr.is_empty())
            .then(|| redis_commands::made_between(&redis_before, &redis_after)),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(flags: &[&str]) -> BenchArgs {
        let argv = std::iter::once("bench").chain(flags.iter().copied());
        Cli::try_parse_from(argv).unwrap().bench
    }

    #[test]
    fn a_flag_given_twice_takes_its_last_value() {
        let args = parse(&["--duration", "5", "--connections", "2", "--duration", "1"]);
        assert_eq!((args.duration, args.connections), (1.0, 2));
    }

    #[test]
    fn without_rate_the_loop_is_closed() {
        assert_eq!(parse(&[]).mode(), Mode::Closed { concurrency: 64 });
        assert_eq!(
            parse(&["--rate", "2500"]).mode(),
            Mode::Open {
                rate: 2500.0,
                max_in_flight: 50_000
            }
        );
    }

    #[test]
    fn values_that_cannot_run_are_refused() {
        for flags in [
            &["--rate", "0"][..],
            &["--rate", "NaN"],
            &["--duration=-1"],
            &["--warmup", "inf"],
            &["--max-in-flight", "0"],
            &["--timeout-ms", "0"],
            &["--connections", "0"],
        ] {
            assert!(parse(flags).check().is_err(), "{flags:?}");
        }
        assert!(parse(&["--rate", "0.5", "--warmup", "0"]).check().is_ok());
    }

    #[test]
    fn the_window_measures_requests_due_after_the_warm_up_and_before_the_end() {
        let start = Instant::now();
        let window = Window::new(start, 1.0, 2.0);
        let at = |seconds| start + Duration::from_secs_f64(seconds);
        assert!(!window.measures(at(0.5)));
        assert!(window.measures(at(1.0)));
        assert!(window.measures(at(2.9)));
        assert!(!window.measures(at(3.0)));
    }
}
