//! One descriptor's outcome: what `response.rs` makes of a resolution and its decisions,
//! and what the headers and the dynamic metadata are built from.

use crate::limiter::{Decision, Limit};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use crate::rules::Rule;

/// One descriptor's outcome, before it becomes a wire status.
pub(super) struct Outcome<'r> {
    pub status: DescriptorStatus,
    /// Counted and over its limit (before shadow mode turns the code OK).
    pub over_limit: bool,
    pub shadow: bool,
    pub quota: bool,
    /// The limit reported in `current_limit`, with its name.
    pub reported: Option<(Option<&'r str>, &'r Limit, Decision)>,
    pub rule: Option<&'r Rule>,
}
