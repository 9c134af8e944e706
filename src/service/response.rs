//! Combines the counters' decisions into the response: one status per descriptor in request
//! order, the overall code after shadow and quota mode, headers and dynamic metadata.

use crate::limiter::{Decision, Limit, SECOND_MICROS, Unit};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as WireUnit;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::outcome::Outcome;
use super::{Resolution, ServiceOptions, headers, metadata};

/// The response, and whether global shadow mode turned it OK.
pub(super) struct Combined {
    pub response: RateLimitResponse,
    /// Over limit, but answered OK because of global shadow mode.
    pub shadowed: bool,
}

pub(super) fn build<'r>(
    request: &RateLimitRequest,
    resolutions: &'r [Resolution<'r>],
    decisions: &[Decision],
    options: &ServiceOptions,
) -> Combined {
    let mut remaining_decisions = decisions;
    let outcomes: Vec<Outcome<'r>> = resolutions
        .iter()
        .map(|resolution| {
            let counted = match resolution {
                Resolution::Counted { limits, .. } => limits.len(),
                _ => 0,
            };
            let (mine, rest) = remaining_decisions.split_at(counted);
            remaining_decisions = rest;
            outcome(resolution, mine, options)
        })
        .collect();

    let enforced_over = outcomes
        .iter()
        .any(|o| o.over_limit && !o.shadow && !o.quota);
    // Quota mode (as envoyproxy/ratelimit): quota descriptors are soft limits that reject only
    // when every quota descriptor of the request is over its limit.
    let quota: Vec<&Outcome> = outcomes.iter().filter(|o| o.quota && !o.shadow).collect();
    let quota_exhausted = !quota.is_empty() && quota.iter().all(|o| o.over_limit);
    let over_before_shadow = enforced_over || quota_exhausted;
    let over = over_before_shadow && !options.shadow_mode;
    let overall_code = if over { Code::OverLimit } else { Code::Ok };

    let response = RateLimitResponse {
        overall_code: overall_code as i32,
        response_headers_to_add: headers::build(&outcomes, over, options),
        dynamic_metadata: options
            .dynamic_metadata
            .then(|| metadata::build(request, &outcomes)),
        statuses: outcomes.into_iter().map(|o| o.status).collect(),
        ..Default::default()
    };
    Combined {
        response,
        shadowed: over_before_shadow && options.shadow_mode,
    }
}

/// The decision a descriptor reports among its limits': the first one over, else the one
/// with the least remaining.
pub(super) fn most_restrictive(decisions: &[Decision]) -> Option<(usize, Decision)> {
    decisions
        .iter()
        .enumerate()
        .min_by_key(|(_, d)| (d.allowed, d.remaining))
        .map(|(i, d)| (i, *d))
}

fn outcome<'r>(
    resolution: &'r Resolution<'r>,
    decisions: &[Decision],
    options: &ServiceOptions,
) -> Outcome<'r> {
    let (rule, limits) = match resolution {
        Resolution::Pass => return uncounted(None, 0),
        Resolution::Unlimited { rule } => return uncounted(Some(rule), u32::MAX),
        Resolution::Counted { rule, limits, .. } => (*rule, limits),
    };
    let Some((index, decision)) = most_restrictive(decisions) else {
        return uncounted(rule, 0);
    };
    let (name, limit) = &limits[index];
    let over_limit = decisions.iter().any(|d| !d.allowed);
    let shadow = rule.is_some_and(|r| r.shadow_mode);
    let code = if over_limit && !shadow {
        Code::OverLimit
    } else {
        Code::Ok
    };
    Outcome {
        status: DescriptorStatus {
            code: code as i32,
            current_limit: Some(wire_limit(*name, limit)),
            limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration(decision.reset_micros)),
            quota: None,
        },
        over_limit,
        shadow,
        quota: options.quota_mode || rule.is_some_and(|r| r.quota_mode),
        reported: Some((*name, limit.as_ref(), decision)),
        rule,
    }
}

/// OK with no `current_limit`: unmatched, replaced, unknown domain, or unlimited.
fn uncounted(rule: Option<&crate::rules::Rule>, remaining: u32) -> Outcome<'_> {
    Outcome {
        status: DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: remaining,
            ..Default::default()
        },
        over_limit: false,
        shadow: false,
        quota: false,
        reported: None,
        rule,
    }
}

/// The limit as Envoy sees it; `unit_multiplier` whenever the window is not one unit, so
/// Envoy's own headers show the real window.
fn wire_limit(name: Option<&str>, limit: &Limit) -> RateLimit {
    RateLimit {
        name: name.unwrap_or_default().to_owned(),
        requests_per_unit: limit.requests_per_unit,
        unit: wire_unit(limit.unit) as i32,
        unit_multiplier: (limit.unit_multiplier != 1).then_some(pbjson_types::UInt32Value {
            value: limit.unit_multiplier,
        }),
    }
}

fn wire_unit(unit: Unit) -> WireUnit {
    match unit {
        Unit::Second => WireUnit::Second,
        Unit::Minute => WireUnit::Minute,
        Unit::Hour => WireUnit::Hour,
        Unit::Day => WireUnit::Day,
        Unit::Week => WireUnit::Week,
        Unit::Month => WireUnit::Month,
        Unit::Year => WireUnit::Year,
    }
}

fn duration(micros: u64) -> pbjson_types::Duration {
    pbjson_types::Duration {
        seconds: i64::try_from(micros / SECOND_MICROS).unwrap_or(i64::MAX),
        // Below 10^9 by construction.
        nanos: ((micros % SECOND_MICROS) * 1_000) as i32,
    }
}
