//! Feeds one request's outcome into the rule statistics: per descriptor that matched a rule
//! or carried an override, its hits and how its reported limit judged them.

use crate::backend::AnsweredBy;
use crate::limiter::Decision;
use crate::metrics::Metrics;
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::rules::Judged;

use super::{Resolution, request, response};

/// `decisions` and `origins` hold one entry per counted limit, in resolution order, as
/// `response::build` reads them. Give-backs (`is_negative_hits`) are not hits and count
/// nowhere; unmatched and replaced descriptors have no rule to count in.
pub(super) fn record(
    metrics: &Metrics,
    request: &RateLimitRequest,
    resolutions: &[Resolution<'_>],
    decisions: &[Decision],
    origins: &[AnsweredBy],
) {
    let mut offset = 0;
    for (descriptor, resolution) in request.descriptors.iter().zip(resolutions) {
        let hits = request::hits(request, descriptor);
        let (rule, judged) = match resolution {
            Resolution::Pass => continue,
            Resolution::Unlimited { rule } => (Some(*rule), Judged::Unlimited),
            Resolution::Counted { rule, limits, .. } => {
                let first = offset;
                offset += limits.len();
                let Some((index, decision)) = response::most_restrictive(&decisions[first..offset])
                else {
                    continue;
                };
                let shadow = rule.is_some_and(|rule| rule.shadow_mode);
                let judged = match origins.get(first + index) {
                    Some(AnsweredBy::OverLimitCache) => Judged::FromCache { shadow },
                    Some(AnsweredBy::NotConsulted) | None => Judged::Undecided,
                    Some(AnsweredBy::Store) => Judged::Counted {
                        decision,
                        capacity: limits[index].1.capacity(),
                        shadow,
                    },
                };
                (*rule, judged)
            }
        };
        if hits.negative {
            continue;
        }
        metrics.record_rule(
            &request.domain,
            rule,
            &descriptor.entries,
            hits.amount,
            judged,
        );
    }
}
