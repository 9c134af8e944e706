//! STUB — to be replaced: finds the rule for one descriptor.
use std::sync::Arc;

use super::{Domain, Rule};

/// The rule a descriptor matched, and the (key, value) pairs its counter is keyed by: the
/// request's values, or the wildcard pattern where the node has `share_threshold`.
#[derive(Debug, Clone)]
pub struct Match<'a> {
    pub rule: &'a Arc<Rule>,
    pub entries: Vec<(&'a str, &'a str)>,
}

impl Domain {
    /// envoyproxy/ratelimit's lookup: per entry, exact value, then the first matching
    /// wildcard in declaration order, then the key-only default; the rule must sit at exactly
    /// the descriptor's depth; no backtracking. `None`: no limit applies.
    pub fn find<'a, I>(&'a self, _entries: I) -> Option<Match<'a>>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        todo!()
    }
}
