//! What became of each request, and the tally of a run's requests.

use std::collections::HashMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use tonic::{Code, Status};

use floodgate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code as OverallCode;

/// The class of one request's answer. Only `Decided` requests did what the load is meant to
/// measure; the others say why a request did not (and a server that sheds or fails fast can
/// look fast, so they are reported next to the throughput, never folded into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerClass {
    /// OK or OVER_LIMIT: the server made every decision the request asked for.
    Decided { over_limit: bool },
    /// UNAVAILABLE because the server shed the request: Redis was saturated and the rule's
    /// `on_backend_error` policy answered at once (the message says "overloaded").
    Shed,
    /// Any other UNAVAILABLE: Redis down or timing out, the server unreachable.
    Unavailable,
    /// Any other status, DEADLINE_EXCEEDED and CANCELLED included.
    Error,
}

impl AnswerClass {
    /// The class of an answer.
    pub fn of(answer: &Result<RateLimitResponse, Status>) -> AnswerClass {
        match answer {
            Ok(response) => AnswerClass::Decided {
                over_limit: response.overall_code == OverallCode::OverLimit as i32,
            },
            Err(status) => AnswerClass::of_status(status),
        }
    }

    /// The class of a failed request.
    pub fn of_status(status: &Status) -> AnswerClass {
        match status.code() {
            Code::Unavailable if status.message().contains("overloaded") => AnswerClass::Shed,
            Code::Unavailable => AnswerClass::Unavailable,
            _ => AnswerClass::Error,
        }
    }
}

/// Whether a failed request ran out of its `--timeout-ms`: the generator gave up on it
/// (reported as DEADLINE_EXCEEDED, as a gRPC client would), the server said
/// DEADLINE_EXCEEDED, or tonic's server enforced the `grpc-timeout` header, which it answers
/// with CANCELLED "Timeout expired".
pub fn timed_out(status: &Status) -> bool {
    match status.code() {
        Code::DeadlineExceeded => true,
        Code::Cancelled => status.message().contains("Timeout expired"),
        _ => false,
    }
}

/// A failed request's status in one line: its code and message, and the errors under it
/// (a GOAWAY's reason, an I/O error), which the message alone often leaves out.
pub fn describe(status: &Status) -> String {
    let mut line = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        // Wrappers often repeat the text of what they wrap.
        let text = error.to_string();
        if !line.ends_with(&text) {
            let _ = write!(line, ": {text}");
        }
        source = error.source();
    }
    line
}

/// One request, timed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub outcome: AnswerClass,
    pub timed_out: bool,
    /// A failed request's [`describe`]d status.
    pub failure: Option<String>,
    /// From when the request was due to its answer. In the open loop it was due at its
    /// scheduled time, so every delay before it left (the server's backlog, the generator's
    /// own lateness) counts; in the closed loop it was due when it was sent.
    pub latency: Duration,
    /// From when the request was sent to its answer.
    pub service: Duration,
}

impl Sample {
    pub fn new(
        answer: &Result<RateLimitResponse, Status>,
        due: Instant,
        sent: Instant,
        answered: Instant,
    ) -> Sample {
        Sample {
            outcome: AnswerClass::of(answer),
            timed_out: answer.as_ref().err().is_some_and(timed_out),
            failure: answer.as_ref().err().map(describe),
            latency: answered.saturating_duration_since(due),
            service: answered.saturating_duration_since(sent),
        }
    }
}

/// How many requests ended which way (and, for the open loop, what the generator did).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests sent, the warm-up's included (to compare with a backend's own counts).
    pub sent: u64,
    pub decided: u64,
    /// Of `decided`, those answered OVER_LIMIT.
    pub over_limit: u64,
    pub shed: u64,
    pub unavailable: u64,
    pub errors: u64,
    /// Of `errors`, those that ran out of their timeout.
    pub timed_out: u64,
    /// Open loop: requests due but never sent, because `--max-in-flight` were outstanding.
    pub dropped: u64,
    /// Open loop: the most requests outstanding at once.
    pub peak_in_flight: u64,
}

impl Counts {
    pub fn add(&mut self, other: Counts) {
        self.sent += other.sent;
        self.decided += other.decided;
        self.over_limit += other.over_limit;
        self.shed += other.shed;
        self.unavailable += other.unavailable;
        self.errors += other.errors;
        self.timed_out += other.timed_out;
        self.dropped += other.dropped;
        self.peak_in_flight = self.peak_in_flight.max(other.peak_in_flight);
    }
}

/// The counts and latencies of a run's requests (or of one worker's share, merged later).
#[derive(Debug, Default)]
pub struct Tally {
    pub counts: Counts,
    /// [`Sample::latency`] of decided requests, unsorted, in microseconds.
    pub latencies_micros: Vec<u32>,
    /// [`Sample::service`] of decided requests, in the same order.
    pub service_micros: Vec<u32>,
    pub failures: Failures,
}

impl Tally {
    /// Counts one measured request.
    pub fn record(&mut self, sample: &Sample) {
        let counts = &mut self.counts;
        match sample.outcome {
            AnswerClass::Decided { over_limit } => {
                counts.decided += 1;
                counts.over_limit += u64::from(over_limit);
                self.latencies_micros.push(micros(sample.latency));
                self.service_micros.push(micros(sample.service));
            }
            AnswerClass::Shed => counts.shed += 1,
            AnswerClass::Unavailable => counts.unavailable += 1,
            AnswerClass::Error => counts.errors += 1,
        }
        counts.timed_out += u64::from(sample.timed_out);
        if let Some(failure) = &sample.failure {
            self.failures.add(failure.clone(), 1);
        }
    }

    pub fn merge(&mut self, other: Tally) {
        self.counts.add(other.counts);
        self.latencies_micros.extend(other.latencies_micros);
        self.service_micros.extend(other.service_micros);
        for (failure, count) in other.failures.0 {
            self.failures.add(failure, count);
        }
    }
}

/// How often each kind of failure happened, so that the most common can be shown: the
/// outcome classes say what failed, these say why.
#[derive(Debug, Default)]
pub struct Failures(HashMap<String, u64>);

/// Distinct failures kept; the rest are counted together, so that failures whose text
/// varies cannot grow the map without bound.
const FAILURE_KINDS: usize = 32;

const OTHER_KINDS: &str = "(other kinds of failure)";

impl Failures {
    fn add(&mut self, failure: String, count: u64) {
        let failure = without_figures(&failure);
        if self.0.len() >= FAILURE_KINDS && !self.0.contains_key(&failure) {
            *self.0.entry(OTHER_KINDS.to_owned()).or_default() += count;
        } else {
            *self.0.entry(failure).or_default() += count;
        }
    }

    /// The `n` most common failures, the most common first.
    pub fn most_common(&self, n: usize) -> Vec<(String, u64)> {
        let mut failures: Vec<_> = (self.0.iter())
            .map(|(failure, &count)| (failure.clone(), count))
            .collect();
        failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        failures.truncate(n);
        failures
    }
}

/// `text` with every number (a duration's `39.8ms`, a count) shown as `N`: failures that
/// differ only in their figures are one kind.
fn without_figures(text: &str) -> String {
    let mut kind = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        let figure = c.is_ascii_digit() || (in_number && c == '.');
        if figure && !in_number {
            kind.push('N');
        } else if !figure {
            kind.push(c);
        }
        in_number = figure;
    }
    kind
}

/// Whole microseconds, saturating (a u32 holds over an hour).
fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(code: OverallCode) -> Result<RateLimitResponse, Status> {
        Ok(RateLimitResponse {
            overall_code: code as i32,
            ..Default::default()
        })
    }

    #[test]
    fn failures_that_differ_in_their_figures_are_one_kind() {
        let mut failures = Failures::default();
        failures.add("no turn within 39.8ms; 2 sent".into(), 1);
        failures.add("no turn within 40.125ms; 17 sent".into(), 2);
        assert_eq!(
            failures.most_common(2),
            [("no turn within Nms; N sent".to_owned(), 3)]
        );
    }

    #[test]
    fn ok_and_over_limit_are_both_decided() {
        assert_eq!(
            AnswerClass::of(&response(OverallCode::Ok)),
            AnswerClass::Decided { over_limit: false }
        );
        assert_eq!(
            AnswerClass::of(&response(OverallCode::OverLimit)),
            AnswerClass::Decided { over_limit: true }
        );
    }

    #[test]
    fn unavailable_saying_overloaded_is_shed() {
        let status = Status::unavailable("backend overloaded: 5000 requests waiting");
        assert_eq!(AnswerClass::of(&Err(status)), AnswerClass::Shed);
    }

    #[test]
    fn other_unavailable_is_unavailable() {
        let status = Status::unavailable("backend error: connection refused");
        assert_eq!(AnswerClass::of(&Err(status)), AnswerClass::Unavailable);
    }

    #[test]
    fn overloaded_with_another_code_is_an_error() {
        let status = Status::resource_exhausted("overloaded");
        assert_eq!(AnswerClass::of_status(&status), AnswerClass::Error);
    }

    #[test]
    fn deadline_and_cancellation_are_errors() {
        assert_eq!(
            AnswerClass::of_status(&Status::deadline_exceeded("late")),
            AnswerClass::Error
        );
        assert_eq!(
            AnswerClass::of_status(&Status::cancelled("Timeout expired")),
            AnswerClass::Error
        );
    }

    #[test]
    fn timeouts_are_deadline_exceeded_or_tonics_expired_cancellation() {
        assert!(timed_out(&Status::deadline_exceeded("no answer")));
        assert!(timed_out(&Status::cancelled("Timeout expired")));
        assert!(!timed_out(&Status::cancelled("client went away")));
        assert!(!timed_out(&Status::unavailable("backend timeout")));
    }

    #[test]
    fn sample_latency_counts_from_due_and_service_time_from_send() {
        let due = Instant::now();
        let sent = due + Duration::from_millis(3);
        let answered = due + Duration::from_millis(5);
        let sample = Sample::new(&response(OverallCode::Ok), due, sent, answered);
        assert_eq!(sample.latency, Duration::from_millis(5));
        assert_eq!(sample.service, Duration::from_millis(2));
        assert!(!sample.timed_out);
    }

    #[test]
    fn tally_keeps_latencies_of_decided_requests_only() {
        let due = Instant::now();
        let later = due + Duration::from_micros(250);
        let mut tally = Tally::default();
        tally.record(&Sample::new(
            &response(OverallCode::OverLimit),
            due,
            due,
            later,
        ));
        let late = Err(Status::deadline_exceeded("no answer"));
        tally.record(&Sample::new(&late, due, due, later));
        tally.record(&Sample::new(
            &Err(Status::unavailable("overloaded")),
            due,
            due,
            later,
        ));
        let counts = tally.counts;
        assert_eq!((counts.decided, counts.over_limit), (1, 1));
        assert_eq!((counts.errors, counts.timed_out, counts.shed), (1, 1, 1));
        assert_eq!(tally.latencies_micros, [250]);
    }

    #[test]
    fn a_failure_is_described_with_the_errors_under_it() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let mut status = Status::unknown("connection error");
        status.set_source(std::sync::Arc::new(io));
        assert_eq!(describe(&status), "Unknown: connection error: broken pipe");
        let repeated = Status::from_error(Box::new(std::io::Error::other("refused")));
        assert_eq!(describe(&repeated), "Unknown: refused");
        let late = Sample::new(
            &Err(Status::deadline_exceeded("no answer")),
            Instant::now(),
            Instant::now(),
            Instant::now(),
        );
        assert_eq!(late.failure.as_deref(), Some("DeadlineExceeded: no answer"));
    }

    #[test]
    fn failures_come_most_common_first() {
        let mut failures = Failures::default();
        failures.add("b".into(), 1);
        failures.add("a".into(), 3);
        failures.add("c".into(), 2);
        assert_eq!(
            failures.most_common(2),
            [("a".to_owned(), 3), ("c".to_owned(), 2)]
        );
    }

    #[test]
    fn failures_beyond_the_kinds_kept_are_counted_together() {
        let mut failures = Failures::default();
        // Kinds told apart by their words (figures alone would make them one kind).
        let name = |kind: usize| format!("kind {}", "x".repeat(kind + 1));
        for kind in 0..FAILURE_KINDS + 5 {
            failures.add(name(kind), 10);
        }
        failures.add(name(0), 1);
        let most_common = failures.most_common(2);
        assert_eq!(most_common[0], (OTHER_KINDS.to_owned(), 50));
        assert_eq!(most_common[1], (name(0), 11));
    }

    #[test]
    fn merging_adds_counts_and_keeps_the_highest_peak() {
        let mut a = Tally {
            counts: Counts {
                decided: 2,
                dropped: 1,
                peak_in_flight: 10,
                ..Counts::default()
            },
            latencies_micros: vec![1, 2],
            service_micros: vec![1, 2],
            failures: Failures::default(),
        };
        a.merge(Tally {
            counts: Counts {
                decided: 3,
                dropped: 4,
                peak_in_flight: 7,
                ..Counts::default()
            },
            latencies_micros: vec![3],
            service_micros: vec![3],
            failures: Failures::default(),
        });
        let counts = a.counts;
        assert_eq!(
            (counts.decided, counts.dropped, counts.peak_in_flight),
            (5, 5, 10)
        );
        assert_eq!(a.latencies_micros, [1, 2, 3]);
    }
}
