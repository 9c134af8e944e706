//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): a data plane
//! reports each bucket's usage every few seconds over one stream, and enforces the
//! assignment the server sends back, with no call per request.
//!
//! A stream's first message names the domain. Each reported bucket is matched to a rule of
//! that domain (its entries, which have no order, put in the order of a path of the rule
//! tree), its allowed requests are charged to the counters `ShouldRateLimit` uses, so both
//! kinds of client share one limit, and what is left becomes the bucket's assignment
//! (`assign.rs`). A bucket whose rule disappeared (a reload, an xDS update) is abandoned; a
//! report the protocol forbids ends the stream with INVALID_ARGUMENT; shutdown ends every
//! stream with UNAVAILABLE, so data planes reconnect to another replica.

pub mod assign;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
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
use crate::metrics::{Code, Strategy as Assigned};
use crate::service::RateLimiter;
use crate::service::quota::{BucketQuota, DEMAND_WINDOW};
use assign::{Assignment, Demand, FIRST_INTERVAL};

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
        self.limiter.metrics().quota().stream_opened();
        let stream = QuotaStream {
            limiter: self.limiter.clone(),
            headers: request.metadata().clone().into_headers(),
            domain: None,
            buckets: HashMap::new(),
        };
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
    /// Each bucket reported, with its entries in rule order once a rule matched them.
    buckets: HashMap<BucketKey, Option<Vec<(String, String)>>>,
}

impl QuotaStream {
    /// Answers each report in turn until the data plane ends the stream, breaks a rule of
    /// the protocol, or the server stops.
    async fn run(
        mut self,
        mut reports: Streaming<RateLimitQuotaUsageReports>,
        answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
        mut stopped: watch::Receiver<bool>,
    ) {
        loop {
            let report = tokio::select! {
                report = reports.message() => report,
                () = stopping(&mut stopped) => {
                    let leaving = Status::unavailable("floodgate is shutting down: report to another replica");
                    let _ = answers.send(Err(leaving)).await;
                    break;
                }
            };
            let answer = match report {
                Ok(Some(report)) => self.traced_answer(report).await,
                // The data plane ended the stream, or its connection broke.
                Ok(None) | Err(_) => break,
            };
            if matches!(&answer, Ok(response) if response.bucket_action.is_empty()) {
                // Nothing to change (the backend could not count): no message.
                continue;
            }
            let refused = answer.is_err();
            if refused {
                self.limiter.metrics().quota().refused();
            }
            // A refusal ends the stream; so does a data plane that is gone.
            if answers.send(answer).await.is_err() || refused {
                break;
            }
        }
        (self.limiter.metrics().quota()).stream_closed(self.buckets.len());
    }

    /// [`QuotaStream::answer`], traced as a span `floodgate.rlqs.report` when tracing is
    /// on: the domain, the buckets reported, and whether the report was refused.
    async fn traced_answer(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
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
        let answer = self.answer(report).await;
        span.finish(match answer {
            Ok(_) => Code::Ok,
            Err(_) => Code::InvalidArgument,
        });
        answer
    }

    /// The actions for one report's buckets, in the report's order.
    async fn answer(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        let domain = match (&self.domain, report.domain.as_str()) {
            (None, "") => {
                return Err(Status::invalid_argument(
                    "the stream's first report names no domain",
                ));
            }
            (None, domain) => self.domain.insert(domain.to_owned()).clone(),
            (Some(known), "") => known.clone(),
            (Some(known), domain) if known == domain => known.clone(),
            (Some(known), domain) => {
                return Err(Status::invalid_argument(format!(
                    "the stream reports for domain {known:?}; {domain:?} needs a stream of its own"
                )));
            }
        };
        self.limiter.metrics().quota().report();
        let mut actions = Vec::with_capacity(report.bucket_quota_usages.len());
        for (index, usage) in report.bucket_quota_usages.into_iter().enumerate() {
            let key = bucket_key(&usage).map_err(|why| {
                Status::invalid_argument(format!("bucket_quota_usages[{index}]: {why}"))
            })?;
            if let Some(action) = self.bucket_action(&domain, key, usage).await {
                actions.push(action);
            }
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// Charges one bucket's usage and decides its action; `None` leaves the data plane's
    /// assignment as it is (the backend could not count).
    async fn bucket_action(
        &mut self,
        domain: &str,
        key: BucketKey,
        usage: BucketQuotaUsage,
    ) -> Option<BucketAction> {
        let bucket_id = usage.bucket_id.clone();
        let matched_before = self.buckets.get(&key).is_some_and(Option::is_some);
        let descriptor = self.limiter.bucket_descriptor(domain, &key);
        if descriptor.is_none() && matched_before {
            // Its rule is gone: the data plane forgets the bucket, and starts it anew
            // (unassigned) with its next request into it.
            self.buckets.remove(&key);
            let stats = self.limiter.metrics().quota();
            stats.buckets_changed(-1);
            stats.abandoned();
            return Some(BucketAction {
                bucket_id,
                bucket_action: Some(Action::AbandonAction(AbandonAction {})),
            });
        }
        let elapsed = (usage.time_elapsed.as_ref())
            .and_then(|elapsed| Duration::try_from(*elapsed).ok())
            .filter(|elapsed| !elapsed.is_zero());
        let interval = elapsed.unwrap_or(FIRST_INTERVAL);
        let requests = (usage.num_requests_allowed).saturating_add(usage.num_requests_denied);
        let quota = match &descriptor {
            Some(entries) => {
                (self.limiter)
                    .charge_bucket(domain, entries, usage.num_requests_allowed, requests)
                    .await
            }
            None => BucketQuota::NoRule,
        };
        let demand = match &quota {
            BucketQuota::Counted { demand, .. } => Demand {
                this: requests as f64 / interval.as_secs_f64(),
                total: *demand as f64 / DEMAND_WINDOW.as_secs_f64(),
            },
            _ => Demand::default(),
        };
        if self.buckets.insert(key, descriptor).is_none() {
            self.limiter.metrics().quota().buckets_changed(1);
        }
        let assignment = assign::assign(&quota, interval, demand)?;
        (self.limiter.metrics().quota()).assigned(match assignment {
            Assignment::TokenBucket { .. } => Assigned::TokenBucket,
            Assignment::DenyAll { .. } => Assigned::DenyAll,
            Assignment::AllowAll { .. } => Assigned::AllowAll,
        });
        Some(BucketAction {
            bucket_id,
            bucket_action: Some(Action::QuotaAssignmentAction(assignment_action(assignment))),
        })
    }
}

/// Resolves once `stopped` turns true (or its sender is gone).
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// A usage's bucket as the server keys it; why it cannot be one.
fn bucket_key(usage: &BucketQuotaUsage) -> Result<BucketKey, &'static str> {
    let Some(BucketId { bucket }) = &usage.bucket_id else {
        return Err("no bucket_id");
    };
    if bucket.is_empty() {
        return Err("a bucket_id with no entries");
    }
    if bucket
        .iter()
        .any(|(key, value)| key.is_empty() || value.is_empty())
    {
        return Err("a bucket_id entry with an empty name or value");
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
