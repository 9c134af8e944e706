//! Runs `rlqs_model` instances against a floodgate (in process or the real binary) in
//! scenarios placed at a chosen phase of the rule's window, and judges what they let
//! through: the shared part of `tests/rlqs_phases.rs` and `tests/rlqs_real.rs`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;

use floodgate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use floodgate::quota::Connection;

use super::rlqs_model::{EnvoyModel, REPORT_PERIOD, Tally};

/// The domain of the sweep's rules.
pub const DOMAIN: &str = "phases";

/// Every window length the sweep uses divides this many seconds (an hour and seven
/// seconds both do): a time line that starts at a multiple of it starts a window of each.
pub const ALIGNED_SECONDS: u64 = 25_200;

/// A time in 2027 (seconds since the Unix epoch) that starts a window of every length the
/// sweep uses, for a clock in virtual time.
pub const EPOCH_SECONDS: u64 = 71_428 * ALIGNED_SECONDS;

/// Where floodgate is: a stream to one of its replicas.
pub trait Transport {
    fn connect(&self, replica: usize) -> impl Future<Output = Connection>;
}

/// Seconds on the sweep's time line, whose zero starts a window of every length the sweep
/// uses (a multiple of [`ALIGNED_SECONDS`] since the Unix epoch), and the instant of one.
pub trait Timeline {
    fn now(&self) -> f64;
    fn instant(&self, at: f64) -> tokio::time::Instant;
}

/// One run: instances reporting one bucket of a rule of `limit` per `window` seconds, the
/// first request (which starts Envoy's report timer) `offset` seconds into a window, so
/// reports land `offset` (mod 5 s) after each reset; demand a multiple of the limit's pace.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub window: u64,
    pub limit: u32,
    pub offset: f64,
    pub envoys: usize,
    pub replicas: usize,
    /// Every instance's demand together, as a multiple of `limit` per `window`.
    pub demand: f64,
    /// Set by [`rules`]: the value of the bucket's one entry, which names the rule.
    pub id: usize,
}

impl Scenario {
    pub fn new(
        window: u64,
        limit: u32,
        offset: f64,
        envoys: usize,
        replicas: usize,
        demand: f64,
    ) -> Self {
        Scenario {
            window,
            limit,
            offset,
            envoys,
            replicas,
            demand,
            id: 0,
        }
    }

    fn bucket(&self) -> BucketId {
        BucketId {
            bucket: [("phase".to_owned(), self.id.to_string())].into(),
        }
    }

    /// How long its demand runs: a few of its windows, and at least a minute.
    pub fn length(&self) -> f64 {
        (self.window as f64 * 3.0).max(60.0)
    }

    /// The most its instances may let through in one window once every instance knows its
    /// share (docs/algorithms.md, "RLQS assignments"). Where the counter steers the
    /// instances (a window as long as a report interval or longer): the limit; per instance
    /// five tokens (whole tokens, the token its last assignment hands out early) and its
    /// bucket (a tenth of a second at twice its share of the pace, at most); and what the
    /// others let through but had not reported when one was assigned (its share of one
    /// report interval at the rule's pace). Where it cannot (a shorter window): the limit,
    /// four tokens an instance, and the 5% of a share a changed assignment may start with.
    pub fn bound(&self) -> f64 {
        let (limit, n) = (f64::from(self.limit), self.envoys as f64);
        let window = self.window as f64;
        if window < REPORT_PERIOD {
            limit * 1.05 + 4.0 * n
        } else {
            let pace = limit / window;
            limit + 5.0 * n + 0.2 * pace + (n - 1.0) / n * pace * REPORT_PERIOD
        }
    }

    /// The same for a window in which instances join, their shares not known yet for two
    /// report intervals: each instance may count on the share it would have were it the
    /// last to join (together at most the harmonic number of instances times the limit),
    /// and what they let through before their first assignment (`unassigned`, under
    /// `no_assignment_behavior`: a round trip's worth of requests) is on top.
    pub fn joining_bound(&self, unassigned: u64) -> f64 {
        let harmonic: f64 = (1..=self.envoys).map(|k| 1.0 / k as f64).sum();
        let limit = f64::from(self.limit);
        self.bound() + (harmonic - 1.0) * limit + unassigned as f64
    }

    pub fn describe(&self) -> String {
        format!(
            "{} per {} s, reports {:.1} s after the reset, {} Envoy(s) on {} replica(s), demand {}× the limit",
            self.limit, self.window, self.offset, self.envoys, self.replicas, self.demand
        )
    }
}

/// The rule file of `scenarios`, one rule each, numbering them.
pub fn rules(scenarios: &mut [Scenario]) -> String {
    let mut rules = format!("domain: {DOMAIN}\ndescriptors:\n");
    for (id, scenario) in scenarios.iter_mut().enumerate() {
        scenario.id = id;
        rules.push_str(&format!(
            "  - key: phase\n    value: \"{id}\"\n    rate_limit: {{unit: second, unit_multiplier: {}, requests_per_unit: {}}}\n",
            scenario.window, scenario.limit
        ));
    }
    rules
}

/// What one scenario's instances did, together.
#[derive(Debug, Default)]
pub struct Outcome {
    pub let_through: BTreeMap<u64, u64>,
    pub arrived: BTreeMap<u64, u64>,
    /// The last window some instance began in, not knowing its share yet (two report
    /// intervals from its first request).
    pub joining_until: u64,
    /// Let through before the instances' first assignments.
    pub unassigned: u64,
    pub under_expired: u64,
    /// Windows whose whole length had steady demand: (what was let through, what the
    /// limit and the demand allowed).
    pub steady: (u64, f64),
    pub ended: Vec<String>,
}

/// Runs every scenario at once, each from the first start its window allows after `begin`
/// on `timeline`, and fails naming every run that broke a promise.
pub async fn run_sweep(
    transport: &impl Transport,
    timeline: &impl Timeline,
    scenarios: &[Scenario],
    begin: f64,
) {
    let runs = (scenarios.iter()).map(|scenario| run(transport, timeline, scenario, begin));
    let outcomes = futures_util::future::join_all(runs).await;
    let verbose = std::env::var_os("FLOODGATE_RLQS_SWEEP_PRINT").is_some();
    let mut failures = Vec::new();
    for (scenario, outcome) in scenarios.iter().zip(outcomes) {
        if verbose {
            let joining = outcome.joining_until;
            let most = (outcome.let_through.iter())
                .filter(|(w, _)| **w > joining)
                .map(|(_, c)| *c)
                .max()
                .unwrap_or(0);
            let most_joining = (outcome.let_through.iter())
                .filter(|(w, _)| **w <= joining)
                .map(|(_, c)| *c)
                .max()
                .unwrap_or(0);
            eprintln!(
                "{}: most in a window {most} joining {most_joining} (bound {:.1}), steady {} of {:.0} {:?}",
                scenario.describe(),
                scenario.bound(),
                outcome.steady.0,
                outcome.steady.1,
                outcome.let_through,
            );
        }
        let judged = judge(scenario, &outcome);
        failures.extend(judged.map(|why| format!("{}: {why}", scenario.describe())));
    }
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n")
    );
}

/// Whether `outcome` keeps the promises: the bound in every window, no expired assignment,
/// 90% of what steady demand could have.
fn judge(scenario: &Scenario, outcome: &Outcome) -> Option<String> {
    if !outcome.ended.is_empty() {
        return Some(format!("a stream ended: {}", outcome.ended.join("; ")));
    }
    if outcome.under_expired > 0 {
        let expired = outcome.under_expired;
        return Some(format!("{expired} requests under an expired assignment"));
    }
    for (window, count) in &outcome.let_through {
        let bound = if *window <= outcome.joining_until {
            scenario.joining_bound(outcome.unassigned)
        } else {
            scenario.bound()
        };
        if *count as f64 > bound {
            let all = &outcome.let_through;
            return Some(format!(
                "{count} let through in window {window}, bound {bound:.1}: {all:?}"
            ));
        }
    }
    let (granted, possible) = outcome.steady;
    if (granted as f64) < 0.9 * possible {
        let all = &outcome.let_through;
        return Some(format!(
            "{granted} granted where steady demand could have {possible:.0}: {all:?}"
        ));
    }
    None
}

/// One scenario's instances, each on its own stream, until its demand ends.
async fn run(
    transport: &impl Transport,
    timeline: &impl Timeline,
    scenario: &Scenario,
    begin: f64,
) -> Outcome {
    let window = scenario.window as f64;
    // The first window that starts after `begin`, and the offset into it.
    let start = (begin / window).floor() * window + window + scenario.offset;
    let end = start + scenario.length();
    let rate = scenario.demand * f64::from(scenario.limit) / window / scenario.envoys as f64;
    let instances = (0..scenario.envoys).map(|index| async move {
        let connection = transport.connect(index % scenario.replicas).await;
        let model = EnvoyModel::new(scenario.bucket(), window);
        instance(model, connection, timeline, start, end, rate).await
    });
    let tallies: Vec<Result<Tally, String>> = futures_util::future::join_all(instances).await;
    let mut outcome = Outcome::default();
    for tally in tallies {
        match tally {
            Ok(tally) => {
                for (window, count) in tally.let_through {
                    *outcome.let_through.entry(window).or_default() += count;
                }
                for (window, count) in tally.arrived {
                    *outcome.arrived.entry(window).or_default() += count;
                }
                outcome.under_expired += tally.under_expired;
                outcome.unassigned += tally.unassigned;
            }
            Err(ended) => outcome.ended.push(ended),
        }
    }
    // Steady: windows wholly after two report intervals (every share known) and before
    // the end.
    let settled = start + 2.0 * REPORT_PERIOD;
    let first = (settled / window).ceil() as u64;
    let last = (end / window).floor() as u64;
    outcome.joining_until = (settled / window).floor() as u64;
    for index in first..last {
        let arrived = outcome.arrived.get(&index).copied().unwrap_or(0);
        outcome.steady.0 += outcome.let_through.get(&index).copied().unwrap_or(0);
        outcome.steady.1 += arrived.min(u64::from(scenario.limit)) as f64;
    }
    outcome
}

/// One instance: requests at `rate` a second from `start` to `end`, reports on Envoy's
/// timer, assignments applied as they come.
pub async fn instance(
    mut model: EnvoyModel,
    (reports, mut answers): Connection,
    timeline: &impl Timeline,
    start: f64,
    end: f64,
    rate: f64,
) -> Result<Tally, String> {
    let report = |usage| RateLimitQuotaUsageReports {
        domain: DOMAIN.to_owned(),
        bucket_quota_usages: vec![usage],
    };
    // Requests come `rate` a second, decided together at most every millisecond.
    let mut arrived: u64 = 0;
    let mut next_arrival = start;
    loop {
        let next_report = model.next_report.unwrap_or(f64::INFINITY);
        let next = next_arrival.min(next_report);
        if next >= end {
            break;
        }
        tokio::select! {
            biased;
            answer = answers.recv() => match answer {
                Some(Ok(answer)) => {
                    let now = timeline.now();
                    (answer.bucket_action.iter()).for_each(|action| model.apply(action, now));
                }
                Some(Err(status)) => return Err(format!("{status:?}")),
                None => return Err("the stream closed".into()),
            },
            () = tokio::time::sleep_until(timeline.instant(next)) => {
                if next == next_report && let Some(usage) = model.report(next) {
                    let sent = reports.send(report(usage)).await;
                    sent.map_err(|_| "the stream closed")?;
                }
                if next == next_arrival {
                    let due = ((next - start) * rate + 1e-9).floor() as u64 + 1;
                    if let Some(usage) = model.requests(next, due - arrived) {
                        let sent = reports.send(report(usage)).await;
                        sent.map_err(|_| "the stream closed")?;
                    }
                    arrived = due;
                    next_arrival = (start + arrived as f64 / rate).max(next + 0.001);
                }
            }
        }
    }
    Ok(model.tally)
}
