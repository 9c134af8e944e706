//! RLQS' gRPC adapter: a `StreamRateLimitQuotas` call becomes one quota stream (`quota/`).
//! What the stream reads is told apart here, where the wire is known: a report; a message
//! that does not decode (too large, or not a report), which the stream refuses; a call cut
//! to make room for others (`grpc_body.rs`), which the data plane may open again at once;
//! or the data plane gone (the stream's end).

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use tonic::{Code, Request, Response, Status, Streaming};

use super::grpc_body;
use crate::proto::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::quota::{Incoming, Outgoing, QuotaService};

pub use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;

/// The Rate Limit Quota Service on the gRPC port.
#[derive(Clone)]
pub struct QuotaGrpc {
    quota: QuotaService,
}

impl QuotaGrpc {
    pub fn new(quota: QuotaService) -> Self {
        QuotaGrpc { quota }
    }
}

type Answers = Pin<Box<dyn Stream<Item = Outgoing> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaGrpc {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let headers = request.metadata().clone().into_headers();
        // A failed read the stream cannot go on after (the connection broke) ends it.
        let incoming = (request.into_inner()).scan((), |(), read| {
            let read = read.map_or_else(|status| ended_by(&status), |r| Some(Incoming::Report(r)));
            std::future::ready(read)
        });
        let receiver = self.quota.serve(headers, Box::pin(incoming));
        let answers = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|answer| (answer, receiver))
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// What a failed read says to the stream: cut to make room, a message that does not decode,
/// or (`None`) the data plane gone.
fn ended_by(status: &Status) -> Option<Incoming> {
    if grpc_body::is_cut(status) {
        return Some(Incoming::Cut(status.clone()));
    }
    undecodable(status).map(Incoming::Undecodable)
}

/// Why a report read from the stream is refused, when the transport's error says it does
/// not decode (too large, or not a report), rather than that the data plane went away.
fn undecodable(status: &Status) -> Option<String> {
    let transport = std::error::Error::source(status).is_some();
    match status.code() {
        Code::OutOfRange | Code::ResourceExhausted => Some(format!(
            "the report is too large to read: {}",
            cut_message(status.message())
        )),
        // The codec's own refusal (`codec.rs`), or one it let through.
        Code::InvalidArgument | Code::Internal if !transport => {
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
