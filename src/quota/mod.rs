//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): a data plane
//! reports each bucket's usage every few seconds over one stream, and enforces the
//! assignment the server sends back, with no call per request.
//!
//! A stream's first message names the domain. Each reported bucket is matched to a rule of
//! that domain (its entries, which have no order, put in the order of a path of the rule
//! tree), its allowed requests are charged to the counters `ShouldRateLimit` uses, so both
//! kinds of client share one limit, and what is left becomes the bucket's assignment
//! (`assign.rs`). A bucket whose rule disappeared (a reload, an xDS update) is abandoned. A
//! report with no domain, or another stream's, ends the stream with INVALID_ARGUMENT and
//! charges nothing. A bucket that cannot be a descriptor ends it with INVALID_ARGUMENT, and
//! one no rule matches with NOT_FOUND, once the report's other buckets are answered (the
//! data plane keeps their assignments, and reports again on a new stream). Shutdown ends
//! every stream with UNAVAILABLE, so data planes reconnect to another replica.

pub mod assign;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

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
use crate::metrics::{Code, Refusal, Strategy as Assigned};
use crate::rules::{OnBackendError, RuleSet};
use crate::service::RateLimiter;
use crate::settings::RequestLimits;
use crate::service::quota::{BucketQuota, BucketUsage, DEMAND_WINDOW, bucket_descriptor};
use assign::{Assignment, Demand};

pub use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// The name of a report's span.
const REPORT_SPAN: &str = "floodgate.rlqs.report";

/// A bucket as the server keys it: its entries, sorted.
type BucketKey = Vec<(String, String)>;

/// The Rate Limit Quota Service over `limiter`'s rules and counters.
#[derive(Clone)]
pub struct QuotaService {
    limiter: Arc<RateLimiter>,
    stopped: watch::Receiver<bool>,
}

impl QuotaService {
    /// The service; its streams end when `stopped` turns true.
    pub fn new(limiter: Arc<RateLimiter>, stopped: watch::Receiver<bool>) -> Self {
        QuotaService { limiter, stopped }
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
            headers,
            domain: None,
            buckets: HashMap::new(),
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

/// One data plane's stream: its domain, and the descriptor each of its buckets matched.
struct QuotaStream {
    limiter: Arc<RateLimiter>,
    /// The stream's request headers: each report's span continues the trace they carry.
    headers: http::HeaderMap,
    domain: Option<String>,
    /// Each bucket that matched a rule, with its entries in that rule's order (the
    /// descriptor it is charged on), or `None` once the rules changed: then it is matched
    /// again at its next report.
    buckets: HashMap<BucketKey, Option<Vec<(String, String)>>>,
    /// The rules the descriptors in `buckets` were found under.
    matched_under: Weak<RuleSet>,
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
    /// No rule matches it, nor ever did on this stream.
    Unmatched(BucketKey),
    /// It cannot be a descriptor, for this reason: no entries, an empty or oversized one.
    Invalid(String),
}

impl QuotaStream {
    /// Answers each report in turn until the data plane ends the stream, breaks a rule of
    /// the protocol, reports a bucket no rule matches, or the server stops.
    async fn run(
        mut self,
        mut reports: impl Stream<Item = Result<RateLimitQuotaUsageReports, Status>> + Unpin,
        answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
        mut stopped: watch::Receiver<bool>,
    ) {
        // The status that ends the stream, if floodgate ends it.
        let ending = loop {
            let report = tokio::select! {
                report = reports.next() => report,
                () = stopping(&mut stopped) => {
                    break Some(Status::unavailable("floodgate is shutting down: report to another replica"));
                }
            };
            let reply = match report {
                Some(Ok(report)) => self.traced_answer(report).await,
                // The data plane ended the stream, or its connection broke.
                None | Some(Err(_)) => break None,
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
    /// before a bucket that cannot be a descriptor, or that no rule matches, ends the stream.
    async fn answer(&mut self, report: RateLimitQuotaUsageReports) -> Reply {
        let domain = match self.report_domain(&report.domain) {
            Ok(domain) => domain,
            Err(refusal) => return Reply::forbidden(refusal),
        };
        self.limiter.metrics().quota().report();
        let rules = self.limiter.rules();
        self.match_under(&rules);
        let usages = report.bucket_quota_usages;
        let limits = self.limiter.request_limits();
        let verdicts: Vec<Verdict> = (usages.iter())
            .map(|usage| match bucket_key(usage, limits) {
                Ok(key) => self.verdict(&rules, &domain, key),
                Err(why) => Verdict::Invalid(why),
            })
            .collect();
        let charged = self.charge(&rules, &domain, &verdicts, &usages).await;
        let mut charged = charged.into_iter();
        let mut reply = Reply::default();
        let (mut invalid, mut unmatched) = (Vec::new(), Vec::new());
        for (index, (verdict, usage)) in verdicts.into_iter().zip(usages).enumerate() {
            let action = match verdict {
                Verdict::Charge { key, descriptor } => {
                    let missing = || BucketQuota::Failed {
                        error: BackendError::Protocol("uncharged".into()),
                        policy: OnBackendError::Error,
                    };
                    let quota = charged.next().unwrap_or_else(missing);
                    self.assigned(key, descriptor, &usage, quota)
                }
                Verdict::Abandon(key) => Some(self.abandoned(&key)),
                Verdict::Unmatched(key) => {
                    unmatched.push(format!("bucket_quota_usages[{index}] {}", describe(&key)));
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
        reply.refusal = if !invalid.is_empty() {
            let refusal = Status::invalid_argument(listed(&invalid, "; "));
            Some((Refusal::Forbidden, refusal))
        } else if !unmatched.is_empty() {
            let known = rules.domain(&domain).is_some();
            let refusal = unmatched_refusal(&domain, known, &unmatched);
            Some((Refusal::Unmatched, refusal))
        } else {
            None
        };
        reply
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
            (self.buckets.values_mut()).for_each(|descriptor| *descriptor = None);
        }
    }

    /// How the bucket `key` is answered under `rules`: matched again only when the rules
    /// changed since it last matched, or it never did.
    fn verdict(&self, rules: &RuleSet, domain: &str, key: BucketKey) -> Verdict {
        if let Some(Some(descriptor)) = self.buckets.get(&key) {
            let descriptor = descriptor.clone();
            return Verdict::Charge { key, descriptor };
        }
        match bucket_descriptor(rules, domain, &key) {
            Some(descriptor) => Verdict::Charge { key, descriptor },
            None if self.buckets.contains_key(&key) => Verdict::Abandon(key),
            None => Verdict::Unmatched(key),
        }
    }

    /// Charges the usage of the buckets to charge, in one batch; what is left of each, in
    /// their order.
    async fn charge(
        &self,
        rules: &RuleSet,
        domain: &str,
        verdicts: &[Verdict],
        usages: &[BucketQuotaUsage],
    ) -> Vec<BucketQuota> {
        let charges: Vec<BucketUsage<'_>> = (verdicts.iter().zip(usages))
            .filter_map(|(verdict, usage)| match verdict {
                Verdict::Charge { descriptor, .. } => Some(BucketUsage {
                    entries: descriptor,
                    allowed: usage.num_requests_allowed,
                    requests: (usage.num_requests_allowed)
                        .saturating_add(usage.num_requests_denied),
                }),
                _ => None,
            })
            .collect();
        self.limiter.charge_buckets(rules, domain, &charges).await
    }

    /// The assignment for a charged bucket, which the stream now holds; `None` leaves the
    /// data plane's assignment as it is (the backend could not count).
    fn assigned(
        &mut self,
        key: BucketKey,
        descriptor: Vec<(String, String)>,
        usage: &BucketQuotaUsage,
        quota: BucketQuota,
    ) -> Option<Action> {
        let interval = assign::interval(usage.time_elapsed.as_ref());
        let requests = (usage.num_requests_allowed).saturating_add(usage.num_requests_denied);
        let demand = match &quota {
            BucketQuota::Counted { demand, .. } => Demand {
                this: requests as f64 / interval.as_secs_f64(),
                total: *demand as f64 / DEMAND_WINDOW.as_secs_f64(),
            },
            _ => Demand::default(),
        };
        if self.buckets.insert(key, Some(descriptor)).is_none() {
            self.limiter.metrics().quota().buckets_changed(1);
        }
        let assignment = assign::assign(&quota, interval, demand)?;
        (self.limiter.metrics().quota()).assigned(match assignment {
            Assignment::TokenBucket { .. } => Assigned::TokenBucket,
            Assignment::DenyAll { .. } => Assigned::DenyAll,
            Assignment::AllowAll { .. } => Assigned::AllowAll,
        });
        Some(Action::QuotaAssignmentAction(assignment_action(assignment)))
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
}

/// Buckets a refusal names; the others are counted. A status message travels in a header,
/// which clients cap (16 KiB is common): a refusal stays a few hundred bytes.
const BUCKETS_NAMED: usize = 3;
/// Entries of a bucket a refusal quotes.
const ENTRIES_QUOTED: usize = 4;
/// Characters of a name or value a refusal quotes.
const CHARS_QUOTED: usize = 64;

/// NOT_FOUND for a report's buckets no rule of `domain` matches (`unmatched`, each named
/// with its index): they stay with the data plane's own `no_assignment_behavior`, and the
/// data plane sees why when the stream ends (it reports again on a new stream, so new
/// rules are found then).
fn unmatched_refusal(domain: &str, known: bool, unmatched: &[String]) -> Status {
    if !known {
        return Status::not_found(format!(
            "domain {} has no rules here: none of its buckets is limited",
            quoted(domain)
        ));
    }
    Status::not_found(format!(
        "no rule of domain {} matches {}",
        quoted(domain),
        listed(unmatched, ", ")
    ))
}

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
