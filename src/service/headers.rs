//! The rate-limit headers floodgate adds to `response_headers_to_add`, by setting:
//! draft-polli-ratelimit-headers-03 (`X-RateLimit-*`) or draft-ietf-httpapi-ratelimit-headers-10
//! (`RateLimit-Policy`, `RateLimit`), plus `Retry-After` when the request is over limit.

use std::fmt::Write;

use crate::limiter::SECOND_MICROS;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::settings::HeaderStyle;

use super::ServiceOptions;
use super::outcome::Outcome;

pub(super) fn build(
    outcomes: &[Outcome],
    over: bool,
    options: &ServiceOptions,
) -> Vec<HeaderValue> {
    if options.response_headers == HeaderStyle::None {
        return Vec::new();
    }
    // Most restrictive first: over limit, then least remaining.
    let mut reported: Vec<Policy> = outcomes.iter().filter_map(Policy::of).collect();
    reported.sort_by_key(|p| (!p.over_limit, p.remaining));
    let Some(first) = reported.first() else {
        return Vec::new();
    };

    let mut headers = Vec::with_capacity(3);
    match options.response_headers {
        HeaderStyle::None => {}
        HeaderStyle::Draft03 => {
            let mut limit = first.quota.to_string();
            for policy in &reported {
                let _ = write!(limit, ", {};w={}", policy.quota, policy.window_seconds);
                if let Some(name) = policy.name {
                    let _ = write!(limit, ";name={}", sf_string(name));
                }
            }
            headers.push(header("x-ratelimit-limit", limit));
            headers.push(header("x-ratelimit-remaining", first.remaining.to_string()));
            headers.push(header("x-ratelimit-reset", first.reset_seconds.to_string()));
        }
        HeaderStyle::Ietf => {
            let policies = join(reported.iter().map(|p| {
                format!(
                    "{};q={};w={}",
                    sf_string(p.label),
                    p.quota,
                    p.window_seconds
                )
            }));
            let current = join(reported.iter().map(|p| {
                format!(
                    "{};r={};t={}",
                    sf_string(p.label),
                    p.remaining,
                    p.reset_seconds
                )
            }));
            headers.push(header("ratelimit-policy", policies));
            headers.push(header("ratelimit", current));
        }
    }
    if over {
        let jitter = match options.retry_after_jitter {
            0 => 0,
            max => u64::from(fastrand::u32(0..=max)),
        };
        let wait = reported
            .iter()
            .filter(|p| p.over_limit)
            .map(|p| p.reset_seconds)
            .max()
            .unwrap_or(first.reset_seconds);
        headers.push(header("retry-after", (wait + jitter).to_string()));
    }
    headers
}

/// One counted descriptor's limit, as the headers show it.
struct Policy<'a> {
    name: Option<&'a str>,
    /// The policy's identifier in the IETF headers: its name, else its rule id.
    label: &'a str,
    quota: u32,
    window_seconds: u64,
    remaining: u64,
    reset_seconds: u64,
    over_limit: bool,
}

impl<'a> Policy<'a> {
    fn of(outcome: &'a Outcome<'a>) -> Option<Self> {
        let (name, limit, decision) = outcome.reported?;
        let label = name
            .or(outcome.rule.map(|rule| rule.id.as_str()))
            .unwrap_or("override");
        Some(Policy {
            name,
            label,
            quota: limit.requests_per_unit,
            window_seconds: limit.window_micros() / SECOND_MICROS,
            remaining: decision.remaining,
            reset_seconds: decision.reset_micros.div_ceil(SECOND_MICROS),
            over_limit: outcome.over_limit,
        })
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// An RFC 8941 structured-field string: quoted, `"` and `\` escaped, anything outside
/// printable ASCII replaced by `?`.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::sf_string;

    #[test]
    fn structured_field_strings_escape_quotes_and_backslashes() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("naïve"), "\"na?ve\"");
    }
}
