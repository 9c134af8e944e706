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

pub mod assign;

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tonic::{Code as GrpcCode, Request, Response, Status, Streaming};

use crate::proto::envoy::r#type::v3::TokenBucket;
use crate::proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::envoy::r#type::v3::RateLimitStrategy;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::backend::BackendError;
use crate::clock::{Clock, SystemClock};
use crate::limiter::{Algorithm, Limit};
use crate::metrics::{Code, Refusal, Strategy as Assigned};
use crate::rules::{OnBackendError, RuleSet};
use crate::service::RateLimiter;
use crate::settings::RequestLimits;
use crate::service::quota::{
    BucketQuota, BucketUsage, DEMAND_PERIOD, DemandReport, DemandSeen, bucket_descriptor,
};
use assign::{Assignment, REPORT_INTERVAL};

pub use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// The name of a report's span.
const REPORT_SPAN: &str = "floodgate.rlqs.report";

/// A bucket as the server keys it: its entries, sorted.
type BucketKey = Vec<(String, String)>;

/// Buckets no rule matches that a stream remembers, so that their next reports skip the
/// match; past this many, the others are matched again at each report.
const UNMATCHED_KEPT: usize = 10_000;

/// How long after a window's reset its new assignment is sent: the backend's clock and this
/// process' may differ by a few milliseconds, and the new window must have begun there.
const AFTER_RESET: Duration = Duration::from_millis(20);

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
}

impl QuotaService {
    /// The service; its streams end when `stopped` turns true.
    pub fn new(limiter: Arc<RateLimiter>, stopped: watch::Receiver<bool>) -> Self {
        QuotaService {
            limiter,
            stopped,
            clock: Arc::new(SystemClock),
        }
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
        let (answers, receiver) = mpsc::channel(16);
        let stream = self.open(http::HeaderMap::new());
        let incoming = futures_util::stream::unfold(incoming, |mut incoming| async move {
            incoming.recv().await.map(|report| (Ok(report), incoming))
        });
        tokio::spawn(stream.run(Box::pin(incoming), answers, self.stopped.clone()));
        (reports, receiver)
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
        let reports = futures_util::stream::iter(reports.into_iter().map(Ok));
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
        }
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let (answers, receiver) = mpsc::channel(16);
        let stream = self.open(request.metadata().clone().into_headers());
        tokio::spawn(stream.run(request.into_inner(), answers, self.stopped.clone()));
        let answers = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|answer| (answer, receiver))
        });
        Ok(Response::new(Box::pin(answers)))
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
    /// Each bucket that matched a rule.
    buckets: HashMap<BucketKey, Bucket>,
    /// Buckets no rule matches (up to [`UNMATCHED_KEPT`]), under `matched_under`.
    unmatched: HashSet<BucketKey>,
    /// Whether a bucket no rule matches was logged: once a stream.
    unmatched_logged: bool,
    /// The rules the descriptors in `buckets` were found under.
    matched_under: Weak<RuleSet>,
}

/// A bucket a stream charges: its rule's descriptor, its last report, and its window.
struct Bucket {
    /// The bucket's id as the data plane last reported it, to name it in an assignment sent
    /// at a reset.
    id: BucketId,
    /// Its entries in its rule's order (the descriptor it is charged on), or `None` once the
    /// rules changed: then it is matched again at its next report.
    descriptor: Option<Vec<(String, String)>>,
    /// When it was last reported (µs on the stream's clock), and the interval that report
    /// covered.
    reported_at: u64,
    interval: Duration,
    /// This stream's share of the bucket's demand, at its last report.
    share: f64,
    /// The demand this stream added for the bucket: the period it went to, and how much.
    demand_added: Option<DemandReport>,
    /// The limit its last assignment came from, and when that limit's window resets.
    window: Option<(Limit, u64)>,
    /// What the assignment made at its last report lets through at most: so many at once
    /// and so many a second (`None`: no bound, `ALLOW_ALL` or none sent). At once, a full
    /// bucket: unless the data plane kept its bucket (the same assignment again) after
    /// refusing requests, which emptied it.
    allowance: Option<(f64, f64)>,
    /// The assignment the data plane holds (the last sent).
    holds: Option<Assignment>,
    /// The same of the assignment sent at the window's reset since, and when it was sent.
    pushed: Option<(f64, f64, u64)>,
    /// When the stream sends the bucket a new assignment unasked (its window resets before
    /// its next report).
    push_at: Option<u64>,
}

impl Bucket {
    /// Of `allowed` requests let through (and `refused` refused) between the bucket's last
    /// report and `now`, those let through before its fixed window last reset: that window
    /// is over, and they are not charged to the new one.
    fn let_through_before_reset(&self, allowed: u64, refused: u64, now: u64) -> u64 {
        let Some((limit, resets_at)) = &self.window else {
            return 0;
        };
        if limit.algorithm != Algorithm::FixedWindow || now <= self.reported_at {
            return 0;
        }
        // The resets are `resets_at` give or take whole windows: the last one up to now.
        let window = i128::from(limit.window_micros().max(1));
        let (now, since) = (i128::from(now), i128::from(self.reported_at));
        let last_reset = now - (now - i128::from(*resets_at)).rem_euclid(window);
        if last_reset <= since {
            return 0;
        }
        let before = (last_reset - since) as f64 / (now - since) as f64;
        let even = (allowed as f64 * before).round();
        // Within what each side's assignment could let through. A data plane that refused
        // requests took all it was given, on both sides: the split is what each allowed,
        // a bucket that replaced a drained one starting drained. Otherwise the requests are
        // taken to have come evenly, within what each side allowed.
        let saturated = refused > 0;
        let most = self.allowance.map_or(f64::INFINITY, |(burst, rate)| {
            (burst + rate * (last_reset - since) as f64 / 1e6).floor()
        });
        if saturated && most.is_finite() {
            return (most as u64).min(allowed);
        }
        // After the reset: the old assignment until the new one arrived, then the new one.
        let old_rate = self.allowance.map_or(0.0, |(_, rate)| rate);
        let after_most = self.pushed.map_or(f64::INFINITY, |(burst, rate, at)| {
            let at = i128::from(at);
            let old = old_rate * (at - last_reset).max(0) as f64 / 1e6;
            old + burst + rate * (now - at).max(0) as f64 / 1e6
        });
        let least = (allowed as f64 - after_most.ceil()).max(0.0);
        even.min(most).max(least).min(allowed as f64) as u64
    }
}

/// What a report's bucket is charged, besides its usage: the interval it covers, and the
/// demand to add.
struct Charge {
    interval: Duration,
    demand: DemandReport,
    /// Requests the data plane refused since its last report.
    refused: u64,
}

/// What one report gets back: the actions for its buckets, in its order (none: no message),
/// then, when the report is refused in whole or in part, the status that ends the stream.
#[derive(Default)]
struct Reply {
    actions: Vec<BucketAction>,
    refusal: Option<(Refusal, Status)>,
}

impl Reply {
    /// A report whose domain is missing or wrong: no action, INVALID_ARGUMENT.
    fn forbidden(status: Status) -> Self {
        Reply {
            actions: Vec::new(),
            refusal: Some((Refusal::Forbidden, status)),
        }
    }
}

/// How a report's bucket is answered.
enum Verdict {
    /// Charged on `descriptor` (its entries in rule order), then assigned what is left.
    Charge {
        key: BucketKey,
        descriptor: Vec<(String, String)>,
    },
    /// Its rule went away since it last matched.
    Abandon(BucketKey),
    /// No rule matches it: no assignment.
    Unmatched(BucketKey),
    /// It cannot be a descriptor, for this reason: no entries, an empty or oversized one.
    Invalid(String),
}

/// What woke a stream up.
enum Event {
    Report(Option<Result<RateLimitQuotaUsageReports, Status>>),
    Reset,
}

impl QuotaStream {
    /// Answers each report in turn, and sends buckets whose window reset their new
    /// assignment, until the data plane ends the stream, breaks a rule of the protocol, or
    /// the server stops.
    async fn run(
        mut self,
        mut reports: impl Stream<Item = Result<RateLimitQuotaUsageReports, Status>> + Unpin,
        answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
        mut stopped: watch::Receiver<bool>,
    ) {
        // The status that ends the stream, if floodgate ends it.
        let ending = loop {
            let push_at = self.buckets.values().filter_map(|b| b.push_at).min();
            let event = tokio::select! {
                report = reports.next() => Event::Report(report),
                () = stopping(&mut stopped) => {
                    break Some(Status::unavailable("floodgate is shutting down: report to another replica"));
                }
                () = sleep_until(self.clock.as_ref(), push_at) => Event::Reset,
            };
            let reply = match event {
                Event::Report(Some(Ok(report))) => self.traced_answer(report).await,
                Event::Report(Some(Err(status))) => match undecodable(&status) {
                    Some(why) => Reply::forbidden(Status::invalid_argument(why)),
                    // The data plane ended the stream, or its connection broke.
                    None => break None,
                },
                Event::Report(None) => break None,
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
        let verdicts: Vec<Verdict> = (usages.iter())
            .map(|usage| match bucket_key(usage, limits) {
                Ok(key) => self.verdict(&rules, &domain, key),
                Err(why) => Verdict::Invalid(why),
            })
            .collect();
        let mut plans = Vec::new();
        let charges: Vec<BucketUsage<'_>> = (verdicts.iter().zip(&usages))
            .filter_map(|(verdict, usage)| match verdict {
                Verdict::Charge { key, descriptor } => {
                    let (charge, usage) = self.usage(key, descriptor, usage, now);
                    plans.push(charge);
                    Some(usage)
                }
                _ => None,
            })
            .collect();
        let charged = self.limiter.charge_buckets(&rules, &domain, &charges).await;
        drop(charges);
        let mut charged = charged.into_iter().zip(plans);
        let mut reply = Reply::default();
        let mut invalid = Vec::new();
        for (index, (verdict, usage)) in verdicts.into_iter().zip(usages).enumerate() {
            let action = match verdict {
                Verdict::Charge { key, descriptor } => {
                    let missing = || {
                        let quota = BucketQuota::Failed {
                            error: BackendError::Protocol("uncharged".into()),
                            policy: OnBackendError::Error,
                        };
                        let demand = DemandReport { period: 0, rate: 0 };
                        (
                            quota,
                            Charge {
                                interval: REPORT_INTERVAL,
                                demand,
                                refused: 0,
                            },
                        )
                    };
                    let (quota, charge) = charged.next().unwrap_or_else(missing);
                    let id = usage.bucket_id.clone().unwrap_or_default();
                    self.assigned(key, descriptor, id, quota, charge, now)
                }
                Verdict::Abandon(key) => Some(self.abandoned(&key)),
                Verdict::Unmatched(key) => {
                    self.unmatched_bucket(&rules, &domain, &key);
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
        if !invalid.is_empty() {
            let refusal = Status::invalid_argument(listed(&invalid, "; "));
            reply.refusal = Some((Refusal::Forbidden, refusal));
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
        let mut due: Vec<(BucketKey, Vec<(String, String)>)> = Vec::new();
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
        let quotas = self.limiter.charge_buckets(&rules, &domain, &charges).await;
        drop(charges);
        let mut actions = Vec::new();
        for ((key, _), quota) in due.into_iter().zip(quotas) {
            let Some(bucket) = self.buckets.get_mut(&key) else {
                continue;
            };
            let Some(assignment) = assign::assign(&quota, bucket.interval, bucket.share) else {
                continue;
            };
            let next_report = bucket.reported_at + micros(REPORT_INTERVAL);
            bucket.follow(&quota, now, next_report);
            bucket.pushed = assignment
                .allowance()
                .map(|(burst, rate)| (burst, rate, now));
            bucket.holds = Some(assignment.clone());
            self.limiter.metrics().quota().pushed();
            actions.push(BucketAction {
                bucket_id: Some(bucket.id.clone()),
                bucket_action: Some(self.sent(assignment)),
            });
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
            self.unmatched.clear();
        }
    }

    /// How the bucket `key` is answered under `rules`: matched again only when the rules
    /// changed since it last matched, or it never did.
    fn verdict(&mut self, rules: &RuleSet, domain: &str, key: BucketKey) -> Verdict {
        if let Some(descriptor) = self.buckets.get(&key).and_then(|b| b.descriptor.clone()) {
            return Verdict::Charge { key, descriptor };
        }
        if self.unmatched.contains(&key) {
            return Verdict::Unmatched(key);
        }
        match bucket_descriptor(rules, domain, &key) {
            Some(descriptor) => Verdict::Charge { key, descriptor },
            None if self.buckets.contains_key(&key) => Verdict::Abandon(key),
            None => {
                if self.unmatched.len() < UNMATCHED_KEPT {
                    self.unmatched.insert(key.clone());
                }
                Verdict::Unmatched(key)
            }
        }
    }

    /// A bucket's report as it is charged: the requests let through in the window now
    /// running (the rest went to a window that reset since the bucket's last report), the
    /// interval the report covers (measured between this stream's reports of the bucket
    /// when it has one before), and the demand that makes.
    fn usage<'d>(
        &self,
        key: &BucketKey,
        descriptor: &'d [(String, String)],
        usage: &BucketQuotaUsage,
        now: u64,
    ) -> (Charge, BucketUsage<'d>) {
        let bucket = self.buckets.get(key);
        let measured = bucket.map(|b| Duration::from_micros(now.saturating_sub(b.reported_at)));
        let interval = assign::interval(measured, usage.time_elapsed.as_ref());
        let allowed = usage.num_requests_allowed;
        let refused = usage.num_requests_denied;
        let earlier = bucket.map_or(0, |b| b.let_through_before_reset(allowed, refused, now));
        let requests = allowed.saturating_add(usage.num_requests_denied);
        let rate = (requests as f64 * 1000.0 / interval.as_secs_f64()).min(u64::MAX as f64);
        let demand = DemandReport {
            period: now / micros(DEMAND_PERIOD),
            rate: rate as u64,
        };
        let charge = BucketUsage {
            entries: descriptor,
            allowed: allowed - earlier,
            earlier,
            refused,
            demand: Some(demand),
        };
        (
            Charge {
                interval,
                demand,
                refused,
            },
            charge,
        )
    }

    /// The assignment for a charged bucket, which the stream now holds; `None` leaves the
    /// data plane's assignment as it is (the backend could not count).
    fn assigned(
        &mut self,
        key: BucketKey,
        descriptor: Vec<(String, String)>,
        id: BucketId,
        quota: BucketQuota,
        charge: Charge,
        now: u64,
    ) -> Option<Action> {
        let previous = self.buckets.get(&key);
        let added = previous.and_then(|b| b.demand_added);
        let share = match &quota {
            BucketQuota::Counted {
                demand: Some(seen), ..
            } => share(charge.demand, added, *seen),
            _ => previous.map_or(1.0, |b| b.share),
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
        let held = previous.and_then(|b| b.holds.clone());
        let kept = (assignment.as_ref().zip(held.as_ref()))
            .is_some_and(|(new, held)| new.keeps_bucket_of(held));
        // A bucket kept, or replacing one, starts as full as it was: empty when requests
        // were refused.
        let replaces = held
            .as_ref()
            .is_some_and(|held| held.allowance().is_some_and(|(burst, _)| burst > 0.0));
        let drained = (kept || replaces) && charge.refused > 0;
        let allowance =
            (assignment.as_ref().and_then(Assignment::allowance)).map(|(burst, rate)| {
                if drained { (0.0, rate) } else { (burst, rate) }
            });
        let mut bucket = Bucket {
            id,
            descriptor: Some(descriptor),
            reported_at: now,
            interval: charge.interval,
            share,
            demand_added: Some(demand_added),
            window: None,
            allowance,
            holds: assignment.clone().or(held),
            pushed: None,
            push_at: None,
        };
        bucket.follow(&quota, now, now + micros(REPORT_INTERVAL));
        if self.buckets.insert(key, bucket).is_none() {
            self.limiter.metrics().quota().buckets_changed(1);
        }
        Some(self.sent(assignment?))
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
        self.buckets.remove(key);
        let stats = self.limiter.metrics().quota();
        stats.buckets_changed(-1);
        stats.abandoned();
        Action::AbandonAction(AbandonAction {})
    }

    /// Counts a reported bucket no rule of `domain` matches, and logs the stream's first.
    fn unmatched_bucket(&mut self, rules: &RuleSet, domain: &str, key: &BucketKey) {
        let known = rules.domain(domain).is_some();
        self.limiter
            .metrics()
            .quota()
            .unmatched(known.then_some(domain));
        if !std::mem::replace(&mut self.unmatched_logged, true) {
            tracing::warn!(
                domain = %cut(domain),
                bucket = %describe(key),
                domain_has_rules = known,
                "an RLQS bucket matches no rule: floodgate sends it no assignment, so the data \
                 plane applies its own no_assignment_behavior (logged once a stream; \
                 floodgate_rlqs_unmatched_buckets_total counts them all)"
            );
        }
    }
}

impl Bucket {
    /// Follows the window of `quota`, assigned `now`: when it resets before `next_report`
    /// (and the reset changes what is left: a fixed window, or an exhausted limit), the
    /// stream sends the new window's assignment then.
    fn follow(&mut self, quota: &BucketQuota, now: u64, next_report: u64) {
        self.window = None;
        self.push_at = None;
        let BucketQuota::Counted {
            limit,
            remaining,
            reset_micros,
            ..
        } = quota
        else {
            return;
        };
        let resets_at = now.saturating_add(*reset_micros);
        let resetting = limit.algorithm == Algorithm::FixedWindow || *remaining == 0;
        if resetting && !assign::paced_alone(limit) && resets_at <= next_report {
            self.push_at = Some(resets_at + micros(AFTER_RESET));
        }
        self.window = Some((limit.clone(), resets_at));
    }
}

/// A stream's share of a bucket's demand: its rate now (`demand`) against its rate and the
/// others'. The others' are what the period it reports in holds (every stream's rate of the
/// period before) or, when more, what the next one holds so far (streams that reported
/// since, a newcomer among them), each without this stream's own (`added` before this
/// report, and this report's). All of it when nobody asked for anything.
fn share(demand: DemandReport, added: Option<DemandReport>, seen: DemandSeen) -> f64 {
    let own = |period: u64| {
        added
            .filter(|added| added.period == period)
            .map_or(0, |a| a.rate)
    };
    let in_period = seen.period.saturating_sub(own(demand.period));
    let own_next = own(demand.period + 1).saturating_add(demand.rate);
    let in_next = seen.next.saturating_sub(own_next);
    let total = in_period.max(in_next).saturating_add(demand.rate);
    if total == 0 {
        1.0
    } else {
        demand.rate as f64 / total as f64
    }
}

/// Why a report read from the stream is refused, when the transport's error says it does
/// not decode (too large, or not a report), rather than that the data plane went away.
fn undecodable(status: &Status) -> Option<String> {
    let transport = std::error::Error::source(status).is_some();
    match status.code() {
        GrpcCode::OutOfRange | GrpcCode::ResourceExhausted => Some(format!(
            "the report is too large to read: {}",
            cut_message(status.message())
        )),
        // The codec's own refusal (`service::codec`), or one it let through.
        GrpcCode::InvalidArgument | GrpcCode::Internal if !transport => {
            let why = status.message();
            let why = why
                .strip_prefix("the message does not decode: ")
                .unwrap_or(why);
            Some(format!(
                "the report does not decode as RateLimitQuotaUsageReports: {}",
                cut_message(why)
            ))
        }
        _ => None,
    }
}

/// A transport's message cut to a few hundred characters.
fn cut_message(message: &str) -> String {
    message.chars().take(300).collect()
}

/// `duration` in microseconds.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
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

/// Buckets a refusal names; the others are counted. A status message travels in a header,
/// which clients cap (16 KiB is common): a refusal stays a few hundred bytes.
const BUCKETS_NAMED: usize = 3;
/// Entries of a bucket a refusal quotes.
const ENTRIES_QUOTED: usize = 4;
/// Characters of a name or value a refusal quotes.
const CHARS_QUOTED: usize = 64;

/// The first [`BUCKETS_NAMED`] of `items`, joined by `separator`, and how many more.
fn listed(items: &[String], separator: &str) -> String {
    let named = &items[..items.len().min(BUCKETS_NAMED)];
    match items.len() - named.len() {
        0 => named.join(separator),
        more => format!("{} and {more} more", named.join(separator)),
    }
}

/// A bucket's entries as a refusal quotes them: `{name=value, …}`, long values cut.
fn describe(key: &BucketKey) -> String {
    let mut entries: Vec<String> = (key.iter().take(ENTRIES_QUOTED))
        .map(|(name, value)| format!("{}={}", cut(name), cut(value)))
        .collect();
    if key.len() > ENTRIES_QUOTED {
        entries.push(format!("{} more entries", key.len() - ENTRIES_QUOTED));
    }
    format!("{{{}}}", entries.join(", "))
}

/// `text` cut as [`cut`] cuts it, quoted and escaped as Rust writes a string.
fn quoted(text: &str) -> String {
    format!("{:?}", cut(text))
}

/// `text` up to [`CHARS_QUOTED`] characters, and an ellipsis where it went on.
fn cut(text: &str) -> String {
    let mut kept: String = text.chars().take(CHARS_QUOTED).collect();
    if kept.len() < text.len() {
        kept.push('…');
    }
    kept
}

/// Resolves once `stopped` turns true (or its sender is gone).
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// A usage's bucket as the server keys it: its entries, which must be a descriptor's
/// (`request_limits`: not too many, no name or value empty or too long); why it cannot be.
fn bucket_key(usage: &BucketQuotaUsage, limits: &RequestLimits) -> Result<BucketKey, String> {
    let Some(BucketId { bucket }) = &usage.bucket_id else {
        return Err("no bucket_id".into());
    };
    if bucket.is_empty() {
        return Err("a bucket_id with no entries".into());
    }
    if bucket.len() > limits.max_entries {
        return Err(format!(
            "a bucket_id of {} entries; at most {} are allowed",
            bucket.len(),
            limits.max_entries
        ));
    }
    for (name, value) in bucket {
        if name.is_empty() || value.is_empty() {
            return Err("a bucket_id entry with an empty name or value".into());
        }
        if name.len() > limits.max_key_bytes {
            return Err(format!(
                "a bucket_id entry name of {} bytes; at most {} are allowed",
                name.len(),
                limits.max_key_bytes
            ));
        }
        if value.len() > limits.max_value_bytes {
            return Err(format!(
                "the value of bucket_id entry {} is {} bytes; at most {} are allowed",
                quoted(name),
                value.len(),
                limits.max_value_bytes
            ));
        }
    }
    let mut key: BucketKey = (bucket.iter())
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    key.sort();
    Ok(key)
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
