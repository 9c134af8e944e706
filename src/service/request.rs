//! Checks a request before any rule or counter sees it. Every rejection is a gRPC
//! INVALID_ARGUMENT whose message says what is wrong and where.

use crate::limiter::{Hits, Limit, MAX_SPAN_MICROS, Unit};
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use crate::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::settings::RequestLimits;

/// What is wrong with a request; the text goes back to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// Rejects empty domains, domains longer than a value may be, empty or oversized descriptor lists, empty keys, oversized keys and
/// values, and malformed limit overrides.
pub fn check(request: &RateLimitRequest, limits: &RequestLimits) -> Result<(), InvalidRequest> {
    let fail = |message: String| Err(InvalidRequest(message));
    if request.domain.is_empty() {
        return fail("rate limit domain must not be empty".into());
    }
    if request.domain.len() > limits.max_value_bytes {
        return fail(format!(
            "domain is {} bytes; at most {} are allowed (request_limits.max_value_bytes)",
            request.domain.len(),
            limits.max_value_bytes
        ));
    }
    if request.descriptors.is_empty() {
        return fail("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > limits.max_descriptors {
        return fail(format!(
            "request has {} descriptors; at most {} are allowed",
            request.descriptors.len(),
            limits.max_descriptors
        ));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        check_descriptor(index, descriptor, limits)?;
    }
    Ok(())
}

fn check_descriptor(
    index: usize,
    descriptor: &RateLimitDescriptor,
    limits: &RequestLimits,
) -> Result<(), InvalidRequest> {
    let fail = |message: String| Err(InvalidRequest(format!("descriptor {index}: {message}")));
    if descriptor.entries.is_empty() {
        return fail("has no entries".into());
    }
    if descriptor.entries.len() > limits.max_entries {
        return fail(format!(
            "has {} entries; at most {} are allowed",
            descriptor.entries.len(),
            limits.max_entries
        ));
    }
    for (position, entry) in descriptor.entries.iter().enumerate() {
        if entry.key.is_empty() {
            return fail(format!("entry {position} has an empty key"));
        }
        if entry.key.len() > limits.max_key_bytes {
            return fail(format!(
                "entry {position} key is {} bytes; at most {} are allowed",
                entry.key.len(),
                limits.max_key_bytes
            ));
        }
        if entry.value.len() > limits.max_value_bytes {
            return fail(format!(
                "entry {position} (key {:?}) value is {} bytes; at most {} are allowed",
                entry.key,
                entry.value.len(),
                limits.max_value_bytes
            ));
        }
    }
    if let Some(limit) = &descriptor.limit {
        override_limit(limit)
            .map_err(|message| InvalidRequest(format!("descriptor {index}: {message}")))?;
    }
    Ok(())
}

/// The limit a request-supplied override describes (always a fixed window, as in
/// envoyproxy/ratelimit).
pub fn override_limit(limit: &RateLimitOverride) -> Result<Limit, String> {
    let unit = match RateLimitUnit::try_from(limit.unit) {
        Ok(RateLimitUnit::Second) => Unit::Second,
        Ok(RateLimitUnit::Minute) => Unit::Minute,
        Ok(RateLimitUnit::Hour) => Unit::Hour,
        Ok(RateLimitUnit::Day) => Unit::Day,
        Ok(RateLimitUnit::Month) => Unit::Month,
        Ok(RateLimitUnit::Year) => Unit::Year,
        Ok(RateLimitUnit::Unknown) => return Err("limit override has unit UNKNOWN".into()),
        Err(_) => return Err(format!("limit override has unknown unit {}", limit.unit)),
    };
    let multiplier = limit.unit_multiplier.map_or(1, |m| m.value);
    if multiplier == 0 {
        return Err("limit override unit_multiplier must be at least 1".into());
    }
    let mut resolved = Limit::per(limit.requests_per_unit, unit);
    resolved.unit_multiplier = multiplier;
    // The bound rule files have: every timestamp of the window stays exact in the Lua
    // twins' doubles, and no two windows saturate to one counter.
    if resolved.span_micros() > MAX_SPAN_MICROS {
        return Err(format!(
            "limit override window of {multiplier} × {} is longer than 100 years",
            unit.name()
        ));
    }
    Ok(resolved)
}

/// What one descriptor costs: its own `hits_addend` when present (even 0, which only
/// checks), else the request's, where 0 means 1.
pub fn hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> Hits {
    let amount = descriptor
        .hits_addend
        .map(|hits| hits.value)
        .unwrap_or_else(|| u64::from(request.hits_addend.max(1)));
    if descriptor.is_negative_hits {
        Hits::give_back(amount)
    } else {
        Hits::take(amount)
    }
}
