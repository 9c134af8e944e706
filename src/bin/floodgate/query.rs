//! `floodgate query`: one `ShouldRateLimit` call from the command line, printed for people.

use std::process::ExitCode;

use anyhow::{Context, bail};

use floodgate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use floodgate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus,
};
use floodgate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use floodgate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    /// The server's gRPC address.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub addr: String,
    /// The rate-limit domain.
    #[arg(long)]
    pub domain: String,
    /// A descriptor as `key=value[,key=value…]`; repeat for several descriptors.
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Hits this request costs (request-level hits_addend).
    #[arg(long, default_value_t = 1)]
    pub hits: u32,
    /// Print the response as protobuf JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `floodgate query`'s exit status when the answer is OVER_LIMIT. 0 is OK, 1 no decision (the
/// server could not be reached or answered an error), 2 a usage error (clap's): a script
/// tells the three apart.
pub const OVER_LIMIT_EXIT: u8 = 3;

/// Sends the request and prints the decision; exit 0 when OK, [`OVER_LIMIT_EXIT`] when over
/// limit.
pub async fn run(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let request = RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: args
            .descriptors
            .iter()
            .map(|text| parse_descriptor(text))
            .collect::<anyhow::Result<_>>()?,
        hits_addend: args.hits,
    };
    let mut client = RateLimitServiceClient::connect(args.addr.clone())
        .await
        .with_context(|| format!("connecting to {}", args.addr))?;
    let response = client
        .should_rate_limit(request.clone())
        .await
        .map_err(|status| anyhow::anyhow!("{}: {}", status.code(), status.message()))?
        .into_inner();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else {
        print!("{}", render(&request, &response));
    }
    Ok(if response.overall_code == Code::OverLimit as i32 {
        ExitCode::from(OVER_LIMIT_EXIT)
    } else {
        ExitCode::SUCCESS
    })
}

/// Parses `key=value,key=value`; the value is everything after the first `=`.
pub(crate) fn parse_descriptor(text: &str) -> anyhow::Result<RateLimitDescriptor> {
    let entries = text
        .split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }),
            _ => bail!("descriptor entry {pair:?} is not key=value"),
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name())
}

/// The decision as text: the overall code, then one line per descriptor.
fn render(request: &RateLimitRequest, response: &RateLimitResponse) -> String {
    let mut out = format!("{}\n", code_name(response.overall_code));
    for (descriptor, status) in request.descriptors.iter().zip(&response.statuses) {
        let entries: Vec<String> = descriptor
            .entries
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        out.push_str(&format!("  {}: {}\n", entries.join(","), describe(status)));
    }
    for header in &response.response_headers_to_add {
        out.push_str(&format!("  header {}: {}\n", header.key, header.value));
    }
    out
}

fn describe(status: &DescriptorStatus) -> String {
    let code = code_name(status.code);
    let Some(limit) = &status.current_limit else {
        return if status.limit_remaining == u32::MAX {
            format!("{code} (unlimited)")
        } else {
            format!("{code} (no limit applies)")
        };
    };
    let unit = floodgate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::try_from(limit.unit)
        .map_or("UNKNOWN", |u| u.as_str_name())
        .to_lowercase();
    let window = match &limit.unit_multiplier {
        Some(m) if m.value != 1 => format!("{} {unit}s", m.value),
        _ => unit,
    };
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9);
    let name = if limit.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", limit.name)
    };
    format!(
        "{code}, limit {} per {window}{name}, remaining {}, reset in {reset:.3}s",
        limit.requests_per_unit, status.limit_remaining
    )
}

#[cfg(test)]
mod tests {
    use super::parse_descriptor;

    #[test]
    fn descriptor_value_keeps_everything_after_the_first_equals_sign() {
        let descriptor = parse_descriptor("path=/a?b=c,user=u").unwrap();
        let pairs: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(pairs, [("path", "/a?b=c"), ("user", "u")]);
    }

    #[test]
    fn descriptor_entry_without_key_is_an_error() {
        assert!(parse_descriptor("=v").is_err());
        assert!(parse_descriptor("novalue").is_err());
    }
}
