//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): a data plane
//! reports each bucket's usage every few seconds over one stream, and enforces the
//! assignment the server sends back, with no call per request.
//!
//! A stream's first message names the domain. Each reported bucket is matched to a rule of
//! that domain (its entries, which have no order, put in the order of a path of the rule
//! tree), its allowed requests are charged to the counters `ShouldRateLimit` uses, so both
//! kinds of client share one limit, and what is left becomes the bucket's assignment
//! (`assign.rs`). When a bucket's window resets before the data plane's next report, the
//! stream sends the new window's assignment at the reset, unasked.
//!
//! A bucket whose rule disappeared (a reload, an xDS update) is abandoned. A bucket no rule
//! matches gets no assignment (the data plane applies its own `no_assignment_behavior`); it
//! is counted and logged, and the stream goes on. A report with no domain, or another
//! stream's, ends the stream with INVALID_ARGUMENT and charges nothing; so does a report
//! that does not decode. A bucket that cannot be a descriptor ends it with INVALID_ARGUMENT
//! once the report's other buckets are answered (the data plane keeps their assignments,
//! and reports again on a new stream). Shutdown ends every stream with UNAVAILABLE, so data
//! planes reconnect to another replica.
//!
//! The wire is `edge/rlqs.rs`'s: it turns a gRPC call into a stream here
//! ([`QuotaService::serve`]), and what it read into [`Incoming`]; in process, tests and the
//! fuzzer open streams with [`QuotaService::connect`] and [`QuotaService::replay`].

pub mod assign;
mod bucket;
pub mod charge;
mod refusal;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::proto::envoy::r#type::v3::TokenBucket;
use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::envoy::r#type::v3::RateLimitStrategy;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::backend::BackendError;
use crate::clock::{Clock, SystemClock};
use crate::metrics::{Code, ReportRefusal, Strategy as Assigned};
use crate::rules::{Entry, OnBackendError, RuleSet};
use crate::service::RateLimiter;
use charge::{
    BucketQuota, BucketUsage, DEMAND_PERIOD, DemandReport, bucket_descriptor,
    charge_in_turn,
};
use assign::{Assignment, REPORT_INTERVAL};
use bucket::{Bucket, CountedBetween, micros, share};
use refusal::{bucket_key, cut, describe, listed, quoted};

/// The name of a report's span.
const REPORT_SPAN: &str = "floodgate.rlqs.report";

/// A bucket as the server keys it: its entries, sorted.
type BucketKey = Vec<Entry>;

/// Entries a stream keeps: a remembered bucket's key, and the descriptor that shares it.
type Entries = Arc<[Entry]>;

/// A report's buckets matched between two yields of the worker: a report of 10,000 buckets
/// with long entries holds it for no more than a slice's work (its charges and assignments
/// yield once a backend call, 128 buckets).
const MATCHED_AT_ONCE: usize = 128;

/// Buckets no rule matches that a stream remembers, so that their next reports skip the
/// match; past this many, the others are matched again at each report.
const UNMATCHED_KEPT: usize = 10_000;

/// What remembering a bucket keyed `key` takes, about: its entries twice at most (the key,
/// and its descriptor where the rule's order is not the sorted one; otherwise they share
/// one copy), each part with a string's header; and the bucket's state with its slot in the
/// stream's map (the key's pointer and the state, 256 bytes, the map's control bytes, the
/// entries' shared header). Measured resident, 100 streams of 100 and of 900 buckets of one
/// short entry (`benches/rlqs_report.rs`): about 260 bytes a pair, where this says 420.
fn remembered_bytes(key: &[Entry]) -> usize {
    const STRING: usize = std::mem::size_of::<String>();
    const STATE: usize = 300;
    let entries: usize = (key.iter())
        .map(|entry| entry.key.len() + entry.value.len() + 2 * STRING)
        .sum();
    2 * entries + STATE
}

/// The bytes every stream's remembered buckets take, and the most they may.
#[derive(Debug)]
pub struct Remembered {
    held: AtomicUsize,
    most: usize,
}

impl Remembered {
    fn new(most: usize) -> Self {
        Remembered {
            held: AtomicUsize::new(0),
            most,
        }
    }

    /// Takes `bytes` if they fit; whether they did.
    fn take(&self, bytes: usize) -> bool {
        (self.held)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&after| after <= self.most)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes remembered now, across streams.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// What a stream reads from its data plane, as the transport (`edge/rlqs.rs`) tells it.
#[derive(Debug)]
pub enum Incoming {
    /// A report.
    Report(RateLimitQuotaUsageReports),
    /// A message that does not decode as a report (too large, or not one), and why: the
    /// stream is refused INVALID_ARGUMENT.
    Undecodable(String),
    /// The transport cut the stream to make room for others: the data plane is told so
    /// (this status), and may open a stream again at once.
    Cut(Status),
}

/// What a stream sends its data plane: an answer, or the status that ends the stream.
pub type Outgoing = Result<RateLimitQuotaResponse, Status>;

/// An in-process RLQS stream: reports go in, what the stream sends comes out.
pub type Connection = (
    mpsc::Sender<RateLimitQuotaUsageReports>,
    mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>,
);

/// The Rate Limit Quota Service over `limiter`'s rules and counters.
#[derive(Clone)]
pub struct QuotaService {
    limiter: Arc<RateLimiter>,
    stopped: watch::Receiver<bool>,
    clock: Arc<dyn Clock>,
    remembered: Arc<Remembered>,
}

impl QuotaService {
    /// The service; its streams end when `stopped` turns true, and remember their buckets up
    /// to the limiter's `rlqs_max_remembered_bytes`.
    pub fn new(limiter: Arc<RateLimiter>, stopped: watch::Receiver<bool>) -> Self {
        let most = limiter.options().rlqs_max_remembered_bytes;
        QuotaService {
            limiter,
            stopped,
            clock: Arc::new(SystemClock),
            remembered: Arc::new(Remembered::new(most)),
        }
    }

    /// The service, its streams' memory of buckets held to `most` bytes together.
    pub fn remembering_at_most(self, most: usize) -> Self {
        QuotaService {
            remembered: Arc::new(Remembered::new(most)),
            ..self
        }
    }

    /// What its streams remember of their buckets now, in bytes (estimated).
    pub fn remembered(&self) -> usize {
        self.remembered.held()
    }

    /// The service, reading the time from `clock` (the backend's, in tests that drive
    /// time by hand) for intervals, resets and demand periods.
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        QuotaService { clock, ..self }
    }

    /// A new stream without a transport, for callers in process (tests, the fuzzer): send
    /// reports, receive what the stream sends, up to the status that ends it.
    pub fn connect(&self) -> Connection {
        let (reports, incoming) = mpsc::channel(16);
        let incoming = futures_util::stream::unfold(incoming, |mut incoming| async move {
            (incoming.recv().await).map(|report| (Incoming::Report(report), incoming))
        });
        let receiver = self.serve(http::HeaderMap::new(), Box::pin(incoming));
        (reports, receiver)
    }

    /// Serves one data plane's stream, whose request carried `headers`, on a task of its
    /// own: what it reads comes from `incoming` (its end is the data plane's), what it
    /// sends, up to the status that ends it, from the receiver.
    pub fn serve(
        &self,
        headers: http::HeaderMap,
        incoming: impl Stream<Item = Incoming> + Send + Unpin + 'static,
    ) -> mpsc::Receiver<Outgoing> {
        let (answers, receiver) = mpsc::channel(16);
        let stream = self.open(headers);
        tokio::spawn(stream.run(incoming, answers, self.stopped.clone()));
        receiver
    }

    /// Answers `reports` as one stream's, without a transport: what the stream sends back,
    /// in order, up to the status that ends it (reports after a refusal go unread). For
    /// callers in process, such as the fuzzer.
    pub async fn replay(
        &self,
        reports: Vec<RateLimitQuotaUsageReports>,
    ) -> Vec<Result<RateLimitQuotaResponse, Status>> {
        let (answers, mut receiver) = mpsc::channel(16);
        let stream = self.open(http::HeaderMap::new());
        let reports = futures_util::stream::iter(reports.into_iter().map(Incoming::Report));
        let run = stream.run(reports, answers, self.stopped.clone());
        let sent = async {
            let mut sent = Vec::new();
            while let Some(answer) = receiver.recv().await {
                sent.push(answer);
            }
            sent
        };
        tokio::join!(run, sent).1
    }

    /// A new stream, whose requests carried `headers`.
    fn open(&self, headers: http::HeaderMap) -> QuotaStream {
        self.limiter.metrics().quota().stream_opened();
        QuotaStream {
            limiter: self.limiter.clone(),
            clock: self.clock.clone(),
            headers,
            domain: None,
            buckets: HashMap::new(),
            unmatched: HashSet::new(),
            unmatched_logged: false,
            matched_under: Weak::new(),
            remembered: self.remembered.clone(),
            holds: 0,
            forgetting_logged: false,
        }
    }
}

/// One data plane's stream: its domain, and what it knows of each of its buckets.
struct QuotaStream {
    limiter: Arc<RateLimiter>,
    /// The time intervals, resets and demand periods are read on (the backend's).
    clock: Arc<dyn Clock>,
    /// The stream's request headers: each report's span continues the trace they carry.
    headers: http::HeaderMap,
    domain: Option<String>,
    /// Each bucket that matched a rule, keyed by its entries (sorted), which its descriptor
    /// shares when its rule's order is the same.
    buckets: HashMap<Entries, Bucket>,
    /// Buckets no rule matches (up to [`UNMATCHED_KEPT`]), under `matched_under`.
    unmatched: HashSet<BucketKey>,
    /// Whether a bucket no rule matches was logged: once a stream.
    unmatched_logged: bool,
    /// The rules the descriptors in `buckets` were found under.
    matched_under: Weak<RuleSet>,
    /// What every stream's buckets take, and the most they may.
    remembered: Arc<Remembered>,
    /// What this stream's take (its buckets and unmatched keys), given back when it ends.
    holds: usize,
    /// Whether a bucket not remembered for want of room was logged: once a stream.
    forgetting_logged: bool,
}

impl Drop for QuotaStream {
    fn drop(&mut self) {
        self.remembered.give_back(self.holds);
    }
}

/// What a report's bucket is charged: the requests let through in the window now running
/// and in an earlier one, those refused, the interval the report covers, and the demand to
/// add.
#[derive(Debug, Clone, Copy)]
struct Charge {
    allowed: u64,
    earlier: u64,
    /// Requests the data plane refused since its last report.
    refused: u64,
    interval: Duration,
    demand: DemandReport,
}

impl Charge {
    /// The bucket's usage to charge on `descriptor`, its entries in rule order.
    fn usage<'d>(&self, descriptor: &'d [Entry]) -> BucketUsage<'d> {
        BucketUsage {
            entries: descriptor,
            allowed: self.allowed,
            earlier: self.earlier,
            refused: self.refused,
            demand: Some(self.demand),
        }
    }
}

/// What one report gets back: the actions for its buckets, in its order (none: no message),
/// then, when the report is refused in whole or in part, the status that ends the stream.
#[derive(Default)]
struct Reply {
    actions: Vec<BucketAction>,
    refusal: Option<(ReportRefusal, Status)>,
}

impl Reply {
    /// A report whose domain is missing or wrong: no action, INVALID_ARGUMENT.
    fn forbidden(status: Status) -> Self {
        Reply {
            actions: Vec::new(),
            refusal: Some((ReportRefusal::Forbidden, status)),
        }
    }
}

/// How a report's bucket is answered.
enum Verdict {
    /// Charged on `descriptor` (its entries in rule order), then assigned what is left.
    Charge {
        key: BucketKey,
        descriptor: Entries,
        charge: Charge,
    },
    /// Its rule went away since it last matched.
    Abandon(BucketKey),
    /// No rule matches it: no assignment.
    Unmatched,
    /// It cannot be a descriptor, for this reason: no entries, an empty or oversized one.
    Invalid(String),
}

/// What woke a stream up.
enum Event {
    /// Something read from the data plane; `None` when it ended the stream.
    Read(Option<Incoming>),
    Reset,
}

impl QuotaStream {
    /// Answers each report in turn, and sends buckets whose window reset their new
    /// assignment, until the data plane ends the stream, breaks a rule of the protocol, or
    /// the server stops.
    async fn run(
        mut self,
        mut incoming: impl Stream<Item = Incoming> + Unpin,
        answers: mpsc::Sender<Outgoing>,
        mut stopped: watch::Receiver<bool>,
    ) {
        // The status that ends the stream, if floodgate ends it.
        let ending = loop {
            let push_at = self.buckets.values().filter_map(|b| b.push_at).min();
            let event = tokio::select! {
                read = incoming.next() => Event::Read(read),
                () = stopping(&mut stopped) => {
                    break Some(Status::unavailable("floodgate is shutting down: report to another replica"));
                }
                () = sleep_until(self.clock.as_ref(), push_at) => Event::Reset,
            };
            let reply = match event {
                Event::Read(Some(Incoming::Report(report))) => self.traced_answer(report).await,
                Event::Read(Some(Incoming::Undecodable(why))) => {
                    Reply::forbidden(Status::invalid_argument(why))
                }
                Event::Read(Some(Incoming::Cut(status))) => break Some(status),
                // The data plane ended the stream, or its connection broke.
                Event::Read(None) => break None,
                Event::Reset => Reply {
                    actions: self.at_reset().await,
                    refusal: None,
                },
            };
            // Nothing to change (the backend could not count): no message.
            if !reply.actions.is_empty() {
                let response = RateLimitQuotaResponse {
                    bucket_action: reply.actions,
                };
                if answers.send(Ok(response)).await.is_err() {
                    break None;
                }
            }
            if let Some((why, refusal)) = reply.refusal {
                self.limiter.metrics().quota().refused(why);
                break Some(refusal);
            }
        };
        // Counted closed before the data plane hears of it, so that what it reads next on
        // the metrics page agrees.
        (self.limiter.metrics().quota()).stream_closed(self.buckets.len());
        // Free before the stream is seen to end (`Drop` would be too, a moment later).
        self.remembered.give_back(std::mem::take(&mut self.holds));
        if let Some(status) = ending {
            let _ = answers.send(Err(status)).await;
        }
    }

    /// [`QuotaStream::answer`], traced as a span `floodgate.rlqs.report` when tracing is
    /// on: the domain, the buckets reported, and whether the report was refused.
    async fn traced_answer(&mut self, report: RateLimitQuotaUsageReports) -> Reply {
        let limiter = self.limiter.clone();
        let Some(telemetry) = limiter.telemetry() else {
            return self.answer(report).await;
        };
        let domain = match report.domain.as_str() {
            "" => self.domain.clone().unwrap_or_default(),
            domain => domain.to_owned(),
        };
        let buckets = report.bucket_quota_usages.len();
        let span = telemetry.decision(REPORT_SPAN, &self.headers, &domain, buckets);
        let reply = self.answer(report).await;
        match &reply.refusal {
            None => span.finish(Code::Ok),
            Some((why, _)) => span.finish_as(why.code_name(), true),
        }
        reply
    }

    /// The actions for one report's buckets, and whether the report is refused: nothing is
    /// charged for a report whose domain is wrong; the buckets a rule matches are answered
    /// before a bucket that cannot be a descriptor ends the stream.
    async fn answer(&mut self, report: RateLimitQuotaUsageReports) -> Reply {
        let domain = match self.report_domain(&report.domain) {
            Ok(domain) => domain,
            Err(refusal) => return Reply::forbidden(refusal),
        };
        self.limiter.metrics().quota().report();
        let rules = self.limiter.rules();
        self.match_under(&rules);
        let now = self.clock.now_micros();
        let usages = report.bucket_quota_usages;
        let limiter = self.limiter.clone();
        let limits = limiter.request_limits();
        let mut verdicts = Vec::with_capacity(usages.len());
        for (index, usage) in usages.iter().enumerate() {
            // A large report lets the worker answer other requests between slices of it.
            if index % MATCHED_AT_ONCE == MATCHED_AT_ONCE - 1 {
                tokio::task::yield_now().await;
            }
            verdicts.push(match bucket_key(usage, limits) {
                Ok(key) => self.verdict(&rules, &domain, key, usage, now),
                Err(why) => Verdict::Invalid(why),
            });
        }
        let charges: Vec<BucketUsage<'_>> = (verdicts.iter())
            .filter_map(|verdict| match verdict {
                Verdict::Charge {
                    descriptor, charge, ..
                } => Some(charge.usage(descriptor)),
                _ => None,
            })
            .collect();
        // Each call's buckets are assigned as its answer comes, while the calls after it are
        // with the backend.
        let clock = self.clock.clone();
        let calls = charge_in_turn(&limiter, clock.as_ref(), &rules, &domain, &charges);
        let mut calls = std::pin::pin!(calls);
        let mut answered = Vec::new().into_iter();
        let mut counted = CountedBetween {
            sent_at: now,
            read_at: now,
        };
        let mut reply = Reply::default();
        let (mut invalid, mut unmatched) = (Vec::new(), 0);
        for (index, (verdict, usage)) in verdicts.iter().zip(usages).enumerate() {
            let action = match verdict {
                Verdict::Charge {
                    key,
                    descriptor,
                    charge,
                } => {
                    if answered.len() == 0 {
                        let call = calls.next().await.unwrap_or_default();
                        counted = CountedBetween {
                            sent_at: call.sent_at,
                            read_at: self.clock.now_micros(),
                        };
                        answered = call.quotas.into_iter();
                    }
                    let quota = answered.next().unwrap_or_else(uncharged);
                    self.assigned(key, descriptor, quota, *charge, now, counted)
                }
                Verdict::Abandon(key) => Some(self.abandoned(key)),
                Verdict::Unmatched => {
                    unmatched += 1;
                    None
                }
                Verdict::Invalid(why) => {
                    invalid.push(format!("bucket_quota_usages[{index}]: {why}"));
                    None
                }
            };
            reply.actions.extend(action.map(|action| BucketAction {
                bucket_id: usage.bucket_id,
                bucket_action: Some(action),
            }));
        }
        if unmatched > 0 {
            let known = rules.domain(&domain).is_some();
            let stats = self.limiter.metrics().quota();
            stats.unmatched(known.then_some(domain.as_str()), unmatched);
        }
        if !invalid.is_empty() {
            let refusal = Status::invalid_argument(listed(&invalid, "; "));
            reply.refusal = Some((ReportRefusal::Forbidden, refusal));
        }
        reply
    }

    /// The assignments of the buckets whose window reset before their next report, sent
    /// at the reset: what is left of the new window (nothing charged: the data plane's
    /// usage since its report comes with its next one), at the share of its last report.
    async fn at_reset(&mut self) -> Vec<BucketAction> {
        let now = self.clock.now_micros();
        let rules = self.limiter.rules();
        self.match_under(&rules);
        let mut due: Vec<(Entries, Entries)> = Vec::new();
        for (key, bucket) in &mut self.buckets {
            if bucket.push_at.is_some_and(|at| at <= now) {
                bucket.push_at = None;
                if let Some(descriptor) = &bucket.descriptor {
                    due.push((key.clone(), descriptor.clone()));
                }
            }
        }
        let Some(domain) = self.domain.clone() else {
            return Vec::new();
        };
        let charges: Vec<BucketUsage<'_>> = (due.iter())
            .map(|(_, descriptor)| BucketUsage {
                entries: descriptor,
                allowed: 0,
                earlier: 0,
                refused: 0,
                demand: None,
            })
            .collect();
        let (limiter, clock) = (self.limiter.clone(), self.clock.clone());
        let calls = charge_in_turn(&limiter, clock.as_ref(), &rules, &domain, &charges);
        let mut calls = std::pin::pin!(calls);
        let mut keys = due.iter().map(|(key, _)| key);
        let mut actions = Vec::new();
        while let Some(call) = calls.next().await {
            let counted = CountedBetween {
                sent_at: call.sent_at,
                read_at: self.clock.now_micros(),
            };
            // The answers first: zipped the other way round, the end of one call's answers
            // would take a key of the next call's with it.
            for (quota, key) in call.quotas.into_iter().zip(keys.by_ref()) {
                let Some(bucket) = self.buckets.get_mut(key) else {
                    continue;
                };
                let Some(assignment) = assign::assign(&quota, bucket.interval, bucket.share) else {
                    continue;
                };
                let next_report = bucket.reported_at + micros(REPORT_INTERVAL);
                bucket.follow(&quota, counted, next_report);
                bucket.pushed = assignment
                    .allowance()
                    .map(|(burst, rate)| (burst, rate, now));
                bucket.holds = Some(assignment.clone());
                self.limiter.metrics().quota().pushed();
                actions.push(BucketAction {
                    bucket_id: Some(bucket_id(key)),
                    bucket_action: Some(self.sent(assignment)),
                });
            }
        }
        actions
    }

    /// The stream's domain, as the report names it (or leaves it to the first report).
    fn report_domain(&mut self, named: &str) -> Result<String, Status> {
        match (&self.domain, named) {
            (None, "") => Err(Status::invalid_argument(
                "the stream's first report names no domain",
            )),
            (None, domain) => Ok(self.domain.insert(domain.to_owned()).clone()),
            (Some(known), "") => Ok(known.clone()),
            (Some(known), domain) if known == domain => Ok(known.clone()),
            (Some(known), domain) => Err(Status::invalid_argument(format!(
                "the stream reports for domain {}; {} needs a stream of its own",
                quoted(known),
                quoted(domain)
            ))),
        }
    }

    /// Makes `rules` the ones the buckets are matched under: when they changed, each bucket
    /// is matched again at its next report.
    fn match_under(&mut self, rules: &Arc<RuleSet>) {
        if !Weak::ptr_eq(&self.matched_under, &Arc::downgrade(rules)) {
            self.matched_under = Arc::downgrade(rules);
            (self.buckets.values_mut()).for_each(|bucket| bucket.descriptor = None);
            for key in std::mem::take(&mut self.unmatched) {
                self.forget(&key);
            }
        }
    }

    /// How the bucket `key`, reported with `usage` at `now`, is answered under `rules`:
    /// matched again only when the rules changed since it last matched, or it never did.
    fn verdict(
        &mut self,
        rules: &RuleSet,
        domain: &str,
        key: BucketKey,
        usage: &BucketQuotaUsage,
        now: u64,
    ) -> Verdict {
        let bucket = self.buckets.get(key.as_slice());
        if let Some(descriptor) = bucket.and_then(|b| b.descriptor.clone()) {
            let charge = charge(bucket, usage, now);
            return Verdict::Charge {
                key,
                descriptor,
                charge,
            };
        }
        if self.unmatched.contains(&key) {
            return Verdict::Unmatched;
        }
        match bucket_descriptor(rules, domain, &key) {
            Some(descriptor) => Verdict::Charge {
                charge: charge(bucket, usage, now),
                key,
                descriptor: descriptor.into(),
            },
            None if bucket.is_some() => Verdict::Abandon(key),
            None => {
                self.log_unmatched(rules, domain, &key);
                if self.unmatched.len() < UNMATCHED_KEPT && self.remember(&key) {
                    self.unmatched.insert(key);
                }
                Verdict::Unmatched
            }
        }
    }

    /// The assignment for a bucket charged for a report read `now`, counted by the backend
    /// between the instants of `counted`, which the stream now holds; `None` leaves the data plane's
    /// assignment as it is (the backend could not count). A bucket the stream remembers is
    /// updated where it lies.
    fn assigned(
        &mut self,
        key: &BucketKey,
        descriptor: &Entries,
        quota: BucketQuota,
        charge: Charge,
        now: u64,
        counted: CountedBetween,
    ) -> Option<Action> {
        let previous = self.buckets.get_mut(key.as_slice());
        let added = previous.as_ref().and_then(|b| b.demand_added);
        let share = match &quota {
            BucketQuota::Counted {
                demand: Some(seen), ..
            } => share(charge.demand, added, *seen),
            _ => previous.as_ref().map_or(1.0, |b| b.share),
        };
        let demand_added = match added {
            Some(added) if added.period == charge.demand.period + 1 => DemandReport {
                rate: added.rate.saturating_add(charge.demand.rate),
                ..added
            },
            _ => DemandReport {
                period: charge.demand.period + 1,
                rate: charge.demand.rate,
            },
        };
        let assignment = assign::assign(&quota, charge.interval, share);
        let held = previous.as_ref().and_then(|b| b.holds.as_ref());
        let kept =
            (assignment.as_ref().zip(held)).is_some_and(|(new, held)| new.keeps_bucket_of(held));
        // A bucket kept, or replacing one, starts as full as it was: empty when requests
        // were refused.
        let replaces =
            held.is_some_and(|held| held.allowance().is_some_and(|(burst, _)| burst > 0.0));
        let drained = (kept || replaces) && charge.refused > 0;
        let allowance =
            (assignment.as_ref().and_then(Assignment::allowance)).map(|(burst, rate)| {
                if drained { (0.0, rate) } else { (burst, rate) }
            });
        let next_report = now + micros(REPORT_INTERVAL);
        if let Some(bucket) = previous {
            if !bucket
                .descriptor
                .as_ref()
                .is_some_and(|d| Arc::ptr_eq(d, descriptor))
            {
                bucket.descriptor = Some(descriptor.clone());
            }
            bucket.reported_at = now;
            bucket.interval = charge.interval;
            bucket.share = share;
            bucket.demand_added = Some(demand_added);
            bucket.allowance = allowance;
            if let Some(assignment) = &assignment {
                bucket.holds = Some(assignment.clone());
            }
            bucket.pushed = None;
            bucket.follow(&quota, counted, next_report);
        } else if self.remember(key) {
            let mut bucket = Bucket {
                descriptor: Some(descriptor.clone()),
                reported_at: now,
                interval: charge.interval,
                share,
                demand_added: Some(demand_added),
                window: None,
                allowance,
                holds: assignment.clone(),
                pushed: None,
                push_at: None,
            };
            bucket.follow(&quota, counted, next_report);
            // One copy of the entries where the rule's order is the sorted one.
            let key = if **descriptor == *key.as_slice() {
                descriptor.clone()
            } else {
                Arc::from(key.as_slice())
            };
            self.buckets.insert(key, bucket);
            self.limiter.metrics().quota().buckets_changed(1);
        }
        Some(self.sent(assignment?))
    }

    /// Takes room for remembering the bucket `key`; whether there was (when not, logged once
    /// a stream).
    fn remember(&mut self, key: &BucketKey) -> bool {
        let bytes = remembered_bytes(key);
        if self.remembered.take(bytes) {
            self.holds += bytes;
            return true;
        }
        if !std::mem::replace(&mut self.forgetting_logged, true) {
            tracing::warn!(
                most = self.remembered.most,
                "RLQS streams remember {} bytes of buckets, all they may: a new bucket is \
                 answered but not remembered (its next report is answered as its first)",
                self.remembered.held()
            );
        }
        false
    }

    /// Gives back the room the bucket `key` took.
    fn forget(&mut self, key: &BucketKey) {
        let bytes = remembered_bytes(key);
        self.holds -= bytes;
        self.remembered.give_back(bytes);
    }

    /// `assignment` as an action, counted.
    fn sent(&self, assignment: Assignment) -> Action {
        (self.limiter.metrics().quota()).assigned(match assignment {
            Assignment::TokenBucket { .. } => Assigned::TokenBucket,
            Assignment::DenyAll { .. } => Assigned::DenyAll,
            Assignment::AllowAll { .. } => Assigned::AllowAll,
        });
        Action::QuotaAssignmentAction(assignment_action(assignment))
    }

    /// Forgets the bucket `key`, whose rule is gone: the data plane forgets it too, and
    /// starts it anew (unassigned) with its next request into it.
    fn abandoned(&mut self, key: &BucketKey) -> Action {
        if self.buckets.remove(key.as_slice()).is_some() {
            self.forget(key);
        }
        let stats = self.limiter.metrics().quota();
        stats.buckets_changed(-1);
        stats.abandoned();
        Action::AbandonAction(AbandonAction {})
    }

    /// Logs the first bucket of the stream that no rule of `domain` matches.
    fn log_unmatched(&mut self, rules: &RuleSet, domain: &str, key: &BucketKey) {
        if !std::mem::replace(&mut self.unmatched_logged, true) {
            tracing::warn!(
                domain = %cut(domain),
                bucket = %describe(key),
                domain_has_rules = rules.domain(domain).is_some(),
                "an RLQS bucket matches no rule: floodgate sends it no assignment, so the data \
                 plane applies its own no_assignment_behavior (logged once a stream; \
                 floodgate_rlqs_unmatched_buckets_total counts them all)"
            );
        }
    }
}

/// The id a data plane knows the bucket `key` by: its entries (the stream keeps no copy of
/// the id it reported).
fn bucket_id(key: &[Entry]) -> BucketId {
    let entries = key
        .iter()
        .map(|entry| (entry.key.clone(), entry.value.clone()));
    BucketId {
        bucket: entries.collect(),
    }
}

/// A bucket's report, `usage` at `now`, as it is charged: the requests let through in the
/// window now running (the rest went to a window that reset since the bucket's last report,
/// `bucket` as the stream remembers it), the interval the report covers (measured between
/// this stream's reports of the bucket when it has one before), and the demand that makes.
fn charge(bucket: Option<&Bucket>, usage: &BucketQuotaUsage, now: u64) -> Charge {
    let measured = bucket.map(|b| Duration::from_micros(now.saturating_sub(b.reported_at)));
    let interval = assign::interval(measured, usage.time_elapsed.as_ref());
    let allowed = usage.num_requests_allowed;
    let refused = usage.num_requests_denied;
    let earlier = bucket.map_or(0, |b| b.let_through_before_reset(allowed, refused, now));
    let requests = allowed.saturating_add(refused);
    let rate = (requests as f64 * 1000.0 / interval.as_secs_f64()).min(u64::MAX as f64);
    Charge {
        allowed: allowed - earlier,
        earlier,
        refused,
        interval,
        demand: DemandReport {
            period: now / micros(DEMAND_PERIOD),
            rate: rate as u64,
        },
    }
}

/// What a bucket the charge left without an answer gets: a failed charge, answered as an
/// error. It does not happen: the charge answers every bucket it was given.
fn uncharged() -> BucketQuota {
    BucketQuota::Failed {
        error: BackendError::Protocol("uncharged".into()),
        policy: OnBackendError::Error,
    }
}

/// Resolves at `at` (µs on `clock`), never when there is no `at`.
async fn sleep_until(clock: &dyn Clock, at: Option<u64>) {
    match at {
        Some(at) => {
            let wait = at.saturating_sub(clock.now_micros());
            tokio::time::sleep(Duration::from_micros(wait)).await;
        }
        None => std::future::pending().await,
    }
}

/// Resolves once `stopped` turns true (or its sender is gone).
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

fn assignment_action(assignment: Assignment) -> QuotaAssignmentAction {
    let duration = |duration: Duration| pbjson_types::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: duration.subsec_nanos() as i32,
    };
    let (strategy, ttl) = match assignment {
        Assignment::AllowAll { ttl } => (Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl),
        Assignment::DenyAll { ttl } => (Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl),
        Assignment::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval,
            ttl,
        } => (
            Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(pbjson_types::UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(duration(fill_interval)),
            }),
            ttl,
        ),
    };
    QuotaAssignmentAction {
        assignment_time_to_live: Some(duration(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, MemoryBackend};
    use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use crate::service::ServiceOptions;

    const RULES: &str = "domain: q\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

    fn report(users: std::ops::Range<usize>) -> RateLimitQuotaUsageReports {
        let usage = |user: usize| BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_owned(), format!("u{user:03}"))].into(),
            }),
            time_elapsed: Some(pbjson_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: 1,
            num_requests_denied: 0,
        };
        RateLimitQuotaUsageReports {
            domain: "q".into(),
            bucket_quota_usages: users.map(usage).collect(),
        }
    }

    #[tokio::test]
    async fn buckets_past_the_room_for_them_are_answered_but_not_remembered() {
        let rules = RuleSet::from_sources(&[("q.yaml".into(), RULES.into())]).expect("rules");
        let memory = Arc::new(MemoryBackend::new(Arc::new(SystemClock), 10_000));
        let limiter = RateLimiter::new(
            rules,
            Backend::memory(memory.clone()),
            memory,
            ServiceOptions::default(),
        );
        let (_running, stopped) = watch::channel(false);
        let one = remembered_bytes(&[Entry::new("user", "u000")]);
        let service = QuotaService::new(Arc::new(limiter), stopped).remembering_at_most(10 * one);
        let (reports, mut answers) = service.connect();
        for round in 0..2 {
            reports.send(report(0..100)).await.expect("open");
            let answer = answers
                .recv()
                .await
                .expect("an answer")
                .expect("no refusal");
            assert_eq!(answer.bucket_action.len(), 100, "round {round}");
            // Each answered with its assignment, as its first report would be.
            assert!(answer.bucket_action.iter().all(|action| matches!(
                action.bucket_action,
                Some(Action::QuotaAssignmentAction(_))
            )));
            assert_eq!(service.remembered(), 10 * one);
        }
        drop(reports);
        assert!(answers.recv().await.is_none(), "the stream ends");
        assert_eq!(service.remembered(), 0, "what it remembered is free again");
    }
}
