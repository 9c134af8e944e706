//! The RLQS limit at every phase of the window: a model of Envoy 1.40's client
//! (`rlqs_model`) reports a bucket every 5 s at a chosen offset from the window's reset,
//! enforces what floodgate assigns as Envoy does (whole-second token buckets, times to live,
//! `ALLOW_ALL` when no assignment or an expired one holds), and tallies what it let through
//! in each of the rule's windows. Swept over offsets (every 0.5 s), limits, windows shorter
//! than, equal to and longer than the report interval, 1–4 instances on 1–2 replicas, and
//! demand below, at and above the limit; each run asserts the bound of docs/algorithms.md
//! ("RLQS assignments"), that no request met an expired assignment, and that steady demand
//! got at least 90% of what the limit allows.
//!
//! In process, on the memory backend, in virtual time (tokio's paused clock, which the
//! counters read too): deterministic, and an hour's window takes a second.
//! `FLOODGATE_RLQS_SWEEP=full` runs every combination (a few minutes); the default is a
//! cross-section of it. `tests/rlqs_real.rs` drives the same model against the real binary,
//! on Redis, in real time.

mod rlqs_model;
mod rlqs_sweep;

use std::sync::Arc;

use floodgate::backend::{Backend, MemoryBackend};
use floodgate::clock::Clock;
use floodgate::quota::QuotaService;
use floodgate::rules::RuleSet;
use floodgate::service::{RateLimiter, ServiceOptions};

use rlqs_model::EnvoyModel;
use rlqs_sweep::{Scenario, Timeline, Transport, run_sweep};

/// The counters' clock: tokio's, so that pausing tokio's time pauses theirs.
struct VirtualClock {
    epoch_micros: u64,
    start: tokio::time::Instant,
}

impl Clock for VirtualClock {
    fn now_micros(&self) -> u64 {
        self.epoch_micros + self.start.elapsed().as_micros() as u64
    }
}

/// `replicas` floodgates in process, sharing one memory backend (as replicas share Redis).
struct InProcess {
    replicas: Vec<QuotaService>,
    _running: tokio::sync::watch::Sender<bool>,
}

impl InProcess {
    fn start(rules: &str, replicas: usize, clock: Arc<VirtualClock>) -> Self {
        let memory = Arc::new(MemoryBackend::new(clock.clone(), 1_000_000));
        let (running, stopped) = tokio::sync::watch::channel(false);
        let replicas = (0..replicas)
            .map(|_| {
                let rules = RuleSet::from_sources(&[("phases.yaml".into(), rules.into())])
                    .expect("the sweep's rules");
                let limiter = RateLimiter::new(
                    rules,
                    Backend::memory(memory.clone()),
                    memory.clone(),
                    ServiceOptions::default(),
                );
                QuotaService::new(Arc::new(limiter), stopped.clone()).with_clock(clock.clone())
            })
            .collect();
        InProcess {
            replicas,
            _running: running,
        }
    }
}

/// Virtual seconds since the test began, which began at `rlqs_sweep::EPOCH_SECONDS`.
struct Virtual(tokio::time::Instant);

impl Timeline for Virtual {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }

    fn instant(&self, at: f64) -> tokio::time::Instant {
        self.0 + std::time::Duration::from_secs_f64(at)
    }
}

impl Transport for InProcess {
    async fn connect(&self, replica: usize) -> floodgate::quota::Connection {
        self.replicas[replica % self.replicas.len()].connect()
    }
}

/// The sweep: windows of 1 s, 7 s (the reports' phase in the window moving from one window
/// to the next), 10 s, 15 s, 1 min and 1 h, limits of 1, 5, 100 and 10,000, the report's
/// offset from the reset every 0.5 s of the report interval, instances and replicas, demand
/// at a half, once and three times the limit.
fn scenarios(full: bool) -> Vec<Scenario> {
    let mut scenarios = Vec::new();
    for window in [1, 7, 10, 15, 60, 3600] {
        for limit in [1, 5, 100, 10_000] {
            let offsets: Vec<f64> = match window {
                1 => vec![0.0, 0.5],
                _ => (0..10).map(|step| f64::from(step) * 0.5).collect(),
            };
            for (index, offset) in offsets.into_iter().enumerate() {
                for (envoys, replicas) in [(1, 1), (2, 2), (3, 1), (4, 2)] {
                    for demand in [0.5, 1.0, 3.0] {
                        // The cross-section: every offset, with the other axes turning over.
                        let turn = index + envoys + (demand * 2.0) as usize + window as usize;
                        let pick = turn.is_multiple_of(if window % 10 == 0 { 4 } else { 8 });
                        if full || pick || (window == 3600 && index % 3 == 0 && envoys <= 2) {
                            scenarios.push(Scenario::new(
                                window, limit, offset, envoys, replicas, demand,
                            ));
                        }
                    }
                }
            }
        }
    }
    scenarios
}

#[tokio::test(start_paused = true)]
async fn the_limit_holds_at_every_phase_on_the_memory_backend() {
    let full = std::env::var("FLOODGATE_RLQS_SWEEP").is_ok_and(|sweep| sweep == "full");
    let mut scenarios = scenarios(full);
    if let Ok(only) = std::env::var("FLOODGATE_RLQS_ONLY") {
        scenarios.retain(|scenario| scenario.describe().starts_with(&only));
    }
    let start = tokio::time::Instant::now();
    let clock = Arc::new(VirtualClock {
        epoch_micros: rlqs_sweep::EPOCH_SECONDS * 1_000_000,
        start,
    });
    let rules = rlqs_sweep::rules(&mut scenarios);
    let replicas = scenarios.iter().map(|s| s.replicas).max().unwrap_or(1);
    let world = InProcess::start(&rules, replicas, clock);
    run_sweep(&world, &Virtual(start), &scenarios, 0.0).await;
}

/// Instances share a bucket by their demand, measured over each report's own interval: a
/// lone one gets all of it (what it asks, within the rule's pace), and two asking 10 and
/// 30 a second get a quarter and three quarters of the pace, within 10%.
#[tokio::test(start_paused = true)]
async fn shares_follow_the_demand_of_each_reports_interval() {
    // 26 a second (93,600 an hour), as the issue measured: a lone stream asking 20 a second
    // got 18.
    let mut scenarios = vec![
        Scenario::new(3600, 93_600, 0.0, 1, 1, 0.0),
        Scenario::new(3600, 93_600, 2.0, 2, 2, 0.0),
    ];
    let start = tokio::time::Instant::now();
    let clock = Arc::new(VirtualClock {
        epoch_micros: rlqs_sweep::EPOCH_SECONDS * 1_000_000,
        start,
    });
    let rules = rlqs_sweep::rules(&mut scenarios);
    let world = InProcess::start(&rules, 2, clock);
    let timeline = Virtual(start);
    let bucket =
        |scenario: &Scenario| floodgate::proto::envoy::service::rate_limit_quota::v3::BucketId {
            bucket: [("phase".to_owned(), scenario.id.to_string())].into(),
        };
    let run = |scenario: &Scenario, replica: usize, rate: f64| {
        let model = EnvoyModel::new(bucket(scenario), 3600.0);
        let world = &world;
        let timeline = &timeline;
        let offset = scenario.offset;
        async move {
            let connection = world.connect(replica).await;
            rlqs_sweep::instance(
                model,
                connection,
                timeline,
                10.0 + offset,
                70.0 + offset,
                rate,
            )
            .await
            .expect("the stream stays open")
        }
    };
    let (alone, slow, busy) = tokio::join!(
        run(&scenarios[0], 0, 20.0),
        run(&scenarios[1], 0, 10.0),
        run(&scenarios[1], 1, 30.0),
    );
    // Alone: what it asked, after its first report interval (20 a second over 55 s).
    let granted: u64 = alone.let_through.values().sum();
    assert!(
        granted as f64 >= 0.95 * 20.0 * 60.0,
        "{granted} of 1,200 asked"
    );
    let share = slow.last_rate / (slow.last_rate + busy.last_rate);
    assert!(
        (0.225..=0.275).contains(&share),
        "{share}: {} and {} a second",
        slow.last_rate,
        busy.last_rate
    );
}
