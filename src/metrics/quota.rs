//! The Rate Limit Quota Service's figures: streams open and opened, reports, buckets held,
//! assignments by strategy and those sent at a reset, unmatched buckets by domain,
//! abandoned buckets and refused reports.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use super::exposition::{Exposition, Kind};
use crate::instruments::Tally;

/// What an assignment told a data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    TokenBucket,
    DenyAll,
    AllowAll,
}

impl Strategy {
    const ALL: [Strategy; 3] = [Strategy::TokenBucket, Strategy::DenyAll, Strategy::AllowAll];

    fn name(self) -> &'static str {
        match self {
            Strategy::TokenBucket => "token_bucket",
            Strategy::DenyAll => "deny_all",
            Strategy::AllowAll => "allow_all",
        }
    }
}

/// Why a report was refused, ending its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportRefusal {
    /// The report or one of its buckets cannot be read (gRPC INVALID_ARGUMENT).
    Forbidden,
}

impl ReportRefusal {
    const ALL: [ReportRefusal; 1] = [ReportRefusal::Forbidden];

    /// The gRPC status code the stream ends with.
    pub fn code_name(self) -> &'static str {
        match self {
            ReportRefusal::Forbidden => "INVALID_ARGUMENT",
        }
    }
}

/// The `domain` label of buckets no rule matches in a domain the rules do not know: such a
/// domain comes from the data plane, and is not kept in a label.
const UNKNOWN_DOMAIN: &str = "(unknown)";

/// Domains [`QuotaStats`] keeps a series of unmatched buckets for; past them, the others
/// are counted as [`UNKNOWN_DOMAIN`].
const UNMATCHED_DOMAINS_KEPT: usize = 1_000;

/// Counted by `crate::quota` as streams come and go.
#[derive(Debug, Default)]
pub struct QuotaStats {
    streams_opened: Tally,
    streams_open: AtomicI64,
    buckets: AtomicI64,
    reports: Tally,
    assignments: [Tally; Strategy::ALL.len()],
    abandoned: Tally,
    refused: [Tally; ReportRefusal::ALL.len()],
    pushed: Tally,
    /// Reported buckets no rule matches, by domain (those the rules know).
    unmatched: Mutex<BTreeMap<String, u64>>,
}

impl QuotaStats {
    pub fn stream_opened(&self) {
        self.streams_opened.add(1);
        self.streams_open.fetch_add(1, Ordering::Relaxed);
    }

    /// A stream ended, holding `buckets`.
    pub fn stream_closed(&self, buckets: usize) {
        self.streams_open.fetch_sub(1, Ordering::Relaxed);
        self.buckets_changed(-(buckets as i64));
    }

    /// Buckets held by the streams, up or down by `change`.
    pub fn buckets_changed(&self, change: i64) {
        self.buckets.fetch_add(change, Ordering::Relaxed);
    }

    pub fn report(&self) {
        self.reports.add(1);
    }

    pub fn assigned(&self, strategy: Strategy) {
        self.assignments[strategy as usize].add(1);
    }

    pub fn abandoned(&self) {
        self.abandoned.add(1);
    }

    /// An assignment sent at a window's reset, with no report.
    pub fn pushed(&self) {
        self.pushed.add(1);
    }

    /// `buckets` reported buckets no rule matches, in `domain` when the rules know it.
    pub fn unmatched(&self, domain: Option<&str>, buckets: u64) {
        let mut counts = self.unmatched.lock().unwrap_or_else(|e| e.into_inner());
        let known = domain
            .filter(|domain| counts.contains_key(*domain) || counts.len() < UNMATCHED_DOMAINS_KEPT);
        let count = counts
            .entry(known.unwrap_or(UNKNOWN_DOMAIN).to_owned())
            .or_default();
        *count = count.saturating_add(buckets);
    }

    /// A report refused, which ended its stream.
    pub fn refused(&self, why: ReportRefusal) {
        self.refused[why as usize].add(1);
    }

    pub(super) fn render(&self, page: &mut Exposition) {
        let counters = [
            (
                "floodgate_rlqs_streams_opened_total",
                "RLQS streams opened by data planes.",
                self.streams_opened.get(),
            ),
            (
                "floodgate_rlqs_reports_total",
                "RLQS usage reports received.",
                self.reports.get(),
            ),
            (
                "floodgate_rlqs_abandoned_total",
                "Buckets abandoned because their rule went away.",
                self.abandoned.get(),
            ),
            (
                "floodgate_rlqs_reset_assignments_total",
                "RLQS assignments sent at a window's reset, before the data plane's next report.",
                self.pushed.get(),
            ),
        ];
        for (name, help, value) in counters {
            page.family(name, Kind::Counter, help);
            page.sample(name, &[], value);
        }
        let gauges = [
            (
                "floodgate_rlqs_streams",
                "RLQS streams open now.",
                self.streams_open.load(Ordering::Relaxed).max(0),
            ),
            (
                "floodgate_rlqs_buckets",
                "Buckets matched to a rule on the open RLQS streams.",
                self.buckets.load(Ordering::Relaxed).max(0),
            ),
        ];
        for (name, help, value) in gauges {
            page.family(name, Kind::Gauge, help);
            page.sample(name, &[], value);
        }
        let name = "floodgate_rlqs_unmatched_buckets_total";
        let help = "Reported RLQS buckets no rule matches, left to the data plane's \
                    no_assignment_behavior, by domain ((unknown): a domain without rules).";
        page.family(name, Kind::Counter, help);
        let counts = self.unmatched.lock().unwrap_or_else(|e| e.into_inner());
        for (domain, count) in counts.iter() {
            page.sample(name, &[("domain", domain)], *count);
        }
        drop(counts);
        let name = "floodgate_rlqs_refused_reports_total";
        let help = "RLQS reports refused, ending their stream, by gRPC status: INVALID_ARGUMENT \
                    (it, or a bucket of it, cannot be read).";
        page.family(name, Kind::Counter, help);
        for why in ReportRefusal::ALL {
            let count = self.refused[why as usize].get();
            page.sample(name, &[("code", why.code_name())], count);
        }
        let name = "floodgate_rlqs_assignments_total";
        page.family(name, Kind::Counter, "RLQS assignments sent, by strategy.");
        for strategy in Strategy::ALL {
            let count = self.assignments[strategy as usize].get();
            page.sample(name, &[("strategy", strategy.name())], count);
        }
    }
}
