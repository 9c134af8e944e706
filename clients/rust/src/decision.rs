//! The answer to a rate-limit call, in plain types rather than the wire's codes and wrappers.

use std::time::Duration;

use crate::proto::envoy::service::ratelimit::v3::RateLimitResponse;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as WireUnit;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus as WireStatus, RateLimit,
};

/// What a call decides when the server cannot answer: `UNAVAILABLE` (after the retries that
/// are allowed), a transport failure, or the deadline passing. Never for any other error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailureMode {
    /// Allow: an outage of the rate limiter does not become an outage of the service.
    /// Envoy's default (`failure_mode_deny: false`) too.
    #[default]
    Open,
    /// Reject: for limits that protect something that must not be overrun.
    Closed,
}

/// Whether a request may go ahead, and the quota behind that answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// `false` when any descriptor is over its limit. The server's `UNKNOWN` code counts as
    /// allowed, as it does for Envoy.
    pub allowed: bool,
    /// One status per descriptor sent, in the same order.
    pub statuses: Vec<DescriptorStatus>,
    /// Headers the server asks to add to the response (`RateLimit-Policy`, `RateLimit`,
    /// `X-RateLimit-*`, `Retry-After`), as configured by its `response_headers` setting.
    pub headers: Vec<(String, String)>,
    /// `true` when the server could not answer and the client's [`FailureMode`] decided:
    /// the statuses then carry no limit and no quota.
    pub degraded: bool,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// `false` when this descriptor is over its limit.
    pub allowed: bool,
    /// The limit that decided; `None` when no rule matched, when the descriptor's rule is
    /// replaced or whitelisted, and in a degraded decision.
    pub limit: Option<Limit>,
    /// Quota left after this call.
    pub remaining: u32,
    /// Time until quota comes back; when exhausted, when one more request would pass.
    pub reset: Duration,
}

/// A limit as the server reports it: `requests_per_unit` per `unit_multiplier` × `unit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The rule's `name`, when it has one.
    pub name: Option<String>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// The window's length in units; 1 unless the rule sets `unit_multiplier`.
    pub unit_multiplier: u32,
}

/// The unit of a limit's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// The server sent no unit, or one this client does not know.
    Unknown,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Decision {
    pub(crate) fn from_wire(response: RateLimitResponse) -> Self {
        Decision {
            allowed: response.overall_code() != Code::OverLimit,
            statuses: response.statuses.into_iter().map(status).collect(),
            headers: response
                .response_headers_to_add
                .into_iter()
                .map(|header| {
                    let value = if header.value.is_empty() {
                        String::from_utf8_lossy(&header.raw_value).into_owned()
                    } else {
                        header.value
                    };
                    (header.key, value)
                })
                .collect(),
            degraded: false,
        }
    }

    /// The decision `mode` makes for `descriptors` descriptors when the server can't answer.
    pub(crate) fn from_failure(mode: FailureMode, descriptors: usize) -> Self {
        let allowed = mode == FailureMode::Open;
        let status = DescriptorStatus {
            allowed,
            limit: None,
            remaining: 0,
            reset: Duration::ZERO,
        };
        Decision {
            allowed,
            statuses: vec![status; descriptors],
            headers: Vec::new(),
            degraded: true,
        }
    }
}

fn status(wire: WireStatus) -> DescriptorStatus {
    DescriptorStatus {
        allowed: wire.code() != Code::OverLimit,
        limit: wire.current_limit.map(limit),
        remaining: wire.limit_remaining,
        reset: wire
            .duration_until_reset
            .and_then(|duration| Duration::try_from(duration).ok())
            .unwrap_or_default(),
    }
}

fn limit(wire: RateLimit) -> Limit {
    Limit {
        unit: unit(wire.unit()),
        requests_per_unit: wire.requests_per_unit,
        unit_multiplier: wire.unit_multiplier.unwrap_or(1),
        name: Some(wire.name).filter(|name| !name.is_empty()),
    }
}

fn unit(wire: WireUnit) -> Unit {
    match wire {
        WireUnit::Unknown => Unit::Unknown,
        WireUnit::Second => Unit::Second,
        WireUnit::Minute => Unit::Minute,
        WireUnit::Hour => Unit::Hour,
        WireUnit::Day => Unit::Day,
        WireUnit::Week => Unit::Week,
        WireUnit::Month => Unit::Month,
        WireUnit::Year => Unit::Year,
    }
}
