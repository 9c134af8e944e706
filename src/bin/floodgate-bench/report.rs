//! What one run measured, and its text form for people.

use std::fmt;
use std::time::Duration;

use super::cpu::Process;
use super::outcome::Counts;
use super::redis_commands::CommandCounts;

/// How the load was offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// `concurrency` requests always in flight.
    Closed { concurrency: usize },
    /// `rate` requests per second on a schedule, at most `max_in_flight` outstanding.
    Open { rate: f64, max_in_flight: u32 },
}

/// Latencies, sorted, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latencies(Vec<u32>);

impl Latencies {
    pub fn new(mut micros: Vec<u32>) -> Latencies {
        micros.sort_unstable();
        Latencies(micros)
    }

    /// The latency at quantile `q` (0..=1) by nearest rank, in milliseconds; 0 when empty.
    pub fn percentile_ms(&self, q: f64) -> f64 {
        let Some(last) = self.0.len().checked_sub(1) else {
            return 0.0;
        };
        let rank = ((self.0.len() as f64 * q).ceil() as usize).saturating_sub(1);
        f64::from(self.0[rank.min(last)]) / 1000.0
    }
}

impl fmt::Display for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  max {:.3} ms",
            self.percentile_ms(0.50),
            self.percentile_ms(0.99),
            self.percentile_ms(0.999),
            self.percentile_ms(1.0)
        )
    }
}

/// What one run measured, over its measured interval.
#[derive(Debug, Clone)]
pub struct Report {
    pub mode: Mode,
    /// The measured interval's length: the denominator of every rate.
    pub seconds: f64,
    pub descriptors_per_request: usize,
    pub timeout: Duration,
    pub counts: Counts,
    /// Of decided requests, from when each was due (see `Sample::latency`).
    pub latency: Latencies,
    /// Of decided requests, from when each was sent.
    pub service: Latencies,
    /// The most common failures (of shed, unavailable and other errors), the most common
    /// first.
    pub failures: Vec<(String, u64)>,
    /// Connections the server closed and the generator dialed again during the measured
    /// interval (each failed the requests it carried).
    pub redials: u64,
    /// CPU seconds spent over the measured interval, by whom.
    pub cpu: Vec<(Process, f64)>,
    /// Redis commands run over the measured interval, when Redis addresses were given.
    pub redis_commands: Option<CommandCounts>,
}

impl Report {
    pub fn per_second(&self, count: u64) -> f64 {
        count as f64 / self.seconds
    }

    /// Decisions made: each decided request decides each of its descriptors.
    pub fn decisions(&self) -> u64 {
        self.counts.decided * self.descriptors_per_request as u64
    }

    /// `amount` over the decisions made (a run without any counts as one, to stay finite).
    pub fn per_decision(&self, amount: f64) -> f64 {
        amount / self.decisions().max(1) as f64
    }

    /// CPU microseconds per decision of `who`, when it was watched.
    pub fn cpu_micros_per_decision(&self, who: Process) -> Option<f64> {
        self.cpu
            .iter()
            .find(|&&(process, _)| process == who)
            .map(|&(_, seconds)| self.per_decision(seconds * 1e6))
    }

    /// Redis commands per decision, all commands together.
    pub fn redis_commands_per_decision(&self) -> Option<f64> {
        (self.redis_commands.as_ref()).map(|commands| self.per_decision(commands.total() as f64))
    }

    /// Why the result understates the load, when the generator could not offer all of it.
    pub fn dropped_warning(&self) -> Option<String> {
        let Mode::Open { max_in_flight, .. } = self.mode else {
            return None;
        };
        (self.counts.dropped > 0).then(|| {
            format!(
                "warning: the load generator dropped {} requests ({:.1}/s) because {max_in_flight} \
                 were outstanding: the server did not get the offered rate, so this run \
                 understates the load (raise --max-in-flight, or read it as overloaded)",
                self.counts.dropped,
                self.per_second(self.counts.dropped)
            )
        })
    }

    fn write_outcome(&self, f: &mut fmt::Formatter<'_>, label: &str, count: u64) -> fmt::Result {
        write!(f, "{label:<12} {count} ({:.1}/s)", self.per_second(count))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts = &self.counts;
        if let Mode::Open { rate, .. } = self.mode {
            let offered = counts.decided + counts.shed + counts.unavailable + counts.errors;
            writeln!(
                f,
                "offered      {} requests at {rate}/s in {:.1} s",
                offered + counts.dropped,
                self.seconds
            )?;
        }
        self.write_outcome(f, "decided", counts.decided)?;
        writeln!(
            f,
            ", {:.0} decisions/s; {} over limit; {} sent with the warm-up",
            self.per_second(self.decisions()),
            counts.over_limit,
            counts.sent
        )?;
        self.write_outcome(f, "shed", counts.shed)?;
        writeln!(f)?;
        self.write_outcome(f, "unavailable", counts.unavailable)?;
        writeln!(f)?;
        self.write_outcome(f, "other errors", counts.errors)?;
        writeln!(
            f,
            ", {} of them timed out ({} ms)",
            counts.timed_out,
            self.timeout.as_millis()
        )?;
        for (failure, count) in &self.failures {
            writeln!(f, "  {count:>10} × {failure}")?;
        }
        match self.mode {
            Mode::Closed { .. } => writeln!(f, "latency      {}", self.latency)?,
            Mode::Open { max_in_flight, .. } => {
                self.write_outcome(f, "dropped", counts.dropped)?;
                writeln!(
                    f,
                    " by the generator (at most {max_in_flight} in flight; peak {})",
                    counts.peak_in_flight
                )?;
                writeln!(f, "latency      {}  (from schedule)", self.latency)?;
                writeln!(f, "service time {}  (from send)", self.service)?;
            }
        }
        if self.redials > 0 {
            writeln!(
                f,
                "reconnected  {} times: the server closed connections, failing their requests",
                self.redials
            )?;
        }
        for &(who, seconds) in &self.cpu {
            writeln!(
                f,
                "{:<12} {:.2} µs CPU per decision ({seconds:.2} s, {:.2} cores)",
                who.label(),
                self.per_decision(seconds * 1e6),
                seconds / self.seconds
            )?;
        }
        if let Some(commands) = &self.redis_commands {
            write!(
                f,
                "redis cmds   {:.3} per decision (a script's own calls included):",
                self.per_decision(commands.total() as f64)
            )?;
            for (name, calls) in commands.iter() {
                write!(f, " {name} {:.3}", self.per_decision(calls as f64))?;
            }
            writeln!(f)?;
        }
        if let Some(warning) = self.dropped_warning() {
            writeln!(f, "{warning}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A closed-loop run of 2 s in which 1000 requests of 2 descriptors were decided.
    pub fn report() -> Report {
        Report {
            mode: Mode::Closed { concurrency: 64 },
            seconds: 2.0,
            descriptors_per_request: 2,
            timeout: Duration::from_secs(1),
            counts: Counts {
                sent: 1200,
                decided: 1000,
                shed: 10,
                ..Counts::default()
            },
            latency: Latencies::new((1..=1000).rev().collect()),
            service: Latencies::new((1..=1000).collect()),
            failures: Vec::new(),
            redials: 0,
            cpu: vec![(Process::Server, 0.5), (Process::LoadGen, 0.25)],
            redis_commands: None,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank_of_the_sorted_latencies() {
        let latencies = Latencies::new((1..=1000).rev().collect());
        assert_eq!(latencies.percentile_ms(0.5), 0.5);
        assert_eq!(latencies.percentile_ms(0.99), 0.99);
        assert_eq!(latencies.percentile_ms(0.999), 0.999);
        assert_eq!(latencies.percentile_ms(1.0), 1.0);
        assert_eq!(latencies.percentile_ms(0.0), 0.001);
    }

    #[test]
    fn no_latencies_read_as_zero() {
        assert_eq!(Latencies::default().percentile_ms(0.99), 0.0);
    }

    #[test]
    fn decisions_are_decided_requests_times_descriptors() {
        let report = report();
        assert_eq!(report.decisions(), 2000);
        assert_eq!(report.per_second(report.counts.shed), 5.0);
    }

    #[test]
    fn cpu_per_decision_only_for_watched_processes() {
        let report = report();
        assert_eq!(report.cpu_micros_per_decision(Process::Server), Some(250.0));
        assert_eq!(report.cpu_micros_per_decision(Process::Redis), None);
    }

    #[test]
    fn redis_commands_per_decision_sum_every_command() {
        let mut report = report();
        assert_eq!(report.redis_commands_per_decision(), None);
        let commands = CommandCounts::parse("cmdstat_evalsha:calls=1500\ncmdstat_ping:calls=500");
        report.redis_commands = Some(commands);
        assert_eq!(report.redis_commands_per_decision(), Some(1.0));
    }

    #[test]
    fn a_run_without_decisions_stays_finite() {
        let mut report = report();
        report.counts.decided = 0;
        assert_eq!(
            report.cpu_micros_per_decision(Process::Server),
            Some(500_000.0)
        );
    }

    #[test]
    fn only_an_open_loop_that_dropped_requests_warns() {
        let mut report = report();
        report.counts.dropped = 4;
        assert_eq!(report.dropped_warning(), None);
        report.mode = Mode::Open {
            rate: 1000.0,
            max_in_flight: 50,
        };
        let warning = report.dropped_warning().unwrap();
        assert!(warning.contains("dropped 4 requests (2.0/s)"), "{warning}");
        report.counts.dropped = 0;
        assert_eq!(report.dropped_warning(), None);
    }

    #[test]
    fn the_text_lists_the_failures_given() {
        let mut report = report();
        report.failures = vec![("Unavailable: backend overloaded".to_owned(), 10)];
        let text = report.to_string();
        assert!(
            text.contains("10 × Unavailable: backend overloaded\n"),
            "{text}"
        );
    }

    #[test]
    fn open_loop_text_shows_both_latencies_and_the_drops() {
        let mut report = report();
        report.mode = Mode::Open {
            rate: 500.0,
            max_in_flight: 50,
        };
        let text = report.to_string();
        assert!(
            text.contains("offered      1010 requests at 500/s"),
            "{text}"
        );
        assert!(text.contains("(from schedule)"), "{text}");
        assert!(text.contains("(from send)"), "{text}");
        assert!(text.contains("dropped      0 (0.0/s)"), "{text}");
    }
}
